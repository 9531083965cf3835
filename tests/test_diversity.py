"""Window diversity and similarity statistics equal the plain definitions in REFERENCE.md."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order.diversity import similarity_stats, summarize_windows, window_diversity
from reference_impl import ref_similarity_stats, ref_summary, ref_window_diversity


def documents_as_arrays(docs):
    """(labels, token counts) of (cluster, tokens) pairs, as int64 arrays."""
    return np.array([c for c, _ in docs], dtype=np.int64), np.array([t for _, t in docs], dtype=np.int64)


@settings(max_examples=500, deadline=None)
@given(
    st.integers(1, 8).flatmap(lambda k: st.lists(
        st.tuples(st.integers(0, k - 1), st.sampled_from([0, 0, 1, 3, 7, 10, 11, 25, 60])), min_size=0, max_size=80)),
    st.sampled_from([1, 5, 10, 11, 24]),
)
def test_window_diversity_matches_reference_loop(docs, seq_len):
    labels, counts = documents_as_arrays(docs)
    ours = window_diversity(labels, counts, seq_len)
    expected = ref_window_diversity(labels.tolist(), counts.tolist(), seq_len)
    assert ours.tolist() == expected
    assert summarize_windows(ours) == ref_summary(expected)


def test_window_diversity_with_order_and_long_documents():
    labels = np.array([0, 1, 2, 0])
    counts = np.array([5, 30, 5, 5])  # the 30-token document spans whole windows by itself
    order = np.array([3, 1, 0, 2])
    ours = window_diversity(labels, counts, 10, order)
    assert ours.tolist() == ref_window_diversity([0, 1, 0, 2], [5, 30, 5, 5], 10)
    assert ours.tolist() == [1, 1, 1, 1, 2]


def test_no_windows_gives_zero():
    assert window_diversity(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 8).tolist() == [0]


def test_similarity_stats_match_reference():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(300, 16)).astype(np.float32)
    x[:20] = x[0]  # a block of identical rows -> pairs above 0.9
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    ours = similarity_stats(x, seed=7)
    expected = ref_similarity_stats(x, seed=7)
    for key, value in expected.items():
        assert ours[key] == value, key
    assert ours["n_above_0.9"] >= 190


def test_similarity_stats_single_row_has_no_pairs():
    stats = similarity_stats(np.ones((1, 4), np.float32))
    assert stats["n_pairs"] == 0 and stats["mean"] is None


@settings(max_examples=400, deadline=None)
@given(
    st.integers(1, 6).flatmap(lambda k: st.lists(
        st.tuples(st.integers(0, k - 1), st.sampled_from([0, 0, 1, 3, 7, 10, 11, 25, 60])), min_size=0, max_size=60)),
    st.sampled_from([1, 5, 10, 11, 24]),
)
def test_split_packing_matches_concatenate_and_cut(docs, seq_len):
    """--packing split: the stream is cut every seq_len tokens; a document counts in every window it reaches."""
    from diversity_order.diversity import window_share_deviation
    from reference_impl import ref_split_window_diversity, ref_split_window_share_deviation

    labels, counts = documents_as_arrays(docs)
    assert window_diversity(labels, counts, seq_len, packing="split").tolist() == \
        ref_split_window_diversity(labels.tolist(), counts.tolist(), seq_len)
    k = int(labels.max()) + 1 if labels.size else 1
    np.testing.assert_allclose(window_share_deviation(labels, counts, seq_len, n_clusters=k, packing="split"),
                               ref_split_window_share_deviation(labels.tolist(), counts.tolist(), seq_len, k))


def test_split_packing_by_hand():
    # 10-token windows; documents of 7, 6 and 12 tokens: [0 0 0 0 0 0 0 1 1 1 | 1 1 1 2 2 2 2 2 2 2 | 2 2 2 2 2]
    labels, counts = np.array([0, 1, 2]), np.array([7, 6, 12])
    assert window_diversity(labels, counts, 10, packing="split").tolist() == [2, 2, 1]
    assert window_diversity(labels, counts, 10).tolist() == [1, 1, 1, 1]  # whole: 7 | 6 | 10 | 2


# (cluster, tokens) documents: up to 6 clusters, lengths around the window lengths the tests use.
PACKED_DOCUMENTS = st.integers(1, 6).flatmap(lambda k: st.lists(
    st.tuples(st.integers(0, k - 1), st.sampled_from([0, 0, 1, 3, 7, 10, 11, 25, 60])), min_size=0, max_size=60))


@settings(max_examples=300, deadline=None)
@given(
    PACKED_DOCUMENTS,
    st.sampled_from([1, 5, 10, 11, 24]),
    st.booleans(),
)
def test_documents_per_window_and_efficiency(docs, seq_len, split):
    """The bound a window's diversity is measured against: it cannot hold more clusters than documents."""
    from diversity_order.diversity import efficiency, window_counts
    from reference_impl import ref_window_documents

    labels, counts = documents_as_arrays(docs)
    unique, documents = window_counts(labels, counts, seq_len, packing="split" if split else "whole")
    assert documents.tolist() == ref_window_documents(labels.tolist(), counts.tolist(), seq_len, split)
    assert (unique <= documents).all()
    present = len(set(labels.tolist()))
    bound = sum(min(d, present) for d in documents.tolist())
    assert efficiency(unique, documents, present) == (unique.sum() / bound if bound else 1.0)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 40)), min_size=1, max_size=6), st.integers(4, 16),
       st.sampled_from(["whole", "split"]), st.sampled_from([3, 5]))
