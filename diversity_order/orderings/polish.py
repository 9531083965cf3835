"""A pass after ``paced``: local polishing of an order for token-share uniformity, documents packed whole
(documents split: one more sweep of ``paced``'s rule 8, ``split_trades.py``, with another generator). With
``paced`` they make the ``paced-polished`` ordering.

Not part of the ``paced`` ordering. Before ``paced`` traded documents between windows itself (its
rule 5, ``exchange.py``) this pass met issue 14's uniformity bar in 4 more of 72 cells; after it, in
none more (median uniformity lower by at most 0.01 x a random shuffle's), for 0.05-0.5 s of CPU per
1M documents (BENCHMARKS.md, "Rule 5"); ``benchmarks/bench_ordering_quality.py`` measures it as
``paced+polish``.

Walks the trainer's windows (``packing.py``'s whole-document rule) once, first to last, and for each
pair of adjacent windows made only of documents that fit a window takes up to ``ROUNDS`` steps. A
step exchanges a document of one window with one of the other, or moves one to the end of the
other. Of the admissible steps, the ``SHORTLIST`` that lower the pair's summed squared deviation
(sum_k (share of k in the window - tau_k)^2, O(1) to update) most are shortlisted, and the one that
lowers the pair's summed largest deviation (max_k |share - tau_k|, the uniformity measure) most is
taken, if it does not raise it. Admissible:

- every window still holds all its documents (its tokens fit, and the first document of the next
  window still does not fit): the trainer cuts as many windows, after the same windows outside the pair;
- the pair holds at least as many unique clusters as before (diversity per window is kept).

A window holding more than ``CANDIDATES`` documents offers only its ``CANDIDATES`` longest ones.
Windows touched by a document longer than a window are left alone. A step moves a document one
window (it can ride on over the next pairs; on the suite boundary shift moved by at most 0.02 x a
random shuffle's). Linear in the number of documents: O(ROUNDS * CANDIDATES^2) per pair of windows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..packing import WHOLE, packing_model
from .options import OrderingOptions

# Effort bounds, set on the tuning corpora (less effort lost the cells it gains, more cost more time): steps
# per pair of windows, documents per window offered for a step, passes over the windows.
ROUNDS = 4
CANDIDATES = 8
SWEEPS = 1
# Steps (best by squared deviation) of which the one lowering the largest deviations most is taken.
SHORTLIST = 4
# Floating-point noise: a squared-deviation gain must exceed it, a largest-deviation rise must not.
EPSILON = 1e-12


@njit(cache=True, nogil=True)
def _windows(tokens, seq_len):
    """Whole packing: start position of each window's documents (a document longer than a window
    belongs to the window of its last piece), and whether a window holds such a document."""
    starts = np.empty(tokens.shape[0] + 1, dtype=np.int64)
    frozen = np.zeros(tokens.shape[0] + 1, dtype=np.bool_)
    n = 0
    fill = 0
    closed = False  # the open window was closed by a long document's last piece filling it
    for i in range(tokens.shape[0]):
        t = tokens[i]
        if i == 0 or closed or fill + t > seq_len:
            starts[n] = i
            n += 1
            fill = 0
            closed = False
        if t > seq_len:
            frozen[n - 1] = True
            fill = t % seq_len
            # Its last piece fills a window: the window is closed, and the next document opens another
            # even if it has no tokens (packing.place's close_last).
            closed = fill == 0
        else:
            fill += t
    starts[n] = tokens.shape[0]
    return starts[:n + 1].copy(), frozen[:n].copy()


@njit(cache=True, nogil=True)
def _deviation(labs, n, cnt, ndocs, fill, shares, by_share, visit, mark):
    """max_k |cnt[k] / fill - tau_k| for a window holding documents of ``labs[:n]`` (dense ``cnt``, ``ndocs``)."""
    if fill == 0:
        return 0.0
    worst = 0.0
    if n < shares.shape[0]:
        for i in range(n):
            k = labs[i]
            if visit[k] != mark:
                visit[k] = mark
                d = abs(cnt[k] / fill - shares[k])
                if d > worst:
                    worst = d
    else:
        for k in range(shares.shape[0]):
            if ndocs[k] > 0:
                d = abs(cnt[k] / fill - shares[k])
                if d > worst:
                    worst = d
    for k in by_share:  # the largest share of a cluster the window lacks
        if ndocs[k] == 0:
            if shares[k] > worst:
                worst = shares[k]
            break
    return worst


@njit(cache=True, nogil=True, inline="always")
def _add(cnt, ndocs, k, t, sign):
    """Add (sign 1) or remove (sign -1) a document; returns the change in unique clusters."""
    before = ndocs[k] > 0
    ndocs[k] += sign
    cnt[k] += sign * t
    return (ndocs[k] > 0) - before


@njit(cache=True, nogil=True)
def _candidates(toks, n, out):
    """Write into ``out`` the indices of the window's documents offered for a step: all, or the CANDIDATES
    longest (ties to the earlier); returns how many."""
    if n <= CANDIDATES:
        for i in range(n):
            out[i] = i
        return n
    m = 0
    for i in range(n):  # insertion into a sorted top list
        if m == CANDIDATES and toks[i] <= toks[out[m - 1]]:
            continue
        p = m if m < CANDIDATES else m - 1
        while p > 0 and toks[out[p - 1]] < toks[i]:
            out[p] = out[p - 1]
            p -= 1
        out[p] = i
        if m < CANDIDATES:
            m += 1
    return m


@njit(cache=True, nogil=True, inline="always")
def _squares(q, p, cnt, k, t, share):
    """(sum_k cnt_k^2, sum_k cnt_k tau_k) after adding t tokens (t < 0: removing) to cluster k."""
    c = cnt[k]
    return q + (c + t) * (c + t) - c * c, p + t * share


@njit(cache=True, nogil=True)
def _sums(labs, n, cnt, shares, visit, mark):
    """(sum_k cnt_k^2, sum_k cnt_k tau_k) over the clusters of ``labs[:n]``."""
    q = 0.0
    p = 0.0
    for i in range(n):
        k = labs[i]
        if visit[k] != mark:
            visit[k] = mark
            q += cnt[k] * cnt[k]
            p += cnt[k] * shares[k]
    return q, p


@njit(cache=True, nogil=True, inline="always")
def _spread(q, p, fill):
    """sum_k (cnt_k / fill - tau_k)^2 less the constant sum_k tau_k^2."""
    if fill == 0:
        return 0.0
    inverse = 1.0 / fill
    return (q * inverse - 2.0 * p) * inverse


@njit(cache=True, nogil=True)
def _step_deviation(kind, i, j, w, seq_len, shares, by_share, visit, mark):
    """Summed max deviation of the two windows after step (kind, i, j), and the change in unique clusters;
    the step is applied to the counts and labels and undone before returning."""
    a_lab, a_tok, b_lab, b_tok, cnt_a, nd_a, cnt_b, nd_b, n = w
    na, nb, fa, fb = n[0], n[1], n[2], n[3]
    if kind == 0:
        ki, ti, kj, tj = a_lab[i], a_tok[i], b_lab[j], b_tok[j]
        du = (_add(cnt_a, nd_a, ki, ti, -1) + _add(cnt_a, nd_a, kj, tj, 1)
              + _add(cnt_b, nd_b, kj, tj, -1) + _add(cnt_b, nd_b, ki, ti, 1))
        a_lab[i], b_lab[j] = kj, ki
        d = (_deviation(a_lab, na, cnt_a, nd_a, fa - ti + tj, shares, by_share, visit, mark)
             + _deviation(b_lab, nb, cnt_b, nd_b, fb - tj + ti, shares, by_share, visit, mark + 1))
        a_lab[i], b_lab[j] = ki, kj
        _add(cnt_a, nd_a, ki, ti, 1)
        _add(cnt_a, nd_a, kj, tj, -1)
        _add(cnt_b, nd_b, kj, tj, 1)
        _add(cnt_b, nd_b, ki, ti, -1)
    elif kind == 1:
        ki, ti = a_lab[i], a_tok[i]
        du = _add(cnt_a, nd_a, ki, ti, -1) + _add(cnt_b, nd_b, ki, ti, 1)
        d = (_deviation_without(a_lab, na, i, cnt_a, nd_a, fa - ti, shares, by_share, visit, mark)
             + _deviation_with(b_lab, nb, ki, cnt_b, nd_b, fb + ti, shares, by_share, visit, mark + 1))
        _add(cnt_a, nd_a, ki, ti, 1)
        _add(cnt_b, nd_b, ki, ti, -1)
    else:
        kj, tj = b_lab[j], b_tok[j]
        du = _add(cnt_b, nd_b, kj, tj, -1) + _add(cnt_a, nd_a, kj, tj, 1)
        d = (_deviation_with(a_lab, na, kj, cnt_a, nd_a, fa + tj, shares, by_share, visit, mark)
             + _deviation_without(b_lab, nb, j, cnt_b, nd_b, fb - tj, shares, by_share, visit, mark + 1))
        _add(cnt_b, nd_b, kj, tj, 1)
        _add(cnt_a, nd_a, kj, tj, -1)
    return d, du


@njit(cache=True, nogil=True)
def _best_steps(w, prev_fill, next_first, seq_len, shares, visit, mark, cand, top, steps):
    """The SHORTLIST admissible steps (windows cut as before) that lower the pair's summed squared
    deviation most, best first, into ``steps`` rows (kind, i, j); returns how many. kind 0: exchange a[i]
    and b[j]; 1: a[i] to the end of b; 2: b[j] to the end of a."""
    a_lab, a_tok, b_lab, b_tok, cnt_a, nd_a, cnt_b, nd_b, n = w
    na, nb, fa, fb = n[0], n[1], n[2], n[3]
    qa, pa = _sums(a_lab, na, cnt_a, shares, visit, mark)
    qb, pb = _sums(b_lab, nb, cnt_b, shares, visit, mark + 1)
    current = _spread(qa, pa, fa) + _spread(qb, pb, fb) - EPSILON
    m = 0
    ca = cand[0, :_candidates(a_tok, na, cand[0])]
    cb = cand[1, :_candidates(b_tok, nb, cand[1])]
    for i in ca:
        ki, ti = a_lab[i], a_tok[i]
        if na > 1:  # a[i] to the end of b: a keeps a first document and still closes before b's first
            first_a = a_tok[1] if i == 0 else a_tok[0]
            if (fb + ti <= seq_len and prev_fill + first_a > seq_len and fa - ti + b_tok[0] > seq_len
                    and fb + ti + next_first > seq_len):
                q1, p1 = _squares(qa, pa, cnt_a, ki, -ti, shares[ki])
                q2, p2 = _squares(qb, pb, cnt_b, ki, ti, shares[ki])
                d = _spread(q1, p1, fa - ti) + _spread(q2, p2, fb + ti)
                if d < current:
                    m = _shortlist(top, steps, m, d, 1, i, -1)
        for j in cb:
            kj, tj = b_lab[j], b_tok[j]
            if ki == kj and ti == tj:
                continue
            nfa, nfb = fa - ti + tj, fb - tj + ti
            first_a = tj if i == 0 else a_tok[0]
            first_b = ti if j == 0 else b_tok[0]
            if (nfa > seq_len or nfb > seq_len or prev_fill + first_a <= seq_len or nfa + first_b <= seq_len
                    or nfb + next_first <= seq_len):
                continue
            q1, p1 = _squares(qa, pa, cnt_a, ki, -ti, shares[ki])
            cnt_a[ki] -= ti
            q1, p1 = _squares(q1, p1, cnt_a, kj, tj, shares[kj])
            cnt_a[ki] += ti
            q2, p2 = _squares(qb, pb, cnt_b, kj, -tj, shares[kj])
            cnt_b[kj] -= tj
            q2, p2 = _squares(q2, p2, cnt_b, ki, ti, shares[ki])
            cnt_b[kj] += tj
            d = _spread(q1, p1, nfa) + _spread(q2, p2, nfb)
            if d < current:
                m = _shortlist(top, steps, m, d, 0, i, j)
    if nb > 1:
        for j in cb:  # b[j] to the end of a: b keeps a first document, and a still closes before it
            kj, tj = b_lab[j], b_tok[j]
            first_b = b_tok[1] if j == 0 else b_tok[0]
            if fa + tj > seq_len or fa + tj + first_b <= seq_len or fb - tj + next_first <= seq_len:
                continue
            q1, p1 = _squares(qa, pa, cnt_a, kj, tj, shares[kj])
            q2, p2 = _squares(qb, pb, cnt_b, kj, -tj, shares[kj])
            d = _spread(q1, p1, fa + tj) + _spread(q2, p2, fb - tj)
            if d < current:
                m = _shortlist(top, steps, m, d, 2, -1, j)
    return m


@njit(cache=True, nogil=True, inline="always")
def _shortlist(top, steps, m, score, kind, i, j):
    """Insert a step into the sorted shortlist ``top[:m]`` (lowest first, earlier on ties); returns its length."""
    if m == top.shape[0] and score >= top[m - 1]:
        return m
    p = m if m < top.shape[0] else m - 1
    while p > 0 and top[p - 1] > score:
        top[p] = top[p - 1]
        steps[p, 0], steps[p, 1], steps[p, 2] = steps[p - 1, 0], steps[p - 1, 1], steps[p - 1, 2]
        p -= 1
    top[p] = score
    steps[p, 0], steps[p, 1], steps[p, 2] = kind, i, j
    return m + 1 if m < top.shape[0] else m


@njit(cache=True, nogil=True, inline="always")
def _move(src_doc, src_lab, src_tok, src_cnt, src_nd, dst_doc, dst_lab, dst_tok, dst_cnt, dst_nd, n, src, i):
    """Move document ``i`` of one window of the pair to the end of the other (``src`` 0: a to b, 1: b to a);
    ``n`` holds the pair's documents (n[0], n[1]) and tokens (n[2], n[3])."""
    dst = 1 - src
    k, t = src_lab[i], src_tok[i]
    _add(src_cnt, src_nd, k, t, -1)
    _add(dst_cnt, dst_nd, k, t, 1)
    n[2 + src] -= t
    n[2 + dst] += t
    at = n[dst]
    dst_doc[at], dst_lab[at], dst_tok[at] = src_doc[i], k, t
    n[dst] += 1
    for x in range(i, n[src] - 1):
        src_doc[x], src_lab[x], src_tok[x] = src_doc[x + 1], src_lab[x + 1], src_tok[x + 1]
    n[src] -= 1


