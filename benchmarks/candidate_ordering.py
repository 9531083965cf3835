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
def _paced(members, pool_starts, member_counts, seq_len, split, total_tokens):
    """Rules 2 and 3: the count-paced, window-filling greedy over the interleaved pools."""
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


def paced_order(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, seq_len: int, split: bool,
                seed: int = 42) -> np.ndarray:
    """The ``paced`` ordering (see the module docstring): an int64 permutation of input positions."""
    if seq_len < 1:
        raise ValueError("seq_len must be at least 1")
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    if labels.min() < 0 or labels.max() >= n_clusters:
        raise ValueError(f"labels must lie in 0..{n_clusters - 1}")
    if counts.shape != labels.shape or (counts.size and counts.min() < 0):
        raise ValueError("token_counts must be non-negative, one per label")
    members, pool_starts = paced_pools(labels, counts, n_clusters, seed)
    return _paced(members, pool_starts, counts[members], int(seq_len), bool(split), int(counts.sum()))
