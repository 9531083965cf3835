"""The registry: one record per ordering, and everything that lists orderings derives from it.

A record names the ordering, its function, its family (cluster orderings read labels; score
orderings read ``--score-field``), which ``OrderingOptions`` flags it reads, whether it depends
on ``--seq-len``, the name the metadata records, its line style in the comparison plot and a
one-line summary for ``--help``. The command line's choices, the "flag X is not read by
ordering Y" warnings, the options stored in the metadata and the comparison report, and the
plot styles all come from here: adding an ordering is one function and one line below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .baselines import original_order, random_order, round_robin_order
from .options import PER_ORDERING_DEFAULTS, OrderingOptions, flag_fields, flag_value
from .paced import paced_order
from .polish import paced_polished_order
from .score import folding_order, saw_order, segment_order, sorted_order, stair_order, zigzag_order
from .token_share import token_balanced_order
from .window_greedy import balanced_order, bin_packing_order, stratified_order

Ordering = Callable[[np.ndarray, np.ndarray, int, OrderingOptions], np.ndarray]

CLUSTER = "cluster"
SCORE = "score"
_SCORE_READS = ("score_field", "score_default", "jitter_window")
_RANKED = (*_SCORE_READS, "score_order")  # every score ordering but segment, whose layout picks the ends


@dataclass(frozen=True)
class OrderingSpec:
    name: str
    function: Ordering
    family: str  # CLUSTER or SCORE
    summary: str  # one line for --help
    reads: tuple[str, ...] = ()  # OrderingOptions flag fields it reads
    seq_len_aware: bool = False  # its output depends on --seq-len (it simulates the trainer's windows)
    meta_name: str = ""  # the metadata's "ordering" value; empty: the name
    color: str = "#444444"  # in the comparison plot
    line: str = "-"
    highlight: bool = False  # drawn thick in the comparison plot

    @property
    def recorded_name(self) -> str:
        return self.meta_name or self.name


REGISTRY: tuple[OrderingSpec, ...] = (
    OrderingSpec("stratified", stratified_order, CLUSTER,
                 "the original toolkit's greedy: the next document from the cluster most behind its document share",
                 ("within_cluster_sort",), meta_name="stratified_greedy", color="#ff7f0e", highlight=True),
    OrderingSpec("balanced", balanced_order, CLUSTER,
                 "each cluster (and --balance-field category) spread evenly over the stream: steadier token shares "
                 "than a random shuffle, little head-to-tail drift, but fewer clusters per window than stratified on "
                 "heavy-tailed data", ("balance_fields",), seq_len_aware=True, color="#1f77b4",
                 highlight=True),
    OrderingSpec("paced", paced_order, CLUSTER,
                 "as many clusters per window as stratified, the head of the order like its tail, long documents "
                 "spread by token share, documents traded between nearby windows to steady token shares (packed "
                 "split, across window cuts too); honours the packing model", seq_len_aware=True, color="#c51b7d",
                 highlight=True),
    OrderingSpec("paced-polished", paced_polished_order, CLUSTER,
                 "paced, then documents trade places where that steadies token shares without losing clusters "
                 "(packed whole: between adjacent windows; split: one more sweep of paced's trades across window "
                 "cuts); slightly steadier shares than paced for up to twice its run time", seq_len_aware=True,
                 color="#e7298a", line="--"),
    OrderingSpec("token-balanced", token_balanced_order, CLUSTER,
                 "keeps every cluster's (length bin's, balance field's) token share on track",
                 ("length_bins", "length_weight", "balance_fields"), color="#2ca02c"),
    OrderingSpec("bin-packing", bin_packing_order, CLUSTER, "fills each window with clusters it lacks, fullest pool first",
                 ("within_cluster_sort",), seq_len_aware=True, color="#d62728"),
    OrderingSpec("round-robin", round_robin_order, CLUSTER, "one document from each cluster in turn",
                 ("within_cluster_sort",), color="#9467bd"),
    OrderingSpec("random", random_order, CLUSTER, "a seeded shuffle", color="#222222", line="--", highlight=True),
    OrderingSpec("original", original_order, CLUSTER, "the input order", color="#8c564b"),
    OrderingSpec("sorted", sorted_order, SCORE, "ranked by score, optionally with Gumbel noise on the ranks",
                 (*_RANKED, "gumbel_temperature"), color="#e377c2", line=":"),
    OrderingSpec("folding", folding_order, SCORE, "L strided passes over the score range", (*_RANKED, "folds"),
                 color="#7f7f7f", line=":"),
    OrderingSpec("zigzag", zigzag_order, SCORE, "folding with every other pass reversed", (*_RANKED, "folds"),
                 color="#bcbd22", line=":"),
    OrderingSpec("segment", segment_order, SCORE,
                 "a first and a last segment from the score ends, the rest between, each shuffled",
                 (*_SCORE_READS, "segment_percentages", "segment_layout"), color="#17becf", line=":"),
    OrderingSpec("stair", stair_order, SCORE, "sorted, score sections blended by folding at their boundaries",
                 (*_RANKED, "folds", "sections", "transition_ratio"), color="#393b79", line=":"),
    OrderingSpec("saw", saw_order, SCORE, "sorted, score sections blended by zig-zag at their boundaries",
                 (*_RANKED, "folds", "sections", "transition_ratio"), color="#ad494a", line=":"),
)

SPECS: dict[str, OrderingSpec] = {spec.name: spec for spec in REGISTRY}
# User-facing name -> function; the scripts' --ordering choices are read from here.
ORDERINGS: dict[str, Ordering] = {spec.name: spec.function for spec in REGISTRY}
SCORE_ORDERINGS = tuple(spec.name for spec in REGISTRY if spec.family == SCORE)
CLUSTER_ORDERINGS = tuple(spec.name for spec in REGISTRY if spec.family == CLUSTER)
SEQ_LEN_AWARE = tuple(spec.name for spec in REGISTRY if spec.seq_len_aware)


def ordering_meta_name(name: str) -> str:
    """The name recorded in the metadata's "ordering" key (stratified: "stratified_greedy", as the original)."""
    return SPECS[name].recorded_name


