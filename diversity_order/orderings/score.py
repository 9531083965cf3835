"""Curriculum orderings from per-document scores (quality, difficulty, ...), in several shapes.

From *Demystifying Data Organization for Enhanced LLM Training*, with the definitions and default
settings of the code its authors released: ``sorted`` (a plain curriculum, optionally with Gumbel
noise on the ranks), ``folding`` (L strided passes over the score range, so easy data comes back),
``zigzag`` (folding with every other pass reversed, so passes join smoothly), ``segment`` (a first
and a last segment taken from the score ends, a middle one between, each shuffled), ``stair`` and
``saw`` (sorted, with the steps between score sections blended by folding or zig-zag). All but
``segment`` rank by ascending or descending score (``--score-order``); each may end with a local
shuffle (``--jitter-window``). They ignore clusters, so windows are no more diverse than the input's.

Ties keep input order. Each ordering draws all its random numbers from one generator seeded with
``--seed``, in turn (Gumbel noise or segment shuffles first, then the jitter), so no two random
steps reuse the same numbers.
"""

from __future__ import annotations

import logging

import numpy as np

from .. import arrays
from .options import OrderingOptions

log = logging.getLogger(__name__)


def _by_score(options: OrderingOptions, n: int, descending: bool = False) -> np.ndarray:
    """Input positions by ascending (or descending) score; equal scores keep input order."""
    if options.scores is None:
        raise ValueError("score-based orderings need per-document scores (--score-field)")
    scores = np.asarray(options.scores, dtype=np.float64)
    if scores.shape != (n,):
        raise ValueError(f"{scores.shape[0]} scores for {n} documents")
    return np.argsort(-scores if descending else scores, kind="stable").astype(np.int64)


def _ranked(options: OrderingOptions, n: int) -> np.ndarray:
    """Input positions in ``--score-order``."""
    return _by_score(options, n, descending=options.score_order == "descending")


def _folds(ranked: np.ndarray, n_folds: int, zigzag: bool) -> np.ndarray:
    """Deal the ranked list into ``n_folds`` strided folds (i -> fold i % L), concatenated.

    Each fold is a pass over the whole score range, so the order revisits easy data L times
    (cyclic scheduling). With ``zigzag`` every odd fold runs the other way, so consecutive
    folds meet at similar scores (curriculum continuity).
    """
    n = ranked.size
    n_folds = max(1, min(int(n_folds), max(n, 1)))
    rank = np.arange(n)
    fold = rank % n_folds
    within = rank // n_folds
    if zigzag:
        within = np.where(fold % 2 == 1, -within, within)
    return ranked[np.lexsort((within, fold))]


def _gumbel(order: np.ndarray, temperature: float, rng: np.random.Generator) -> np.ndarray:
    """Add ``temperature`` times a standard Gumbel draw to each position and sort by the sums.

    A document moves past a neighbour d places away only when their noise differs by more than
    d / temperature, so small temperatures swap near neighbours and large ones approach a shuffle.
    Equal sums keep their order; temperature 0 draws nothing and changes nothing.
    """
    if temperature <= 0 or order.size <= 1:
        return order
    noisy = np.arange(order.size) + temperature * rng.gumbel(size=order.size)
    return order[np.argsort(noisy, kind="stable")]


def _jitter(order: np.ndarray, window: int, rng: np.random.Generator) -> np.ndarray:
    """Shuffle inside consecutive blocks of ``window`` documents (local diversity)."""
    if window <= 1 or order.size <= 1:
        return order
    block = np.arange(order.size) // int(window)
    noise = rng.random(order.size)
    return order[np.lexsort((noise, block))]


