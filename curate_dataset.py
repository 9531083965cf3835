#!/usr/bin/env python3
"""Reorder a JSONL dataset so every packed training sequence holds as many topic clusters as possible.

Stages: index the input -> token counts and shallow embeddings (cached, incremental) ->
optional PCA -> MiniBatchKMeans -> ordering (stratified greedy by default) -> window diversity before/after ->
curated JSONL, metadata, labels/order arrays and plots. See README.md for every flag and file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diversity_order.cli import ArgumentParser, add_output_flags, run_main, setup_logging
from diversity_order.clustering import CLUSTER_BACKENDS
from diversity_order.curate import CurateConfig, curate
from diversity_order.ordering import ORDERINGS, WITHIN_CLUSTER_SORTS


def _percentages(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers separated by commas, e.g. 30,40,30") from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__)
    p.add_argument("--input", required=True, type=Path, help="input JSONL, one JSON object per line")
    p.add_argument("--output", required=True, type=Path, help="curated JSONL to write (caches and metadata go beside it)")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="local Hugging Face model folder (tokenizer + safetensors with the input-embedding table); "
                        "with --load-embeddings only the tokenizer is needed, and only for records whose token "
                        "counts are not cached")
    p.add_argument("--device", default="auto", help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--gpu", type=int, default=0, help="GPU index used when the device is CUDA (default: 0)")
    p.add_argument("--embed-batch-size", type=int, default=1024,
                   help="documents tokenized and pooled together (default: 1024)")
    p.add_argument("--n-clusters", type=int, default=30, help="number of k-means clusters (default: 30)")
    p.add_argument("--seq-len", type=int, nargs="+", default=[131072], metavar="TOKENS",
                   help="training sequence length in tokens (default: 131072); with --compare-strategies several "
                        "values may be given, and the curated file follows the first")
    p.add_argument("--text-field", default="text", help="JSON field holding the document text (default: text)")
    p.add_argument("--stats-only", action="store_true", help="compute and report everything but do not write the curated JSONL")
    p.add_argument("--calibrate-k", action="store_true",
                   help="sweep k = 5..100, report silhouette scores and a recommended k, then exit")
    p.add_argument("--calibrate-k-samples", type=int, default=10000,
                   help="rows sampled for the silhouette during --calibrate-k (0 = all; default: 10000)")
    p.add_argument("--no-plot", action="store_true", help="skip ordering_comparison.png and cluster_cloud.png")
    g = p.add_argument_group("ordering (see README: 'Choosing an ordering')")
    g.add_argument("--within-cluster-sort", default="original", choices=WITHIN_CLUSTER_SORTS,
                   help="order of documents inside each cluster's pool for stratified, round-robin and bin-packing "
                        "(default: original; random is a seeded shuffle)")
    g.add_argument("--ordering", default="stratified", choices=list(ORDERINGS),
                   help="how to order the documents (default: stratified, the reference's greedy). "
                        "balanced: as many clusters per window as stratified on average, with token shares steadier "
                        "than a random shuffle's and little head-to-tail drift. Score-based orderings need "
                        "--score-field. See README, 'Choosing an ordering'")
    g.add_argument("--compare-strategies", action="store_true",
                   help="also run every applicable ordering at each --seq-len and write a table "
                        "(OUTPUT_strategies.md/.json) and diversity curves (OUTPUT_strategies.png)")
    g.add_argument("--score-field", default=None, metavar="NAME",
                   help="numeric JSON field for the score-based orderings (sorted, folding, zigzag, segment, stair, saw)")
    g.add_argument("--balance-field", action="append", default=[], metavar="NAME",
                   help="categorical JSON field (source, language, ...) to balance as well as clusters: token-balanced "
                        "keeps its token shares on track; balanced interleaves its values inside each cluster; repeatable")
    g.add_argument("--length-bins", type=int, default=16,
                   help="token-balanced: document-length quantile bins balanced with the clusters (1 = off; default: 16)")
    g.add_argument("--length-weight", type=float, default=1.0,
                   help="token-balanced: weight lambda of the length-bin term (default: 1.0)")
    g.add_argument("--folds", type=int, default=3,
                   help="folding/zigzag/stair/saw: number of folds L (default: 3)")
    g.add_argument("--sections", type=int, default=3,
                   help="stair/saw: number of score sections K (K-1 transitions; default: 3)")
    g.add_argument("--transition-ratio", type=float, default=0.1,
                   help="stair/saw: transition region on each side of a section boundary, as a fraction rho "
                        "of a section (default: 0.1)")
    g.add_argument("--segment-percentages", type=_percentages, default=(30.0, 40.0, 30.0), metavar="P,P,...",
                   help="segment: sizes of the score segments, low to high (default: 30,40,30)")
    g.add_argument("--jitter-window", type=int, default=0, metavar="W",
                   help="score-based orderings: shuffle inside consecutive blocks of W documents (0 = off; default: 0)")
    p.add_argument("--seed", type=int, default=42,
                   help="random seed for k-means, PCA, sampling, UMAP and the orderings' random choices (default: 42)")
    p.add_argument("--load-embeddings", type=Path, default=None,
                   help="precomputed N x D embeddings (.npy, input order), e.g. deep embeddings of the same records")
    p.add_argument("--pca-components", type=int, default=0,
                   help="reduce embeddings with PCA before clustering (0 = off; 50-100 suits deep embeddings)")
    p.add_argument("--cluster-backend", default="sklearn", choices=CLUSTER_BACKENDS,
                   help="k-means implementation: sklearn (MiniBatchKMeans, the reference's labels; default), "
                        "faiss (needs faiss-cpu/faiss-gpu) or torch (GPU when the device is CUDA)")
    p.add_argument("--cluster-fit-sample", type=int, default=0,
                   help="fit k-means on this many random rows and assign the rest to the nearest centre "
                        "(0 = fit on all rows; default: 0)")
    add_output_flags(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.verbose)
    config = CurateConfig(
        input=args.input, output=args.output, model_dir=args.model_dir, device=args.device, gpu=args.gpu,
        embed_batch_size=args.embed_batch_size, n_clusters=args.n_clusters, seq_len=args.seq_len[0],
        extra_seq_lens=tuple(args.seq_len[1:]),
        text_field=args.text_field, stats_only=args.stats_only, calibrate_k=args.calibrate_k,
        calibrate_k_samples=args.calibrate_k_samples, no_plot=args.no_plot,
        within_cluster_sort=args.within_cluster_sort, seed=args.seed, load_embeddings=args.load_embeddings,
        pca_components=args.pca_components, cluster_backend=args.cluster_backend,
        cluster_fit_sample=args.cluster_fit_sample, progress=not args.no_progress,
        ordering=args.ordering, compare_strategies=args.compare_strategies, score_field=args.score_field,
        balance_fields=tuple(args.balance_field), length_bins=args.length_bins, length_weight=args.length_weight,
        folds=args.folds, sections=args.sections, transition_ratio=args.transition_ratio,
        segment_percentages=args.segment_percentages, jitter_window=args.jitter_window,
    )
    curate(config)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
