"""Rule 6 of ``paced``, documents split: a document a window long or longer that fills one window more
alone than its length forces is re-cut, by moving the documents next to it to its other side.

A document of t = m L + r tokens (m >= 1; L the window) whose first piece is h tokens (the room left
where it starts) fills m - 1 windows alone when r < h < L, and m when h <= r or h = L (it starts on a
boundary); a window one document fills holds one cluster and the largest deviation. Rules 3 and 4 can
start such a document anywhere when it is the earliest due. Here the run of documents just before it
(or just after it), each shorter than a window, moves to its other side, so it starts X tokens earlier
(later) and its first piece becomes h'. Of the runs of at most L tokens with r < h' < L, the one with
h' closest to (L + r) / 2 (half of the rest either side of a boundary, as rule 4 aims; ties to the
shorter run) is taken if the windows it touches then hold more unique clusters with their summed
uniformity (max_k |share of k - tau_k|, as ``diversity.window_share_deviation`` measures it) raised by
at most ``RECUT_RATE`` per cluster gained, or as many clusters and a lower uniformity; of the two
directions, the one with more clusters, then the lower uniformity. (The document's excess over its
cluster's share is spread over its windows either way, so the summed uniformity moves little, up or
down; the window it no longer fills alone, a one-topic sequence, gains clusters.) Windows outside
the run and the document keep their documents and cuts. The run and the document stay inside one part
of the order (its first ``BOUNDARY_FRACTION`` of tokens, its last, or between), so the epoch
boundary's two ends keep their documents.

One scan over the order: O(N), plus for each such long document O(documents in the windows it and its
runs touch, and K per window).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..diversity import BOUNDARY_FRACTION
from .exchange import EPSILON

# A re-cut that gains clusters may raise the windows' summed uniformity by this much per cluster gained:
# a window one document no longer fills alone gains up to K - 1 clusters and costs a few hundredths.
# Before 2026-11-26 it had to be 0, which kept such windows on a few held-out samples where
# stratified's order had none (BENCHMARKS.md, "The last window, and re-cuts that cost a little
# uniformity"); 0.005 and 0.01 gave the same verdicts on the 72 cells.
RECUT_RATE = 0.01


@njit(cache=True, nogil=True, inline="always")
def _window_of_empty(offset, seq_len):
    """The window of a document without tokens at ``offset``: that of the token before it."""
    return (offset - 1) // seq_len if offset > 0 and offset % seq_len == 0 else offset // seq_len


@njit(cache=True, nogil=True)
def _stats(lab, tok, base, w_lo, w_hi, seq_len, shares, cnt, present):
    """(unique clusters, summed uniformity) over windows w_lo..w_hi of documents ``lab``/``tok`` laid
    out from token ``base``; they must be every document with tokens or presence in those windows."""
    k_total = shares.shape[0]
    unique = 0
    deviation = 0.0
    for w in range(w_lo, w_hi + 1):
        start, stop = w * seq_len, (w + 1) * seq_len
        for k in range(k_total):
            cnt[k] = 0
            present[k] = False
        fill = 0
        offset = base
        for i in range(tok.shape[0]):
            t = tok[i]
            if t == 0:
                if _window_of_empty(offset, seq_len) == w:
                    present[lab[i]] = True
                continue
            piece = min(offset + t, stop) - max(offset, start)
            if piece > 0:
                cnt[lab[i]] += piece
                present[lab[i]] = True
                fill += piece
            offset += t
        if fill == 0:
            continue  # a window without tokens is not one (packing.py)
        worst = 0.0
        for k in range(k_total):
            unique += present[k]
            d = abs(cnt[k] / fill - shares[k])
            if d > worst:
                worst = d
        deviation += worst
    return unique, deviation


@njit(cache=True, nogil=True)
def _best_run(tok, offsets, i, direction, seq_len):
    """The run next to position i (direction -1: before it, 1: after it) to move to its other side:
    its far end j, or -1 when no run of documents shorter than a window, at most seq_len tokens,
    gives a first piece strictly between r and seq_len."""
    n = tok.shape[0]
    t = tok[i]
    r = t % seq_len
    target = (seq_len + r) // 2
    best, best_gap = -1, seq_len + 1
    moved = 0
    j = i
    while True:
        j += direction
        if j < 0 or j >= n or tok[j] >= seq_len:
            return best
        moved += tok[j]
        if moved > seq_len:
            return best
        start = offsets[i] - moved if direction < 0 else offsets[i] + moved
        head = seq_len - start % seq_len
        if r < head < seq_len:
            gap = abs(head - target)
            if gap < best_gap:
                best, best_gap = j, gap


@njit(cache=True, nogil=True)
def _recut(doc, lab, tok, seq_len, shares, fraction):
    n = doc.shape[0]
    offsets = np.zeros(n + 1, dtype=np.int64)
    for p in range(n):
        offsets[p + 1] = offsets[p] + tok[p]
    total = offsets[n]
    k_total = shares.shape[0]
    cnt = np.zeros(k_total, dtype=np.int64)
    present = np.zeros(k_total, dtype=np.bool_)
    i = 0
    while i < n:
        t = tok[i]
        head = seq_len - offsets[i] % seq_len
        if t < seq_len or (t % seq_len < head < seq_len):
            i += 1
            continue
        chosen, chosen_gain, chosen_drop = -1, -1, 0.0
        for direction in (-1, 1):
            j = _best_run(tok, offsets, i, direction, seq_len)
            if j < 0:
                continue
            lo, hi = (j, i) if direction < 0 else (i, j)
            seg_start, seg_end = offsets[lo], offsets[hi + 1]
            if not (seg_end <= fraction * total or seg_start >= (1.0 - fraction) * total
                    or (seg_start >= fraction * total and seg_end <= (1.0 - fraction) * total)):
                continue
            w_lo, w_hi = seg_start // seq_len, (seg_end - 1) // seq_len
            a = lo  # every document with tokens or presence in windows w_lo..w_hi (those without tokens at
            while a > 0 and (offsets[a] > w_lo * seq_len or w_lo == 0):  # the very start are in window 0)
                a -= 1
            b = hi
            while b + 1 < n and (offsets[b + 1] < (w_hi + 1) * seq_len
                                 or (offsets[b + 1] == (w_hi + 1) * seq_len and tok[b + 1] == 0)):
                b += 1
            moved_lab = lab[a:b + 1].copy()
            moved_tok = tok[a:b + 1].copy()
            # the run and the document trade sides: [run, doc] -> [doc, run] or [doc, run] -> [run, doc]
            if direction < 0:
                moved_lab[lo - a] = lab[i]
                moved_tok[lo - a] = tok[i]
                moved_lab[lo - a + 1:hi - a + 1] = lab[lo:hi]
                moved_tok[lo - a + 1:hi - a + 1] = tok[lo:hi]
            else:
                moved_lab[lo - a:hi - a] = lab[lo + 1:hi + 1]
                moved_tok[lo - a:hi - a] = tok[lo + 1:hi + 1]
                moved_lab[hi - a] = lab[i]
                moved_tok[hi - a] = tok[i]
            u0, d0 = _stats(lab[a:b + 1], tok[a:b + 1], offsets[a], w_lo, w_hi, seq_len, shares, cnt, present)
            u1, d1 = _stats(moved_lab, moved_tok, offsets[a], w_lo, w_hi, seq_len, shares, cnt, present)
            # more clusters at little more uniformity, or as many at less (up to EPSILON either way)
            if not ((u1 > u0 and d1 <= d0 + EPSILON + RECUT_RATE * (u1 - u0)) or (u1 == u0 and d1 < d0 - EPSILON)):
                continue
            if chosen < 0 or u1 - u0 > chosen_gain or (u1 - u0 == chosen_gain and d0 - d1 > chosen_drop):
                chosen, chosen_gain, chosen_drop = j, u1 - u0, d0 - d1
        if chosen < 0:
            i += 1
            continue
        lo, hi = (chosen, i) if chosen < i else (i, chosen)
        d, k = doc[i], lab[i]
        if chosen < i:  # the document moves to the front of the run
            for p in range(hi, lo, -1):
                doc[p], lab[p], tok[p] = doc[p - 1], lab[p - 1], tok[p - 1]
            doc[lo], lab[lo], tok[lo] = d, k, t
        else:  # to its back
            for p in range(lo, hi):
                doc[p], lab[p], tok[p] = doc[p + 1], lab[p + 1], tok[p + 1]
            doc[hi], lab[hi], tok[hi] = d, k, t
        for p in range(lo, hi + 1):
            offsets[p + 1] = offsets[p] + tok[p]
        i = hi + 1
    return doc


def recut_pass(order: np.ndarray, labels: np.ndarray, token_counts: np.ndarray, seq_len: int,
               shares: np.ndarray) -> np.ndarray:
    """``order`` after rule 6 (see the module docstring; documents split); a new array."""
    doc = np.asarray(order, dtype=np.int64).copy()
    if doc.size < 2:
        return doc
    lab = np.asarray(labels, dtype=np.int64)[doc]
    tok = np.asarray(token_counts, dtype=np.int64)[doc]
    return _recut(doc, lab, tok, int(seq_len), np.asarray(shares, dtype=np.float64), BOUNDARY_FRACTION)
