"""Token-share greedy (``token-balanced``): keep every cluster's share of the tokens on track.

From *Don't Shuffle, Optimize: A Recipe For Training Data Diversity*: at each step, place the
document that keeps the running token share of every characteristic (cluster, length bin, each
``--balance-field``) closest to its share of the whole corpus. It flattens the head-to-tail mix
best of all orderings, at the cost of unique clusters per window (it never looks at windows).
"""

from __future__ import annotations

import logging

import numba
import numpy as np
from numba import njit, prange

from .options import OrderingOptions
from .pools import grouped_stable

log = logging.getLogger(__name__)

# Each step compares the head of every pool: documents x pools past this take minutes (400,000 documents in
# 64,000 pools, a 200-category --balance-field: 119 s on one core, 70 s on two; BENCHMARKS.md).
SLOW_POOL_STEPS = 10**10
# From this many pools left a step scores them in runs, one per core (below, starting the runs costs more than
# it saves).
PARALLEL_POOLS = 4096


def length_bins(token_counts: np.ndarray, n_bins: int) -> np.ndarray:
    """Quantile bin (0..n_bins-1) of each document's token count; equal lengths share a bin."""
    counts = np.asarray(token_counts, dtype=np.float64)
    if n_bins <= 1 or counts.size == 0:
        return np.zeros(counts.size, dtype=np.int64)
    edges = np.unique(np.quantile(counts, np.linspace(0, 1, n_bins + 1)[1:-1]))
    return np.searchsorted(edges, counts, side="right").astype(np.int64)


def _characteristics(labels, token_counts, n_clusters, options: OrderingOptions):
    """Group ids per document (N x F, one column per characteristic family), and family weights.

    Families: clusters (weight 1), length bins (lambda), then each balance field. Group ids are
    global (families laid end to end), so one target vector and one running total serve them all.
    """
    columns = [np.asarray(labels, dtype=np.int64)]
    sizes = [n_clusters]
    weights = [1.0]
    if options.length_bins > 1 and options.length_weight > 0:
        bins = length_bins(token_counts, options.length_bins)
        columns.append(bins)
        sizes.append(int(bins.max()) + 1 if bins.size else 1)
        weights.append(float(options.length_weight))
    if options.balance_groups is not None:
        fields = np.asarray(options.balance_groups, dtype=np.int64).reshape(len(columns[0]), -1)
        for column in fields.T:
            columns.append(column)
            sizes.append(int(column.max()) + 1 if column.size else 1)
            weights.append(float(options.balance_weight))
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    groups = np.stack(columns, axis=1) + offsets
    family_of_group = np.repeat(np.arange(len(sizes)), sizes)
    return groups, family_of_group, np.asarray(weights, dtype=np.float64), int(sum(sizes))


@njit(cache=True, nogil=True, inline="always")
def _pool_score(p, pool_starts, taken, member_counts, pool_groups, placed, targets, total, cross, tau_sq, weights):
    length = float(member_counts[pool_starts[p] + taken[p]])
    score = 0.0
    for f in range(weights.shape[0]):
        g = pool_groups[p, f]
        error = placed[g] - targets[g] * total
        score += weights[f] * (length * (-2.0 * cross[f] + length * tau_sq[f])
                               + 2.0 * length * (error - targets[g] * length) + length * length)
    return score


@njit(cache=True, nogil=True, parallel=True)
def _best_slot_in_runs(active, n_active, pool_starts, taken, member_counts, pool_groups, placed, targets, total, cross,
                       tau_sq, weights, run_best, run_score):
    # The active pools cut into consecutive runs scored at once, one per core; the lowest score wins, ties to
    # the lowest slot, as one loop over every slot would choose.
    runs = run_best.shape[0]
    size = (n_active + runs - 1) // runs
    for r in prange(runs):
        best, best_score = -1, 0.0
        for slot in range(r * size, min((r + 1) * size, n_active)):
            score = _pool_score(active[slot], pool_starts, taken, member_counts, pool_groups, placed, targets, total,
                                cross, tau_sq, weights)
            if best < 0 or score < best_score:
                best, best_score = slot, score
        run_best[r], run_score[r] = best, best_score
    best, best_score = -1, 0.0
    for r in range(runs):
        if run_best[r] >= 0 and (best < 0 or run_score[r] < best_score):
            best, best_score = run_best[r], run_score[r]
    return best


