"""Rule 8 of ``paced``, documents split: two nearby documents trade places, and the windows between them
are cut again.

Packing split, the trainer cuts the token stream every L tokens, so a document rarely moves without
moving every cut after it; rule 5 only trades documents inside one window each whose exchange moves no
cut but the one inside a document between them. Here two documents at positions p < q trade places when
the stretch from p's first token to q's last spans at most ``MAX_WINDOWS`` windows: the stretch keeps
its length, so only its windows change (the documents between p and q shift by the difference of their
lengths, and those near a cut move across it). The trade is taken if those windows hold at least as
many unique clusters between them as before (diversity) and their summed uniformity (max_k |share of k
in the window - tau_k|, as ``diversity.window_share_deviation`` measures it) falls by more than
``EPSILON``.

One sweep over the order, first position to last. Each document with tokens draws up to ``TRIES``
partners among the next ``SPAN_WINDOWS`` windows' worth of documents (a seeded generator, the same
sequence on every machine) and trades with the first one that qualifies. Skipped without measuring:
partners of the same cluster or without tokens; stretches inside one window (no window changes), over
``MAX_WINDOWS`` windows (a document that long stays where rules 4 and 6 put it) or reaching across the
head, the middle and the tail of the order (its first and last ``BOUNDARY_FRACTION`` of tokens, which
meet at the epoch boundary: their token mixes, and so the boundary shift, do not change); trades that
move neither the cluster that sets the stretch's first window's deviation nor its last one's the way
that lowers it; and trades that would re-cut more than ``MAX_RECUT`` documents between p and q.

The windows are cut into at most ``CHUNKS`` runs of whole windows (``MIN_CHUNK_WINDOWS`` or more each,
so one run below that), each swept with its own generator, a trade staying inside its run: the runs
share no window and no moving document, so numba sweeps them at once on as many cores as it has, and
the order is the same on any number of cores.

O(N * TRIES) proposals, each O(log N) to place and O(MAX_WINDOWS * K + MAX_RECUT) to measure. Memory:
per position its document, cluster, tokens and token offset (32 bytes), per window 17 bytes (its fill
and part of the order), and per run the cluster counts of a band of ``BAND`` windows and a proposal's
changes to at most ``MAX_WINDOWS`` of them, so nothing grows with windows x K. A proposal is measured
from its changes alone (the entries it touches, listed once), not from a copy of its windows.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..diversity import BOUNDARY_FRACTION
from .exchange import ACROSS, EPSILON, _draw_partner, _parts, chunk_bounds, chunk_state
from .recut import _window_of_empty

# Partners drawn per document, and how far (in windows' worth of documents), set on the tuning corpora:
# 2 tries lowered uniformity less, 8 little more for twice the time.
TRIES = 4
SPAN_WINDOWS = 2
# Windows a trade's stretch may span, and documents between the two it may re-cut.
MAX_WINDOWS = 4
MAX_RECUT = 32
# Runs of whole windows swept at once (see the module docstring): at most CHUNKS, of at least
# MIN_CHUNK_WINDOWS windows each (fewer runs cost a core each; more runs cost trades across their cuts).
CHUNKS = 64
MIN_CHUNK_WINDOWS = 64
BAND = 8  # band rows held, a power of two above MAX_WINDOWS + 1


@njit(cache=True, nogil=True, inline="always")
def _add_piece(cnt, nd, row, w, c, offset, t, seq_len):
    """Add to row ``row`` (window w) the piece of a document of cluster c at ``offset`` that window holds, if any
    (a document without tokens: where ``recut._window_of_empty`` puts it)."""
    if t == 0:
        if _window_of_empty(offset, seq_len) == w:
            nd[row, c] += 1
        return
    piece = min(offset + t, (w + 1) * seq_len) - max(offset, w * seq_len)
    if piece > 0:
        cnt[row, c] += piece
        nd[row, c] += 1


@njit(cache=True, nogil=True)
def _row_deviation(cnt, row, fill, shares):
    """(max_k |cnt_k / fill - tau_k|, k + 1 for the lowest k attaining it, negated when k is under its share)
    of row ``row`` of cnt."""
    if fill <= 0:
        return 0.0, 0
    worst = 0.0
    arg = 0
    for k in range(shares.shape[0]):
        d = cnt[row, k] - shares[k] * fill
        if abs(d) > worst:
            worst, arg = abs(d), (k + 1 if d > 0 else -k - 1)
    return worst / fill, arg


@njit(cache=True, nogil=True)
def _load(w, lab, tok, off, seq_len, cnt, nd, r):
    """Window w's cluster tokens and documents into its band row, from the order as it is now, scanning
    from position r (no document before it reaches w). Returns the first position reaching w: trades
    only move documents inside windows already loaded, so windows load in order from there."""
    row = w & (BAND - 1)
    cnt[row, :] = 0
    nd[row, :] = 0
    n = tok.shape[0]
    while r < n and (_window_of_empty(off[r], seq_len) if tok[r] == 0 else (off[r + 1] - 1) // seq_len) < w:
        r += 1
    first = r
    while r < n and off[r] <= (w + 1) * seq_len:
        _add_piece(cnt, nd, row, w, lab[r], off[r], tok[r], seq_len)
        r += 1
    return first


@njit(cache=True, nogil=True)
def _recut_runs(off, p, q, w0, w1, delta, seq_len, runs):
    """The documents strictly between p and q whose pieces change when they shift by ``delta`` tokens: per
    cut inside the stretch, those reaching within |delta| of it (disjoint runs, in order). Writes
    (first, last) pairs into ``runs``; returns how many runs and documents."""
    n_runs = 0
    n_docs = 0
    done = p
    near = off[p:q + 2]  # the stretch's offsets: searches stay in it (and in cache)
    for w in range(w0 + 1, w1 + 1):
        cut = w * seq_len
        first = max(p + np.searchsorted(near, cut - max(delta, 0), side="left") - 1, done + 1)
        last = min(p + np.searchsorted(near, cut + max(-delta, 0), side="right") - 1, q - 1)
        if first <= last:
            runs[n_runs, 0] = first
            runs[n_runs, 1] = last
            n_runs += 1
            n_docs += last - first + 1
            done = last
    return n_runs, n_docs


@njit(cache=True, nogil=True, inline="always")
def _window_at(x, seq_len, w0, w1):
    """The window of token x, from w0 up to w1 + 1 (w0 - 1 before w0): a stretch spans a few windows, and
    stepping over its cuts is cheaper than dividing by seq_len (several divisions per proposal)."""
    if x < w0 * seq_len:
        return w0 - 1
    w = w0
    while w <= w1 and (w + 1) * seq_len <= x:
        w += 1
    return w


@njit(cache=True, nogil=True, inline="always")
def _add_delta(dcnt, dnd, seen, touched, n_touched, c, offset, t, sign, seq_len, w0, w1):
    """Record in dcnt / dnd (row i: window w0 + i) adding (sign 1) or taking out (-1) a document of cluster c
    at ``offset``, its pieces in windows w0..w1 only; each (window, cluster) entry first changed goes into
    ``touched``. Returns how many entries ``touched`` holds."""
    first = _window_at(offset, seq_len, w0, w1)
    if t == 0:
        if offset > 0 and offset == first * seq_len:
            first -= 1  # on a cut: the window of the token before it (``recut._window_of_empty``)
        last = first
    else:
        last = _window_at(offset + t - 1, seq_len, first, w1)
    for w in range(max(first, w0), min(last, w1) + 1):
        i = w - w0
        if t > 0:
            dcnt[i, c] += sign * (min(offset + t, (w + 1) * seq_len) - max(offset, w * seq_len))
        dnd[i, c] += sign
        if not seen[i, c]:
            seen[i, c] = True
            touched[n_touched, 0] = i
            touched[n_touched, 1] = c
            n_touched += 1
    return n_touched


@njit(cache=True, nogil=True)
def _trade(dcnt, dnd, seen, touched, lab, tok, off, p, q, runs, n_runs, seq_len, w0, w1):
    """The trade of positions p and q as changes to windows w0..w1: per window (row i: window w0 + i) and
    cluster, tokens into dcnt and documents into dnd (zero on entry), each changed entry listed once in
    ``touched`` (``seen`` marks them). Returns how many entries ``touched`` holds. Recording changes rather
    than applying them to a copy of the windows spares copying K entries per window for every proposal."""
    delta = tok[q] - tok[p]
    start, end = off[p], off[q + 1]
    n = _add_delta(dcnt, dnd, seen, touched, 0, lab[p], start, tok[p], -1, seq_len, w0, w1)
    n = _add_delta(dcnt, dnd, seen, touched, n, lab[q], off[q], tok[q], -1, seq_len, w0, w1)
    n = _add_delta(dcnt, dnd, seen, touched, n, lab[q], start, tok[q], 1, seq_len, w0, w1)
    n = _add_delta(dcnt, dnd, seen, touched, n, lab[p], end - tok[p], tok[p], 1, seq_len, w0, w1)
    for j in range(n_runs):
        for r in range(runs[j, 0], runs[j, 1] + 1):
            n = _add_delta(dcnt, dnd, seen, touched, n, lab[r], off[r], tok[r], -1, seq_len, w0, w1)
            n = _add_delta(dcnt, dnd, seen, touched, n, lab[r], off[r] + delta, tok[r], 1, seq_len, w0, w1)
    return n


@njit(cache=True, nogil=True)
def _gained(nd, dnd, touched, n_touched, w0, base, mask):
    """The change in unique clusters summed over the windows once dnd is added (window w in nd's row
    (w - base) & mask)."""
    gained = 0
    for j in range(n_touched):
        i, c = touched[j, 0], touched[j, 1]
        held = nd[(w0 + i - base) & mask, c]
        gained += (held + dnd[i, c] > 0) - (held > 0)
    return gained


@njit(cache=True, nogil=True)
def _row_deviation_after(cnt, row, dcnt, i, fill, shares):
    """``_row_deviation`` of row ``row`` of cnt with row i of dcnt added."""
    if fill <= 0:
        return 0.0, 0
    worst = 0.0
    arg = 0
    for k in range(shares.shape[0]):
        d = cnt[row, k] + dcnt[i, k] - shares[k] * fill
        if abs(d) > worst:
            worst, arg = abs(d), (k + 1 if d > 0 else -k - 1)
    return worst / fill, arg


@njit(cache=True, nogil=True)
def _clear(dcnt, dnd, seen, touched, n_touched):
    for j in range(n_touched):
        i, c = touched[j, 0], touched[j, 1]
        dcnt[i, c] = 0
        dnd[i, c] = 0
        seen[i, c] = False


@njit(cache=True, nogil=True)
def _sweep_chunk(doc, lab, tok, off, fill, part, seq_len, shares, state, w_lo, w_hi, tries, span, max_windows,
                 max_recut):
    """The sweep over the documents starting in windows w_lo .. w_hi - 1 (one run), trades inside them."""
    n = doc.shape[0]
    k_total = shares.shape[0]
    cnt = np.zeros((BAND, k_total), dtype=np.int64)
    nd = np.zeros((BAND, k_total), dtype=np.int64)
    dev = np.zeros(BAND, dtype=np.float64)
    worst = np.zeros(BAND, dtype=np.int64)
    runs = np.empty((max_windows, 2), dtype=np.int64)
    dcnt = np.zeros((max_windows, k_total), dtype=np.int64)  # a trade's changes to the stretch's windows
    dnd = np.zeros((max_windows, k_total), dtype=np.int64)
    seen = np.zeros((max_windows, k_total), dtype=np.bool_)
    touched = np.empty((max_windows * k_total, 2), dtype=np.int64)
    trial_dev = np.empty(max_windows, dtype=np.float64)
    trial_worst = np.empty(max_windows, dtype=np.int64)
    p_start = np.searchsorted(off[:n], w_lo * seq_len, side="left")
    p_end = np.searchsorted(off[:n], w_hi * seq_len, side="left")
    loaded = w_lo - 1
    scan = max(p_start - 1, 0)  # no document before this position reaches a window not loaded yet
    for p in range(p_start, p_end):
        if tok[p] == 0:
            continue
        w0 = off[p] // seq_len  # p's first window (a trade that changes it ends p's tries)
        for _ in range(tries):
            state, q = _draw_partner(state, p, span)
            if q >= n:
                break
            if tok[q] == 0 or lab[p] == lab[q]:
                continue
            w1 = (off[q + 1] - 1) // seq_len
            if (w1 == w0 or w1 >= w_hi or w1 - w0 >= max_windows or part[w0] != part[w1]
                    or part[w0] == ACROSS):
                continue
            # The band holds windows loaded - BAND + 1 .. loaded, and w0 >= loaded - (max_windows - 1): positions
            # before p no longer move, so the windows loaded for an earlier p' start at or before w0.
            while loaded < w1:
                loaded += 1
                scan = _load(loaded, lab, tok, off, seq_len, cnt, nd, scan)
                row = loaded & (BAND - 1)
                dev[row], worst[row] = _row_deviation(cnt, row, fill[loaded], shares)
            # The trade moves p's cluster towards the stretch's end and q's towards its start: it must move
            # the cluster that sets the first or the last window's deviation the way that lowers it.
            kp, kq = lab[p] + 1, lab[q] + 1
            first, last = worst[w0 & (BAND - 1)], worst[w1 & (BAND - 1)]
            if not (first == kp or first == -kq or last == kq or last == -kp):
                continue
            delta = tok[q] - tok[p]  # the shift of every document between p and q
            n_runs, n_recut = _recut_runs(off, p, q, w0, w1, delta, seq_len, runs)
            if n_recut > max_recut:
                continue
            n_touched = _trade(dcnt, dnd, seen, touched, lab, tok, off, p, q, runs, n_runs, seq_len, w0, w1)
            take = _gained(nd, dnd, touched, n_touched, w0, 0, BAND - 1) >= 0
            if take:
                budget = -EPSILON  # the windows' summed deviation must fall by more than EPSILON
                for w in range(w0, w1 + 1):
                    budget += dev[w & (BAND - 1)]
                for w in range(w0, w1 + 1):
                    trial_dev[w - w0], trial_worst[w - w0] = _row_deviation_after(cnt, w & (BAND - 1), dcnt, w - w0,
                                                                                  fill[w], shares)
                    budget -= trial_dev[w - w0]
                    if budget <= 0:
                        break
                take = budget > 0
            if take:
                for j in range(n_touched):
                    row, c = (w0 + touched[j, 0]) & (BAND - 1), touched[j, 1]
                    cnt[row, c] += dcnt[touched[j, 0], c]
                    nd[row, c] += dnd[touched[j, 0], c]
                for w in range(w0, w1 + 1):
                    dev[w & (BAND - 1)], worst[w & (BAND - 1)] = trial_dev[w - w0], trial_worst[w - w0]
            _clear(dcnt, dnd, seen, touched, n_touched)
            if not take:
                continue
            for r in range(p + 1, q + 1):
                off[r] += delta
            doc[p], doc[q] = doc[q], doc[p]
            lab[p], lab[q] = lab[q], lab[p]
            tok[p], tok[q] = tok[q], tok[p]
            break


@njit(cache=True, nogil=True, parallel=True)
def _sweep(doc, lab, tok, seq_len, shares, seed, tries, span_windows, max_windows, max_recut, fraction, chunks,
           min_chunk_windows):
    n = doc.shape[0]
    off = np.zeros(n + 1, dtype=np.int64)
    for p in range(n):
        off[p + 1] = off[p] + tok[p]
    total = off[n]
    if total == 0:
        return doc
    n_windows = (total + seq_len - 1) // seq_len
    fill = np.full(n_windows, seq_len, dtype=np.int64)
    fill[-1] = total - (n_windows - 1) * seq_len
    part = _parts(fill, np.zeros(n_windows, dtype=np.bool_), fraction)
    span = min(max(2, span_windows * n // n_windows), 1 << 31)
    bounds = chunk_bounds(n_windows, chunks, min_chunk_windows)
    # Runs share no window and no moving document, so they are swept at once, to the same order in any order.
    for c in prange(bounds.shape[0] - 1):
        _sweep_chunk(doc, lab, tok, off, fill, part, seq_len, shares, chunk_state(seed, c), bounds[c], bounds[c + 1],
                     tries, span, max_windows, max_recut)
    return doc


def split_trade_pass(order: np.ndarray, labels: np.ndarray, token_counts: np.ndarray, seq_len: int,
                     shares: np.ndarray, seed: int, *, chunks: int = CHUNKS,
                     min_chunk_windows: int = MIN_CHUNK_WINDOWS) -> np.ndarray:
    """``order`` after rule 8 (see the module docstring); a new array. ``chunks`` and ``min_chunk_windows``:
    how the windows are cut into runs (tests use small runs)."""
    doc = np.asarray(order, dtype=np.int64).copy()
    if doc.size < 2:
        return doc
    lab = np.asarray(labels, dtype=np.int64)[doc]
    tok = np.asarray(token_counts, dtype=np.int64)[doc]
    return _sweep(doc, lab, tok, int(seq_len), np.asarray(shares, dtype=np.float64), int(seed) & 0x7FFFFFFFFFFFFFFF,
                  TRIES, SPAN_WINDOWS, MAX_WINDOWS, MAX_RECUT, BOUNDARY_FRACTION, int(chunks), int(min_chunk_windows))