def _warn_if_degenerate(name: str, n: int, options: OrderingOptions) -> None:
    """Settings that make ``name``'s order another, simpler one on ``n`` documents are said (they were accepted
    without a word): folds of one document each or one fold, no section boundary or no transition region (the
    ranked list), a jitter block holding every document (a shuffle)."""
    if n <= 1:
        return
    said = []
    # (folds are unset for the orderings that take none; stair and saw fold only their transition regions, where
    # more folds than documents is no sign)
    one_per_fold = name in ("folding", "zigzag") and options.folds >= n
    if name in ("folding", "zigzag", "stair", "saw") and (options.folds <= 1 or one_per_fold):
        said.append(f"--folds {options.folds} on {n} documents deals them into "
                    + ("one fold" if options.folds <= 1 else "folds of one document each"))
    if name in ("stair", "saw") and (options.sections <= 1 or round(n * options.transition_ratio) == 0):
        said.append(f"--sections {options.sections}: no section boundary" if options.sections <= 1 else
                    f"--transition-ratio {options.transition_ratio:g} on {n} documents: transition regions of none")
    if said:
        log.warning("--ordering %s: %s, so the order is the ranked list (as --ordering sorted gives it)", name,
                    "; ".join(said))
    if options.jitter_window >= n:
        log.warning("--jitter-window %i on %d documents: one block holds every document, so the order is a "
                    "shuffle", options.jitter_window, n)


def _rng(options: OrderingOptions) -> np.random.Generator:
    return np.random.default_rng(options.seed)


def sorted_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Curriculum: ranked by score, ``--gumbel-temperature`` noise on the ranks, then ``--jitter-window``."""
    n = np.asarray(labels).shape[0]
    _warn_if_degenerate("sorted", n, options)
    rng = _rng(options)
    noisy = _gumbel(_ranked(options, n), options.gumbel_temperature, rng)
    return _jitter(noisy, options.jitter_window, rng)


def folding_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Folding (FO): L = ``folds`` strided passes (default 5)."""
    options = options.for_ordering("folding")
    n = np.asarray(labels).shape[0]
    _warn_if_degenerate("folding", n, options)
    return _jitter(_folds(_ranked(options, n), options.folds, zigzag=False), options.jitter_window, _rng(options))


def zigzag_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Zig-zag (ZIG): folding with every other fold reversed, so folds join smoothly (default L = 5)."""
    options = options.for_ordering("zigzag")
    n = np.asarray(labels).shape[0]
    _warn_if_degenerate("zigzag", n, options)
    return _jitter(_folds(_ranked(options, n), options.folds, zigzag=True), options.jitter_window, _rng(options))


def _segment_sizes(n: int, percentages: tuple[float, ...]) -> tuple[int, int]:
    """Documents in the first and in the last segment: floor(n * p / 100) each; the middle holds the rest."""
    first = int(n * float(percentages[0]) // 100)
    last = int(n * float(percentages[-1]) // 100)
    first = min(first, n)
    return first, min(last, n - first)  # only float rounding could make them overfill n


def _warn_of_empty_ends(n: int, percentages: tuple[float, ...], n_first: int, n_last: int) -> None:
    """An end segment asked for (a percentage above 0) that holds no document: said (old relative sizes such as 1,1
    read as percentages of a few documents made the order one shuffle)."""
    empty = [end for end, asked, held in (("first", percentages[0], n_first), ("last", percentages[-1], n_last))
             if asked > 0 and not held]
    if n and empty:
        said = "the first and the last segments hold" if len(empty) > 1 else f"the {empty[0]} segment holds"
        log.warning("--segment-percentages %s on %d documents: %s none (a segment holds floor(N x percent / 100) "
                    "documents), so the order is %s", ",".join(f"{v:g}" for v in percentages), n, said,
                    "the middle segment alone, shuffled" if len(empty) > 1 else "two segments, not three")


def segment_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Segments (SEG): a first segment, a middle one and a last one, each shuffled.

    With the default layout ``low-high`` the first segment holds the lowest FIRST percent of the
    scores, the last the highest LAST percent, and the middle the rest; ``high-low`` swaps the
    ends. ``low-low`` and ``high-high`` take FIRST + LAST percent from one end and split them at
    random: FIRST percent go first, the others last, and the middle holds the other end's rest.
    Always ranked from low to high score (the layout says which end goes where).
    """
    n = np.asarray(labels).shape[0]
    _warn_if_degenerate("segment", n, options)
    by_score = _by_score(options, n)
    n_first, n_last = _segment_sizes(n, options.segment_percentages)
    _warn_of_empty_ends(n, options.segment_percentages, n_first, n_last)
    first_end, last_end = options.segment_layout.split("-")
    rng = _rng(options)
    noise = rng.random(n)  # each segment in the order of these random keys
    rank = np.arange(n)
    part = np.ones(n, dtype=np.int64)  # 0 first, 1 middle, 2 last, by score rank
    if first_end == last_end:
        pool = rank[:n_first + n_last] if first_end == "low" else rank[n - n_first - n_last:]
        shuffled = pool[np.argsort(noise[pool], kind="stable")]
        part[shuffled[:n_first]] = 0
        part[shuffled[n_first:]] = 2
    else:
        low, high = (0, 2) if first_end == "low" else (2, 0)
        n_low, n_high = (n_first, n_last) if first_end == "low" else (n_last, n_first)
        part[:n_low] = low
        part[n - n_high:] = high  # n_low + n_high <= n, so the two never overlap
    ordered = by_score[np.lexsort((noise, part))]
    return _jitter(ordered, options.jitter_window, rng)


