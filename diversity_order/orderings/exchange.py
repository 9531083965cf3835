"""Rule 5 of ``paced``: documents trade places between nearby windows where that steadies token shares.

One sweep over the order, first position to last. Each movable document draws up to ``TRIES``
partners among the next ``SPAN_WINDOWS`` windows' worth of documents (a seeded generator, the same
sequence on every machine) and trades places with the first partner whose trade is admissible and
lowers the two windows' summed uniformity (max_k |share of k in the window - tau_k|, as
``diversity.window_share_deviation`` measures it) by more than ``EPSILON``. Admissible:

- every window is cut where it was, so no other window changes:
  - documents whole: both fit where they go; neither opened its window (it did not fit in the one
    before); neither window holds a piece of a document longer than a window; the document that
    opened the window after each still does not fit in it;
  - documents split: neither crosses a window boundary; they are of equal length, or in adjacent
    windows with the boundary between them still inside the document that crossed it (at least one
    token each side), so the cut moves inside that document only;
- the two windows hold at least as many unique clusters between them as before (diversity);
- both windows lie in the same part of the order: its first ``BOUNDARY_FRACTION`` of tokens, its
  last, or between them (a window reaching across is left alone), so the two ends that meet at the
  epoch boundary keep the documents the earlier rules gave them (boundary shift);
- the partner's window is at most ``MAX_WINDOW_GAP`` windows on; documents without tokens stay put;
- a document that was its cluster's first in the order the pass starts from never moves later: on a small corpus (a few windows
  fewer than MAX_WINDOW_GAP) a cluster of two documents, due at a quarter and three quarters of the epoch,
  had its first traded to three quarters, so no token of it came before then (a reviewer's chat set: 73%
  of the tokens before every cluster had appeared, a shuffle's 55%, rules 1-4's 24%);
- both windows lie in one run: the windows are cut into at most ``CHUNKS`` runs of whole windows
  (``MIN_CHUNK_WINDOWS`` or more each, so one run below twice that), each swept with its own generator.
  The runs share no window and no movable document, so numba sweeps them at once on as many cores as it
  has, and the order is the same on any number of cores.

Linear in the number of documents: O(N * TRIES) proposals, each O(1) to reject and O(min(K, documents in
the two windows)) to measure. Many are refused in O(1): a window's deviation after a trade is at least
the deviation then of the cluster that set it before (``_deviation`` reports the lowest id among
equals), which the moved tokens and the new fill give at once; where the two windows' floors sum to at
least their summed deviation before less ``EPSILON``, the trade cannot be taken, so this refuses only
trades a pass without it would refuse too. Memory: per document its position's document, cluster,
tokens, window and movability (33 bytes; 8 more packing split, its token offset), per window seven
numbers, and per run the cluster counts of a band of MAX_WINDOW_GAP + 1 windows only (64 rows), so
nothing grows with windows x K.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..diversity import BOUNDARY_FRACTION
from ..packing import SPLIT, advance, n_pieces, piece_tokens, place

# Partners drawn per document, and how far they are drawn from (in windows' worth of documents),
# set on the tuning corpora: more of either raised uniformity gains slowly and run time linearly.
TRIES = 8
SPAN_WINDOWS = 8
# A partner's window is at most this many windows after the document's (the band of windows held).
MAX_WINDOW_GAP = 4 * SPAN_WINDOWS
# Runs of whole windows swept at once, each with its own generator, a trade staying inside its run: at most
# CHUNKS runs of at least MIN_CHUNK_WINDOWS windows (rule 8 cuts its windows the same way). A run is many
# times MAX_WINDOW_GAP windows, so few trades are lost at its cuts.
CHUNKS = 64
MIN_CHUNK_WINDOWS = 8 * MAX_WINDOW_GAP
# Floating-point noise: a trade must lower the summed deviation by more than this.
EPSILON = 1e-12

HEAD, MIDDLE, TAIL, ACROSS = 0, 1, 2, -1  # the part of the order a window lies in


@njit(cache=True, nogil=True)
def _next_random(state):
    """xorshift64*: the next state and a 31-bit draw (the same sequence on every machine)."""
    state ^= state >> np.uint64(12)
    state ^= state << np.uint64(25)
    state ^= state >> np.uint64(27)
    return state, np.int64((state * np.uint64(2685821657736338717)) >> np.uint64(33))


@njit(cache=True, nogil=True, inline="always")
def _draw_partner(state, p, span):
    """The next generator state and a partner position drawn uniformly from p + 1 .. p + span."""
    state, draw = _next_random(state)
    return state, p + 1 + ((draw * span) >> 31)


@njit(cache=True, nogil=True)
def window_layout(tok, seq_len, model):
    """The windows of the order as the trainer cuts them (``packing.place``), numbered as they open.

    Per position: its window (of its first piece) and whether it may move. Per window: the span of
    positions with tokens or presence in it, its tokens, the tokens of the document that opened it
    (documents whole; seq_len + 1 when nothing fits after it), whether it holds a piece of a document
    longer than a window, and (documents split) the document crossing its end boundary into the next
    window only, with its tokens before the boundary (-1 when none).
    """
    n = tok.shape[0]
    stamp = np.zeros(1, dtype=np.int64)  # a first walk counts the windows, so the arrays are no longer than needed
    w = 0
    f = 0
    for p in range(n):
        w, f = advance(stamp, 0, tok[p], w, f, seq_len, model)
    cap = w + 1
    win = np.empty(n, dtype=np.int64)
    movable = np.ones(n, dtype=np.bool_)
    lo = np.full(cap, -1, dtype=np.int64)
    hi = np.full(cap, -1, dtype=np.int64)
    fill = np.zeros(cap, dtype=np.int64)
    opener = np.full(cap, seq_len + 1, dtype=np.int64)
    frozen = np.zeros(cap, dtype=np.bool_)
    cut = np.full(cap, -1, dtype=np.int64)
    cut_head = np.zeros(cap, dtype=np.int64)
    w = 0
    f = 0
    for p in range(n):
        t = tok[p]
        close_first, head, n_full, tail, close_last = place(f, t, seq_len, model)
        if close_first:
            w += 1
            f = 0
            if model != SPLIT:
                opener[w] = t if t <= seq_len else seq_len + 1
                movable[p] = False  # it opened the window
        win[p] = w
        pieces = n_pieces(n_full, tail)
        if t == 0 or pieces > 1:
            movable[p] = False
        if pieces > 1 and model == SPLIT and n_full == 0:
            cut[w] = p
            cut_head[w] = head
        if model != SPLIT and t > seq_len:
            movable[p] = False
        for piece in range(pieces):
            if piece > 0:
                w += 1
                f = 0
            if lo[w] < 0:
                lo[w] = p
            hi[w] = p
            tokens = piece_tokens(piece, head, n_full, tail, seq_len)
            f += tokens
            fill[w] += tokens
            if model != SPLIT and t > seq_len:
                frozen[w] = True
        if close_last:
            w += 1
            f = 0
    return win, movable, lo, hi, fill, opener, frozen, cut, cut_head


@njit(cache=True, nogil=True)
def _parts(fill, frozen, fraction):
    """Each window's part of the order (HEAD, MIDDLE, TAIL; ACROSS when it reaches across, or is frozen)."""
    total = fill.sum()
    part = np.empty(fill.shape[0], dtype=np.int64)
    start = 0
    for w in range(fill.shape[0]):
        end = start + fill[w]
        if frozen[w]:
            part[w] = ACROSS
        elif end <= fraction * total:
            part[w] = HEAD
        elif start >= (1.0 - fraction) * total:
            part[w] = TAIL
        elif start >= fraction * total and end <= (1.0 - fraction) * total:
            part[w] = MIDDLE
        else:
            part[w] = ACROSS
        start = end
    return part