@njit(cache=True, nogil=True)
def _polish_pair(order, lab_o, tok_o, s0, s1, s2, prev_fill, next_first, seq_len, shares, by_share,
                 cnt_a, nd_a, cnt_b, nd_b, visit, mark, buf, n, cand, top, steps):
    """Polish windows order[s0:s1] and order[s1:s2] (``lab_o``, ``tok_o``: their labels and tokens, kept in
    step); returns (new boundary s1, mark). ``buf``: scratch rows, at least s2 - s0 long."""
    a_doc, a_lab, a_tok, b_doc, b_lab, b_tok = buf[0], buf[1], buf[2], buf[3], buf[4], buf[5]
    n[:] = 0  # documents in a, in b; tokens in a, in b
    for p in range(s0, s2):
        d, k, t = order[p], lab_o[p], tok_o[p]
        if p < s1:
            a_doc[n[0]], a_lab[n[0]], a_tok[n[0]] = d, k, t
            _add(cnt_a, nd_a, k, t, 1)
            n[0] += 1
            n[2] += t
        else:
            b_doc[n[1]], b_lab[n[1]], b_tok[n[1]] = d, k, t
            _add(cnt_b, nd_b, k, t, 1)
            n[1] += 1
            n[3] += t
    w = (a_lab, a_tok, b_lab, b_tok, cnt_a, nd_a, cnt_b, nd_b, n)
    mark += 2
    dev = (_deviation(a_lab, n[0], cnt_a, nd_a, n[2], shares, by_share, visit, mark)
           + _deviation(b_lab, n[1], cnt_b, nd_b, n[3], shares, by_share, visit, mark + 1))
    for _ in range(ROUNDS):
        mark += 2
        m = _best_steps(w, prev_fill, next_first, seq_len, shares, visit, mark, cand, top, steps)
        kind, bi, bj, best = -1, -1, -1, dev + EPSILON
        for r in range(m):  # of the shortlist, the step that lowers the largest deviations most
            mark += 2
            d, du = _step_deviation(steps[r, 0], steps[r, 1], steps[r, 2], w, seq_len, shares, by_share, visit, mark)
            if du >= 0 and d < best - EPSILON * (kind >= 0):
                kind, bi, bj, best = steps[r, 0], steps[r, 1], steps[r, 2], d
        if kind < 0:
            break  # the squares would fall but the pair's largest deviations, or its clusters, would not hold
        dev = best
        if kind == 0:
            ki, ti, kj, tj = a_lab[bi], a_tok[bi], b_lab[bj], b_tok[bj]
            _add(cnt_a, nd_a, ki, ti, -1)
            _add(cnt_a, nd_a, kj, tj, 1)
            _add(cnt_b, nd_b, kj, tj, -1)
            _add(cnt_b, nd_b, ki, ti, 1)
            n[2] += tj - ti
            n[3] += ti - tj
            a_doc[bi], b_doc[bj] = b_doc[bj], a_doc[bi]
            a_lab[bi], b_lab[bj] = kj, ki
            a_tok[bi], b_tok[bj] = tj, ti
        elif kind == 1:
            _move(a_doc, a_lab, a_tok, cnt_a, nd_a, b_doc, b_lab, b_tok, cnt_b, nd_b, n, 0, bi)
        else:
            _move(b_doc, b_lab, b_tok, cnt_b, nd_b, a_doc, a_lab, a_tok, cnt_a, nd_a, n, 1, bj)
    for i in range(n[0]):
        order[s0 + i], lab_o[s0 + i], tok_o[s0 + i] = a_doc[i], a_lab[i], a_tok[i]
        _add(cnt_a, nd_a, a_lab[i], a_tok[i], -1)
    for j in range(n[1]):
        p = s0 + n[0] + j
        order[p], lab_o[p], tok_o[p] = b_doc[j], b_lab[j], b_tok[j]
        _add(cnt_b, nd_b, b_lab[j], b_tok[j], -1)
    return s0 + n[0], mark + 2


