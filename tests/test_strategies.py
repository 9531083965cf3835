"""The ordering registry and the strategy comparison: every ordering and token-share metric against a
plain loop written from its docstring, invariants on the adversarial synthetic corpora, and the
comparison report. The score orderings' own cases are in test_score_orderings.py."""

import logging
import time
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order import diversity
from diversity_order import ordering_report as strategies
from diversity_order.orderings import (
    ORDERINGS,
    SCORE_ORDERINGS,
    WITHIN_CLUSTER_SORTS,
    OrderingOptions,
    applicable_orderings,
    balanced_order,
    bin_packing_order,
    length_bins,
    round_robin_order,
    token_balanced_order,
)
from diversity_order.orderings.window_greedy import BALANCED_COUNT_WEIGHT, BALANCED_HORIZON
from diversity_order.synthetic import SKEWED_CORPORA, skewed_corpus
from reference_impl import (
    assert_mean_of_shuffles,
    ref_balanced_order,
    ref_bin_packing_order,
    ref_boundary_shift,
    ref_coverage,
    ref_f3,
    ref_global_token_shares,
    ref_pools,
    ref_random_pools,
    ref_round_robin_order,
    ref_window_diversity,
    ref_window_share_deviation,
)

CLUSTER_ORDERINGS = tuple(name for name in ORDERINGS if name not in SCORE_ORDERINGS)


def _pools(labels, counts, k, sort, seed):
    if sort == "random":
        return ref_random_pools(labels, k, seed)
    return ref_pools(labels, counts, k, sort)


@st.composite
def documents(draw, max_n=60, max_k=6, counts=(0, 0, 1, 2, 3, 5, 7, 10, 11, 25, 60), min_k=1):
    """(labels, token_counts, n_clusters): few distinct values, so ties, empty clusters, zero-token
    documents and documents longer than the window are common."""
    k = draw(st.integers(min_k, max_k))
    n = draw(st.integers(0, max_n))
    labels = draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    token_counts = draw(st.lists(st.sampled_from(counts), min_size=n, max_size=n))
    return labels, token_counts, k


def _permutation(draw, n):
    return draw(st.permutations(list(range(n))))


# --- Token-share metrics against plain loops --------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.data(), documents(), st.sampled_from([1, 5, 10, 11, 24]), st.integers(0, 2))
def test_window_share_deviation_matches_reference_loop(data, docs, seq_len, extra_clusters):
    labels, counts, k = docs
    order = _permutation(data.draw, len(labels))
    n_clusters = k + extra_clusters  # clusters with no documents have share 0 and still count in the max
    ours = diversity.window_share_deviation(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64),
                                            seq_len, np.array(order, dtype=np.int64), n_clusters)
    expected = ref_window_share_deviation([labels[i] for i in order], [counts[i] for i in order], seq_len,
                                          n_clusters)
    assert ours.shape == (len(expected),)
    assert np.allclose(ours, expected, rtol=0, atol=1e-12)


def test_window_share_deviation_hand_worked():
    # Shares: cluster 0 holds 9 of 11 tokens, cluster 1 2 of 11. seq_len 3:
    # [doc0 (0, 2 tokens)] -> 2/11; doc1 does not fit: [doc1 (1, 2)] -> 9/11; doc2 (0, 7 tokens) fills
    # two whole windows alone (2/11 each) and its last token opens a window of its own (2/11).
    labels, counts = np.array([0, 1, 0]), np.array([2, 2, 7])
    ours = diversity.window_share_deviation(labels, counts, 3)
    assert np.allclose(ours, [2 / 11, 9 / 11, 2 / 11, 2 / 11, 2 / 11], rtol=0, atol=1e-12)
    # The global shares do not depend on the order; the windows do: [doc2 | doc2 | doc2's last + doc0 | doc1].
    ours = diversity.window_share_deviation(labels, counts, 3, np.array([2, 0, 1]))
    assert np.allclose(ours, [2 / 11, 2 / 11, 2 / 11, 9 / 11], rtol=0, atol=1e-12)
    # A third, empty cluster: share 0, absent from every window, changes nothing.
    assert np.allclose(diversity.window_share_deviation(labels, counts, 3, n_clusters=3),
                       [2 / 11, 9 / 11, 2 / 11, 2 / 11, 2 / 11], rtol=0, atol=1e-12)


def test_window_share_deviation_without_windows_is_zero():
    assert diversity.window_share_deviation(np.zeros(0, int), np.zeros(0, int), 8).tolist() == [0.0]
    assert diversity.window_share_deviation(np.array([0, 1]), np.array([0, 0]), 8).tolist() == [0.0]


@settings(max_examples=200, deadline=None)
@given(documents(counts=(0, 1, 2, 3, 5, 20)), st.sampled_from([0.05, 0.1, 0.25, 1 / 3, 0.5, 1.0]), st.data())
def test_global_shares_and_boundary_shift_match_reference_loops(docs, fraction, data):
    labels, counts, k = docs
    order = _permutation(data.draw, len(labels))
    shares = diversity.global_token_shares(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64), k)
    assert np.allclose(shares, ref_global_token_shares(labels, counts, k), rtol=0, atol=1e-12)
    ours = diversity.boundary_shift(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64),
                                    np.array(order, dtype=np.int64), k, fraction)
    expected = ref_boundary_shift([labels[i] for i in order], [counts[i] for i in order], k, fraction)
    assert ours == pytest.approx(expected, abs=1e-9)