@njit(cache=True, nogil=True)
def _load(slot, w, lo, hi, lab, tok, seq_len, model, offsets, cnt, nd):
    """Window w's cluster tokens and documents into band row ``slot`` (from the order as first cut)."""
    cnt[slot, :] = 0
    nd[slot, :] = 0
    if lo[w] < 0:
        return
    start, stop = w * seq_len, (w + 1) * seq_len
    for p in range(lo[w], hi[w] + 1):
        t = tok[p]
        if model == SPLIT:
            t = min(offsets[p] + t, stop) - max(offsets[p], start)
            if t < 0:
                t = 0
        elif t > seq_len:
            continue  # frozen windows are never measured
        cnt[slot, lab[p]] += t
        nd[slot, lab[p]] += 1


@njit(cache=True, nogil=True)
def _deviation(slot, w, lo, hi, lab, fill, cnt, nd, shares, by_share, visit, mark):
    """(max_k |cnt_k - tau_k fill| / fill, the lowest k attaining it) of window w (band row ``slot``):
    max_k |cnt_k / fill - tau_k|, over the clusters present (read from the window's documents when
    fewer than K) and the largest share of a cluster it lacks (the lowest id among equal shares)."""
    f = fill[w]
    if f == 0:
        return 0.0, -1
    worst = 0.0
    arg = -1
    k_total = shares.shape[0]
    if hi[w] - lo[w] + 1 < k_total:
        for p in range(lo[w], hi[w] + 1):
            k = lab[p]
            if visit[k] != mark:
                visit[k] = mark
                d = abs(cnt[slot, k] - shares[k] * f)
                if d > worst or arg < 0 or (d == worst and k < arg):
                    worst, arg = d, k
    else:
        for k in range(k_total):
            if nd[slot, k] > 0:
                d = abs(cnt[slot, k] - shares[k] * f)
                if d > worst or arg < 0:
                    worst, arg = d, k
    for k in by_share:
        if nd[slot, k] == 0:
            d = shares[k] * f
            if d > worst or arg < 0 or (d == worst and k < arg):
                worst, arg = d, k
            break
    return worst / f, arg


