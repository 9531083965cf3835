"""Orderings: cluster labels and token counts in, a permutation of input positions out.

Every ordering has one signature, ``(labels, token_counts, n_clusters, options) -> int64
permutation`` (position i of the curated order holds input document ``order[i]``), and one
record in ``registry.REGISTRY``. Orderings never see the texts: only a few bytes per document
(score orderings: a score too), so one process can order the documents of many ranks.

- ``window_greedy``: stratified (the default), bin-packing, balanced;
- ``paced``: paced (count-paced clusters, token-paced pools, window-filling; then ``exchange``'s trades
  between nearby windows and, packing split, ``recut``'s re-cut long documents);
- ``token_share``: token-balanced;
- ``baselines``: original, random, round-robin;
- ``score``: the curriculum orderings (sorted, folding, zigzag, segment, stair, saw);
- ``pools``: cluster pools and the within-cluster sorts; ``options``: ``OrderingOptions``.
"""

from .baselines import original_order, random_order, round_robin_order
from .options import OrderingOptions
from .paced import paced_order
from .pools import WITHIN_CLUSTER_SORTS, cluster_pools
from .registry import (
    CLUSTER_ORDERINGS,
    ORDERINGS,
    REGISTRY,
    SCORE_ORDERINGS,
    SEQ_LEN_AWARE,
    SPECS,
    OrderingSpec,
    applicable_orderings,
    ordering_meta_name,
)
from .score import folding_order, saw_order, segment_order, sorted_order, stair_order, zigzag_order
from .token_share import length_bins, token_balanced_order
from .window_greedy import balanced_order, bin_packing_order, stratified_order

__all__ = [
    "CLUSTER_ORDERINGS", "ORDERINGS", "REGISTRY", "SCORE_ORDERINGS", "SEQ_LEN_AWARE", "SPECS", "WITHIN_CLUSTER_SORTS",
    "OrderingOptions", "OrderingSpec", "applicable_orderings", "balanced_order", "bin_packing_order", "cluster_pools",
    "folding_order", "length_bins", "ordering_meta_name", "original_order", "paced_order", "random_order", "round_robin_order",
    "saw_order", "segment_order", "sorted_order", "stair_order", "stratified_order", "token_balanced_order",
    "zigzag_order",
]