def test_boundary_shift_hand_worked():
    labels, counts = np.array([0, 1]), np.array([50, 50])
    assert diversity.boundary_shift(labels, counts) == 1.0  # head all cluster 0, tail all cluster 1
    assert diversity.boundary_shift(labels, counts, fraction=0.5) == 1.0
    assert diversity.boundary_shift(labels, counts, fraction=1.0) == 0.0  # head and tail are the whole stream
    # Documents are cut at the edges: 100 tokens, 5 in each 5% slice. Head: 3 of cluster 0, 2 of cluster 1;
    # tail: 5 of cluster 0 -> TV = 0.5 * (|0.6 - 1| + |0.4 - 0|) = 0.4.
    labels, counts = np.array([0, 1, 2, 0]), np.array([3, 2, 90, 5])
    assert diversity.boundary_shift(labels, counts) == pytest.approx(0.4, abs=1e-12)
    assert diversity.boundary_shift(np.zeros(0, int), np.zeros(0, int)) == 0.0


@settings(max_examples=200, deadline=None)
@given(documents(), st.data())
def test_coverage_matches_reference_loop(docs, data):
    labels, counts, _ = docs
    order = _permutation(data.draw, len(labels))
    chunk = data.draw(st.integers(1, 8))  # the order read a few documents at a time, as a long one is
    expected = ref_coverage([labels[i] for i in order], [counts[i] for i in order])
    for given_order in (np.array(order, dtype=np.int64), None):
        ours = diversity.coverage(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64), given_order,
                                  chunk=chunk)
        assert ours == pytest.approx(expected if given_order is not None else ref_coverage(labels, counts), abs=1e-12)


def test_coverage_hand_worked():
    labels, counts = np.array([0, 0, 1, 2]), np.array([10, 10, 10, 10])
    assert diversity.coverage(labels, counts) == 0.75  # cluster 2 first appears after 30 of 40 tokens
    assert diversity.coverage(labels, counts, np.array([3, 2, 0, 1])) == 0.5


def test_ordering_quality_is_the_metrics_rounded():
    labels = np.array([0, 1, 0, 2, 1, 0, 0])
    counts = np.array([3, 9, 1, 4, 0, 12, 2])
    order = np.array([6, 3, 1, 0, 5, 4, 2])
    labels_in, counts_in = labels[order].tolist(), counts[order].tolist()
    deviation = ref_window_share_deviation(labels_in, counts_in, 8, 4)
    quality = diversity.ordering_quality(labels, counts, 8, order, 4)
    assert quality["uniformity_max"] == round(max(deviation), 4)
    assert quality["uniformity_mean"] == round(sum(deviation) / len(deviation), 4)
    assert quality["boundary_shift"] == round(ref_boundary_shift(labels_in, counts_in, 4), 4)
    assert quality["coverage"] == round(ref_coverage(labels_in, counts_in), 4)
    assert quality["diversity"]["n_sequences"] == len(ref_window_diversity(labels_in, counts_in, 8))


# --- Cluster orderings against plain loops ---------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(documents(), st.sampled_from(WITHIN_CLUSTER_SORTS), st.integers(0, 2**31))
def test_round_robin_matches_reference_loop(docs, sort, seed):
    labels, counts, k = docs
    ours = round_robin_order(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64), k,
                             OrderingOptions(within_cluster_sort=sort, seed=seed))
    assert ours.tolist() == ref_round_robin_order(k, _pools(labels, counts, k, sort, seed))


def test_round_robin_hand_worked():
    labels = np.array([2, 0, 2, 2, 0, 1])
    assert round_robin_order(labels, np.ones(6, int), 3).tolist() == [1, 5, 0, 4, 2, 3]


# Orderings that simulate the window: zero-token documents count in the window they join.
WINDOW_COUNTS = (0, 1, 1, 2, 3, 5, 7, 10, 11, 25, 60)


@settings(max_examples=200, deadline=None)
@given(documents(counts=WINDOW_COUNTS), st.sampled_from(WITHIN_CLUSTER_SORTS), st.sampled_from([1, 5, 10, 24, 64]),
       st.integers(0, 2**31))
def test_bin_packing_matches_reference_loop(docs, sort, seq_len, seed):
    labels, counts, k = docs
    ours = bin_packing_order(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64), k,
                             OrderingOptions(within_cluster_sort=sort, seed=seed, seq_len=seq_len))
    assert ours.tolist() == ref_bin_packing_order(labels, counts, k, seq_len, _pools(labels, counts, k, sort, seed))


def test_bin_packing_hand_worked():
    # Pools 0: [0, 1, 2], 1: [3, 4], 2: [5]; every document 3 tokens, seq_len 8 (two fit in a window).
    # Window A: cluster 0 (most left), then 1 (lacking, 2 left > 1 left); then 2, the only lacking cluster,
    # whose document does not fit and opens window B = {2}. B lacks 0 (2 left) and 1 (1 left): 0; then 1,
    # which opens window C = {1}; C lacks 0: its last document.
    labels = np.array([0, 0, 0, 1, 1, 2])
    assert bin_packing_order(labels, np.full(6, 3), 3, OrderingOptions(seq_len=8)).tolist() == [0, 3, 5, 1, 4, 2]
    # A document longer than the window fills whole windows alone; its remainder opens the next window.
    # Cluster 0: [0 (L tokens), 1, 2], 1: [3, 4], 2: [5, 6], all others 2 tokens. Doc 0 first (most left).
    # L = 17: one token remains, the window holds {0}: 1 and 2 (lacking) go first, then 0 (most left), 0
    # (tie -> lowest k; it does not fit and opens {0}), 1, 2 -> [0, 3, 5, 1, 2, 4, 6].
    # L = 16: nothing remains, the next window is empty and lacks 0 too: 0, 1, 2, 0 fills it to 8, then 1
    # (most left among 1 and 2, tie -> lowest k) opens the next, 2 -> [0, 1, 3, 5, 2, 4, 6].
    labels = np.array([0, 0, 0, 1, 1, 2, 2])
    for long, expected in ((17, [0, 3, 5, 1, 2, 4, 6]), (16, [0, 1, 3, 5, 2, 4, 6])):
        counts = np.array([long, 2, 2, 2, 2, 2, 2])
        assert bin_packing_order(labels, counts, 3, OrderingOptions(seq_len=8)).tolist() == expected


