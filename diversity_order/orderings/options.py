"""``OrderingOptions``: everything an ordering may read besides labels and token counts.

Each field that is a command-line flag carries its flag name and help text in its metadata,
so ``curate_dataset.py`` builds its ordering flags (names, defaults, help) from this class and
the registry names, per flag, the orderings that read it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, fields, replace

import numpy as np

from ..defaults import DEFAULT_SEED, DEFAULT_SEQ_LEN

WITHIN_CLUSTER_SORTS = ("original", "length-asc", "length-desc", "length-riffle", "random")
SCORE_ORDERS = ("ascending", "descending")
# Which score end the first and the last segment of ``segment`` come from; "low-low" and "high-high"
# take both from one end (its FIRST + LAST percent, split between the two at random).
SEGMENT_LAYOUTS = ("low-high", "high-low", "low-low", "high-high")

# Options whose default depends on the ordering: the settings the paper's authors released with
# their code (one config per ordering). An option left unset (None) takes the value of the ordering
# that runs; ``OrderingOptions.for_ordering`` fills it in.
PER_ORDERING_DEFAULTS: dict[str, dict[str, int | float]] = {
    "folds": {"folding": 5, "zigzag": 5, "stair": 3, "saw": 2},
    "sections": {"stair": 2, "saw": 3},
    "transition_ratio": {"stair": 0.225, "saw": 0.075},
}


def _per_ordering_default(option: str) -> str:
    """The help text's "(default: 5 for folding/zigzag, 3 for stair, 2 for saw)" of ``option``."""
    by_value: dict = {}
    for ordering, value in PER_ORDERING_DEFAULTS[option].items():
        by_value.setdefault(value, []).append(ordering)
    return "(default: " + ", ".join(f"{value:g} for {'/'.join(names)}" for value, names in by_value.items()) + ")"


def _flag(default, flag: str, help: str, **argparse_kwargs):
    """A field set by ``flag`` on the command line (argparse keywords beyond default and help ride along)."""
    return field(default=default, metadata={"flag": flag, "help": help, "argparse": argparse_kwargs})


