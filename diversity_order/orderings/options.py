"""``OrderingOptions``: everything an ordering may read besides labels and token counts.

Each field that is a command-line flag carries its flag name and help text in its metadata,
so ``curate_dataset.py`` builds its ordering flags (names, defaults, help) from this class and
the registry names, per flag, the orderings that read it.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field, fields

import numpy as np

from ..defaults import DEFAULT_SEED, DEFAULT_SEQ_LEN

WITHIN_CLUSTER_SORTS = ("original", "length-asc", "length-desc", "length-riffle", "random")


def _flag(default, flag: str, help: str, **argparse_kwargs):
    """A field set by ``flag`` on the command line (argparse keywords beyond default and help ride along)."""
    return field(default=default, metadata={"flag": flag, "help": help, "argparse": argparse_kwargs})


def _percentages(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas, e.g. 30,40,30") from None


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
    balance_fields: tuple[str, ...] = _flag(
        (), "--balance-field",
        "categorical JSON field (source, language, ...) to balance as well as clusters; repeatable",
        metavar="NAME", action="append")
    length_bins: int = _flag(16, "--length-bins", "document-length quantile bins balanced with the clusters (1 = off)")
    length_weight: float = _flag(1.0, "--length-weight", "weight lambda of the length-bin term")
    folds: int = _flag(3, "--folds", "number of folds L")
    sections: int = _flag(3, "--sections", "number of score sections K (K-1 transitions)")
    transition_ratio: float = _flag(
        0.1, "--transition-ratio",
        "transition region on each side of a section boundary, as a fraction rho of a section")
    segment_percentages: tuple[float, ...] = _flag(
        (30.0, 40.0, 30.0), "--segment-percentages", "sizes of the score segments, low to high",
        metavar="P,P,...", type=_percentages)
    jitter_window: int = _flag(0, "--jitter-window", "shuffle inside consecutive blocks of W documents (0 = off)",
                               metavar="W")
    # Read from the records at run time (--score-field, --balance-field), not flags themselves:
    # one float per document, and N x F category ids, with the categories' weight.
    scores: np.ndarray | None = field(default=None, compare=False, repr=False)
    balance_groups: np.ndarray | None = field(default=None, compare=False, repr=False)
    balance_weight: float = 1.0

    def validate(self) -> None:
        """Raise a UserError naming the flag of the first option out of range."""
        from ..errors import MAX_COUNT, UserError, check_range

        check_range(self.seq_len, "--seq-len", 1, MAX_COUNT, "tokens")
        check_range(self.seed, "--seed", 0, 2**32 - 1)
        if self.within_cluster_sort not in WITHIN_CLUSTER_SORTS:
            raise UserError(f"--within-cluster-sort {self.within_cluster_sort}: choose one of "
                            f"{', '.join(WITHIN_CLUSTER_SORTS)}")
        check_range(self.length_bins, "--length-bins", 1, 2**20, "1 = off")
        check_range(self.length_weight, "--length-weight", 0, math.inf, "0 = off")
        check_range(self.folds, "--folds", 1, MAX_COUNT)
        check_range(self.sections, "--sections", 1, MAX_COUNT)
        check_range(self.transition_ratio, "--transition-ratio", 0, 0.5)
        check_range(self.jitter_window, "--jitter-window", 0, MAX_COUNT, "0 = off")
        percentages = self.segment_percentages
        if not (len(percentages) >= 1 and all(0 < v < math.inf for v in percentages)):
            raise UserError("--segment-percentages: give one or more positive finite numbers, e.g. 30,40,30")


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