@njit(cache=True, nogil=True)
def _token_share_greedy(members, pool_starts, pool_groups, member_counts, targets, family_of_group, weights,
                        parallel_pools, runs):
    # Minimises f = sum_f w_f sum_{j in f} [(T_j + c_j) - tau_j (S + l)]^2 over the head documents
    # of the non-empty pools, exactly, in O(pools * families) per step: with e_j = T_j - tau_j S,
    # adding a document of length l in group g of each family changes f by
    # sum_f w_f [-2 l sum_j tau_j e_j + l^2 sum_j tau_j^2 + 2 l (e_g - tau_g l) + l^2] + const.
    n_pools = pool_starts.shape[0] - 1
    n_families = weights.shape[0]
    n = members.shape[0]
    placed = np.zeros(targets.shape[0], dtype=np.float64)  # T_j
    tau_placed = np.zeros(n_families, dtype=np.float64)  # sum_{j in f} tau_j T_j
    tau_sq = np.zeros(n_families, dtype=np.float64)  # sum_{j in f} tau_j^2
    for j in range(targets.shape[0]):
        tau_sq[family_of_group[j]] += targets[j] * targets[j]
    taken = np.zeros(n_pools, dtype=np.int64)
    active = np.arange(n_pools)
    n_active = n_pools  # pools come from the combinations that occur: none starts empty
    total = 0.0  # S
    cross = np.empty(n_families, dtype=np.float64)
    order = np.empty(n, dtype=np.int64)
    run_best = np.empty(max(runs, 1), dtype=np.int64)
    run_score = np.empty(max(runs, 1), dtype=np.float64)
    for step in range(n):
        for f in range(n_families):
            cross[f] = tau_placed[f] - total * tau_sq[f]  # sum_j tau_j e_j
        if n_active >= parallel_pools:
            best_slot = _best_slot_in_runs(active, n_active, pool_starts, taken, member_counts, pool_groups, placed,
                                           targets, total, cross, tau_sq, weights, run_best, run_score)
        else:
            best_slot = -1
            best_score = 0.0
            for slot in range(n_active):
                score = _pool_score(active[slot], pool_starts, taken, member_counts, pool_groups, placed, targets,
                                    total, cross, tau_sq, weights)
                if best_slot < 0 or score < best_score:
                    best_slot, best_score = slot, score
        p = active[best_slot]
        position = pool_starts[p] + taken[p]
        taken[p] += 1
        doc_tokens = member_counts[position]
        order[step] = members[position]
        for f in range(n_families):
            g = pool_groups[p, f]
            placed[g] += doc_tokens
            tau_placed[f] += targets[g] * doc_tokens
        total += doc_tokens
        if taken[p] == pool_starts[p + 1] - pool_starts[p]:
            n_active -= 1
            active[best_slot:n_active] = active[best_slot + 1:n_active + 1].copy()
    return order


def token_balanced_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions(),
    *, parallel_pools: int = PARALLEL_POOLS
) -> np.ndarray:
    """Keep every cluster's (and length bin's, and balance field's) token share on track. ``parallel_pools``: from
    this many pools left, each step scores them on every core (tests use fewer)."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.asarray(token_counts, dtype=np.int64)
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    groups, family_of_group, weights, n_groups = _characteristics(labels, counts, n_clusters, options)
    targets = np.zeros(n_groups, dtype=np.float64)
    for f in range(groups.shape[1]):
        share = np.bincount(groups[:, f], weights=counts.astype(np.float64), minlength=n_groups)
        targets += share / share.sum() if share.sum() > 0 else share
    # One pool per combination of characteristics that occurs, each shuffled (seeded) so that no
    # pool keeps the input's head-to-tail drift.
    _, pool_of_doc = np.unique(groups, axis=0, return_inverse=True)
    pool_of_doc = pool_of_doc.reshape(-1)
    n_pools = int(pool_of_doc.max()) + 1 if pool_of_doc.size else 0
    if labels.size * n_pools > SLOW_POOL_STEPS:
        log.warning("token-balanced: %d documents in %d pools (one per combination of cluster, length bin and "
                    "--balance-field category that occurs); every step compares every pool, so this takes minutes "
                    "(400,000 documents in 64,000 pools: 2 on two cores); fewer categories or --length-bins 1 "
                    "make fewer pools", labels.size, n_pools)
    shuffled = np.random.default_rng(options.seed).permutation(labels.size)
    pool_starts = np.zeros(n_pools + 1, dtype=np.int64)
    np.cumsum(np.bincount(pool_of_doc, minlength=n_pools), out=pool_starts[1:])
    members = shuffled[grouped_stable(pool_of_doc[shuffled].astype(np.int64), pool_starts)]
    pool_groups = np.ascontiguousarray(groups[members[pool_starts[:-1]]])
    return _token_share_greedy(members, pool_starts, pool_groups, counts[members], targets, family_of_group,
                               weights, parallel_pools, numba.get_num_threads())