@njit(cache=True, nogil=True, inline="always")
def _worst_after(cnt, row, k, f, shares, ki, ti, kj, tj, ks, delta, side):
    """A floor on a window's deviation after a trade: the deviation then of k, the cluster that set it
    before (0 where none or the window is empty), computed as ``_deviation`` computes it, so never above the
    window's new deviation. side 1: the window gives the document of cluster ki and ti tokens and takes the
    one of kj and tj, and (ks >= 0, documents split) its piece of the cut document of cluster ks shrinks by
    delta; -1: the other way; f: its fill after the trade."""
    if k < 0 or f <= 0:
        return 0.0
    c = cnt[row, k]
    if k == ki:
        c -= side * ti
    if k == kj:
        c += side * tj
    if k == ks:
        c -= side * delta
    return abs(c - shares[k] * f) / f


@njit(cache=True, nogil=True, inline="always")
def _trade_counts(cnt, nd, fill, ra, rb, a, b, ki, kj, ks, ti, tj, model, sign):
    """Window rows ra (window a) and rb (b) after (sign 1) or before (sign -1) a document of cluster ki and ti
    tokens in a trades places with one of kj and tj in b; ks >= 0: the cut document's cluster, whose piece in
    a shrinks by tj - ti (documents split). Documents whole, the windows' fills change instead."""
    delta = tj - ti
    cnt[ra, ki] -= sign * ti
    cnt[rb, ki] += sign * ti
    cnt[rb, kj] -= sign * tj
    cnt[ra, kj] += sign * tj
    nd[ra, ki] -= sign
    nd[rb, ki] += sign
    nd[rb, kj] -= sign
    nd[ra, kj] += sign
    if ks >= 0:
        cnt[ra, ks] -= sign * delta
        cnt[rb, ks] += sign * delta
    if model != SPLIT:
        fill[a] += sign * delta
        fill[b] -= sign * delta