@settings(max_examples=200, deadline=None)
@given(documents(counts=WINDOW_COUNTS), st.sampled_from([1, 5, 10, 24, 64, 200]), st.integers(0, 2**31))
def test_balanced_matches_reference_loop(docs, seq_len, seed):
    labels, counts, k = docs
    ours = balanced_order(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64), k,
                          OrderingOptions(seed=seed, seq_len=seq_len))
    expected = ref_balanced_order(labels, counts, k, seq_len, seed, BALANCED_COUNT_WEIGHT, BALANCED_HORIZON)
    assert ours.tolist() == expected


def test_balanced_constants_are_the_documented_ones():
    assert BALANCED_COUNT_WEIGHT == 0.5 and BALANCED_HORIZON == 2.0  # "w = 1/2", "within two windows"


def test_bin_packing_counts_a_zero_token_document_in_its_window():
    labels, counts = [0, 0, 1], [0, 5, 5]
    ours = bin_packing_order(np.array(labels), np.array(counts), 2, OrderingOptions(seq_len=5)).tolist()
    assert ours == ref_bin_packing_order(labels, counts, 2, 5, ref_pools(labels, counts, 2, "original"))
    assert ours == [0, 2, 1]


def test_balanced_counts_zero_token_documents_in_their_window():
    mismatches = 0
    for seed in range(200):
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 3, 8).tolist()
        counts = rng.choice([0, 0, 3, 5], 8).tolist()
        ours = balanced_order(np.array(labels), np.array(counts), 3, OrderingOptions(seed=seed, seq_len=5)).tolist()
        mismatches += ours != ref_balanced_order(labels, counts, 3, 5, seed, BALANCED_COUNT_WEIGHT, BALANCED_HORIZON)
    assert mismatches == 0


def _token_balanced_families(labels, counts, k, options):
    """Group of every document in each family, and (weight, {group: tau}) per family, as seed 004 defines them."""
    n = len(labels)
    columns, weights, sizes = [list(labels)], [1.0], [k]
    if options.length_bins > 1 and options.length_weight > 0:
        bins = length_bins(np.array(counts, dtype=np.int64), options.length_bins).tolist()
        columns.append(bins)
        weights.append(float(options.length_weight))
        sizes.append(max(bins) + 1 if bins else 1)
    if options.balance_groups is not None:
        fields = np.asarray(options.balance_groups).reshape(n, -1)
        for column in fields.T.tolist():
            columns.append(column)
            weights.append(float(options.balance_weight))
            sizes.append(max(column) + 1 if column else 1)
    total = sum(counts)
    families = []
    for column, weight, size in zip(columns, weights, sizes):
        tokens = [0] * size
        for g, t in zip(column, counts):
            tokens[g] += t
        families.append((weight, {j: (tokens[j] / total if total > 0 else 0.0) for j in range(size)}))
    doc_groups = [tuple(column[i] for column in columns) for i in range(n)]
    return doc_groups, families


def _check_token_balanced(labels, counts, k, options):
    """Replay the package's order: each step's document is the head of its pool (documents with the same
    groups, in the order of one seeded permutation) and no other pool head gives a smaller f_3."""
    order = token_balanced_order(np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64), k,
                                 options).tolist()
    n = len(labels)
    assert sorted(order) == list(range(n))
    if n == 0:
        return
    doc_groups, families = _token_balanced_families(labels, counts, k, options)
    permutation = np.random.default_rng(options.seed).permutation(n).tolist()
    placed_docs = set()
    placed = [{} for _ in families]
    total = 0
    for doc in order:
        heads = {}
        for i in permutation:
            if i not in placed_docs and doc_groups[i] not in heads:
                heads[doc_groups[i]] = i
        assert heads[doc_groups[doc]] == doc, "not the next document of its pool"
        values = {key: ref_f3(families, placed, total, key, counts[i]) for key, i in heads.items()}
        best = min(values.values())
        assert values[doc_groups[doc]] <= best + 1e-9 * max(1.0, max(values.values())), (values, doc)
        placed_docs.add(doc)
        for tokens, g in zip(placed, doc_groups[doc]):
            tokens[g] = tokens.get(g, 0) + counts[doc]
        total += counts[doc]


@settings(max_examples=150, deadline=None)
@given(documents(max_n=40, counts=(0, 1, 2, 3, 5, 8, 100, 5000)), st.sampled_from([1, 2, 4, 16]),
       st.sampled_from([0.0, 0.5, 1.0, 3.0]), st.integers(0, 2**31), st.data())
