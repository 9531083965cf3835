"""Baselines every report compares against: the input order, a seeded shuffle, and round-robin.

None of them aims at diverse windows: ``original`` is what the trainer sees without us,
``random`` is what most pipelines do, and ``round-robin`` is the naive interleave (it ignores
lengths and cluster sizes, so the tail of the order is a few big clusters).
"""

from __future__ import annotations

import numpy as np

from .options import OrderingOptions
from .pools import pools_for


def original_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """The input order, unchanged: the baseline every report compares against."""
    return np.arange(np.asarray(labels).shape[0], dtype=np.int64)


def random_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """A seeded uniform shuffle: what most pipelines do, and the baseline for uniformity and boundary shift."""
    return np.random.default_rng(options.seed).permutation(np.asarray(labels).shape[0]).astype(np.int64)


def round_robin_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """Cycle through clusters 0..K-1 taking each pool's next document, skipping exhausted pools."""
    members, pool_starts = pools_for(labels, token_counts, n_clusters, options)
    member_labels = np.asarray(labels, dtype=np.int64)[members]
    rank_in_pool = np.arange(members.size, dtype=np.int64) - pool_starts[member_labels]
    # Cycle r holds the r-th document of every pool that still has one, in cluster order.
    return members[np.lexsort((member_labels, rank_in_pool))]
