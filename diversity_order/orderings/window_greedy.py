"""Greedy orderings that aim at diverse windows: stratified, bin-packing and balanced.

- ``stratified`` (the default, the original toolkit's): always take the next document of the
  cluster most behind its document-count share. It ignores lengths and windows; it is kept
  identical to the original's interpreted loop (same float64 arithmetic and tie-breaking).
- ``bin-packing``: fill each window with clusters it lacks, fullest pool first. Diverse windows,
  but big clusters drain first, so the mix drifts from head to tail.
- ``balanced``: spread each cluster evenly over the stream in token time, and fill each window
  first with clusters it lacks when they are due soon. Diverse windows, steady token shares and a
  flat head-to-tail mix.

The window-aware ones walk the trainer's windows with the packing rule of ``packing.py``.
All are compiled with numba: O(N*K) machine steps.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..packing import advance, packing_model
from .options import OrderingOptions
from .pools import cluster_pools, pools_for


@njit(cache=True, nogil=True)
def _stratified_greedy(members: np.ndarray, pool_starts: np.ndarray) -> np.ndarray:
    n_clusters = pool_starts.shape[0] - 1
    n = members.shape[0]
    remaining = np.empty(n_clusters, dtype=np.int64)
    for k in range(n_clusters):
        remaining[k] = pool_starts[k + 1] - pool_starts[k]
    placed = np.zeros(n_clusters, dtype=np.int64)
    order = np.empty(n, dtype=np.int64)
    for step in range(n):
        docs_left = max(n - step, 1)
        docs_placed = max(step, 1)
        best = -1
        best_deficit = 0.0
        for k in range(n_clusters):
            if remaining[k] > 0:
                # Same float64 divisions as the interpreted loop, so ties break identically.
                deficit = remaining[k] / docs_left - placed[k] / docs_placed
                if best < 0 or deficit > best_deficit:
                    best = k
                    best_deficit = deficit
        order[step] = members[pool_starts[best] + placed[best]]
        remaining[best] -= 1
        placed[best] += 1
    return order


def stratified_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """Sample-count stratified greedy: always take from the most under-represented cluster.

    deficit_k = remaining_k / max(R, 1) - placed_k / max(P, 1), R documents left, P placed;
    the largest deficit wins, the lowest k on a tie.
    """
    members, pool_starts = pools_for(labels, token_counts, n_clusters, options)
    return _stratified_greedy(members, pool_starts)


@njit(cache=True, nogil=True)
def _bin_packing(members, pool_starts, member_counts, seq_len, model):
    n_clusters = pool_starts.shape[0] - 1
    n = members.shape[0]
    taken = np.zeros(n_clusters, dtype=np.int64)
    stamp = np.full(n_clusters, -1, dtype=np.int64)
    window = 0
    fill = 0
    order = np.empty(n, dtype=np.int64)
    for step in range(n):
        # The cluster with the most documents left among those the window lacks; if the window
        # already holds every cluster that has documents left, the one with the most left.
        best = -1
        best_new = False
        best_left = -1
        for k in range(n_clusters):
            left = pool_starts[k + 1] - pool_starts[k] - taken[k]
            if left <= 0:
                continue
            new = stamp[k] != window
            if best < 0 or (new and not best_new) or (new == best_new and left > best_left):
                best, best_new, best_left = k, new, left
        position = pool_starts[best] + taken[best]
        taken[best] += 1
        order[step] = members[position]
        window, fill = advance(stamp, best, member_counts[position], window, fill, seq_len, model)
    return order


def bin_packing_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """Fill each ``seq_len`` window with documents from clusters it lacks, fullest pools first."""
    members, pool_starts = pools_for(labels, token_counts, n_clusters, options)
    member_counts = np.asarray(token_counts, dtype=np.int64)[members]
    return _bin_packing(members, pool_starts, member_counts, int(options.seq_len), packing_model(options.packing))


@njit(cache=True, nogil=True)
def _due_first(members, pool_starts, due, member_counts, seq_len, model, total_tokens, horizon):
    # Earliest-due-first over the pools' next documents, where a document is "due" at its place in
    # an evenly spread schedule. Clusters the current window lacks go first when their next
    # document is due within `horizon` windows; otherwise the earliest due document goes next.
    n_clusters = pool_starts.shape[0] - 1
    n = members.shape[0]
    taken = np.zeros(n_clusters, dtype=np.int64)
    stamp = np.full(n_clusters, -1, dtype=np.int64)
    window = 0
    fill = 0
    placed_tokens = 0.0
    order = np.empty(n, dtype=np.int64)
    for step in range(n):
        limit = (placed_tokens + horizon * seq_len) / total_tokens
        best_new = -1
        best_new_due = 0.0
        best_any = -1
        best_any_due = 0.0
        for k in range(n_clusters):
            position = pool_starts[k] + taken[k]
            if position == pool_starts[k + 1]:
                continue
            d = due[position]
            if best_any < 0 or d < best_any_due:
                best_any, best_any_due = k, d
            if stamp[k] != window and d <= limit and (best_new < 0 or d < best_new_due):
                best_new, best_new_due = k, d
        k = best_new if best_new >= 0 else best_any
        position = pool_starts[k] + taken[k]
        taken[k] += 1
        order[step] = members[position]
        t = member_counts[position]
        placed_tokens += t
        window, fill = advance(stamp, k, t, window, fill, seq_len, model)
    return order


def _interleave_groups(members: np.ndarray, labels: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Reorder each cluster's pool so its categories (rows of ``groups``) interleave in proportion.

    Inside a cluster, the j-th of the n_c documents of category combination c is placed at
    (j + 1/2) / n_c (systematic sampling): every prefix of the pool holds each combination within
    one document of its share. Documents of one combination keep their (shuffled) pool order.
    """
    member_labels = labels[members]
    rows = np.column_stack([member_labels, groups.reshape(labels.size, -1)[members]])
    _, subgroup = np.unique(rows, axis=0, return_inverse=True)
    subgroup = subgroup.reshape(-1)
    position = np.arange(members.size)
    by_subgroup = np.lexsort((position, subgroup))
    sizes = np.bincount(subgroup)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    rank = np.empty(members.size, dtype=np.float64)
    rank[by_subgroup] = np.arange(members.size) - starts[subgroup[by_subgroup]]
    return members[np.lexsort((position, (rank + 0.5) / sizes[subgroup], member_labels))]