def test_token_balanced_takes_the_f3_minimising_pool_head(docs, bins, length_weight, seed, data):
    labels, counts, k = docs
    n_fields = data.draw(st.integers(0, 2))
    balance_groups = None
    if n_fields:
        balance_groups = np.array(data.draw(st.lists(st.lists(st.integers(0, 2), min_size=n_fields,
                                                              max_size=n_fields),
                                                     min_size=len(labels), max_size=len(labels))),
                                  dtype=np.int64).reshape(len(labels), n_fields)
    options = OrderingOptions(seed=seed, length_bins=bins, length_weight=length_weight,
                              balance_groups=balance_groups, balance_weight=data.draw(st.sampled_from([0.5, 1.0, 2.0])))
    _check_token_balanced(labels, counts, k, options)
    # Scored in runs on every core (here from the first pool), each step takes the same pool, ties included.
    args = np.array(labels, dtype=np.int64), np.array(counts, dtype=np.int64), k, options
    assert np.array_equal(token_balanced_order(*args, parallel_pools=1), token_balanced_order(*args))


def test_token_balanced_f3_on_a_larger_input_with_balance_groups():
    rng = np.random.default_rng(5)
    n, k = 150, 6
    labels = rng.integers(0, k, n).tolist()
    counts = rng.integers(1, 3000, n).tolist()
    sources = rng.choice(3, n, p=[0.7, 0.2, 0.1])
    languages = rng.integers(0, 2, n)
    options = OrderingOptions(seed=3, length_bins=4, balance_groups=np.stack([sources, languages], axis=1))
    _check_token_balanced(labels, counts, k, options)
    # A 1-D field is one column.
    _check_token_balanced(labels, counts, k, OrderingOptions(seed=3, balance_groups=sources, balance_weight=2.0))


# --- Invariants on the adversarial synthetic corpora ---------------------------------------------------------

N_DOCS = 4000


@pytest.fixture(scope="module")
def corpora():
    return {name: skewed_corpus(name, N_DOCS, seed=0) for name in SKEWED_CORPORA}


def _mean_quality(labels, counts, k, seq_len, order):
    return (diversity.window_diversity(labels, counts, seq_len, order).mean(),
            diversity.window_share_deviation(labels, counts, seq_len, order, k).mean(),
            diversity.boundary_shift(labels, counts, order, k))


@pytest.mark.parametrize("corpus", SKEWED_CORPORA)
def test_every_ordering_returns_a_permutation_on_skewed_corpora(corpora, corpus):
    labels, counts, k = corpora[corpus]
    scores = np.random.default_rng(0).random(labels.size)
    for name, strategy in ORDERINGS.items():
        order = strategy(labels, counts, k, OrderingOptions(seq_len=16384, scores=scores, jitter_window=7))
        assert order.dtype == np.int64, name
        assert np.array_equal(np.sort(order), np.arange(labels.size)), name


@pytest.mark.parametrize("corpus", SKEWED_CORPORA)
def test_round_robin_label_sequence_is_cycles(corpora, corpus):
    labels, counts, k = corpora[corpus]
    sizes = np.bincount(labels, minlength=k)
    expected = [c for r in range(sizes.max()) for c in range(k) if sizes[c] > r]
    for sort in WITHIN_CLUSTER_SORTS:
        order = round_robin_order(labels, counts, k, OrderingOptions(within_cluster_sort=sort))
        assert labels[order].tolist() == expected


@pytest.mark.parametrize("name", ["random", "balanced", "token-balanced"])
def test_seeded_orderings_repeat_and_differ_by_seed(corpora, name):
    labels, counts, k = corpora["uneven-sizes"]
    first = ORDERINGS[name](labels, counts, k, OrderingOptions(seed=1, seq_len=16384))
    assert first.tolist() == ORDERINGS[name](labels, counts, k, OrderingOptions(seed=1, seq_len=16384)).tolist()
    assert first.tolist() != ORDERINGS[name](labels, counts, k, OrderingOptions(seed=2, seq_len=16384)).tolist()


@pytest.mark.parametrize("seq_len", [16384, 131072])
@pytest.mark.parametrize("corpus", SKEWED_CORPORA)
def test_token_balanced_worst_window_is_no_worse_than_stratified(corpora, corpus, seq_len):
    # Seed 004's objective is the worst deviation of any window: max over windows.
    labels, counts, k = corpora[corpus]
    ours = token_balanced_order(labels, counts, k, OrderingOptions())
    stratified = ORDERINGS["stratified"](labels, counts, k, OrderingOptions())
    ours_max = float(diversity.window_share_deviation(labels, counts, seq_len, ours, k).max())
    stratified_max = float(diversity.window_share_deviation(labels, counts, seq_len, stratified, k).max())
    assert ours_max <= stratified_max, (ours_max, stratified_max)


# Measured at N_DOCS = 4000, seed 0 (mean window_share_deviation at 16384, token-balanced vs stratified).
# Why stratified's mean is lower there: the synthetic inputs are sorted by length inside each cluster and
# stratified keeps that pool order, so every cluster's short documents come first. Windows of many short
# documents deviate little, windows of a few long ones a lot, and grouping them lowers the mean: a length
# curriculum, which also shows up as boundary shift (e.g. uneven-sizes 0.179 against token-balanced's 0.078).
TOKEN_BALANCED_MEAN_LOSES = {
    "uneven-sizes": "0.3155 vs 0.3115",
    "tiny-clusters": "0.2015 vs 0.1579",
    "k1000": "0.2322 vs 0.2040",
}


