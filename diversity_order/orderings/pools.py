"""Cluster pools: each cluster's documents, in the order an ordering draws them.

Cluster orderings take documents from per-cluster pools; ``--within-cluster-sort`` decides the
order inside each pool (input order by default).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..defaults import DEFAULT_SEED
from .options import WITHIN_CLUSTER_SORTS, OrderingOptions


@njit(cache=True, nogil=True)
def from_both_ends(i, n):
    """Position i // 2 from the front of n for even i, from the back for odd i: 0, n - 1, 1, n - 2, ...
    (ints or arrays). Dealt by ascending length, it puts the shortest at both ends; read by slot, it
    takes shortest, longest, 2nd shortest, ..."""
    return i // 2 + (i % 2) * (n - 1 - 2 * (i // 2))


# Long documents are dealt to a pool's slots shortest at both ends while those hold at most 1 / END_LONG_PARTS
# of the long documents' tokens (the ends of the order, which meet at the epoch boundary, stay short), the
# others in shuffled order between, so long documents come all through an epoch (BENCHMARKS.md, "Where long
# documents sit": dealt longest in the middle, 52-72% of their tokens had fallen in the middle fifth).
END_LONG_PARTS = 5


@njit(cache=True, nogil=True)
def deal_long(docs, token_counts, by_length, deck):
    """``docs`` (in shuffled order) written into ``deck`` as END_LONG_PARTS says: the shortest, by ascending
    length rank r (ties in ``docs`` order), at slot r // 2 (r even) or n - 1 - r // 2 (r odd) while the
    ones so placed hold at most 1 / END_LONG_PARTS of all their tokens; the others in ``docs`` order from
    the first free slot. Read from both ends, the deck gives the shortest first. ``by_length``: the
    indices into ``docs`` in that rank order (np.argsort(token_counts[docs], kind="stable"))."""
    n = docs.shape[0]
    total = 0
    for d in docs:
        total += token_counts[d]
    n_ends = 0
    held = 0
    while n_ends < n and (held + token_counts[docs[by_length[n_ends]]]) * END_LONG_PARTS <= total:
        held += token_counts[docs[by_length[n_ends]]]
        n_ends += 1
    at_an_end = np.zeros(n, dtype=np.bool_)
    for r in range(n_ends):
        deck[from_both_ends(r, n)] = docs[by_length[r]]
        at_an_end[by_length[r]] = True
    at = n_ends // 2 + n_ends % 2
    for i in range(n):
        if not at_an_end[i]:
            deck[at] = docs[i]
            at += 1


@njit(cache=True, nogil=True)
def grouped_stable(keys, pool_starts):
    """The positions of ``keys`` grouped by key, each group in position order: np.argsort(keys,
    kind="stable") for keys 0..K-1 whose group k starts at pool_starts[k], by counting (O(N + K), where
    a comparison sort of 1M int64 keys took 50 ms)."""
    nxt = pool_starts[:-1].copy()
    out = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        k = keys[i]
        out[nxt[k]] = i
        nxt[k] += 1
    return out


def order_by(positions: np.ndarray, major: np.ndarray, minor: np.ndarray) -> np.ndarray:
    """``positions`` (distinct, non-negative) ordered by ``major``, then ``minor``, then position (both keys
    non-negative int64, one per position): one sort of a key combining the three where it fits in int64 (on
    700,000 documents a sixth of np.lexsort's time), else np.lexsort."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size == 0:
        return positions
    major = np.asarray(major, dtype=np.int64)
    minor = np.asarray(minor, dtype=np.int64)
    span_position = int(positions.max()) + 1
    span_minor = int(minor.max()) + 1
    if (int(major.max()) + 1) * span_minor * span_position < 2**63:
        return np.sort((major * span_minor + minor) * span_position + positions) % span_position
    return positions[np.lexsort((positions, minor, major))]


def cluster_pools(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, within_cluster_sort: str = "original",
    seed: int = DEFAULT_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """Each cluster's documents in pool order, concatenated: (members, pool_starts).

    Cluster k's pool is ``members[pool_starts[k]:pool_starts[k + 1]]``.
    - original: input order;
    - length-asc: stable sort by token count (ties keep input order);
    - length-desc: the length-asc pool reversed;
    - length-riffle: from the length-asc pool, shortest, longest, 2nd shortest, 2nd longest, ...
    - random: a seeded shuffle of each pool (so no pool carries the input's head-to-tail drift).
    """
    if within_cluster_sort not in WITHIN_CLUSTER_SORTS:
        raise ValueError(f"within_cluster_sort must be one of {', '.join(WITHIN_CLUSTER_SORTS)}")
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    sizes = np.bincount(labels, minlength=n_clusters)
    pool_starts = np.zeros(n_clusters + 1, dtype=np.int64)
    np.cumsum(sizes, out=pool_starts[1:])
    if within_cluster_sort == "original":
        return grouped_stable(labels, pool_starts), pool_starts
    if within_cluster_sort == "random":
        shuffled = np.random.default_rng(seed).permutation(labels.size)
        return shuffled[grouped_stable(labels[shuffled], pool_starts)], pool_starts
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
        source = from_both_ends(offset_in_pool, pool_size)
    return ascending[pool_starts[pool_of] + source], pool_starts


def pools_for(labels: np.ndarray, token_counts: np.ndarray, n_clusters: int,
              options: OrderingOptions) -> tuple[np.ndarray, np.ndarray]:
    """``cluster_pools`` in the order ``options.within_cluster_sort`` asks for."""
    return cluster_pools(labels, token_counts, n_clusters, options.within_cluster_sort, options.seed)
