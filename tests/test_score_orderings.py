"""The score orderings (sorted, folding, zigzag, segment, stair, saw): hand-worked cases written from
their definitions (score.py's docstrings, README "Choosing an ordering"), the per-ordering defaults,
the flags' checks, and plain loops (reference_impl.py) on random inputs."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order.errors import UserError
from diversity_order.orderings import ORDERINGS, SCORE_ORDERINGS, OrderingOptions, registry
from diversity_order.orderings.options import PER_ORDERING_DEFAULTS, SEGMENT_LAYOUTS, flag_fields
from reference_impl import ref_folds, ref_gumbel, ref_segment_parts, ref_stable_and_transitions

# Position of the document with score rank r: scores are a shuffled permutation, so each expected list
# (written in score ranks, worked by hand from the definitions) also checks the map back to input positions.
PLACE_9 = [4, 7, 0, 2, 8, 1, 6, 3, 5]
PLACE_12 = [9, 2, 11, 5, 0, 7, 3, 10, 1, 8, 6, 4]


def _place(n, seed=0):
    return np.random.default_rng(seed).permutation(n).tolist()


def _score_order(name, place, **kwargs):
    """The order of ``name`` as score ranks (0 = lowest score)."""
    n = len(place)
    scores = np.empty(n)
    scores[place] = np.arange(n)
    options = OrderingOptions(scores=scores, **kwargs)
    order = ORDERINGS[name](np.zeros(n, dtype=np.int64), np.ones(n, dtype=np.int64), 1, options).tolist()
    rank_of = {p: r for r, p in enumerate(place)}
    return [rank_of[i] for i in order]


def _run(name, scores, **kwargs):
    n = len(scores)
    options = OrderingOptions(scores=np.asarray(scores, dtype=np.float64), **kwargs)
    return ORDERINGS[name](np.zeros(n, np.int64), np.ones(n, np.int64), 1, options).tolist()


# --- sorted ------------------------------------------------------------------------------------------------------


def test_sorted_ascending_and_descending_ties_keep_input_order():
    assert _score_order("sorted", PLACE_9) == list(range(9))
    assert _score_order("sorted", PLACE_9, score_order="descending") == list(range(8, -1, -1))
    scores = [2.0, 1.0, 2.0, 1.0, 0.0, -1.5]
    assert _run("sorted", scores) == [5, 4, 1, 3, 0, 2]
    # High first; the two 2.0s (positions 0, 2) and the two 1.0s (1, 3) stay in input order.
    assert _run("sorted", scores, score_order="descending") == [0, 2, 1, 3, 4, 5]


def test_gumbel_temperature_zero_is_sorted_and_small_moves_are_local():
    n = 300
    place = _place(n, 1)
    assert _score_order("sorted", place, gumbel_temperature=0.0) == list(range(n))
    assert _score_order("sorted", place, gumbel_temperature=1e-9) == list(range(n))  # noise far below one place
    noise = np.random.default_rng(7).gumbel(size=n)  # the noise the ordering draws with seed 7
    for tau in (0.5, 2.0, 10.0):
        ranks = _score_order("sorted", place, gumbel_temperature=tau, seed=7)
        assert ranks != list(range(n)) and sorted(ranks) == list(range(n))
        # Rank i sorts by i + tau * g_i: it can only pass ranks whose keys it crosses, so it moves at most
        # tau * (largest - smallest noise) places.
        moved = np.abs(np.array([ranks.index(r) for r in range(n)]) - np.arange(n))
        assert moved.max() <= tau * (noise.max() - noise.min())
    assert _score_order("sorted", place, gumbel_temperature=2.0, seed=7) != \
        _score_order("sorted", place, gumbel_temperature=2.0, seed=8)


def test_gumbel_noise_applies_to_the_descending_ranks():
    place = _place(40, 2)
    descending = list(range(39, -1, -1))
    assert _score_order("sorted", place, gumbel_temperature=3.0, seed=5, score_order="descending") == \
        ref_gumbel(descending, 3.0, 5)


# --- folding and zigzag -----------------------------------------------------------------------------------------


def test_folding_and_zigzag_hand_worked():
    # Ranks 0..8 dealt into L = 3 strided folds: {0,3,6}, {1,4,7}, {2,5,8}; zig-zag reverses the middle one.
    assert _score_order("folding", PLACE_9, folds=3) == [0, 3, 6, 1, 4, 7, 2, 5, 8]
    assert _score_order("zigzag", PLACE_9, folds=3) == [0, 3, 6, 7, 4, 1, 2, 5, 8]
    assert _score_order("folding", PLACE_9, folds=2) == [0, 2, 4, 6, 8, 1, 3, 5, 7]
    assert _score_order("zigzag", PLACE_9, folds=2) == [0, 2, 4, 6, 8, 7, 5, 3, 1]
    assert _score_order("folding", PLACE_9, folds=1) == list(range(9))
    assert _score_order("folding", PLACE_9, folds=20) == list(range(9))  # more folds than documents
    # Descending: the ranked list is 8..0, dealt the same way: {8,5,2}, {7,4,1}, {6,3,0}.
    assert _score_order("folding", PLACE_9, folds=3, score_order="descending") == [8, 5, 2, 7, 4, 1, 6, 3, 0]
    assert _score_order("zigzag", PLACE_9, folds=3, score_order="descending") == [8, 5, 2, 1, 4, 7, 6, 3, 0]


def test_folding_and_zigzag_default_to_five_folds():
    # L = 5 over ranks 0..11: {0,5,10}, {1,6,11}, {2,7}, {3,8}, {4,9}; zig-zag reverses folds 1 and 3.
    assert _score_order("folding", PLACE_12) == [0, 5, 10, 1, 6, 11, 2, 7, 3, 8, 4, 9]
    assert _score_order("zigzag", PLACE_12) == [0, 5, 10, 11, 6, 1, 2, 7, 8, 3, 4, 9]


# --- segment ----------------------------------------------------------------------------------------------------


def _parts(ranks, n_first, n_last):
    n = len(ranks)
    return [sorted(ranks[:n_first]), sorted(ranks[n_first:n - n_last]), sorted(ranks[n - n_last:])]


def test_segment_default_is_ten_percent_from_each_end_floored():
    # n = 999: floor(99.9) = 99 lowest first, 999 - 198 = 801 in the middle, 99 highest last.
    ranks = _score_order("segment", _place(999))
    assert _parts(ranks, 99, 99) == [list(range(99)), list(range(99, 900)), list(range(900, 999))]


def test_segment_layouts_hand_worked():
    place = [3, 8, 0, 6, 1, 9, 4, 7, 2, 5]
    # 25% of 10 = 2.5, floored: 2 documents in the first and in the last segment, 6 between.
    assert _parts(_score_order("segment", place, segment_percentages=(25.0, 25.0)), 2, 2) == \
        [[0, 1], [2, 3, 4, 5, 6, 7], [8, 9]]
    assert _parts(_score_order("segment", place, segment_percentages=(25.0, 25.0), segment_layout="high-low"), 2, 2) \
        == [[8, 9], [2, 3, 4, 5, 6, 7], [0, 1]]
    # Different sizes at each end: 20% -> 2 first, 30% -> 3 last.
    assert _parts(_score_order("segment", place, segment_percentages=(20.0, 30.0)), 2, 3) == \
        [[0, 1], [2, 3, 4, 5, 6], [7, 8, 9]]
    assert _parts(_score_order("segment", place, segment_percentages=(20.0, 30.0), segment_layout="high-low"), 2, 3) \
        == [[8, 9], [3, 4, 5, 6, 7], [0, 1, 2]]
    # Both from one end: the lowest (highest) 2 + 3 ranks are split at random between the first 2 places and the
    # last 3; the other end's 5 ranks fill the middle.
    splits = set()
    for seed in range(20):
        low = _parts(_score_order("segment", place, segment_percentages=(20.0, 30.0), segment_layout="low-low",
                                  seed=seed), 2, 3)
        assert low[1] == [5, 6, 7, 8, 9] and sorted(low[0] + low[2]) == [0, 1, 2, 3, 4]
        splits.add(tuple(low[0]))
        high = _parts(_score_order("segment", place, segment_percentages=(20.0, 30.0), segment_layout="high-high",
                                   seed=seed), 2, 3)
        assert high[1] == [0, 1, 2, 3, 4] and sorted(high[0] + high[2]) == [5, 6, 7, 8, 9]
    assert len(splits) > 3
    # n = 7, 50/50: floor(3.5) = 3 at each end, one document between.
    assert _parts(_score_order("segment", _place(7), segment_percentages=(50.0, 50.0)), 3, 3) == \
        [[0, 1, 2], [3], [4, 5, 6]]
    # One part empty: 0% first, 10% of 10 last.
    assert _parts(_score_order("segment", place, segment_percentages=(0.0, 10.0)), 0, 1) == \
        [[], list(range(9)), [9]]


def test_segment_three_values_are_first_middle_last():
    # The old form 30,40,30 (adding up to 100) still means 3 lowest, 4 between, 3 highest of 10.
    place = [3, 8, 0, 6, 1, 9, 4, 7, 2, 5]
    for seed in range(5):
        ranks = _score_order("segment", place, segment_percentages=(30.0, 40.0, 30.0), seed=seed)
        assert _parts(ranks, 3, 3) == [[0, 1, 2], [3, 4, 5, 6], [7, 8, 9]]


def test_segments_are_shuffled_inside():
    n = 200
    orders = {tuple(_run("segment", np.arange(n), segment_percentages=(30.0, 30.0), seed=s)) for s in range(3)}
    assert len(orders) == 3
    for order in orders:
        for part in (order[:60], order[60:140], order[140:]):
            assert list(part) != sorted(part)
        assert sorted(order[:60]) == list(range(60)) and sorted(order[60:140]) == list(range(60, 140))
    # Nothing at the ends: one shuffled middle.
    whole = _run("segment", np.arange(n), segment_percentages=(0.0, 0.0))
    assert whole != list(range(n)) and sorted(whole) == list(range(n))


# --- stair and saw ----------------------------------------------------------------------------------------------


def test_stair_and_saw_hand_worked():
    # n = 12, K = 3: boundaries 4 and 8; r = 1/6: radius round(12 / 6) = 2 documents on either side, so the
    # regions [2,6) and [6,10). Stair deals each into 3 folds: 2,3,4,5 -> {2,5},{3},{4}; saw into 2 folds,
    # the second reversed: {2,4}, {5,3}.
    assert _score_order("stair", PLACE_12, sections=3, transition_ratio=1 / 6, folds=3) == \
        [0, 1, 2, 5, 3, 4, 6, 9, 7, 8, 10, 11]
    assert _score_order("saw", PLACE_12, sections=3, transition_ratio=1 / 6, folds=2) == \
        [0, 1, 2, 4, 5, 3, 6, 8, 9, 7, 10, 11]
    # Descending: the ranked list is 11..0 and the regions sit at the same places.
    assert _score_order("stair", PLACE_12, sections=3, transition_ratio=1 / 6, folds=3, score_order="descending") \
        == [11, 10, 9, 6, 8, 7, 5, 2, 4, 3, 1, 0]
    # r = 0 or a single section: no transition regions, the plain curriculum.
    assert _score_order("stair", PLACE_12, sections=3, transition_ratio=0.0) == list(range(12))
    assert _score_order("saw", PLACE_12, sections=1, transition_ratio=0.5) == list(range(12))


def test_stair_and_saw_overlapping_regions_start_where_the_previous_ends():
    # n = 12, K = 3, r = 0.25: radius 3, so [1,7) and [5,11) would overlap; the second starts at 7: [7,11).
    # Stair, 3 folds: ranks 1..6 -> {1,4},{2,5},{3,6}; ranks 7..10 -> {7,10},{8},{9}.
    assert _score_order("stair", PLACE_12, sections=3, transition_ratio=0.25, folds=3) == \
        [0, 1, 4, 2, 5, 3, 6, 7, 10, 8, 9, 11]
    # Saw, 2 folds: ranks 1..6 -> {1,3,5}, {6,4,2}; ranks 7..10 -> {7,9}, {10,8}.
    assert _score_order("saw", PLACE_12, sections=3, transition_ratio=0.25, folds=2) == \
        [0, 1, 3, 5, 6, 4, 2, 7, 9, 10, 8, 11]
    # n = 9, K = 3, r = 0.5: radius round(4.5) = 4; boundaries 3 and 6 give [0,7) (cut at the start) and
    # [7,9) (from the first region's end to the list's end).
    assert _score_order("stair", PLACE_9, sections=3, transition_ratio=0.5, folds=3) == [0, 3, 6, 1, 4, 2, 5, 7, 8]
    assert _score_order("saw", PLACE_9, sections=3, transition_ratio=0.5, folds=2) == [0, 2, 4, 6, 5, 3, 1, 7, 8]
    # A radius reaching past both ends: one region, the whole list: stair becomes folding.
    for r in (0.5, 1.0):
        assert _score_order("stair", _place(10), sections=2, transition_ratio=r, folds=3) == \
            [0, 3, 6, 9, 1, 4, 7, 2, 5, 8]


def test_stair_and_saw_when_sections_do_not_divide_n():
    # n = 10, K = 3: boundaries round(3.33) = 3 and round(6.67) = 7; r = 0.2: radius 2, regions [1,5) and [5,9).
    place = _place(10, 3)
    assert _score_order("stair", place, sections=3, transition_ratio=0.2, folds=3) == [0, 1, 4, 2, 3, 5, 8, 6, 7, 9]
    assert _score_order("saw", place, sections=3, transition_ratio=0.2, folds=2) == [0, 1, 3, 4, 2, 5, 7, 8, 6, 9]
    # More sections than documents: n = 4, K = 10 puts boundaries at 0, 1, 1, 2, 2, 2, 3, 3, 4; with r = 1 the
    # region around 0 covers [0,4), and the later ones start at its end, so they are empty.
    assert _score_order("stair", _place(4), sections=10, transition_ratio=1.0, folds=3) == [0, 3, 1, 2]


def test_stair_and_saw_round_halves_to_even():
    # n = 9, K = 2: the boundary 4.5 rounds to 4; r = 0.25: radius round(2.25) = 2, region [2,6).
    assert _score_order("stair", PLACE_9, sections=2, transition_ratio=0.25, folds=3) == [0, 1, 2, 5, 3, 4, 6, 7, 8]
    # n = 10, r = 0.25: radius 2.5 rounds to 2, region [3,7); n = 14: 3.5 rounds to 4, region [3,11).
    assert _score_order("stair", _place(10), sections=2, transition_ratio=0.25, folds=3) == \
        [0, 1, 2, 3, 6, 4, 5, 7, 8, 9]
    assert _score_order("stair", _place(14), sections=2, transition_ratio=0.25, folds=3) == \
        [0, 1, 2, 3, 6, 9, 4, 7, 10, 5, 8, 11, 12, 13]


def test_stair_and_saw_defaults():
    # Stair: K = 2, L = 3, r = 0.225. n = 20: boundary 10, radius round(4.5) = 4, region [6,14) in 3 folds.
    assert _score_order("stair", _place(20)) == [0, 1, 2, 3, 4, 5, 6, 9, 12, 7, 10, 13, 8, 11, *range(14, 20)]
    # Saw: K = 3, L = 2, r = 0.075. n = 40: boundaries 13 and 27, radius 3, regions [10,16) and [24,30).
    assert _score_order("saw", _place(40)) == [*range(10), 10, 12, 14, 15, 13, 11, *range(16, 24),
                                               24, 26, 28, 29, 27, 25, *range(30, 40)]


@pytest.mark.parametrize(("name", "moved"), [("stair", 448), ("saw", 298)])
def test_defaults_move_as_many_positions_as_the_papers(name, moved):
    # n = 1000. Stair: one region [275,725) of 450 in 3 folds, where only its first and last stay put.
    # Saw: regions [258,408) and [592,742) of 150 in 2 zig-zag folds, where only the first stays put.
    ranks = _score_order(name, _place(1000))
    assert sum(r != i for i, r in enumerate(ranks)) == moved


# --- options: per-ordering defaults, flags, checks --------------------------------------------------------------


def test_unset_options_take_each_orderings_default():
    unset = OrderingOptions()
    assert (unset.folds, unset.sections, unset.transition_ratio) == (None, None, None)
    resolved = {name: unset.for_ordering(name) for name in SCORE_ORDERINGS}
    assert [resolved[name].folds for name in ("folding", "zigzag", "stair", "saw")] == [5, 5, 3, 2]
    assert (resolved["stair"].sections, resolved["stair"].transition_ratio) == (2, 0.225)
    assert (resolved["saw"].sections, resolved["saw"].transition_ratio) == (3, 0.075)
    assert resolved["sorted"] == unset and unset.for_ordering("balanced") == unset
    # What the user set stays.
    assert OrderingOptions(folds=4, transition_ratio=0.3).for_ordering("saw").folds == 4
    assert OrderingOptions(folds=4, transition_ratio=0.3).for_ordering("saw").transition_ratio == 0.3
    # Setting the default explicitly gives the same order.
    scores = np.random.default_rng(0).random(500)
    assert _run("saw", scores) == _run("saw", scores, folds=2, sections=3, transition_ratio=0.075)
    assert _run("stair", scores) == _run("stair", scores, folds=3, sections=2, transition_ratio=0.225)


def test_help_names_each_orderings_default():
    helps = {f.name: f.metadata["help"] for f in flag_fields()}
    assert "(default: 5 for folding/zigzag, 3 for stair, 2 for saw)" in helps["folds"]
    assert "(default: 2 for stair, 3 for saw)" in helps["sections"]
    assert "(default: 0.225 for stair, 0.075 for saw)" in helps["transition_ratio"]
    assert set(PER_ORDERING_DEFAULTS) <= set(helps)


def test_flags_parse_to_their_types_and_unset_stays_none():
    from diversity_order.cli.curate_dataset import config_from_args, parse_args

    base = ["--input", "in.jsonl", "--output", "out.jsonl"]
    options = config_from_args(parse_args(base)).ordering_options
    assert (options.folds, options.sections, options.transition_ratio) == (None, None, None)
    options = config_from_args(parse_args([*base, "--folds", "4", "--sections", "5", "--transition-ratio", "0.05",
                                           "--score-order", "descending", "--gumbel-temperature", "1.5",
                                           "--segment-percentages", "5,15", "--segment-layout", "high-high"]))
    options = options.ordering_options
    assert (options.folds, options.sections, options.transition_ratio) == (4, 5, 0.05)
    assert type(options.folds) is int and type(options.transition_ratio) is float
    assert (options.score_order, options.gumbel_temperature) == ("descending", 1.5)
    assert (options.segment_percentages, options.segment_layout) == ((5.0, 15.0), "high-high")


def test_readers_of_the_new_flags():
    assert registry.readers("score_order") == ("sorted", "folding", "zigzag", "stair", "saw")
    assert registry.readers("gumbel_temperature") == ("sorted",)
    assert registry.readers("segment_layout") == ("segment",)
    # segment picks its ends with --segment-layout, so --score-order is flagged there.
    assert [flag for flag, _ in registry.unused_flags("segment", OrderingOptions(score_order="descending"))] == \
        ["--score-order"]
    assert registry.unused_flags("saw", OrderingOptions(folds=2)) == []


@pytest.mark.parametrize(("options", "message"), [
    ({"folds": 0}, "--folds 0"),
    ({"sections": 0}, "--sections 0"),
    ({"transition_ratio": -0.1}, "--transition-ratio -0.1"),
    ({"transition_ratio": 1.5}, "--transition-ratio 1.5: must be within 0..1 (a fraction of all documents)"),
    ({"transition_ratio": math.nan}, "--transition-ratio nan"),
    ({"gumbel_temperature": -1.0}, "--gumbel-temperature -1.0"),
    ({"gumbel_temperature": math.inf}, "--gumbel-temperature inf"),
    # A reviewer's 1e308 overflowed the noise (numpy's RuntimeWarning on stderr, keys of inf).
    ({"gumbel_temperature": 1e308}, "--gumbel-temperature 1e+308: must be within 0..1e+300 (0 = off; larger values "
                                    "shuffle all the same)"),
    ({"score_order": "up"}, "--score-order up: choose one of ascending, descending"),
    ({"segment_layout": "low"}, "--segment-layout low: choose one of " + ", ".join(SEGMENT_LAYOUTS)),
    ({"segment_percentages": (100.0,)}, "--segment-percentages 100: give FIRST,LAST"),
    ({"segment_percentages": (25.0, 25.0, 25.0, 25.0)}, "--segment-percentages 25,25,25,25: give FIRST,LAST"),
    ({"segment_percentages": (60.0, 50.0)}, "the first and last segments hold more than 100 percent"),
    ({"segment_percentages": (-5.0, 10.0)}, "each value must be a percentage within 0..100"),
    ({"segment_percentages": (math.inf, 30.0)}, "each value must be a percentage within 0..100"),
    # The old relative sizes: 3,4,3 meant 30,40,30; the error says so.
    ({"segment_percentages": (3.0, 4.0, 3.0)}, "must add up to 100, as they are percent of the documents "
                                                "(as relative sizes they meant FIRST,LAST = 30,30)"),
])
def test_out_of_range_options_are_one_line_errors_naming_the_flag(options, message):
    with pytest.raises(UserError) as error:
        OrderingOptions(**options).validate()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_in_range_options_pass():
    for options in ({}, {"transition_ratio": 0.0}, {"transition_ratio": 1.0}, {"folds": 1, "sections": 1},
                    {"segment_percentages": (0.0, 100.0)}, {"segment_percentages": (30.0, 40.0, 30.0)},
                    {"segment_percentages": (33.3, 33.4, 33.3)}, {"gumbel_temperature": 1e6}):
        OrderingOptions(**options).validate()


# --- jitter and every score ordering -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", SCORE_ORDERINGS)
def test_jitter_shuffles_inside_blocks_only(name):
    n = 103
    scores = np.random.default_rng(1).random(n)

    def run(window, seed=0):
        return _run(name, scores, jitter_window=window, seed=seed, transition_ratio=0.1)

    plain = run(0)
    assert run(1) == plain
    for window in (2, 5, 10):
        jittered = run(window)
        assert jittered != plain
        for start in range(0, n, window):  # including the last, partial block
            assert sorted(jittered[start:start + window]) == sorted(plain[start:start + window])
        assert run(window) == jittered  # seeded
    assert run(5, seed=1) != run(5, seed=2)
    assert sorted(run(n * 2)) == list(range(n))  # one block larger than the input


def test_jitter_after_gumbel_noise_shuffles_the_noisy_order():
    n = 200
    scores = np.random.default_rng(2).random(n)
    noisy = _run("sorted", scores, gumbel_temperature=3.0, seed=4)
    both = _run("sorted", scores, gumbel_temperature=3.0, jitter_window=8, seed=4)
    assert both != noisy
    for start in range(0, n, 8):
        assert sorted(both[start:start + 8]) == sorted(noisy[start:start + 8])


@pytest.mark.parametrize("name", SCORE_ORDERINGS)
def test_score_orderings_need_one_score_per_document(name):
    labels, counts = np.zeros(4, np.int64), np.ones(4, np.int64)
    with pytest.raises(ValueError, match="scores"):
        ORDERINGS[name](labels, counts, 1, OrderingOptions())
    with pytest.raises(ValueError):
        ORDERINGS[name](labels, counts, 1, OrderingOptions(scores=np.arange(3.0)))


def test_huge_section_counts_stay_cheap():
    # K far above n: the boundaries collapse onto the n + 1 whole numbers.
    ranks = _score_order("stair", _place(50), sections=2**40, transition_ratio=0.1, folds=3)
    assert sorted(ranks) == list(range(50))
    # Radius 5 around boundary 0 gives [0,5); every later region holds one document.
    assert ranks == [0, 3, 1, 4, 2, *range(5, 50)]


# --- plain loops on random inputs --------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(1, 6), st.integers(1, 12),
       st.sampled_from([0.0, 0.025, 0.05, 0.075, 0.1, 1 / 8, 0.2, 0.225, 0.25, 0.3, 0.5, 0.75, 1.0]),
       st.booleans(), st.integers(0, 2**31))
def test_ranked_orderings_match_plain_loops(n, n_folds, n_sections, ratio, descending, seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, max(n // 2, 1), n).astype(np.float64)  # ties are common
    order = "descending" if descending else "ascending"
    # Python's sort is stable with reverse=True too: ties keep input order either way.
    ranked = sorted(range(n), key=lambda i: scores[i], reverse=descending)

    def run(name, **kwargs):
        return _run(name, scores, score_order=order, seed=seed, **kwargs)

    assert run("sorted") == ranked
    assert run("folding", folds=n_folds) == ref_folds(ranked, n_folds, zigzag=False)
    assert run("zigzag", folds=n_folds) == ref_folds(ranked, n_folds, zigzag=True)
    for name, zigzag in (("stair", False), ("saw", True)):
        assert run(name, folds=n_folds, sections=n_sections, transition_ratio=ratio) == \
            ref_stable_and_transitions(ranked, n_sections, ratio, n_folds, zigzag)
    temperature = float(rng.choice([0.0, 0.3, 1.0, 4.0]))
    assert run("sorted", gumbel_temperature=temperature) == ref_gumbel(ranked, temperature, seed)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 60), st.sampled_from([0.0, 5.0, 10.0, 12.5, 25.0, 33.3, 50.0]),
       st.sampled_from([0.0, 5.0, 10.0, 12.5, 25.0, 33.3, 50.0]), st.sampled_from(SEGMENT_LAYOUTS),
       st.integers(0, 2**31))
def test_segment_matches_plain_loop(n, first, last, layout, seed):
    scores = np.random.default_rng(seed).integers(0, max(n // 3, 1), n).astype(np.float64)
    ranked = sorted(range(n), key=lambda i: scores[i])
    order = _run("segment", scores, segment_percentages=(first, last), segment_layout=layout, seed=seed)
    first_part, middle, last_part = ref_segment_parts(ranked, first, last, layout)
    n_first, n_last = int(n * first // 100), int(n * last // 100)
    assert sorted(order) == list(range(n))
    assert set(order[n_first:n - n_last]) == middle
    if first_part is None:  # both from one end: together they hold that end
        assert set(order[:n_first]) | set(order[n - n_last:]) == last_part
    else:
        assert set(order[:n_first]) == first_part and set(order[n - n_last:]) == last_part


def test_the_largest_gumbel_temperature_draws_finite_keys(recwarn):
    """At the largest temperature allowed the keys stay finite: no overflow warning, a permutation."""
    from diversity_order.orderings.options import MAX_TEMPERATURE

    OrderingOptions(gumbel_temperature=MAX_TEMPERATURE).validate()
    order = _score_order("sorted", list(range(2000)), gumbel_temperature=MAX_TEMPERATURE, seed=3)
    assert sorted(order) == list(range(2000)) and not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_segment_that_rounds_to_no_documents_is_warned_of(caplog):
    """A reviewer's old relative setting 1,1 on 40 documents: both ends round down to none and the order was one
    shuffled segment, without a word."""
    import logging

    with caplog.at_level(logging.WARNING):
        order = _score_order("segment", list(range(40)), segment_percentages=(1.0, 1.0))
    assert sorted(order) == list(range(40))
    assert ("--segment-percentages 1,1 on 40 documents: the first and the last segments hold none (a segment holds "
            "floor(N x percent / 100) documents), so the order is the middle segment alone, shuffled") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        _score_order("segment", list(range(40)), segment_percentages=(10.0, 1.0))
        _score_order("segment", list(range(40)), segment_percentages=(0.0, 10.0))  # 0 asked: none meant
    assert caplog.text.count("--segment-percentages") == 1 and "10,1 on 40 documents: the last segment holds none" \
        in caplog.text


def test_settings_that_make_another_simpler_order_are_said(caplog):
    """A reviewer's --sections 1, --folds or --jitter-window past the documents were accepted without a word: the
    order was the ranked list, or a shuffle. Said now, the order unchanged; the defaults say nothing."""
    import logging

    n = 40
    ranked = list(range(n))
    cases = [("stair", {"sections": 1}, "--ordering stair: --sections 1: no section boundary, so the order is the "
                                        "ranked list"),
             ("folding", {"folds": 50}, "--ordering folding: --folds 50 on 40 documents deals them into folds of one "
                                        "document each, so the order is the ranked list"),
             ("zigzag", {"folds": 1}, "--folds 1 on 40 documents deals them into one fold"),
             ("saw", {"transition_ratio": 0.001}, "--transition-ratio 0.001 on 40 documents: transition regions of "
                                                  "none"),
             ("segment", {"jitter_window": 40}, "--jitter-window 40 on 40 documents: one block holds every "
                                                "document, so the order is a shuffle")]
    for name, flags, said in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            order = _score_order(name, ranked, **flags)
        assert said in caplog.text, name
        if "ranked list" in said:
            assert order == ranked
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for name in ("sorted", "folding", "zigzag", "segment", "stair", "saw"):
            _score_order(name, ranked)
    assert caplog.text == ""