@pytest.mark.parametrize("corpus", [
    pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=(
        f"known: token-balanced's mean window share deviation at seq-len 16384 on {name} is above stratified's "
        f"({TOKEN_BALANCED_MEAN_LOSES[name]}), see the comment above")))
    if name in TOKEN_BALANCED_MEAN_LOSES else name for name in SKEWED_CORPORA])
def test_token_balanced_mean_uniformity_against_stratified(corpora, corpus):
    labels, counts, k = corpora[corpus]
    ours = token_balanced_order(labels, counts, k, OrderingOptions())
    stratified = ORDERINGS["stratified"](labels, counts, k, OrderingOptions())
    ours_mean = float(diversity.window_share_deviation(labels, counts, 16384, ours, k).mean())
    stratified_mean = float(diversity.window_share_deviation(labels, counts, 16384, stratified, k).mean())
    assert ours_mean <= stratified_mean, (ours_mean, stratified_mean)


@pytest.mark.parametrize("seq_len", [4096, 16384])
@pytest.mark.parametrize("corpus", SKEWED_CORPORA)
def test_balanced_beats_stratified_diversity_and_random_uniformity_and_shift(corpora, corpus, seq_len):
    labels, counts, k = corpora[corpus]
    options = OrderingOptions(seq_len=seq_len)
    balanced = _mean_quality(labels, counts, k, seq_len, balanced_order(labels, counts, k, options))
    stratified = _mean_quality(labels, counts, k, seq_len, ORDERINGS["stratified"](labels, counts, k, options))
    shuffled = _mean_quality(labels, counts, k, seq_len, ORDERINGS["random"](labels, counts, k, options))
    assert balanced[0] >= stratified[0], (balanced, stratified)
    assert balanced[1] < shuffled[1], (balanced, shuffled)
    assert balanced[2] < shuffled[2], (balanced, shuffled)


# --- The comparison report -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_corpus():
    labels, counts, k = skewed_corpus("long-cluster", 2000, seed=1)
    return labels, counts, k, np.random.default_rng(2).random(labels.size)


def test_applicable_orderings():
    assert applicable_orderings(True) == list(ORDERINGS)
    assert applicable_orderings(False) == list(CLUSTER_ORDERINGS)
    assert not set(SCORE_ORDERINGS) & set(applicable_orderings(False))


@pytest.mark.parametrize("have_scores", [False, True])
def test_compare_strategies_rows_curves_and_markdown(small_corpus, have_scores, caplog):
    labels, counts, k, scores = small_corpus
    seq_lens = [4096, 16384]
    options = OrderingOptions(scores=scores if have_scores else None, jitter_window=3)
    names = applicable_orderings(have_scores)
    caplog.set_level(logging.WARNING, logger=strategies.__name__)
    rows, curves = strategies.compare_strategies(labels, counts, k, seq_lens, options, names)
    # long-cluster packed whole: its lengths and clusters force a uniformity above U's bar (at 4,096 at
    # least), which the run also says in its log, for those lengths only.
    for seq_len in seq_lens:
        at = {r["ordering"]: r for r in rows if r["seq_len"] == seq_len}
        out = strategies.uniformity_out_of_reach(at["random"]["uniformity_bound"], at["random"]["uniformity_mean"])
        assert out or seq_len != 4096
        assert any(f"At seq-len {seq_len} no order of these documents meets U" in m for m in caplog.messages) == out
    assert [(r["seq_len"], r["ordering"]) for r in rows] == [(s, n) for s in seq_lens for n in names]
    assert set(curves) == {(n, s) for s in seq_lens for n in names}
    for row in rows:
        order = ORDERINGS[row["ordering"]](labels, counts, k, replace(options, seq_len=row["seq_len"]))
        quality = diversity.ordering_quality(labels, counts, row["seq_len"], order, k)
        if row["ordering"] == "random":
            assert_mean_of_shuffles(row, labels, counts, k, row["seq_len"], options.seed)
        else:
            assert {key: row[key] for key in quality} == quality, row["ordering"]
        assert row["uniformity_bound"] == diversity.uniformity_lower_bound(labels, counts, row["seq_len"], k)
        assert 0 < row["uniformity_bound"] <= row["uniformity_mean"]  # long-cluster: long documents force some
        assert row["seconds"] >= 0
        assert curves[(row["ordering"], row["seq_len"])].tolist() == \
            diversity.window_diversity(labels, counts, row["seq_len"], order).tolist()

    wins = strategies.verdicts(rows)
    assert sorted(wins) == seq_lens
    for seq_len in seq_lens:
        at = {r["ordering"]: r for r in rows if r["seq_len"] == seq_len}
        strat, rand = at["stratified"], at["random"]
        assert wins[seq_len] == [
            n for n, r in at.items() if n not in ("stratified", "random")
            and r["diversity"]["mean"] >= strat["diversity"]["mean"] - 0.05
            and r["uniformity_mean"] <= 0.8 * rand["uniformity_mean"]
            and r["boundary_shift"] <= 0.5 * rand["boundary_shift"]]

    table = strategies.markdown_table(rows, k, "synthetic")
    lines = table.splitlines()
    assert lines[0] == "# Ordering strategies: synthetic"
    assert f"K = {k} clusters." in table
    for seq_len in seq_lens:
        heading = lines.index(f"## seq-len {seq_len:,}")
        assert lines[heading + 2].startswith("| ordering | diversity mean |")
        body = lines[heading + 4:heading + 4 + len(names)]
        assert [line.split(" | ")[0].lstrip("| ") for line in body] == names
        for r in (r for r in rows if r["seq_len"] == seq_len):  # the least diverse tenth of the epoch, beside std
            d = r["diversity"]
            assert f"| {r['ordering']} | {d['mean']:.2f} | {d['min']} | {d['std']:.2f} | " \
                   f"{r['diversity_lowest_tenth']:.2f} |" in body[names.index(r["ordering"])]
            unique, _ = diversity.window_counts(labels, counts, seq_len, ORDERINGS[r["ordering"]](
                labels, counts, k, replace(options, seq_len=seq_len))) if r["ordering"] != "random" else (None, None)
            if unique is not None:
                assert r["diversity_by_tenth"] == diversity.diversity_by_part(unique)
                assert r["diversity_lowest_tenth"] == min(diversity.diversity_by_part(unique))
        assert lines[heading + 4 + len(names)] == ""
        verdict = lines[heading + 5 + len(names)]
        assert verdict.startswith(f"Meets all three criteria (D, U, B): {', '.join(wins[seq_len]) or 'none'}.")
        bound = next(r["uniformity_bound"] for r in rows if r["seq_len"] == seq_len)
        assert lines[heading + 7 + len(names)].startswith(f"No order of these documents has a mean uniformity "
                                                          f"below {bound:.4f} ")
    assert sum(line.startswith("## seq-len") for line in lines) == len(seq_lens)