def test_no_order_beats_the_uniformity_lower_bound(docs, seq_len, packing, n_clusters):
    """Every order of a few documents (all permutations) has a mean window deviation >= the bound."""
    from itertools import permutations

    from diversity_order.diversity import uniformity_lower_bound, window_share_deviation

    labels, counts = documents_as_arrays(docs)
    labels %= n_clusters
    bound = uniformity_lower_bound(labels, counts, seq_len, n_clusters, packing)
    best = min(window_share_deviation(labels, counts, seq_len, np.array(order), n_clusters, packing).mean()
               for order in permutations(range(len(docs))))
    assert 0.0 <= bound <= best + 1e-12


def test_the_uniformity_bound_is_what_lone_long_documents_force():
    from diversity_order.diversity import uniformity_lower_bound, window_share_deviation

    # Two clusters of equal tokens, each one document of exactly three windows: every window holds one
    # cluster and deviates by 1/2, in every order and under both packings.
    labels, counts = np.array([0, 1]), np.array([30, 30])
    for packing in ("whole", "split"):
        actual = window_share_deviation(labels, counts, 10, None, 2, packing).mean()
        assert actual == 0.5
    assert uniformity_lower_bound(labels, counts, 10, 2, "whole") == 0.5
    assert uniformity_lower_bound(labels, counts, 10, 2, "split") == 0.5 * 4 / 6  # m - 1 windows whole each
    # Short documents force nothing.
    assert uniformity_lower_bound(np.array([0, 1, 0, 1]), np.array([2, 2, 2, 2]), 10, 2, "whole") == 0.0


def test_the_uniformity_bound_counts_the_windows_a_cluster_cannot_reach():
    from itertools import permutations

    from diversity_order.diversity import BOUND_GRID, uniformity_lower_bound, window_share_deviation

    # Packing whole, three documents of 6 tokens (cluster 1) and one of 4 (cluster 0) make 3 windows of
    # 10 tokens or fewer in every order, and cluster 0 reaches one of them: the other two lack it and
    # deviate by tau_0 = 4/22, the shared one by 0.4 - tau_0. Every order has that mean.
    labels, counts = np.array([0, 1, 1, 1]), np.array([4, 6, 6, 6])
    tau_0 = 4 / 22
    every_order = {round(float(window_share_deviation(labels, counts, 10, np.array(order), 2, "whole").mean()), 12)
                   for order in permutations(range(4))}
    assert every_order == {round((2 * tau_0 + 0.4 - tau_0) / 3, 12)}
    # The pieces' excess alone gives (0.4 - tau_0) / 4 (a window count that could be 4); with the
    # windows lacking cluster 0, and the 4th window lacking cluster 1 (three documents), it is exact up
    # to the thresholds' grid.
    bound = uniformity_lower_bound(labels, counts, 10, 2, "whole")
    assert min(every_order) - 2 / BOUND_GRID <= bound <= min(every_order)

    # Split, 30 tokens make 3 windows; cluster 0 is one document of 12 tokens (tau_0 = 0.4). Any window
    # lacking it deviates by 0.4, and touching all three it fills one alone (deviation 0.6): so for every
    # s < 0.4 some window deviates by more than s, and the mean is at least 0.4 / 3. (Touching two, its
    # larger piece holds at least 6 tokens, excess 0.2: that alone gave 0.2 / 3.)
    labels, counts = np.array([0, 1, 1, 1]), np.array([12, 6, 6, 6])
    best = min(window_share_deviation(labels, counts, 10, np.array(order), 2, "split").mean()
               for order in permutations(range(4)))
    bound = uniformity_lower_bound(labels, counts, 10, 2, "split")
    assert 0.4 / 3 - 2 / BOUND_GRID <= bound <= 0.4 / 3 < best