@njit(cache=True, nogil=True)
def _deviation_without(labs, n, skip, cnt, ndocs, fill, shares, by_share, visit, mark):
    """``_deviation`` of the window ``labs[:n]`` less document ``skip`` (already removed from cnt, ndocs)."""
    keep = labs[skip]
    labs[skip] = labs[0] if skip != 0 else (labs[1] if n > 1 else keep)
    d = _deviation(labs, n, cnt, ndocs, fill, shares, by_share, visit, mark)
    labs[skip] = keep
    return d


@njit(cache=True, nogil=True)
def _deviation_with(labs, n, extra, cnt, ndocs, fill, shares, by_share, visit, mark):
    """``_deviation`` of the window ``labs[:n]`` plus a document of cluster ``extra`` (already in cnt, ndocs)."""
    keep = labs[n]
    labs[n] = extra
    d = _deviation(labs, n + 1, cnt, ndocs, fill, shares, by_share, visit, mark)
    labs[n] = keep
    return d


@njit(cache=True, nogil=True)
def _polish_whole(order, labels, tokens, seq_len, shares):
    order = order.copy()
    lab_o = labels[order]
    tok_o = tokens[order]
    by_share = np.argsort(-shares, kind="mergesort")
    starts, frozen = _windows(tok_o, seq_len)
    n_windows = frozen.shape[0]
    fills = np.zeros(n_windows, dtype=np.int64)
    for w in range(n_windows):
        for p in range(starts[w], starts[w + 1]):
            t = tok_o[p]
            fills[w] += t % seq_len if t > seq_len else t
        if frozen[w] and fills[w] == 0:
            fills[w] = seq_len  # a document's last piece filled it
    k = shares.shape[0]
    counts = np.zeros((5, k), dtype=np.int64)  # tokens and documents per cluster in a and in b; visit marks
    buf = np.empty((6, 64), dtype=np.int64)
    n = np.zeros(4, dtype=np.int64)
    cand = np.empty((2, CANDIDATES), dtype=np.int64)
    top = np.empty(SHORTLIST, dtype=np.float64)
    steps = np.empty((SHORTLIST, 3), dtype=np.int64)
    mark = 0
    for _ in range(SWEEPS):
        for w in range(n_windows - 1):
            if frozen[w] or frozen[w + 1]:
                continue
            prev_fill = fills[w - 1] if w > 0 else seq_len + 1  # the first window has nothing before it
            next_first = tok_o[starts[w + 2]] if w + 2 < n_windows else seq_len + 1
            if starts[w + 2] - starts[w] > buf.shape[1]:
                buf = np.empty((6, 2 * (starts[w + 2] - starts[w])), dtype=np.int64)
            starts[w + 1], mark = _polish_pair(order, lab_o, tok_o, starts[w], starts[w + 1], starts[w + 2], prev_fill,
                                               next_first, seq_len, shares, by_share, counts[0], counts[1],
                                               counts[2], counts[3], counts[4], mark, buf, n, cand, top, steps)
            fills[w], fills[w + 1] = n[2], n[3]
    return order


def polish_whole(order: np.ndarray, labels: np.ndarray, token_counts: np.ndarray, seq_len: int,
                 shares: np.ndarray) -> np.ndarray:
    """``order`` polished for uniformity under whole packing (see the module docstring); a new array."""
    if order.size < 2:
        return order.copy()
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    return _polish_whole(order, labels, counts, int(seq_len), np.asarray(shares, dtype=np.float64))


def paced_polished_order(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int,
                         options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """``paced``, then the polishing pass of its packing model (``polish_whole``; packing split, a second sweep of
    rule 8 seeded with ``options.seed + 1``): steadier token shares than ``paced``, for more run time."""
    from ..diversity import global_token_shares
    from .paced import paced_order
    from .split_trades import split_trade_pass

    order = paced_order(labels, token_counts, n_clusters, options)
    shares = global_token_shares(labels, token_counts, n_clusters)
    if packing_model(options.packing) != WHOLE:
        return split_trade_pass(order, labels, token_counts, options.seq_len, shares, options.seed + 1)
    return polish_whole(order, labels, token_counts, options.seq_len, shares)
