"""Orderings: cluster labels and token counts in, a permutation of input positions out.

Every strategy has one signature, ``(labels, token_counts, n_clusters, options) -> int64
permutation``, and is listed in ``ORDERINGS`` so the scripts' choices come from one place.
Orderings never see the texts: only a few bytes per document (score-based ones: a score too),
so one process can order the documents of many ranks.

- cluster orderings: ``stratified`` (the reference), ``balanced``, ``token-balanced`` (seed 004),
  ``bin-packing``, ``round-robin``, ``random``, ``original``;
- score orderings (seed 002): ``sorted``, ``folding``, ``zigzag``, ``segment``, ``stair``, ``saw``,
  each followed by optional local jitter.

``stratified`` is the reference's sample-count stratified greedy, compiled with numba: the same
float64 arithmetic and tie-breaking as the interpreted loop, so the output is identical, but
O(N*K) machine steps instead of interpreted ones. The other greedy orderings are compiled too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numba import njit

WITHIN_CLUSTER_SORTS = ("original", "length-asc", "length-desc", "length-riffle", "random")


@dataclass(frozen=True)
class OrderingOptions:
    """Everything an ordering may read besides labels and token counts; each uses what it needs."""

    within_cluster_sort: str = "original"
    seed: int = 42
    # The trainer's packed sequence length: window-aware orderings (bin-packing, balanced) simulate it.
    seq_len: int = 131072
    # token-balanced / balanced (seed 004): document-length quantile bins and their weight lambda.
    length_bins: int = 16
    length_weight: float = 1.0
    # Categorical fields balanced jointly with clusters: N x F category ids (or None), and their weight.
    balance_groups: np.ndarray | None = field(default=None, compare=False, repr=False)
    balance_weight: float = 1.0
    # Score-based orderings (seed 002): one float per document, and their parameters.
    scores: np.ndarray | None = field(default=None, compare=False, repr=False)
    folds: int = 3
    sections: int = 3
    transition_ratio: float = 0.1
    segment_percentages: tuple[float, ...] = (30.0, 40.0, 30.0)
    jitter_window: int = 0


def cluster_pools(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, within_cluster_sort: str = "original",
    seed: int = 42,
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
        members = np.argsort(labels, kind="stable")
        return members.astype(np.int64), pool_starts
    if within_cluster_sort == "random":
        shuffled = np.random.default_rng(seed).permutation(labels.size)
        return shuffled[np.argsort(labels[shuffled], kind="stable")].astype(np.int64), pool_starts
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
    members, pool_starts = _pools(labels, token_counts, n_clusters, options)
    return _stratified_greedy(members, pool_starts)


def original_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """The input order, unchanged: the baseline every report compares against."""
    return np.arange(np.asarray(labels).shape[0], dtype=np.int64)


def _pools(labels, token_counts, n_clusters, options: OrderingOptions):
    return cluster_pools(labels, token_counts, n_clusters, options.within_cluster_sort, options.seed)


def random_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """A seeded uniform shuffle: what most pipelines do, and the baseline for uniformity and boundary shift."""
    return np.random.default_rng(options.seed).permutation(np.asarray(labels).shape[0]).astype(np.int64)


def round_robin_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """Cycle through clusters 0..K-1 taking each pool's next document, skipping exhausted pools."""
    members, pool_starts = _pools(labels, token_counts, n_clusters, options)
    member_labels = np.asarray(labels, dtype=np.int64)[members]
    rank_in_pool = np.arange(members.size, dtype=np.int64) - pool_starts[member_labels]
    # Cycle r holds the r-th document of every pool that still has one, in cluster order.
    return members[np.lexsort((member_labels, rank_in_pool))]


@njit(cache=True, nogil=True)
def _pack(stamp, cluster, tokens, window, fill, seq_len):
    """Place one document as the trainer packs (window_diversity's rules); mark its cluster present.

    It joins the current window if it fits (even with 0 tokens); otherwise it opens the next one,
    fills whole windows alone if it is long, and is present in the window its remainder opens.
    Returns the new (window, fill).
    """
    if fill + tokens <= seq_len:
        stamp[cluster] = window
        return window, fill + tokens
    window += 1
    fill = tokens
    while fill >= seq_len:
        fill -= seq_len
        window += 1
    if fill > 0:
        stamp[cluster] = window
    return window, fill


@njit(cache=True, nogil=True)
def _bin_packing(members, pool_starts, member_counts, seq_len):
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
        t = member_counts[position]
        window, fill = _pack(stamp, best, t, window, fill, seq_len)
    return order