def test_the_uniformity_bound_counts_windows_of_few_documents():
    from itertools import permutations

    from diversity_order.diversity import BOUND_GRID, uniformity_lower_bound, window_share_deviation

    # Packing whole, five documents of 4 tokens, one per cluster (tau = 0.2 each), in windows of 10: two
    # fit in a window, so 3 windows, 2 of two documents (deviation 0.5 - 0.2) and 1 alone (1 - 0.2).
    labels, counts = np.arange(5), np.full(5, 4)
    every_order = {round(float(window_share_deviation(labels, counts, 10, np.array(order), 5, "whole").mean()), 12)
                   for order in permutations(range(5))}
    assert every_order == {round((0.3 + 0.3 + 0.8) / 3, 12)}
    # The bound: 3 windows at least (two fit in one); for s < 0.2 all 3 deviate by more (each lacks a
    # cluster of share 0.2 or holds a piece of excess 0.2), for s < 0.3 two (at least 3 - (5 - 3) // 2
    # windows hold two documents or fewer), for s < 0.8 one (2 x 3 - 5 hold one): (0.6 + 0.2 + 0.5) / 3.
    bound = uniformity_lower_bound(labels, counts, 10, 5, "whole")
    assert 1.3 / 3 - 3 / BOUND_GRID <= bound <= 1.3 / 3 < min(every_order)


def test_the_uniformity_bound_counts_a_clusters_shortfall_in_shared_windows():
    from itertools import permutations

    from diversity_order.diversity import BOUND_GRID, uniformity_lower_bound, window_share_deviation

    # Packing whole, windows of 10: cluster 1 is one document of 15 tokens (tau_1 = 0.75), cluster 0 two
    # of 3 and 2 (tau_0 = 0.25). The long one fills a window alone (deviation 0.25) and the windows
    # shared by the rest hold 10 tokens, only 5 of them cluster 1's: 2.5 tokens short of its share,
    # which over windows of at most 10 tokens sums to a deviation of at least 0.25 however they are
    # cut. Best order: both windows at 0.25.
    labels, counts = np.array([0, 0, 1]), np.array([3, 2, 15])
    best = min(window_share_deviation(labels, counts, 10, np.array(order), 2, "whole").mean()
               for order in permutations(range(3)))
    assert abs(best - 0.25) < 1e-12
    bound = uniformity_lower_bound(labels, counts, 10, 2, "whole")
    assert best - 1e-12 <= bound <= best + 1e-12
    # Without the shortfall the pieces' excess and the windows lacking a cluster gave 0.15 here.
    assert bound > 0.15 + 1 / BOUND_GRID