def readers(option: str) -> tuple[str, ...]:
    """The orderings that read the flag field ``option`` of OrderingOptions."""
    return tuple(spec.name for spec in REGISTRY if option in spec.reads)


def unused_flags(name: str, options: OrderingOptions) -> list[tuple[str, tuple[str, ...]]]:
    """(flag, its readers) for each flag set away from its default that ordering ``name`` does not read."""
    defaults = OrderingOptions()
    return [(f.metadata["flag"], readers(f.name)) for f in flag_fields()
            if getattr(options, f.name) != getattr(defaults, f.name) and f.name not in SPECS[name].reads]


def options_meta(name: str, options: OrderingOptions) -> dict:
    """The flags that shaped ordering ``name`` (only those it reads, and seq_len if it reads windows), with the
    values it ran with (an unset per-ordering option as its default for ``name``)."""
    spec = SPECS[name]
    options = options.for_ordering(name)
    meta = {f.name: flag_value(options, f.name) for f in flag_fields() if f.name in spec.reads}
    if spec.seq_len_aware:
        meta["seq_len"] = options.seq_len
    return meta


def comparison_options(options: OrderingOptions, names: list[str] = ()) -> dict:
    """The packing model, every ordering flag and the seed: what shaped a comparison of all orderings; and under
    ``per_ordering``, the options each of ``names`` takes its own value of (``--folds`` left unset: 5 for folding,
    2 for saw), as it ran with them."""
    per_ordering = {name: {option: flag_value(options.for_ordering(name), option) for option, by_ordering in
                           PER_ORDERING_DEFAULTS.items() if name in by_ordering} for name in names}
    return {"packing": options.packing, **{f.name: flag_value(options, f.name) for f in flag_fields()},
            "seed": options.seed, "per_ordering": {name: values for name, values in per_ordering.items() if values}}


def applicable_orderings(have_scores: bool) -> list[str]:
    """Every registered ordering, score-based ones only when there are scores."""
    return [spec.name for spec in REGISTRY if have_scores or spec.family == CLUSTER]