def bin_packing_order(
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """Fill each ``seq_len`` window with documents from clusters it lacks, fullest pools first."""
    members, pool_starts = _pools(labels, token_counts, n_clusters, options)
    member_counts = np.asarray(token_counts, dtype=np.int64)[members]
    return _bin_packing(members, pool_starts, member_counts, int(options.seq_len))


# --- Token-share greedy (seed 004) ---------------------------------------------------------------


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


@njit(cache=True, nogil=True)
def _token_share_greedy(members, pool_starts, pool_groups, member_counts, targets, family_of_group, weights):
    # Minimises seed 004's f_3 = sum_f w_f sum_{j in f} [(T_j + c_j) - tau_j (S + l)]^2 over the
    # head documents of the non-empty pools, exactly, in O(pools * families) per step: with
    # e_j = T_j - tau_j S, adding a document of length l in group g of each family changes f_3 by
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
    for step in range(n):
        for f in range(n_families):
            cross[f] = tau_placed[f] - total * tau_sq[f]  # sum_j tau_j e_j
        best_slot = -1
        best_score = 0.0
        for slot in range(n_active):
            p = active[slot]
            position = pool_starts[p] + taken[p]
            length = float(member_counts[position])
            score = 0.0
            for f in range(n_families):
                g = pool_groups[p, f]
                error = placed[g] - targets[g] * total
                score += weights[f] * (length * (-2.0 * cross[f] + length * tau_sq[f])
                                       + 2.0 * length * (error - targets[g] * length) + length * length)
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
    labels: np.ndarray, token_counts: np.ndarray, n_clusters: int, options: OrderingOptions = OrderingOptions()
) -> np.ndarray:
    """Seed 004's greedy: keep every cluster's (and length bin's, and balance field's) token share on track."""
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
    shuffled = np.random.default_rng(options.seed).permutation(labels.size)
    members = shuffled[np.argsort(pool_of_doc[shuffled], kind="stable")].astype(np.int64)
    pool_starts = np.zeros(n_pools + 1, dtype=np.int64)
    np.cumsum(np.bincount(pool_of_doc, minlength=n_pools), out=pool_starts[1:])
    pool_groups = np.ascontiguousarray(groups[members[pool_starts[:-1]]])
    return _token_share_greedy(members, pool_starts, pool_groups, counts[members], targets, family_of_group,
                               weights)



# --- balanced: token-time schedule, with each window first filled from clusters it lacks -----------


@njit(cache=True, nogil=True)
def _due_first(members, pool_starts, due, member_counts, seq_len, total_tokens, horizon):
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
        window, fill = _pack(stamp, k, t, window, fill, seq_len)
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
    member_labels = labels[members]
    member_counts = counts[members]
    sizes = np.diff(pool_starts)
    cluster_tokens = np.bincount(labels, weights=counts.astype(np.float64), minlength=n_clusters)
    running = np.cumsum(member_counts, dtype=np.float64)
    tokens_before = running - member_counts - (running - member_counts)[pool_starts[:-1][member_labels]]
    rank = np.arange(members.size) - pool_starts[:-1][member_labels]
    w = BALANCED_COUNT_WEIGHT
    due = (w * (rank + 0.5) / sizes[member_labels]
           + (1 - w) * (tokens_before + 0.5 * member_counts) / np.maximum(cluster_tokens[member_labels], 1.0))
    total = max(float(counts.sum()), 1.0)
    return _due_first(members, pool_starts, due, member_counts, int(options.seq_len), total, BALANCED_HORIZON)


# --- Score-based orderings (seed 002): a per-document score, low to high, in several shapes -------


def _by_score(options: OrderingOptions, n: int) -> np.ndarray:
    """Input positions sorted by ascending score; equal scores keep input order."""
    if options.scores is None:
        raise ValueError("score-based orderings need per-document scores (--score-field)")
    scores = np.asarray(options.scores, dtype=np.float64)
    if scores.shape != (n,):
        raise ValueError(f"{scores.shape[0]} scores for {n} documents")
    return np.argsort(scores, kind="stable").astype(np.int64)


def _folds(sorted_positions: np.ndarray, n_folds: int, zigzag: bool) -> np.ndarray:
    """Deal the sorted list into ``n_folds`` strided folds (i -> fold i % L), concatenated.

    Each fold is a low-to-high pass over the whole score range, so the order revisits easy data L
    times (cyclic scheduling). With ``zigzag`` every odd fold runs high to low, so consecutive
    folds meet at similar scores (curriculum continuity).
    """
    n = sorted_positions.size
    n_folds = max(1, min(int(n_folds), max(n, 1)))
    rank = np.arange(n)
    fold = rank % n_folds
    within = rank // n_folds
    if zigzag:
        within = np.where(fold % 2 == 1, -within, within)
    return sorted_positions[np.lexsort((within, fold))]


