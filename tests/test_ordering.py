"""The compiled stratified greedy equals the plain loop from REFERENCE.md, on random inputs."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order.orderings import ORDERINGS, WITHIN_CLUSTER_SORTS, OrderingOptions, cluster_pools, stratified_order
from reference_impl import ref_pools, ref_stratified_order

# The reference's four pool orders; "random" (ours) is checked separately below.
REFERENCE_SORTS = tuple(s for s in WITHIN_CLUSTER_SORTS if s != "random")


@st.composite
def labelled_docs(draw, max_n=120, max_k=12):
    k = draw(st.integers(1, max_k))
    n = draw(st.integers(1, max_n))
    # Few distinct labels and token counts make ties and empty clusters common.
    labels = draw(st.lists(st.integers(0, k - 1), min_size=n, max_size=n))
    counts = draw(st.lists(st.sampled_from([0, 1, 2, 3, 5, 8, 100, 5000]), min_size=n, max_size=n))
    return np.array(labels), np.array(counts), k


@settings(max_examples=300, deadline=None)
@given(labelled_docs(), st.sampled_from(REFERENCE_SORTS))
def test_stratified_order_matches_reference_loop(docs, sort):
    labels, counts, k = docs
    ours = stratified_order(labels, counts, k, OrderingOptions(within_cluster_sort=sort))
    expected = ref_stratified_order(labels.tolist(), counts.tolist(), k, sort)
    assert ours.tolist() == expected


@settings(max_examples=200, deadline=None)
@given(labelled_docs(), st.sampled_from(REFERENCE_SORTS))
def test_cluster_pools_match_reference(docs, sort):
    labels, counts, k = docs
    members, starts = cluster_pools(labels, counts, k, sort)
    expected = ref_pools(labels.tolist(), counts.tolist(), k, sort)
    assert [members[starts[c]:starts[c + 1]].tolist() for c in range(k)] == expected


def test_larger_random_input_matches_reference():
    rng = np.random.default_rng(0)
    k = 30
    # Skewed cluster sizes, one cluster empty.
    labels = rng.choice(k, size=3000, p=np.r_[0, rng.dirichlet(np.ones(k - 1) * 0.3)])
    counts = rng.integers(0, 20000, size=3000)
    for sort in REFERENCE_SORTS:
        ours = stratified_order(labels, counts, k, OrderingOptions(sort))
        assert ours.tolist() == ref_stratified_order(labels.tolist(), counts.tolist(), k, sort)


def test_single_document_and_single_cluster():
    assert stratified_order(np.array([0]), np.array([7]), 1).tolist() == [0]
    assert stratified_order(np.zeros(5, int), np.arange(5), 1).tolist() == [0, 1, 2, 3, 4]


def test_hand_worked_tie_breaking():
    # Two clusters of two: step 0 deficits 0.5/0.5 tie -> cluster 0 (lowest k) first,
    # then cluster 1 (deficit 2/3 - 0 > 1/3 - 1), and so on: a perfect interleave.
    labels = np.array([1, 1, 0, 0])
    assert stratified_order(labels, np.ones(4, int), 2).tolist() == [2, 0, 3, 1]


def test_registry_orderings_return_permutations():
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 7, 500)
    counts = rng.integers(0, 100, 500)
    scores = rng.normal(size=500)
    for name, strategy in ORDERINGS.items():
        order = strategy(labels, counts, 7, OrderingOptions(scores=scores, jitter_window=5, seq_len=300))
        assert np.array_equal(np.sort(order), np.arange(500)), name


def test_unknown_within_cluster_sort_is_refused():
    with pytest.raises(ValueError, match="within_cluster_sort"):
        cluster_pools(np.zeros(3, int), np.ones(3, int), 1, "by-magic")


@settings(max_examples=100, deadline=None)
@given(labelled_docs(), st.integers(0, 2**31))
def test_random_pools_are_seeded_shuffles_of_each_cluster(docs, seed):
    labels, counts, k = docs
    members, starts = cluster_pools(labels, counts, k, "random", seed)
    again, _ = cluster_pools(labels, counts, k, "random", seed)
    assert members.tolist() == again.tolist()
    for c, pool in enumerate(ref_pools(labels.tolist(), counts.tolist(), k, "original")):
        assert sorted(members[starts[c]:starts[c + 1]].tolist()) == pool


@settings(max_examples=200, deadline=None)
@given(labelled_docs(), st.integers(0, 2**31))
def test_pools_group_by_counting_as_a_stable_sort_would(docs, seed):
    from diversity_order.orderings.pools import grouped_stable

    labels, counts, k = docs
    starts = np.concatenate(([0], np.cumsum(np.bincount(labels, minlength=k))))
    assert grouped_stable(labels, starts).tolist() == np.argsort(labels, kind="stable").tolist()
    # random pools: the seeded shuffle, grouped stably (what paced's and stratified's seeds promise)
    shuffled = np.random.default_rng(seed).permutation(labels.size)
    members, _ = cluster_pools(labels, counts, k, "random", seed)
    assert members.tolist() == shuffled[np.argsort(labels[shuffled], kind="stable")].tolist()


@settings(max_examples=300, deadline=None)
@given(st.data(), st.sampled_from([10, 2**20, 2**40, 2**62]))
def test_order_by_sorts_as_lexsort_would(data, largest):
    """By major key, minor key, then position; keys of any size (large ones take np.lexsort)."""
    from diversity_order.orderings.pools import order_by

    n = data.draw(st.integers(0, 60))
    positions = np.asarray(data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n, unique=True)),
                          dtype=np.int64)
    key = st.lists(st.integers(0, largest), min_size=n, max_size=n)
    major, minor = np.asarray(data.draw(key), dtype=np.int64), np.asarray(data.draw(key), dtype=np.int64)
    want = sorted(range(n), key=lambda i: (major[i], minor[i], positions[i]))
    assert order_by(positions, major, minor).tolist() == positions[want].tolist()


def test_random_pools_differ_by_seed_and_remove_input_drift():
    labels = np.zeros(1000, int)
    first, _ = cluster_pools(labels, np.ones(1000, int), 1, "random", 1)
    second, _ = cluster_pools(labels, np.ones(1000, int), 1, "random", 2)
    assert first.tolist() != second.tolist()
    # The input-order pool keeps 0..999; a shuffled pool's first half draws about equally from both halves of the input.
    assert 200 < (first[:500] < 500).sum() < 300


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 2, 3, 5, 8, 100, 5000]), max_size=40), st.integers(0, 2**32 - 1))
def test_long_documents_are_dealt_as_the_plain_loop_deals_them(lengths, seed):
    """``deal_long``: the shortest at the two ends while they hold a fifth of the tokens, the rest in the
    given order between (few distinct lengths make ties common)."""
    from conftest import plain_deal_long
    from diversity_order.orderings.pools import deal_long

    counts = np.asarray(lengths, dtype=np.int64)
    docs = np.random.default_rng(seed).permutation(counts.size).astype(np.int64)
    deck = np.full(counts.size, -1, dtype=np.int64)
    deal_long(docs, counts, np.argsort(counts[docs], kind="stable"), deck)
    assert deck.tolist() == plain_deal_long(docs.tolist(), counts.tolist())


def test_hand_dealt_long_documents():
    """Six documents of 1, 2, 3, 10, 40 and 44 tokens (100 in all), given in the order 40, 3, 44, 1, 10, 2:
    1, 2 and 3 hold 6 tokens, 1-10 hold 16 <= 20, and 40 would make 56 > 20, so 1 and 3 go to the front, 2
    and 10 to the back (shortest outermost), and 40 then 44 between, in the given order."""
    from diversity_order.orderings.pools import deal_long

    counts = np.array([1, 2, 3, 10, 40, 44], dtype=np.int64)
    docs = np.array([4, 2, 5, 0, 3, 1], dtype=np.int64)
    deck = np.empty(6, dtype=np.int64)
    deal_long(docs, counts, np.argsort(counts[docs], kind="stable"), deck)
    assert counts[deck].tolist() == [1, 3, 40, 44, 10, 2]
