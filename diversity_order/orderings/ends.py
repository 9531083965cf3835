"""Rule 11 of ``paced``: large documents moved off the ends of the finished order.

The boundary shift compares the cluster mix of the first and the last ``BOUNDARY_FRACTION`` of tokens (the
*stretches*). Rule 10 moves a large document inward in its cluster's pool, which keeps the pacing but cannot
always clear an end: where one cluster holds most of the tokens in a few huge documents, its pool has too few
short documents to be due at the head, so one of the huge ones is (seen on a corpus of 6,000 one-line records
and four whole packages, three of one cluster: one filled three quarters of the first stretch, and the shift
was 0.42 against a random shuffle's 0.74 and stratified's 0.03).

Here the order itself is changed: the first document of more than ``big_document_tokens`` that reaches into
the first stretch moves to the first place where it starts clear of it (the documents it passes move up by
its length), and the last one reaching into the last stretch to the last place where it ends clear of it;
one at a time, until none is left, none can move, an arrangement comes back or ``MAX_END_MOVES`` were made.
Of the arrangements met, the one with the fewest tokens of such documents inside the stretches is returned
(the first of equals), or None where that is the order as given. ``paced`` keeps it under rule 10's test.

O(N) per move (the token offsets), at most ``MAX_END_MOVES`` moves, and only where a large document reaches
into a stretch.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ..diversity import BOUNDARY_FRACTION

# At most this many moves (a move can bring another large document to an end).
MAX_END_MOVES = 32
# The stretch as a fraction p / q of the tokens: offsets are compared scaled by q, in integers, exactly.
_STRETCH = Fraction(BOUNDARY_FRACTION).limit_denominator(1000)


def _scaled_offsets(counts: np.ndarray) -> np.ndarray:
    """Each document's first token's offset, and the total last, times q."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return offsets * _STRETCH.denominator


def _stretch(offsets: np.ndarray) -> int:
    """The stretch's tokens times q (``offsets`` scaled)."""
    return int(offsets[-1]) // _STRETCH.denominator * _STRETCH.numerator


def tokens_in_stretches(order_counts: np.ndarray, big: float) -> int:
    """Tokens (times q) of documents of more than ``big`` tokens inside the first or last stretch of the order
    whose documents hold ``order_counts`` tokens, in order."""
    offsets = _scaled_offsets(order_counts)
    total, stretch = int(offsets[-1]), _stretch(offsets)
    starts, ends = offsets[:-1], offsets[1:]
    head = np.clip(np.minimum(ends, stretch) - starts, 0, None)
    tail = np.clip(ends - np.maximum(starts, total - stretch), 0, None)
    return int((head + tail)[order_counts > big].sum())


def _moved(order: np.ndarray, counts: np.ndarray, offsets: np.ndarray, p: int, from_head: bool) -> np.ndarray | None:
    """The order with the document at position ``p`` moved to the nearest place where it is clear of both
    stretches, or None where there is none (``offsets`` scaled)."""
    total, stretch = int(offsets[-1]), _stretch(offsets)
    t = int(offsets[p + 1] - offsets[p])
    rest = np.concatenate([offsets[:p], offsets[p + 1:-1] - t])  # the others' offsets, were p taken out
    clear = np.flatnonzero((rest >= stretch) & (rest + t <= total - stretch))  # starting there
    if not clear.size:
        return None
    place = int(clear[0] if from_head else clear[-1])
    return np.insert(np.delete(order, p), place, order[p])


def ends_moved(order: np.ndarray, token_counts: np.ndarray, big: float) -> np.ndarray | None:
    """Rule 11 (see the module doc) on ``order``, documents of more than ``big`` tokens moved; None where nothing
    better than ``order`` was found."""
    counts_all = np.asarray(token_counts, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    counts = counts_all[order]
    best, best_weight = None, tokens_in_stretches(counts, big)
    seen = {order.tobytes()}
    for _ in range(MAX_END_MOVES):
        if best_weight == 0:
            break
        offsets = _scaled_offsets(counts)
        total, stretch = int(offsets[-1]), _stretch(offsets)
        large = counts > big
        at_head = np.flatnonzero(large & (offsets[:-1] < stretch))[:1]
        at_tail = np.flatnonzero(large & (offsets[1:] > total - stretch))[-1:]
        moved = None
        for p, from_head in [(int(p), True) for p in at_head] + [(int(p), False) for p in at_tail]:
            moved = _moved(order, counts, offsets, p, from_head)
            if moved is not None:
                break
        if moved is None or moved.tobytes() in seen:
            break
        order = moved
        seen.add(order.tobytes())
        counts = counts_all[order]
        weight = tokens_in_stretches(counts, big)
        if weight < best_weight:
            best, best_weight = order.copy(), weight
    return best