def _jitter(order: np.ndarray, window: int, seed: int) -> np.ndarray:
    """Shuffle inside consecutive blocks of ``window`` documents (local diversity, seed 002's JIT)."""
    if window <= 1 or order.size <= 1:
        return order
    block = np.arange(order.size) // int(window)
    noise = np.random.default_rng(seed).random(order.size)
    return order[np.lexsort((noise, block))]


def _section_bounds(n: int, n_sections: int) -> np.ndarray:
    return np.linspace(0, n, max(1, int(n_sections)) + 1).round().astype(np.int64)


def sorted_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Curriculum: ascending score (then ``--jitter-window`` shuffling)."""
    n = np.asarray(labels).shape[0]
    return _jitter(_by_score(options, n), options.jitter_window, options.seed)


def folding_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Folding (FO): L = ``folds`` strided low-to-high passes."""
    n = np.asarray(labels).shape[0]
    return _jitter(_folds(_by_score(options, n), options.folds, zigzag=False), options.jitter_window, options.seed)


def zigzag_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Zig-zag (ZIG): folding with every other fold reversed, so folds join smoothly."""
    n = np.asarray(labels).shape[0]
    return _jitter(_folds(_by_score(options, n), options.folds, zigzag=True), options.jitter_window, options.seed)


def segment_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Segments (SEG): the sorted list cut by ``segment_percentages``, segments low to high, each shuffled."""
    n = np.asarray(labels).shape[0]
    by_score = _by_score(options, n)
    shares = np.asarray(options.segment_percentages, dtype=np.float64)
    bounds = np.concatenate(([0], np.cumsum(shares) / shares.sum() * n)).round().astype(np.int64)
    segment = np.searchsorted(bounds[1:-1], np.arange(n), side="right")
    noise = np.random.default_rng(options.seed).random(n)
    return _jitter(by_score[np.lexsort((noise, segment))], options.jitter_window, options.seed)


def _stable_and_transitions(by_score: np.ndarray, options: OrderingOptions, zigzag: bool) -> np.ndarray:
    """Stable regions stay sorted; around each of the K-1 section boundaries a transition region of
    rho * (section length) on either side (2 rho in all) is reordered by folding (stair) or zig-zag (saw),
    so scores from both sides of the step interleave instead of jumping. A region reaches at most
    halfway to the next boundary, so regions never overlap."""
    n = by_score.size
    bounds = _section_bounds(n, options.sections)
    section = n / max(1, int(options.sections))
    half = int(round(options.transition_ratio * section))
    if bounds.size > 3:  # neighbouring regions must not overlap (rho = 0.5 with odd section sizes would)
        half = min(half, int(np.diff(bounds[1:-1]).min()) // 2)
    out = by_score.copy()
    if half <= 0:
        return out
    for edge in bounds[1:-1]:
        lo, hi = max(0, edge - half), min(n, edge + half)
        out[lo:hi] = _folds(by_score[lo:hi], options.folds, zigzag)
    return out


def stair_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Stair (STR): K score sections as steps, folded transition regions between them, then jitter."""
    n = np.asarray(labels).shape[0]
    ordered = _stable_and_transitions(_by_score(options, n), options, zigzag=False)
    return _jitter(ordered, options.jitter_window, options.seed)


def saw_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Saw (SAW): like stair, with zig-zag transition regions (all four guidances of seed 002)."""
    n = np.asarray(labels).shape[0]
    ordered = _stable_and_transitions(_by_score(options, n), options, zigzag=True)
    return _jitter(ordered, options.jitter_window, options.seed)


Ordering = Callable[[np.ndarray, np.ndarray, int, OrderingOptions], np.ndarray]

# User-facing name -> strategy; the scripts' --ordering choices are read from here.
ORDERINGS: dict[str, Ordering] = {
    "stratified": stratified_order,
    "balanced": balanced_order,
    "token-balanced": token_balanced_order,
    "bin-packing": bin_packing_order,
    "round-robin": round_robin_order,
    "random": random_order,
    "original": original_order,
    "sorted": sorted_order,
    "folding": folding_order,
    "zigzag": zigzag_order,
    "segment": segment_order,
    "stair": stair_order,
    "saw": saw_order,
}

# Orderings that read per-document scores (--score-field) rather than clusters, and the rest.
SCORE_ORDERINGS = ("sorted", "folding", "zigzag", "segment", "stair", "saw")
CLUSTER_ORDERINGS = tuple(name for name in ORDERINGS if name not in SCORE_ORDERINGS)
# Orderings whose output depends on options.seq_len (they simulate the trainer's windows).
SEQ_LEN_AWARE = ("balanced", "bin-packing")


def ordering_meta_name(name: str) -> str:
    """The name recorded in the metadata's "ordering" key; the reference writes "stratified_greedy"."""
    return "stratified_greedy" if name == "stratified" else name