def _percentages(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas, e.g. 10,10") from None


@dataclass(frozen=True)
class OrderingOptions:
    """What the orderings read; each uses only the fields the registry lists for it."""

    within_cluster_sort: str = _flag(
        "original", "--within-cluster-sort",
        "order of documents inside each cluster's pool (random is a seeded shuffle)", choices=WITHIN_CLUSTER_SORTS)
    # The trainer's packed sequence length: window-aware orderings simulate its windows.
    seq_len: int = DEFAULT_SEQ_LEN
    seed: int = DEFAULT_SEED
    # How the trainer fills its windows (packing.PACKING_MODELS): documents whole, or split.
    packing: str = "whole"
    score_field: str | None = _flag(
        None, "--score-field", "numeric JSON field holding the per-document score of the score-based orderings",
        metavar="NAME")
    score_default: float | None = _flag(
        None, "--score-default",
        "score given to records whose --score-field holds no finite number (missing, null, text); default: such "
        "records are an error", type=float, metavar="X")
    balance_fields: tuple[str, ...] = _flag(
        (), "--balance-field",
        "categorical JSON field (source, language, ...) to balance as well as clusters; repeatable",
        metavar="NAME", action="append")
    length_bins: int = _flag(16, "--length-bins", "document-length quantile bins balanced with the clusters (1 = off)")
    length_weight: float = _flag(1.0, "--length-weight", "weight lambda of the length-bin term")
    score_order: str = _flag(
        "ascending", "--score-order",
        "rank documents by ascending score (low first) or descending (high first); segment picks its ends "
        "with --segment-layout", choices=SCORE_ORDERS)
    gumbel_temperature: float = _flag(
        0.0, "--gumbel-temperature",
        "add TAU times seeded Gumbel noise to each document's rank and sort again, so documents trade places "
        "with near neighbours (0 = off)", metavar="TAU")
    # None: the ordering's own default (PER_ORDERING_DEFAULTS).
    folds: int | None = _flag(None, "--folds", f"number of folds L {_per_ordering_default('folds')}",
                              type=int, metavar="L")
    sections: int | None = _flag(
        None, "--sections", f"number of score sections K, K-1 transitions {_per_ordering_default('sections')}",
        type=int, metavar="K")
    transition_ratio: float | None = _flag(
        None, "--transition-ratio",
        "radius r of the transition region around each section boundary, as a fraction of all documents: "
        f"round(r * N) on either side {_per_ordering_default('transition_ratio')}", type=float, metavar="R")
    segment_percentages: tuple[float, ...] = _flag(
        (10.0, 10.0), "--segment-percentages",
        "percent of the documents in the first and in the last segment; the middle segment holds the rest "
        "(FIRST,MIDDLE,LAST adding up to 100 is read the same way)", metavar="FIRST,LAST", type=_percentages)
    segment_layout: str = _flag(
        "low-high", "--segment-layout",
        "score ends the first and last segments come from: low-high (lowest first, highest last), high-low, "
        "or both from one end (low-low, high-high: that end's FIRST+LAST percent, split at random)",
        choices=SEGMENT_LAYOUTS)
    jitter_window: int = _flag(0, "--jitter-window", "shuffle inside consecutive blocks of W documents (0 = off)",
                               metavar="W")
    # Read from the records at run time (--score-field, --balance-field), not flags themselves:
    # one float per document, and N x F category ids, with the categories' weight.
    scores: np.ndarray | None = field(default=None, compare=False, repr=False)
    balance_groups: np.ndarray | None = field(default=None, compare=False, repr=False)
    balance_weight: float = 1.0

    def validate(self) -> None:
        """Raise a UserError naming the flag of the first option out of range."""
        from ..defaults import MAX_SEED
        from ..errors import MAX_COUNT, UserError, check_range

        check_range(self.seq_len, "--seq-len", 1, MAX_COUNT, "tokens")
        check_range(self.seed, "--seed", 0, MAX_SEED)
        from ..packing import PACKING_MODELS

        if self.packing not in PACKING_MODELS:
            raise UserError(f"--packing {self.packing}: choose one of {', '.join(PACKING_MODELS)}")
        if self.within_cluster_sort not in WITHIN_CLUSTER_SORTS:
            raise UserError(f"--within-cluster-sort {self.within_cluster_sort}: choose one of "
                            f"{', '.join(WITHIN_CLUSTER_SORTS)}")
        check_range(self.length_bins, "--length-bins", 1, 2**20, "1 = off")
        check_range(self.length_weight, "--length-weight", 0, math.inf, "0 = off")
        if self.folds is not None:
            check_range(self.folds, "--folds", 1, MAX_COUNT)
        if self.sections is not None:
            check_range(self.sections, "--sections", 1, MAX_COUNT)
        if self.transition_ratio is not None:
            check_range(self.transition_ratio, "--transition-ratio", 0, 1, "a fraction of all documents")
        check_range(self.jitter_window, "--jitter-window", 0, MAX_COUNT, "0 = off")
        if self.score_default is not None and not math.isfinite(self.score_default):
            raise UserError(f"--score-default {self.score_default}: give a finite number")
        if self.score_order not in SCORE_ORDERS:
            raise UserError(f"--score-order {self.score_order}: choose one of {', '.join(SCORE_ORDERS)}")
        # Past MAX_TEMPERATURE the noise times it overflows a float; long before, the order is a shuffle.
        check_range(self.gumbel_temperature, "--gumbel-temperature", 0, MAX_TEMPERATURE, "0 = off; larger values "
                    "shuffle all the same")
        if self.segment_layout not in SEGMENT_LAYOUTS:
            raise UserError(f"--segment-layout {self.segment_layout}: choose one of {', '.join(SEGMENT_LAYOUTS)}")
        _check_segment_percentages(self.segment_percentages)

    def for_ordering(self, ordering: str) -> OrderingOptions:
        """These options as ``ordering`` runs with them: each unset per-ordering option takes its default."""
        unset = {option: by_ordering[ordering] for option, by_ordering in PER_ORDERING_DEFAULTS.items()
                 if getattr(self, option) is None and ordering in by_ordering}
        return replace(self, **unset) if unset else self


# The largest --gumbel-temperature: its noise (a Gumbel draw is below 100 for any float the generator gives)
# stays finite.
MAX_TEMPERATURE = 1e300


def _check_segment_percentages(percentages: tuple[float, ...]) -> None:
    """FIRST,LAST (or FIRST,MIDDLE,LAST adding up to 100), percent of the documents, FIRST + LAST at most 100."""
    from ..errors import UserError

    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in percentages)
    text = ",".join(f"{v:g}" if numbers else str(v) for v in percentages)
    if len(percentages) not in (2, 3):
        raise UserError(f"--segment-percentages {text}: give FIRST,LAST, the percent of the documents in the first "
                        "and in the last segment (the middle holds the rest), e.g. 10,10")
    if not (numbers and all(0 <= v <= 100 for v in percentages)):
        raise UserError(f"--segment-percentages {text}: each value must be a percentage within 0..100")
    total = sum(percentages)
    if len(percentages) == 3 and not math.isclose(total, 100, abs_tol=1e-9):
        # Before, three values were relative sizes: say what they meant as FIRST,LAST.
        meant = (f" (as relative sizes they meant FIRST,LAST = {100 * percentages[0] / total:.4g},"
                 f"{100 * percentages[2] / total:.4g})" if total > 0 else "")
        raise UserError(f"--segment-percentages {text}: FIRST,MIDDLE,LAST must add up to 100, as they are percent of "
                        f"the documents{meant}")
    if percentages[0] + percentages[-1] > 100:
        raise UserError(f"--segment-percentages {text}: the first and last segments hold more than 100 percent")


def flag_fields() -> list:
    """The dataclass fields of ``OrderingOptions`` that are command-line flags, in declaration order."""
    return [f for f in fields(OrderingOptions) if "flag" in f.metadata]


def flag_of(name: str) -> str:
    """The command-line flag of the option ``name`` (e.g. "--folds")."""
    return next(f.metadata["flag"] for f in flag_fields() if f.name == name)


def flag_value(options: OrderingOptions, name: str):
    """The option's value as JSON shows it (tuples as lists)."""
    value = getattr(options, name)
    return list(value) if isinstance(value, tuple) else value
