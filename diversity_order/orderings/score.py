"""Curriculum orderings from per-document scores (quality, difficulty, ...), low to high in several shapes.

From *Demystifying Data Organization for Enhanced LLM Training*: ``sorted`` (a plain curriculum),
``folding`` (L strided low-to-high passes, so easy data comes back), ``zigzag`` (folding with
every other pass reversed, so passes join smoothly), ``segment`` (score segments, each
shuffled), ``stair`` and ``saw`` (sorted, with the steps between score sections blended by
folding or zig-zag). Each may end with a local shuffle (``--jitter-window``). They ignore
clusters, so windows are no more diverse than the input's.
"""

from __future__ import annotations

import numpy as np

from .options import OrderingOptions


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
    """Shuffle inside consecutive blocks of ``window`` documents (local diversity)."""
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
    """Saw (SAW): like stair, with zig-zag transition regions."""
    n = np.asarray(labels).shape[0]
    ordered = _stable_and_transitions(_by_score(options, n), options, zigzag=True)
    return _jitter(ordered, options.jitter_window, options.seed)