# The schedule's mix of document-count time and token time, and how many windows ahead a
# lacking cluster may be pulled forward. Tuned on the demo corpus and the synthetic corpora in
# diversity_order.synthetic (benchmarks/bench_orderings.py); see BENCHMARKS.md.
BALANCED_COUNT_WEIGHT = 0.5
BALANCED_HORIZON = 2.0


def _due_times(labels: np.ndarray, counts: np.ndarray, members: np.ndarray, pool_starts: np.ndarray,
               n_clusters: int) -> np.ndarray:
    """Each pool member's due time: its place, as a fraction of the stream, in its cluster's even spread."""
    member_labels = labels[members]
    member_counts = counts[members]
    sizes = np.diff(pool_starts)
    cluster_tokens = np.bincount(labels, weights=counts.astype(np.float64), minlength=n_clusters)
    running = np.cumsum(member_counts, dtype=np.float64)
    tokens_before = running - member_counts - (running - member_counts)[pool_starts[:-1][member_labels]]
    rank = np.arange(members.size) - pool_starts[:-1][member_labels]
    w = BALANCED_COUNT_WEIGHT
    return (w * (rank + 0.5) / sizes[member_labels]
            + (1 - w) * (tokens_before + 0.5 * member_counts) / np.maximum(cluster_tokens[member_labels], 1.0))


def balanced_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """Clusters spread evenly in token time, each ``seq_len`` window filled first with clusters it lacks.

    Each cluster's pool is shuffled (seeded); its j-th document is due at
    ``w * (j + 1/2) / n_k + (1 - w) * (tokens before it + l_j / 2) / tokens_k`` (a fraction of the
    stream: halfway between spreading the cluster's documents and its tokens evenly, w = 1/2).
    Documents then go earliest-due-first, except that a cluster the current window lacks goes first
    when its next document is due within two windows. Even spreading keeps token shares on track
    (uniformity) and head and tail alike (boundary shift); the window rule keeps the unique
    clusters per window at or above the stratified order's. With ``balance_groups``
    (--balance-field) each pool interleaves its documents' categories in proportion (see
    ``_interleave_groups``) instead of leaving them in shuffled order.
    """
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    members, pool_starts = cluster_pools(labels, counts, n_clusters, "random", options.seed)
    if options.balance_groups is not None:
        members = _interleave_groups(members, labels, np.asarray(options.balance_groups, dtype=np.int64))
    due = _due_times(labels, counts, members, pool_starts, n_clusters)
    total = max(float(counts.sum()), 1.0)
    return _due_first(members, pool_starts, due, counts[members], int(options.seq_len), packing_model(options.packing),
                      total, BALANCED_HORIZON)
