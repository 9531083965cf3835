"""Candidate ordering ``paced``: clusters paced by document count, each cluster's tokens paced inside its pool.

    paced_order(labels, token_counts, n_clusters, seq_len, split, seed) -> int64 permutation

Three rules, one per measure; no constant fitted to a corpus:

1. Pools track tokens (uniformity, boundary shift). Each cluster's documents, seeded-shuffled, are
   split at the cluster's mean length m into short (<= m) and long (> m) ones and interleaved by
   sigma-delta modulation: the next document is the next long one when the pool is behind its
   token schedule (j documents should hold j * m tokens) by at least half of that document's excess
   over m, else the next short one. Every prefix of the pool then holds j * m tokens to within
   half the largest excess (above) and half that plus m (below), so document count and token count
   progress together. The long documents are dealt shortest-at-both-ends, longest-in-the-middle:
   a document too long for its neighbours to balance stays away from the start and end of the
   order, which meet at the epoch boundary.
2. Clusters are paced by document count (diversity). The j-th of a cluster's n_k documents is due at
   (j + 1/2) / n_k of the stream, as the stratified order spaces them, so a cluster with fewer
   documents than windows never puts two in one window while another window lacks it; by rule 1
   that spacing is also (nearly) even in tokens.
3. Windows are filled with clusters they lack (diversity). The order simulates the trainer's packing
   (``split``: one token stream cut every ``seq_len`` tokens; else whole documents, a document that
   does not fit opening the next window). The next document is, in this order of preference:
   the earliest-due one of a cluster the current window lacks, if it is due before the *next*
   window ends (and, packing whole, fits); else (packing whole) the earliest-due one that is due
   before this window ends and fits, so the window is not closed early; else the earliest-due one.
   Ties go to the lowest cluster id. So a document runs at most one window ahead of its due time,
   unless nothing at all is due, and the pacing of rules 1-2 holds to within about a window.

O(N log N) to build the pools plus O(N * K) for the greedy, compiled with numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NONE = np.iinfo(np.int64).max  # no next document (the pool is empty)
# Split packing: a window's straddler is chosen among the documents due before this many windows after it.
STRADDLE_HORIZON = 3


@njit(cache=True, nogil=True)
def _paced_pools(shuffled, labels, token_counts, n_clusters):
    """Rule 1 for every cluster; returns (members, pool_starts), cluster k's pool being
    ``members[pool_starts[k]:pool_starts[k + 1]]``.

    ``shuffled`` is a seeded permutation of the documents: pools keep its order among short
    documents and among long ones of equal length. Short/long and the schedule error are exact
    integer arithmetic: a document is long when t * n_k > T_k, and with E = n_k * (tokens so far)
    - j * T_k the next long document (length l) goes next when 2 E + (n_k * l - T_k) <= 0.
    """
    n = shuffled.shape[0]
    sizes = np.zeros(n_clusters, dtype=np.int64)
    cluster_tokens = np.zeros(n_clusters, dtype=np.int64)
    for i in range(n):
        sizes[labels[i]] += 1
        cluster_tokens[labels[i]] += token_counts[i]
    pool_starts = np.zeros(n_clusters + 1, dtype=np.int64)
    for k in range(n_clusters):
        pool_starts[k + 1] = pool_starts[k] + sizes[k]
    grouped = np.empty(n, dtype=np.int64)  # shuffled order, grouped by cluster (counting sort)
    cursor = pool_starts[:-1].copy()
    for i in shuffled:
        grouped[cursor[labels[i]]] = i
        cursor[labels[i]] += 1
    members = np.empty(n, dtype=np.int64)
    for k in range(n_clusters):
        n_k = sizes[k]
        total = cluster_tokens[k]
        docs = grouped[pool_starts[k]:pool_starts[k + 1]]
        n_long = 0
        for d in docs:
            if token_counts[d] * n_k > total:
                n_long += 1
        short = np.empty(n_k - n_long, dtype=np.int64)
        long_docs = np.empty(n_long, dtype=np.int64)
        a = 0
        b = 0
        for d in docs:
            if token_counts[d] * n_k > total:
                long_docs[b] = d
                b += 1
            else:
                short[a] = d
                a += 1
        # Organ pipe: ascending length rank r goes to slot r // 2 (r even) or n_long - 1 - r // 2 (r odd).
        ascending = long_docs[np.argsort(token_counts[long_docs], kind="mergesort")]
        pipe = np.empty(n_long, dtype=np.int64)
        for r in range(n_long):
            pipe[r // 2 if r % 2 == 0 else n_long - 1 - r // 2] = ascending[r]
        i = 0
        j = 0
        error = 0
        for slot in range(pool_starts[k], pool_starts[k + 1]):
            take_long = j < n_long and (i == short.shape[0] or 2 * error + (n_k * token_counts[pipe[j]] - total) <= 0)
            if take_long:
                d = pipe[j]
                j += 1
            else:
                d = short[i]
                i += 1
            members[slot] = d
            error += n_k * token_counts[d] - total
    return members, pool_starts


@njit(cache=True, nogil=True)
def _due_positions(pool_starts, member_counts):
    """Rule 2: each pool slot's due position, the token offset at which it starts in the pure count-paced merge
    (slot j of a pool of n, key (j + 1/2) / n; equal keys: the lower cluster first). A binary heap over the
    clusters' next keys, compared exactly as (2j + 1) * n' < (2j' + 1) * n."""
    n_clusters = pool_starts.shape[0] - 1
    due = np.empty(member_counts.shape[0], dtype=np.int64)
    heap = np.empty(n_clusters, dtype=np.int64)  # cluster ids, keyed by their next slot
    nxt = np.zeros(n_clusters, dtype=np.int64)  # slots of each pool merged so far
    size = 0
    for k in range(n_clusters):
        if pool_starts[k + 1] > pool_starts[k]:
            heap[size] = k
            size += 1
    # heapify (every key is 1/(2n) here; sift down from the middle)
    for root in range(size // 2 - 1, -1, -1):
        _sift_down(heap, root, size, nxt, pool_starts)
    placed = 0
    while size > 0:
        k = heap[0]
        slot = pool_starts[k] + nxt[k]
        due[slot] = placed
        placed += member_counts[slot]
        nxt[k] += 1
        if pool_starts[k] + nxt[k] == pool_starts[k + 1]:
            size -= 1
            heap[0] = heap[size]
        _sift_down(heap, 0, size, nxt, pool_starts)
    return due


@njit(cache=True, nogil=True)
def _before(a, b, nxt, pool_starts):
    """Cluster a's next key comes before cluster b's: (2 j_a + 1) / n_a < (2 j_b + 1) / n_b, ties to the lower id."""
    left = (2 * nxt[a] + 1) * (pool_starts[b + 1] - pool_starts[b])
    right = (2 * nxt[b] + 1) * (pool_starts[a + 1] - pool_starts[a])
    return left < right or (left == right and a < b)


@njit(cache=True, nogil=True)
def _sift_down(heap, root, size, nxt, pool_starts):
    while True:
        child = 2 * root + 1
        if child >= size:
            return
        if child + 1 < size and _before(heap[child + 1], heap[child], nxt, pool_starts):
            child += 1
        if not _before(heap[child], heap[root], nxt, pool_starts):
            return
        heap[root], heap[child] = heap[child], heap[root]
        root = child


@njit(cache=True, nogil=True)
def _paced(members, pool_starts, member_counts, due, cluster_tokens, seq_len, split, saturated):
    """Rules 3 and 4: the window-filling greedy over the interleaved pools, against due positions in tokens."""
    n_clusters = pool_starts.shape[0] - 1
    n = members.shape[0]
    total = 0
    for k in range(n_clusters):
        total += cluster_tokens[k]
    taken = np.zeros(n_clusters, dtype=np.int64)
    # Each cluster's next document: its due position (NONE once the pool is empty), length and excess over
    # the cluster's own share of a window (t * total - T_k * seq_len: the share t / seq_len - T_k / total,
    # scaled by total * seq_len), kept per cluster so the scans below read small arrays.
    next_due = np.full(n_clusters, NONE, dtype=np.int64)
    next_length = np.zeros(n_clusters, dtype=np.int64)
    next_excess = np.zeros(n_clusters, dtype=np.int64)
    for k in range(n_clusters):
        if pool_starts[k + 1] > pool_starts[k]:
            next_due[k] = due[pool_starts[k]]
            next_length[k] = member_counts[pool_starts[k]]
            next_excess[k] = next_length[k] * total - cluster_tokens[k] * seq_len
    stamp = np.full(n_clusters, -1, dtype=np.int64)  # stamp[k] == window: cluster k is in that window
    window = 0
    fill = 0  # whole packing: tokens in the current window
    placed = 0  # tokens placed so far
    order = np.empty(n, dtype=np.int64)
    for step in range(n):
        if split:
            window = placed // seq_len
            room = (window + 1) * seq_len - placed
        else:
            room = seq_len - fill
        window_end = placed + room
        next_window_end = window_end + seq_len
        horizon = window_end + STRADDLE_HORIZON * seq_len
        lacking, lacking_due = -1, NONE
        fitting, fitting_due = -1, NONE
        earliest, earliest_due = -1, NONE
        # split: the largest excess due within the horizon, of a lacking cluster if any (unless saturated)
        straddler = -1
        straddler_lacks = False
        straddler_excess = 0
        for k in range(n_clusters):
            d = next_due[k]
            if d == NONE:
                continue
            if d < earliest_due:
                earliest, earliest_due = k, d
            lacks = stamp[k] != window
            if split:
                if lacks and d <= next_window_end and d < lacking_due:
                    lacking, lacking_due = k, d
                if d <= horizon:
                    excess = next_excess[k]
                    if saturated:
                        lacks = True
                    if straddler < 0 or (lacks and not straddler_lacks) or (
                            lacks == straddler_lacks and excess > straddler_excess):
                        straddler, straddler_lacks, straddler_excess = k, lacks, excess
            elif fill + next_length[k] <= seq_len:
                if lacks:
                    if d <= next_window_end and d < lacking_due:
                        lacking, lacking_due = k, d
                elif d <= window_end and d < fitting_due:
                    fitting, fitting_due = k, d
        k = -1
        if straddler >= 0:
            t = next_length[straddler]
            half = (t % seq_len if t >= seq_len else t) // 2
            if room <= half:
                k = straddler  # cut at the boundary near its middle
            else:
                # the earliest-due lacking document due before the next window ends that ends before the
                # straddle point
                limit = room - half
                k_due = NONE
                for j in range(n_clusters):
                    d = next_due[j]
                    if d <= next_window_end and d < k_due and stamp[j] != window and next_length[j] <= limit \
                            and j != straddler:
                        k, k_due = j, d
                if k < 0 and 2 * room <= 3 * half:
                    k = straddler
        if k < 0:
            k = lacking if lacking >= 0 else (fitting if fitting >= 0 and not split else earliest)
        position = pool_starts[k] + taken[k]
        taken[k] += 1
        order[step] = members[position]
        t = member_counts[position]
        if position + 1 < pool_starts[k + 1]:
            next_due[k] = due[position + 1]
            next_length[k] = member_counts[position + 1]
            next_excess[k] = next_length[k] * total - cluster_tokens[k] * seq_len
        else:
            next_due[k] = NONE
        if split:
            if t > 0:
                stamp[k] = (placed + t - 1) // seq_len  # the last window the document reaches
            else:
                stamp[k] = (placed - 1) // seq_len if placed > 0 else 0
            placed += t
        else:
            placed += t
            if fill + t <= seq_len:
                stamp[k] = window
                fill += t
            else:
                window += 1
                fill = t
                while fill >= seq_len:  # a long document fills whole windows alone
                    fill -= seq_len
                    window += 1
                if fill > 0:
                    stamp[k] = window
    return order


@njit(cache=True, nogil=True)
def _paced1(members, pool_starts, member_counts, seq_len, split, total_tokens):
    """The first version's rules 2-3 (kept for comparison): due at (j + 1/2) / n_k of the stream's tokens."""
    n_clusters = pool_starts.shape[0] - 1
    n = members.shape[0]
    taken = np.zeros(n_clusters, dtype=np.int64)
    # Each cluster's next document: when it is due (a fraction of the stream; inf once the pool is
    # empty) and its length, kept per cluster so the scan below reads two small arrays.
    next_due = np.full(n_clusters, np.inf)
    next_length = np.zeros(n_clusters, dtype=np.int64)
    for k in range(n_clusters):
        size = pool_starts[k + 1] - pool_starts[k]
        if size > 0:
            next_due[k] = 0.5 / size
            next_length[k] = member_counts[pool_starts[k]]
    stamp = np.full(n_clusters, -1, dtype=np.int64)  # stamp[k] == window: cluster k is in that window
    window = 0
    fill = 0  # whole packing: tokens in the current window
    placed = 0  # tokens placed so far
    total = max(float(total_tokens), 1.0)
    order = np.empty(n, dtype=np.int64)
    for step in range(n):
        if split:
            window = placed // seq_len
            room = (window + 1) * seq_len - placed
        else:
            room = seq_len - fill
        window_end = (placed + room) / total  # the current window's end, as a fraction of the stream
        next_window_end = window_end + seq_len / total
        lacking = -1
        lacking_due = 0.0
        fitting = -1
        fitting_due = 0.0
        earliest = -1
        earliest_due = 0.0
        for k in range(n_clusters):
            due = next_due[k]
            if earliest < 0 or due < earliest_due:
                earliest, earliest_due = k, due
            fits = split or fill + next_length[k] <= seq_len
            if fits and stamp[k] != window:
                if due <= next_window_end and (lacking < 0 or due < lacking_due):
                    lacking, lacking_due = k, due
            elif fits and due <= window_end and (fitting < 0 or due < fitting_due):
                fitting, fitting_due = k, due
        k = lacking if lacking >= 0 else (fitting if fitting >= 0 and not split else earliest)
        position = pool_starts[k] + taken[k]
        taken[k] += 1
        order[step] = members[position]
        t = member_counts[position]
        size = pool_starts[k + 1] - pool_starts[k]
        if taken[k] < size:
            next_due[k] = (taken[k] + 0.5) / size
            next_length[k] = member_counts[position + 1]
        else:
            next_due[k] = np.inf
        if split:
            if t > 0:
                stamp[k] = (placed + t - 1) // seq_len  # the last window the document reaches
            else:
                stamp[k] = (placed - 1) // seq_len if placed > 0 else 0
            placed += t
        else:
            placed += t
            if fill + t <= seq_len:
                stamp[k] = window
                fill += t
            else:
                window += 1
                fill = t
                while fill >= seq_len:  # a long document fills whole windows alone
                    fill -= seq_len
                    window += 1
                if fill > 0:
                    stamp[k] = window
    return order


def paced_pools(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, seed: int):
    """(members, pool_starts): each cluster's pool after rule 1, clusters concatenated in id order."""
    labels = np.asarray(labels, dtype=np.int64)
    shuffled = np.random.default_rng(seed).permutation(labels.size).astype(np.int64)
    return _paced_pools(shuffled, labels, np.asarray(token_counts, dtype=np.int64), int(n_clusters))


def _checked(labels, token_counts, n_clusters, seq_len):
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= n_clusters):
        raise ValueError(f"labels must lie in 0..{n_clusters - 1}")
    if counts.shape != labels.shape or (counts.size and counts.min() < 0):
        raise ValueError("token_counts must be non-negative, one per label")
    return labels, counts


def due_positions(members: np.ndarray, pool_starts: np.ndarray, token_counts: np.ndarray) -> np.ndarray:
    """Rule 2: each pool slot's due position in tokens (slots as ``paced_pools`` returns them)."""
    return _due_positions(np.asarray(pool_starts, dtype=np.int64), np.asarray(token_counts, dtype=np.int64)[members])


def paced_order(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, seq_len: int, split: bool,
                seed: int = 42) -> np.ndarray:
    """The ``paced`` ordering (see the module docstring): an int64 permutation of input positions."""
    labels, counts = _checked(labels, token_counts, n_clusters, seq_len)
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    members, pool_starts = paced_pools(labels, counts, n_clusters, seed)
    member_counts = counts[members]
    due = _due_positions(pool_starts, member_counts)
    cluster_tokens = np.bincount(labels, weights=counts, minlength=int(n_clusters)).astype(np.int64)
    # Windows hold more documents than there are clusters on average: which cluster straddles costs no diversity.
    saturated = labels.size * int(seq_len) >= int(n_clusters) * int(counts.sum())
    return _paced(members, pool_starts, member_counts, due, cluster_tokens, int(seq_len), bool(split), saturated)


def paced1_order(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, seq_len: int, split: bool,
                 seed: int = 42) -> np.ndarray:
    """The first version of ``paced`` (due at (j + 1/2) / n_k of the stream's tokens, no straddling), for comparison."""
    labels, counts = _checked(labels, token_counts, n_clusters, seq_len)
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    members, pool_starts = paced_pools(labels, counts, n_clusters, seed)
    return _paced1(members, pool_starts, counts[members], int(seq_len), bool(split), int(counts.sum()))