def _row(name, seq_len, div, uniformity, shift):
    return {"seq_len": seq_len, "ordering": name, "seconds": 0.0, "efficiency": 1.0, "uniformity_mean": uniformity,
            "uniformity_max": 1.0, "boundary_shift": shift, "coverage": 0.0,
            "diversity": {"mean": div, "std": 0.0, "min": 1, "max": 1, "n_sequences": 20}}


def test_verdicts_hand_worked():
    # stratified 5.0 clusters; random: uniformity 0.4, shift 0.3. The bar: D >= 4.95, U <= 0.32, B <= 0.15.
    rows = [_row("stratified", 10, 5.0, 0.3, 0.2), _row("random", 10, 4.0, 0.4, 0.3),
            _row("at-the-bar", 10, 4.95, 0.32, 0.15),  # every criterion exactly met: in
            _row("less-diverse", 10, 4.94, 0.1, 0.1),  # D missed: out
            _row("uniform-enough", 10, 6.0, 0.33, 0.1),  # U missed (0.33 > 0.8 x 0.4): out
            _row("shifted", 10, 6.0, 0.1, 0.16),  # B missed (0.16 > 0.5 x 0.3): out
            _row("balanced", 20, 9.0, 0.1, 0.1), _row("random", 20, 1.0, 0.5, 0.5)]  # no stratified at 20
    assert strategies.verdicts(rows) == {10: ["at-the-bar"]}
    met = strategies.row_criteria(rows)[10]
    assert met["less-diverse"] == {"D": False, "U": True, "B": True}
    assert met["uniform-enough"] == {"D": True, "U": False, "B": True}
    assert met["shifted"] == {"D": True, "U": True, "B": False}
    table = strategies.markdown_table(rows, 3, "t")
    assert "Meets all three criteria (D, U, B): at-the-bar." in table
    assert "| shifted |" in table and "| D U **B✗** |" in table
    assert strategies.verdicts([_row("stratified", 1, 1.0, 0.1, 0.1), _row("random", 1, 1.0, 0.1, 0.1)]) == {1: []}
    assert "(D, U, B): none." in strategies.markdown_table(
        [_row("stratified", 1, 1.0, 0.1, 0.1), _row("random", 1, 1.0, 0.1, 0.1)], 3, "t")


def test_no_out_of_reach_warning_where_the_bound_leaves_u_open(caplog):
    labels, counts, k = skewed_corpus("tiny-clusters", 2000, seed=1)
    caplog.set_level(logging.WARNING, logger=strategies.__name__)
    rows, _ = strategies.compare_strategies(labels, counts, k, [16384], OrderingOptions(), ["stratified", "random"])
    random_row = next(r for r in rows if r["ordering"] == "random")
    assert 0 < random_row["uniformity_bound"] <= 0.8 * random_row["uniformity_mean"]
    assert not any("no order of these documents meets U" in m for m in caplog.messages)


def test_the_table_says_when_the_bound_puts_u_out_of_reach():
    # random's mean uniformity 0.4: U needs <= 0.32. A bound of 0.33 rules it out for every order; 0.32 does not.
    for bound, unreachable in ((0.33, True), (0.32, False)):
        rows = [{**_row("stratified", 10, 5.0, 0.35, 0.2), "uniformity_bound": bound},
                {**_row("random", 10, 4.0, 0.4, 0.3), "uniformity_bound": bound},
                {**_row("paced", 10, 5.0, 0.34, 0.1), "uniformity_bound": bound},  # D and B met, U missed
                {**_row("balanced", 10, 5.0, 0.33, 0.2), "uniformity_bound": bound}]  # B missed
        assert strategies.u_out_of_reach_by_length(rows) == {10: unreachable}  # the report JSON's field
        lines = strategies.markdown_table(rows, 3, "t").splitlines()
        floor = next(line for line in lines if line.startswith("No order of these documents"))
        assert floor.endswith(f"That is {bound / 0.4:.2f} x the random shuffle's 0.4000; U asks for 0.8 x: "
                              + ("no order of these documents meets U at this length." if unreachable else
                                 "the bound does not rule that out."))
        paced = next(line for line in lines if line.startswith("| paced |"))
        assert ("| D **U✗** (out of reach) B |" in paced) == unreachable
        assert ("| D **U✗** B |" in paced) != unreachable
        assert "Meets all three criteria (D, U, B): none. Of those meeting D and B, the most uniform: paced " \
               "(0.3400)." in lines
    rows = [{**_row("stratified", 10, 5.0, 0.35, 0.2), "uniformity_bound": 0.0}]
    assert "set no floor on uniformity here" in strategies.markdown_table(rows, 3, "t")


