"""Rule 9 of ``paced`` (documents whole): the last window emptied into earlier windows' room, or given the
clusters it lacks.

Packed whole, every window but the last closes with a little room its next document did not fit in,
and the last holds what is left: on a corpus of a few dozen windows that is often a handful of
documents, or one, so a window of few clusters weighs on the mean as much as a full one (and a
trainer gets a nearly empty sequence). Where every document of the last window fits in the room other
windows were closed with, each goes there, and the last window is gone:

- each is appended after the last document of a window with room for it (some room: a full window may
  have closed already, and a document without tokens would open the next one), which cuts no window
  anywhere else: that window's next document did not fit before and fits still less now;
- longest first, each goes to the nearest window before the end that lacks its cluster, among the
  last ``SCAN_WINDOWS`` window numbers, else the nearest one with room (the documents stay near the end,
  which meets the head of the order at the epoch boundary);
- all of them or none, and only where the mean unique clusters per window does not fall.

Where they do not all fit (or emptying it is not kept), the documents of clusters the last window lacks
are pulled into it from the windows before it (nearest the end first, among the last ``SCAN_WINDOWS``
window numbers, empty windows counted), each from a window holding
another document of its cluster and tokens left, and still closing where it did (the document after it
still does not fit); a window's opening document stays. Either change is kept only where the boundary
shift rises by at most ``BOUNDARY_SLACK``.

O(N) for the windows and the boundary shift, O(SCAN_WINDOWS * documents per window) for the choice.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..diversity import boundary_shift
from ..packing import WHOLE
from .exchange import window_layout

# Windows before the end looked at for room: the rule is for corpora of few windows, where one window
# weighs on the mean; on larger ones the last window hardly counts, and the scan stays bounded.
SCAN_WINDOWS = 256
# Documents leaving the last window, or joining it, change the mix of the order's last tokens, which meet
# its first at the epoch boundary; a change is kept only where the boundary shift (total variation between
# the two mixes) rises by at most this: about a tenth of a shuffle's shift on a corpus of a few thousand
# documents (0.4-0.5 on the samples looked at; `paced`'s 0.05-0.1). Moved into windows before the tail, the last
# window's documents let the tail reach back into what precedes it: on such samples with long documents,
# that was a long document's cluster, and the shift rose fivefold.
BOUNDARY_SLACK = 0.05


@njit(cache=True, nogil=True)
def _unique_per_window(lab, first, last, n_clusters):
    """Unique clusters in each window, from the positions with a piece in it (``first``..``last``)."""
    unique = np.zeros(first.shape[0], dtype=np.int64)
    stamp = np.full(n_clusters, -1, dtype=np.int64)
    for w in range(first.shape[0]):
        if first[w] < 0:
            continue
        for p in range(first[w], last[w] + 1):
            if stamp[lab[p]] != w:
                stamp[lab[p]] = w
                unique[w] += 1
    return unique


@njit(cache=True, nogil=True)
def _destinations(lab, tok, seq_len, n_clusters, scan, fill, unique, last, first):
    """For each position, the position it is to follow (-1: it stays); an empty array when the last window
    cannot be emptied, or emptying it would lower the mean unique clusters per window."""
    n = tok.shape[0]
    nothing = np.empty(0, dtype=np.int64)
    windows = np.flatnonzero(fill > 0)
    if windows.size < 2:
        return nothing
    end = windows[-1]
    start = first[end]
    # The last window must be made of whole documents that start in it (no remainder of a longer one).
    moved = tok[start:].sum()
    if moved != fill[end] or tok[start:].max() > seq_len:
        return nothing
    movers = start + np.argsort(-tok[start:], kind="mergesort")  # longest first, ties by position
    after = np.full(n, -1, dtype=np.int64)
    room = seq_len - fill
    present = np.full(n_clusters, -1, dtype=np.int64)
    gained = 0
    lowest = max(0, end - scan)
    # First, windows lacking the document's cluster, nearest the end first.
    for w in range(end - 1, lowest - 1, -1):
        if fill[w] == 0 or room[w] == 0:
            continue
        for p in range(first[w], last[w] + 1):
            present[lab[p]] = w
        for i in range(movers.size):
            p = movers[i]
            if after[p] < 0 and tok[p] <= room[w] and present[lab[p]] != w:
                after[p] = last[w]
                room[w] -= tok[p]
                present[lab[p]] = w
                gained += 1
    # Then any window with room, nearest the end first.
    for i in range(movers.size):
        p = movers[i]
        if after[p] >= 0:
            continue
        for w in range(end - 1, lowest - 1, -1):
            if fill[w] > 0 and room[w] > 0 and tok[p] <= room[w]:
                after[p] = last[w]
                room[w] -= tok[p]
                break
        if after[p] < 0:
            return nothing
    # Mean unique clusters per window, before (W windows) and after (W - 1, the gains added): keep the
    # change only if it does not fall.
    n_windows = windows.size
    rest = unique[windows].sum() - unique[end]
    if (rest + gained) * n_windows < (rest + unique[end]) * (n_windows - 1):
        return nothing
    return after


@njit(cache=True, nogil=True)
def _pulled(lab, tok, seq_len, n_clusters, scan, fill, last, first):
    """Positions to move to the end of the order, in that order: documents of clusters the last window
    lacks, from nearby windows that keep their cut and a document of that cluster."""
    nothing = np.empty(0, dtype=np.int64)
    windows = np.flatnonzero(fill > 0)
    if windows.size < 2:
        return nothing
    fill = fill.copy()
    end = windows[-1]
    room = seq_len - fill[end]
    present = np.zeros(n_clusters, dtype=np.bool_)
    for p in range(first[end], last[end] + 1):
        present[lab[p]] = True
    in_window = np.zeros(n_clusters, dtype=np.int64)
    picked = np.empty(n_clusters, dtype=np.int64)
    n_picked = 0
    for w in range(end - 1, max(0, end - scan) - 1, -1):
        if fill[w] == 0 or room == 0 or n_picked == n_clusters or last[w] == first[w]:
            continue  # (a window of one document has none to give: it opens the window)
        for p in range(first[w], last[w] + 1):
            in_window[lab[p]] += 1
        opener = tok[last[w] + 1]  # the document after the window: it must still not fit in it
        for p in range(last[w], first[w], -1):  # the window's opener stays
            k = lab[p]
            t = tok[p]
            if not present[k] and in_window[k] >= 2 and t <= room and fill[w] - t + opener > seq_len and t < fill[w]:
                present[k] = True
                in_window[k] -= 1
                fill[w] -= t
                room -= t
                picked[n_picked] = p
                n_picked += 1
        for p in range(first[w], last[w] + 1):
            in_window[lab[p]] = 0
    return picked[:n_picked]


@njit(cache=True, nogil=True)
def _rebuild(order, after, start):
    """``order`` with the positions from ``start`` on each moved after its destination (several after one
    destination in position order)."""
    n = order.shape[0]
    follow_count = np.zeros(n, dtype=np.int64)
    for p in range(start, n):
        follow_count[after[p]] += 1
    offsets = np.zeros(n + 1, dtype=np.int64)
    for p in range(n):
        offsets[p + 1] = offsets[p] + follow_count[p]
    followers = np.empty(n - start, dtype=np.int64)
    slot = offsets[:-1].copy()
    for p in range(start, n):
        followers[slot[after[p]]] = p
        slot[after[p]] += 1
    out = np.empty(n, dtype=np.int64)
    k = 0
    for p in range(start):
        out[k] = order[p]
        k += 1
        for j in range(offsets[p], offsets[p + 1]):
            out[k] = order[followers[j]]
            k += 1
    return out


def mend_last_window(order: np.ndarray, labels: np.ndarray, token_counts: np.ndarray, seq_len: int,
                     n_clusters: int, scan_windows: int = SCAN_WINDOWS) -> np.ndarray:
    """Rule 9 (see the module doc), documents packed whole: ``order`` with its last window emptied into
    earlier windows' room where that can be done, else with the clusters it lacks pulled into it; each
    only where the boundary shift rises by at most ``BOUNDARY_SLACK``."""
    order = np.asarray(order, dtype=np.int64)
    if order.size < 2:
        return order
    lab = np.asarray(labels, dtype=np.int64)[order]
    tok = np.asarray(token_counts, dtype=np.int64)[order]
    seq_len, n_clusters, scan_windows = int(seq_len), int(n_clusters), int(scan_windows)
    if lab.min() < 0 or lab.max() >= n_clusters:  # the kernels index per-cluster arrays unchecked
        raise ValueError(f"labels must lie in 0..{n_clusters - 1}")
    shift = None
    first, last, fill = window_layout(tok, seq_len, WHOLE)[2:5]  # windows as the trainer packs them
    unique = _unique_per_window(lab, first, last, n_clusters)
    after = _destinations(lab, tok, seq_len, n_clusters, scan_windows, fill, unique, last, first)
    if after.size:
        emptied = _rebuild(order, after, int(np.flatnonzero(after >= 0)[0]))
        shift = boundary_shift(labels, token_counts, order, n_clusters)
        if boundary_shift(labels, token_counts, emptied, n_clusters) <= shift + BOUNDARY_SLACK:
            return emptied
    pulled = _pulled(lab, tok, seq_len, n_clusters, scan_windows, fill, last, first)
    if pulled.size == 0:
        return order
    stays = np.ones(order.size, dtype=bool)
    stays[pulled] = False
    mended = np.concatenate((order[stays], order[pulled]))
    shift = boundary_shift(labels, token_counts, order, n_clusters) if shift is None else shift
    return mended if boundary_shift(labels, token_counts, mended, n_clusters) <= shift + BOUNDARY_SLACK else order
