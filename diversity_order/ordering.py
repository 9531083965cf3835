"""Orderings: cluster labels and token counts in, a permutation of input positions out.

Every strategy has one signature, ``(labels, token_counts, n_clusters, options) -> int64
permutation``, and is listed in ``ORDERINGS`` so the scripts' choices come from one place.
Orderings never see the texts: only a few bytes per document, so one process can order the
documents of many ranks.

``stratified`` is the reference's sample-count stratified greedy, compiled with numba: the same
float64 arithmetic and tie-breaking as the interpreted loop, so the output is identical, but
O(N*K) machine steps instead of interpreted ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numba import njit

WITHIN_CLUSTER_SORTS = ("original", "length-asc", "length-desc", "length-riffle")


@dataclass(frozen=True)
class OrderingOptions:
    within_cluster_sort: str = "original"
    seed: int = 42


def cluster_pools(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, within_cluster_sort: str = "original"
) -> tuple[np.ndarray, np.ndarray]:
    """Each cluster's documents in pool order, concatenated: (members, pool_starts).

    Cluster k's pool is ``members[pool_starts[k]:pool_starts[k + 1]]``.
    - original: input order;
    - length-asc: stable sort by token count (ties keep input order);
    - length-desc: the length-asc pool reversed;
    - length-riffle: from the length-asc pool, shortest, longest, 2nd shortest, 2nd longest, ...
    """
    if within_cluster_sort not in WITHIN_CLUSTER_SORTS:
        raise ValueError(f"within_cluster_sort must be one of {', '.join(WITHIN_CLUSTER_SORTS)}")
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    sizes = np.bincount(labels, minlength=n_clusters)
    pool_starts = np.zeros(n_clusters + 1, dtype=np.int64)
    np.cumsum(sizes, out=pool_starts[1:])
    if within_cluster_sort == "original":
        members = np.argsort(labels, kind="stable")
        return members.astype(np.int64), pool_starts
    # lexsort is stable and sorts by its last key first: cluster, then token count, then position.
    ascending = np.lexsort((counts, labels)).astype(np.int64)
    if within_cluster_sort == "length-asc":
        return ascending, pool_starts
    pool_of = labels[ascending]
    offset_in_pool = np.arange(labels.size, dtype=np.int64) - pool_starts[pool_of]
    pool_size = sizes[pool_of]
    if within_cluster_sort == "length-desc":
        source = pool_size - 1 - offset_in_pool
    else:  # length-riffle: even slots from the front, odd slots from the back
        half = offset_in_pool // 2
        source = np.where(offset_in_pool % 2 == 0, half, pool_size - 1 - half)
    return ascending[pool_starts[pool_of] + source], pool_starts


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
                # Same float64 divisions as the reference loop, so ties break identically.
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
    members, pool_starts = cluster_pools(labels, token_counts, n_clusters, options.within_cluster_sort)
    return _stratified_greedy(members, pool_starts)


def original_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """The input order, unchanged: the baseline every report compares against."""
    return np.arange(np.asarray(labels).shape[0], dtype=np.int64)


Ordering = Callable[[np.ndarray, np.ndarray, int, OrderingOptions], np.ndarray]

# User-facing name -> strategy; the scripts' --ordering choices are read from here.
ORDERINGS: dict[str, Ordering] = {
    "stratified": stratified_order,
    "original": original_order,
}

# The name recorded in the metadata's "ordering" key, as the reference writes it.
ORDERING_META_NAMES = {"stratified": "stratified_greedy", "original": "original"}