def test_the_table_does_not_call_an_ordering_most_uniform_where_stratified_is_more():
    # random: U <= 0.32, B <= 0.15; paced meets D and B at 0.34, stratified (the baseline, not a candidate) is at
    # 0.335 and meets B (0.1): it is the pick, and nothing is named.
    rows = [_row("stratified", 10, 5.0, 0.335, 0.1), _row("random", 10, 4.0, 0.4, 0.3), _row("paced", 10, 5.0, 0.34, 0.1)]
    table = strategies.markdown_table(rows, 3, "t")
    assert ("Meets all three criteria (D, U, B): none. None of those meeting D and B is more uniform than stratified "
            "(0.3350), which meets them too.") in table.splitlines()
    assert "stratified and random, the two they measure against, show -" in table
    # stratified's boundary shift misses B (0.2 > 0.15): the most uniform of those meeting D and B is named, as the
    # README says (a new user was given no pick), with stratified's figure beside it
    rows[0] = _row("stratified", 10, 5.0, 0.335, 0.2)
    assert ("Meets all three criteria (D, U, B): none. Of those meeting D and B, the most uniform: paced (0.3400); "
            "stratified's is 0.3350, but its boundary shift (0.2000) misses B (0.5 x the shuffle's 0.3000).") in \
        strategies.markdown_table(rows, 3, "t").splitlines()


# --- Edge cases ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ORDERINGS))
@pytest.mark.parametrize("k", [1, 3])
def test_empty_input_and_a_single_document(name, k):
    options = OrderingOptions(scores=np.zeros(0), seq_len=10, jitter_window=4)
    empty = ORDERINGS[name](np.zeros(0, np.int64), np.zeros(0, np.int64), k, options)
    assert empty.dtype == np.int64 and empty.tolist() == []
    for count in (0, 7, 25):
        one = ORDERINGS[name](np.array([k - 1]), np.array([count]), k, replace(options, scores=np.array([0.5])))
        assert one.dtype == np.int64 and one.tolist() == [0]


@pytest.mark.parametrize("name", list(ORDERINGS))
def test_one_cluster_and_zero_token_documents(name):
    rng = np.random.default_rng(4)
    n = 40
    scores = rng.random(n)
    for labels, counts, k in [(np.zeros(n, np.int64), rng.integers(1, 30, n), 1),  # all in one cluster
                              (np.zeros(n, np.int64), rng.integers(1, 30, n), 4),  # ... of four
                              (rng.integers(0, 3, n), np.zeros(n, np.int64), 3),   # no tokens at all
                              (rng.integers(0, 3, n), rng.choice([0, 0, 5, 40], n), 3)]:
        order = ORDERINGS[name](labels, counts, k, OrderingOptions(seq_len=16, scores=scores))
        assert np.array_equal(np.sort(order), np.arange(n)), name


def test_one_cluster_orders_follow_the_pool():
    n = 30
    labels = np.zeros(n, np.int64)
    counts = np.random.default_rng(0).integers(1, 50, n)
    for name in ("stratified", "round-robin", "bin-packing"):
        assert ORDERINGS[name](labels, counts, 1, OrderingOptions(seq_len=64)).tolist() == list(range(n)), name
    # balanced: one shuffled pool whose due times increase along it.
    assert balanced_order(labels, counts, 1, OrderingOptions(seed=9, seq_len=64)).tolist() == \
        ref_random_pools(labels.tolist(), 1, 9)[0]


def test_metrics_without_tokens():
    labels, counts = np.array([0, 1, 2]), np.zeros(3, np.int64)
    assert diversity.window_share_deviation(labels, counts, 8).tolist() == [0.0]
    assert diversity.boundary_shift(labels, counts) == 0.0
    assert diversity.coverage(labels, counts) == 0.0
    assert diversity.global_token_shares(labels, counts, 3).tolist() == [0.0, 0.0, 0.0]


def test_compile_time_in_an_ordering_s_run_is_left_out_of_its_time(monkeypatch):
    """The warm-up runs each ordering on 64 documents; a path only the full input takes may still compile
    (a fresh install: paced showed 1.19 s, 0.007 s in the next run). Here a run that 'compiles' for 0.4 s
    of its 0.4 s: its time is near zero, and a run without compiling keeps its time."""
    clock = {"compiled": 0.0}
    slow = {"compile": True}

    def ordering(labels, counts, k, options):
        if labels.size > 64:
            time.sleep(0.4)
            if slow["compile"]:
                clock["compiled"] += 0.4
        return np.arange(labels.size)

    monkeypatch.setitem(strategies.ORDERINGS, "original", ordering)
    monkeypatch.setattr(strategies, "compile_seconds", lambda: clock["compiled"])
    labels, counts = np.zeros(200, dtype=np.int64), np.full(200, 10, dtype=np.int64)
    rows, _ = strategies.compare_strategies(labels, counts, 1, [1024], OrderingOptions(), ["original"])
    assert rows[0]["seconds"] < 0.1
    slow["compile"] = False
    rows, _ = strategies.compare_strategies(labels, counts, 1, [1024], OrderingOptions(), ["original"])
    assert rows[0]["seconds"] >= 0.39