@settings(max_examples=300, deadline=None)
@given(
    PACKED_DOCUMENTS,
    st.sampled_from([1, 5, 10, 11, 24]),
    st.booleans(),
)
def test_sequence_fill_is_tokens_over_the_windows_slots(docs, seq_len, split):
    """Fill: the tokens over seq_len times the windows holding tokens, windows packed by the plain packers."""
    from diversity_order.diversity import ordering_quality
    from reference_impl import RefWindow, ref_split_windows

    labels, counts = documents_as_arrays(docs)
    if split:
        windows = [w for w in ref_split_windows(labels.tolist(), counts.tolist(), seq_len) if sum(w.values())]
    else:
        packer = RefWindow(seq_len)
        for c, t in docs:
            packer.add(c, t)
        windows = packer.finish()
    expected = sum(t for _, t in docs) / (len(windows) * seq_len) if windows else 0.0
    quality = ordering_quality(labels, counts, seq_len, None, 6, packing="split" if split else "whole")
    assert quality["fill"] == round(expected, 4)
    assert 0.0 <= quality["fill"] <= 1.0


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 5).flatmap(lambda k: st.lists(
        st.tuples(st.integers(0, k - 1), st.sampled_from([0, 1, 2, 3, 9, 10, 11, 21, 32, 47])), min_size=1,
        max_size=40)),
    st.sampled_from([1, 2, 10, 11]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_window_measures_read_the_order_as_the_gathered_documents(docs, seq_len, split, rng):
    """The kernels read documents through the order (no gathered copies, outputs sized in advance from
    the documents' lengths): the same windows as the plain reference walking the gathered lists, for any
    order, with documents of many windows (the most pieces the size allows) among them."""
    from diversity_order.diversity import _most_windows, window_counts, window_share_deviation
    from reference_impl import (
        ref_split_window_diversity,
        ref_split_window_share_deviation,
        ref_window_diversity,
        ref_window_documents,
        ref_window_share_deviation,
    )

    labels, counts = documents_as_arrays(docs)
    order = np.array(rng.sample(range(labels.size), labels.size), dtype=np.int64)
    packing = "split" if split else "whole"
    k = int(labels.max()) + 1
    in_labels, in_counts = labels[order].tolist(), counts[order].tolist()
    unique, documents = window_counts(labels, counts, seq_len, order, packing)
    if split:
        expected_unique = ref_split_window_diversity(in_labels, in_counts, seq_len)
        expected_deviation = ref_split_window_share_deviation(in_labels, in_counts, seq_len, k)
    else:
        expected_unique = ref_window_diversity(in_labels, in_counts, seq_len)
        expected_deviation = ref_window_share_deviation(in_labels, in_counts, seq_len, k)
    assert unique.tolist() == (expected_unique or [0])
    # (without numba's bounds checks a short output array would be overrun silently)
    assert _most_windows(counts, order, seq_len) >= len(expected_unique)
    assert documents.tolist() == (ref_window_documents(in_labels, in_counts, seq_len, split) or [0])
    np.testing.assert_allclose(window_share_deviation(labels, counts, seq_len, order, k, packing),
                               expected_deviation or [0.0])


def test_window_measures_refuse_an_order_outside_the_documents():
    """The kernels read through the order without bounds checks, so an order with a position outside the
    documents is refused before (as numpy's indexing did when the measures gathered copies)."""
    import pytest

    from diversity_order.diversity import window_counts, window_share_deviation

    labels, counts = np.array([0, 1, 0]), np.array([3, 4, 5])
    for order in ([0, 1, 3], [0, -1, 2], [0, 1, 1_000_000]):
        with pytest.raises(IndexError):
            window_counts(labels, counts, 8, np.array(order))
        with pytest.raises(IndexError):
            window_share_deviation(labels, counts, 8, np.array(order), 2)
    assert window_counts(labels, counts, 8, np.array([2, 0]))[0].tolist() == [1]  # a part of the documents: fine


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=60), st.integers(1, 12))
def test_diversity_by_part_is_the_mean_of_each_run_of_windows(unique, parts):
    """Windows cut into ``parts`` runs as even as can be, the first ones a window longer (as a plain loop deals);
    fewer windows than parts: one run per window."""
    from diversity_order.diversity import diversity_by_part

    runs = min(parts, len(unique))
    size, extra = divmod(len(unique), runs)
    plain, start = [], 0
    for i in range(runs):
        length = size + (1 if i < extra else 0)
        run = unique[start:start + length]
        plain.append(round(sum(run) / len(run), 2))
        start += length
    assert diversity_by_part(np.array(unique), parts) == plain


def test_mean_measures_of_several_orders():
    from diversity_order.diversity import mean_measures

    one = {"diversity": {"mean": 2.0, "min": 1, "max": 4, "n_sequences": 10}, "diversity_by_tenth": [1.0, 3.0],
           "boundary_shift": 0.2, "name": "a"}
    two = {"diversity": {"mean": 3.0, "min": 0, "max": 5, "n_sequences": 11}, "diversity_by_tenth": [2.0, 5.0],
           "boundary_shift": 0.4, "name": "b"}
    assert mean_measures([one, two]) == {
        "diversity": {"mean": 2.5, "min": 0, "max": 4, "n_sequences": 10},  # 0.5, 4.5 and 10.5 round to even
        "diversity_by_tenth": [1.5, 4.0], "boundary_shift": 0.3, "name": "a", "boundary_shift_range": [0.2, 0.4]}
