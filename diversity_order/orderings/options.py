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
        from ..errors import UserError

        percentages = self.segment_percentages
        checks = [
            (self.seq_len >= 1, f"--seq-len {self.seq_len}: must be at least 1 token"),
            (self.within_cluster_sort in WITHIN_CLUSTER_SORTS,
             f"--within-cluster-sort {self.within_cluster_sort}: choose one of {', '.join(WITHIN_CLUSTER_SORTS)}"),
            (self.length_bins >= 1, f"--length-bins {self.length_bins}: must be at least 1 (1 = off)"),
            (0 <= self.length_weight < math.inf,
             f"--length-weight {self.length_weight}: must be a finite number, 0 (off) or more"),
            (self.folds >= 1, f"--folds {self.folds}: must be at least 1"),
            (self.sections >= 1, f"--sections {self.sections}: must be at least 1"),
            (0 <= self.transition_ratio <= 0.5, f"--transition-ratio {self.transition_ratio}: must be within 0..0.5"),
            (len(percentages) >= 1 and all(0 < v < math.inf for v in percentages),
             "--segment-percentages: give one or more positive finite numbers, e.g. 30,40,30"),
            (self.jitter_window >= 0, f"--jitter-window {self.jitter_window}: must be 0 (off) or more"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)


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