def test_token_balanced_says_when_its_pools_make_it_slow(monkeypatch, caplog):
    """Its time grows with documents x pools (cluster x length bin x field category): a field of many
    categories took minutes at 400,000 documents, silently; past the threshold it says so first."""
    from diversity_order.orderings import token_share

    labels = np.arange(200) % 5
    counts = np.arange(200) % 17 + 1
    options = replace(OrderingOptions(seq_len=64), balance_fields=("source",),
                      balance_groups=(np.arange(200) % 40)[:, None])
    with caplog.at_level("WARNING"):
        ORDERINGS["token-balanced"](labels, counts, 5, options)
    assert "every step compares every pool" not in caplog.text
    monkeypatch.setattr(token_share, "SLOW_POOL_STEPS", 200 * 10)
    with caplog.at_level("WARNING"):
        ORDERINGS["token-balanced"](labels, counts, 5, options)
    assert "token-balanced: 200 documents in " in caplog.text and "every step compares every pool" in caplog.text


def test_the_random_row_is_the_mean_of_the_baseline_shuffles_its_order_the_first():
    from diversity_order import diversity
    from diversity_order.orderings import ORDERINGS, OrderingOptions

    rng = np.random.default_rng(3)
    labels, counts = rng.integers(0, 5, 300), rng.integers(1, 400, 300)
    options = OrderingOptions(seed=11, seq_len=2000)
    shuffles = list(diversity.baseline_shuffles(labels.size, options.seed))
    assert np.array_equal(ORDERINGS["random"](labels, counts, 5, options), shuffles[0])

    def measure(order, windows=None):
        return diversity.ordering_quality(labels, counts, 2000, order, 5, windows)

    plain = diversity.mean_measures([measure(order) for order in shuffles])
    given_first = diversity.random_baseline(labels.size, options.seed, measure, first=measure(shuffles[0]))
    assert given_first == diversity.random_baseline(labels.size, options.seed, measure) == \
        {**plain, "shuffles": len(shuffles)}


def test_compare_strategies_says_where_few_windows_carry_the_figures(caplog):
    """A reviewer's 131,072-token section rested on 3 windows and printed its verdicts without a word (a single run
    warns of so few windows)."""
    labels = np.arange(60) % 4
    counts = np.full(60, 100)
    caplog.set_level(logging.WARNING, logger=strategies.__name__)
    rows, _ = strategies.compare_strategies(labels, counts, 4, [100, 1024], OrderingOptions(), ["stratified", "random"])
    assert [m for m in caplog.messages if "more than" in m] == [
        "At seq-len 1024 no order makes more than 6 windows: the figures there rest on so few that one document "
        "moved changes them"]
    table = strategies.markdown_table(rows, 4, "few")
    at_1024 = table[table.index("## seq-len 1,024"):]
    assert "No order makes more than 6 windows at this length" in at_1024
    assert "No order makes more than" not in table[table.index("## seq-len 100"):table.index("## seq-len 1,024")]


def test_a_bound_equal_to_us_bar_but_for_rounding_is_not_out_of_reach():
    """Where every token fits in one window, the bound and a shuffle's uniformity are both 0 but for rounding: a
    bound of 1e-17 against 0.8 x 0 was said to put U out of reach, beside a table where orders met U."""
    assert not strategies.uniformity_out_of_reach(1e-17, 0.0)
    assert not strategies.uniformity_out_of_reach(0.8 * 0.3 + 1e-15, 0.3)
    assert strategies.uniformity_out_of_reach(0.25, 0.3) and strategies.uniformity_out_of_reach(1e-6, 0.0)
    # an order meeting U proves the bound under U's bar: the two verdicts never disagree (up to rounding)
    met = strategies.criteria(20.0, 0.0, 0.0, 20.0, 0.0, 0.0)["U"]
    assert met and not strategies.uniformity_out_of_reach(0.0 + 1e-17, 0.0)


def test_a_length_of_one_window_judges_no_order(caplog):
    """A reviewer's 107,169-token chat set at 131,072: one window, where every order holds the same clusters and
    U is met by 0 <= 0; the table said "Meets all three criteria: balanced, paced, paced-polished" and marked the
    input order as meeting U."""
    labels = np.arange(60) % 4
    counts = np.full(60, 100)
    names = ["stratified", "paced", "original", "random"]
    rows, _ = strategies.compare_strategies(labels, counts, 4, [1000, 100_000], OrderingOptions(), names)
    table = strategies.markdown_table(rows, 4, "one window")
    at_long = table[table.index("## seq-len 100,000"):]
    assert "Every order makes one window at this length" in at_long and "Meets all three" not in at_long
    assert all(line.split(" | ")[-2] == "-" for line in at_long.splitlines() if line.startswith("| paced")
               or line.startswith("| original"))
    assert "Meets all three criteria" in table[table.index("## seq-len 1,000"):table.index("## seq-len 100,000")]
    assert 100_000 not in strategies.row_criteria(rows) and 1000 in strategies.row_criteria(rows)


def test_rows_of_an_earlier_report_without_their_own_lowest_tenth_are_shown():
    """Reports written before each order's own lowest tenth was kept hold only the tenths: shown from them."""
    rows = [dict(_row(name, 10, 5.0, 0.3, 0.2), diversity_by_tenth=[3.0, 2.0, 4.0]) for name in ("stratified", "random")]
    table = strategies.markdown_table(rows, 4, "earlier")
    assert "| stratified | 5.00 | 1 | 0.00 | 2.00 |" in table