@njit(cache=True, nogil=True)
def chunk_bounds(n_windows, chunks, min_chunk_windows):
    """The first window of each run, and n_windows after the last: at most ``chunks`` runs of whole windows
    of at least ``min_chunk_windows`` each (one run for fewer windows)."""
    n_chunks = max(1, min(chunks, n_windows // min_chunk_windows))
    bounds = np.empty(n_chunks + 1, dtype=np.int64)
    for c in range(n_chunks + 1):
        bounds[c] = c * n_windows // n_chunks
    return bounds


@njit(cache=True, nogil=True)
def chunk_state(seed, chunk):
    """Run ``chunk``'s generator state (odd, so never zero; the same on every machine)."""
    return (np.uint64(seed) * np.uint64(2) + np.uint64(0x9E3779B97F4A7C15)
            + np.uint64(chunk) * np.uint64(0x3C6EF372FE94F82A))


@njit(cache=True, nogil=True)
def _sweep_chunk(doc, lab, tok, seq_len, model, shares, state, tries, span, max_gap, win, movable, lo, hi, fill,
                 opener, cut, cut_head, part, offsets, trading, first, w_lo, w_hi):
    """The sweep over the documents whose window is w_lo .. w_hi - 1 (one run), trades inside them. ``first``:
    at each position, whether its document was its cluster's first in the order the pass started from: such a
    document never moves later (see the module docstring)."""
    n = doc.shape[0]
    n_windows = fill.shape[0]
    k_total = shares.shape[0]
    by_share = np.argsort(-shares, kind="mergesort")
    band = 1  # rows held: a power of two above max_gap, so a window's row is w & (band - 1)
    while band <= max_gap:
        band *= 2
    cnt = np.zeros((band, k_total), dtype=np.int64)
    nd = np.zeros((band, k_total), dtype=np.int64)
    dev = np.zeros(band, dtype=np.float64)
    worst = np.full(band, -1, dtype=np.int64)  # a cluster that sets the row's deviation
    visit = np.zeros(k_total, dtype=np.int64)
    mark = 0
    loaded = w_lo - 1  # windows w_lo..loaded have been read into the band
    for p in range(np.searchsorted(win, w_lo, side="left"), np.searchsorted(win, w_hi, side="left")):
        if not movable[p] or first[p]:  # (a trade moves p's document later)
            continue
        a = win[p]
        if part[a] == ACROSS:
            continue
        for _ in range(tries):
            state, q = _draw_partner(state, p, span)
            if q >= n:
                break
            b = win[q]
            if b == a or b - a > max_gap or b >= w_hi or not movable[q] or part[b] != part[a]:
                continue
            ti, tj = tok[p], tok[q]
            ki, kj = lab[p], lab[q]
            if ki == kj:
                continue
            delta = tj - ti
            ks = -1  # the cluster of the document the shared boundary cuts (split, unequal lengths)
            if model == SPLIT:
                if delta != 0:
                    if b != a + 1 or cut[a] < 0:
                        continue
                    s = cut[a]
                    if cut_head[a] - delta < 1 or tok[s] - cut_head[a] + delta < 1:
                        continue
                    ks = lab[s]
            else:
                fa, fb = fill[a] + delta, fill[b] - delta
                if fa > seq_len or fb > seq_len:
                    continue
                if a + 1 < n_windows and fa + opener[a + 1] <= seq_len:
                    continue
                if b + 1 < n_windows and fb + opener[b + 1] <= seq_len:
                    continue
            while loaded < b:
                loaded += 1
                if not trading[loaded]:
                    continue  # never a trade's window, so never read (windows a long document fills, mostly)
                row = loaded & (band - 1)
                _load(row, loaded, lo, hi, lab, tok, seq_len, model, offsets, cnt, nd)
                mark += 1
                dev[row], worst[row] = _deviation(row, loaded, lo, hi, lab, fill, cnt, nd, shares, by_share, visit, mark)
            ra, rb = a & (band - 1), b & (band - 1)
            # Each window's deviation after the trade is at least that of the cluster setting it now; where
            # these floors cannot beat the current sum by more than EPSILON, refused without measuring.
            grow = 0 if model == SPLIT else delta
            if (_worst_after(cnt, ra, worst[ra], fill[a] + grow, shares, ki, ti, kj, tj, ks, delta, 1)
                    + _worst_after(cnt, rb, worst[rb], fill[b] - grow, shares, ki, ti, kj, tj, ks, delta, -1)
                    >= dev[ra] + dev[rb] - EPSILON):
                continue
            before = (nd[ra, ki] > 0) + (nd[rb, ki] > 0) + (nd[ra, kj] > 0) + (nd[rb, kj] > 0)
            _trade_counts(cnt, nd, fill, ra, rb, a, b, ki, kj, ks, ti, tj, model, 1)
            # the exchange, so _deviation reads the windows' new documents
            lab[p], lab[q] = kj, ki
            after = (nd[ra, ki] > 0) + (nd[rb, ki] > 0) + (nd[ra, kj] > 0) + (nd[rb, kj] > 0)
            take = after >= before
            if take:
                mark += 1
                da, wa = _deviation(ra, a, lo, hi, lab, fill, cnt, nd, shares, by_share, visit, mark)
                mark += 1
                db, wb = _deviation(rb, b, lo, hi, lab, fill, cnt, nd, shares, by_share, visit, mark)
                take = da + db < dev[ra] + dev[rb] - EPSILON
            if take:
                dev[ra], dev[rb] = da, db
                worst[ra], worst[rb] = wa, wb
                doc[p], doc[q] = doc[q], doc[p]
                tok[p], tok[q] = tj, ti
                first[p], first[q] = first[q], False  # (the flags go with the documents; p's was not one)
                if ks >= 0:
                    cut_head[a] -= delta
                break
            lab[p], lab[q] = ki, kj
            _trade_counts(cnt, nd, fill, ra, rb, a, b, ki, kj, ks, ti, tj, model, -1)


@njit(cache=True, nogil=True, parallel=True)
def _sweep(doc, lab, tok, seq_len, model, shares, seed, tries, span_windows, max_gap, fraction, chunks,
           min_chunk_windows):
    n = doc.shape[0]
    win, movable, lo, hi, fill, opener, frozen, cut, cut_head = window_layout(tok, seq_len, model)
    n_windows = fill.shape[0]
    part = _parts(fill, frozen, fraction)
    offsets = np.zeros(n if model == SPLIT else 0, dtype=np.int64)  # token offsets as first cut (split)
    for p in range(1, offsets.shape[0]):
        offsets[p] = offsets[p - 1] + tok[p - 1]
    with_tokens = 0
    for w in range(n_windows):
        with_tokens += fill[w] > 0
    span = min(max(1, span_windows * n // max(with_tokens, 1)), 1 << 31)
    trading = np.zeros(n_windows, dtype=np.bool_)  # the windows a movable document lies in: all a trade reads
    for p in range(n):
        if movable[p]:
            trading[win[p]] = True
    first = np.zeros(n, dtype=np.bool_)  # each cluster's first document in the order
    seen = np.zeros(shares.shape[0], dtype=np.bool_)
    for p in range(n):
        if not seen[lab[p]]:
            seen[lab[p]] = True
            first[p] = True
    bounds = chunk_bounds(n_windows, chunks, min_chunk_windows)
    # Runs share no window and no movable document (a document that reaches into the next run's first window
    # stays put), so they are swept at once, to the same order in any order.
    for c in prange(bounds.shape[0] - 1):
        _sweep_chunk(doc, lab, tok, seq_len, model, shares, chunk_state(seed, c), tries, span, max_gap, win,
                     movable, lo, hi, fill, opener, cut, cut_head, part, offsets, trading, first, bounds[c],
                     bounds[c + 1])
    return doc


def exchange_pass(order: np.ndarray, labels: np.ndarray, token_counts: np.ndarray, seq_len: int, shares: np.ndarray,
                  model: int, seed: int, *, chunks: int = CHUNKS, min_chunk_windows: int = MIN_CHUNK_WINDOWS
                  ) -> np.ndarray:
    """``order`` after rule 5 (see the module docstring) under packing ``model``; a new array. ``chunks`` and
    ``min_chunk_windows``: how the windows are cut into runs (tests use small runs)."""
    order = np.asarray(order, dtype=np.int64)
    doc = order.copy()
    if doc.size < 2:
        return doc
    lab = np.asarray(labels, dtype=np.int64)[doc]
    tok = np.asarray(token_counts, dtype=np.int64)[doc]
    return _sweep(doc, lab, tok, int(seq_len), int(model), np.asarray(shares, dtype=np.float64),
                  int(seed) & 0x7FFFFFFFFFFFFFFF, TRIES, SPAN_WINDOWS, MAX_WINDOW_GAP, BOUNDARY_FRACTION, int(chunks),
                  int(min_chunk_windows))