def _round_half_even(numerator, denominator: int):
    """numerator / denominator (whole numbers, or an array of them) to the nearest whole number, halves
    to the even one, in exact integer arithmetic."""
    quotient, remainder = divmod(numerator, denominator)
    twice = 2 * remainder
    return quotient + ((twice > denominator) | ((twice == denominator) & (quotient % 2 == 1)))


def _section_bounds(n: int, n_sections: int) -> np.ndarray:
    """The distinct inner section boundaries n * s / K, s = 1..K-1, each rounded halves to even."""
    if n_sections - 1 <= n + 1:
        return arrays.distinct(_round_half_even(n * np.arange(1, n_sections, dtype=np.int64), n_sections))
    # More boundaries than documents: neighbours lie less than one document apart, so the rounded
    # boundaries are every whole number from the first to the last.
    first, last = _round_half_even(n, n_sections), _round_half_even(n * (n_sections - 1), n_sections)
    return np.arange(first, last + 1, dtype=np.int64)


def _stable_and_transitions(ranked: np.ndarray, n_sections: int, transition_ratio: float, n_folds: int,
                            zigzag: bool) -> np.ndarray:
    """Sorted, with a transition region around each of the K-1 section boundaries.

    The boundaries are n * s / K (s = 1..K-1) rounded, the radius R = round(r * n) rounded too
    (halves to even): a fraction r of all documents, whatever K. Around boundary b the region
    [b - R, b + R) is dealt into L folds (stair) or zig-zag folds (saw), so scores from both sides
    of the step interleave instead of jumping; the rest stays sorted. Regions are cut at both ends
    of the list, and a region that would reach back into the previous one starts where it ends.
    """
    n = ranked.size
    if n == 0 or n_sections <= 1 or transition_ratio <= 0:
        return ranked
    radius = round(n * float(transition_ratio))
    bounds = _section_bounds(n, int(n_sections))
    ends = np.minimum(n, bounds + radius)  # never decreasing, as the boundaries
    starts = np.maximum(np.concatenate(([0], ends[:-1])), bounds - radius)
    out = ranked.copy()
    for start, end in zip(starts.tolist(), ends.tolist()):
        if end - start > 2:  # folds of one or two documents keep their order
            out[start:end] = _folds(ranked[start:end], n_folds, zigzag)
    return out


def _blended(options: OrderingOptions, name: str, labels, zigzag: bool) -> np.ndarray:
    options = options.for_ordering(name)
    _warn_if_degenerate(name, np.asarray(labels).shape[0], options)
    ranked = _ranked(options, np.asarray(labels).shape[0])
    ordered = _stable_and_transitions(ranked, options.sections, options.transition_ratio, options.folds, zigzag)
    return _jitter(ordered, options.jitter_window, _rng(options))


def stair_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Stair (STR): K score sections as steps, folded transition regions between them, then jitter
    (defaults K = 2, L = 3, r = 0.225)."""
    return _blended(options, "stair", labels, zigzag=False)


def saw_order(labels, token_counts, n_clusters, options: OrderingOptions = OrderingOptions()) -> np.ndarray:
    """Saw (SAW): like stair, with zig-zag transition regions (defaults K = 3, L = 2, r = 0.075)."""
    return _blended(options, "saw", labels, zigzag=True)
