"""Reorder a JSONL dataset so every packed training sequence holds as many topic clusters as possible.

Stages: index the input -> token counts and shallow embeddings (cached, incremental) ->
optional PCA -> MiniBatchKMeans -> ordering (stratified greedy by default) -> window diversity before/after ->
curated JSONL, metadata, labels/order arrays and plots. See README.md for every flag and file.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from . import ArgumentParser, add_output_flags, run_main, setup_logging


def _add_ordering_flags(group, config_defaults: dict) -> None:
    """--ordering and every OrderingOptions flag: names, defaults and help from the dataclass and the registry."""
    from ..orderings import SPECS
    from ..orderings.options import flag_fields
    from ..orderings.registry import readers

    listing = "; ".join(f"{name}: {spec.summary}" for name, spec in SPECS.items())
    group.add_argument("--ordering", default=config_defaults["ordering"], choices=list(SPECS),
                       help=f"how to order the documents (default: {config_defaults['ordering']}). {listing}. "
                            "See README, 'Choosing an ordering'")
    group.add_argument("--compare-strategies", action="store_true",
                       help="also run every applicable ordering at each --seq-len and write a table "
                            "(OUTPUT_strategies.md/.json) and diversity curves (OUTPUT_strategies.png)")
    for f in flag_fields():
        kwargs = dict(f.metadata["argparse"])
        if "type" not in kwargs and "action" not in kwargs and isinstance(f.default, int | float):
            kwargs["type"] = type(f.default)
        default = list(f.default) if kwargs.get("action") == "append" else f.default
        shown = ",".join(f"{v:g}" for v in f.default) if isinstance(f.default, tuple) else f.default
        suffix = f" (default: {shown})" if shown not in (None, "") else ""
        group.add_argument(f.metadata["flag"], dest=f.name, default=default,
                           help=f"{'/'.join(readers(f.name))}: {f.metadata['help']}{suffix}", **kwargs)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from ..clustering import CLUSTER_BACKENDS
    from ..curate import CurateConfig
    from ..orderings import OrderingOptions

    defaults = {f.name: f.default for f in fields(CurateConfig) if not callable(f.default_factory)}
    options = OrderingOptions()
    p = ArgumentParser(description=__doc__, prog="curate_dataset.py")
    p.add_argument("--input", required=True, type=Path, help="input JSONL, one JSON object per line")
    p.add_argument("--output", required=True, type=Path, help="curated JSONL to write (caches and metadata go beside it)")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="local Hugging Face model folder (tokenizer + safetensors with the input-embedding table); "
                        "with --load-embeddings only the tokenizer is needed, and only for records whose token "
                        "counts are not cached")
    p.add_argument("--device", default=defaults["device"],
                   help="auto (CUDA when present, else CPU), cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--gpu", type=int, default=defaults["gpu"], help="GPU index used when the device is CUDA (default: 0)")
    p.add_argument("--embed-batch-size", type=int, default=defaults["embed_batch_size"],
                   help=f"documents tokenized and pooled together (default: {defaults['embed_batch_size']})")
    p.add_argument("--n-clusters", type=int, default=defaults["n_clusters"],
                   help=f"number of k-means clusters (default: {defaults['n_clusters']})")
    p.add_argument("--seq-len", type=int, nargs="+", default=[options.seq_len], metavar="TOKENS",
                   help=f"training sequence length in tokens (default: {options.seq_len}); with --compare-strategies "
                        "several values may be given, and the curated file follows the first")
    p.add_argument("--text-field", default=defaults["text_field"],
                   help=f"JSON field holding the document text (default: {defaults['text_field']})")
    p.add_argument("--stats-only", action="store_true", help="compute and report everything but do not write the curated JSONL")
    p.add_argument("--calibrate-k", action="store_true",
                   help="sweep k = 5..100, report silhouette scores and a recommended k, then exit")
    p.add_argument("--calibrate-k-samples", type=int, default=defaults["calibrate_k_samples"],
                   help=f"rows sampled for the silhouette during --calibrate-k (0 = all; default: "
                        f"{defaults['calibrate_k_samples']})")
    p.add_argument("--no-plot", action="store_true", help="skip ordering_comparison.png and cluster_cloud.png")
    _add_ordering_flags(p.add_argument_group("ordering (see README: 'Choosing an ordering')"), defaults)
    p.add_argument("--seed", type=int, default=options.seed,
                   help=f"random seed for k-means, PCA, sampling, UMAP and the orderings' random choices "
                        f"(default: {options.seed})")
    p.add_argument("--load-embeddings", type=Path, default=None,
                   help="precomputed N x D embeddings (.npy, input order), e.g. deep embeddings of the same records")
    p.add_argument("--pca-components", type=int, default=defaults["pca_components"],
                   help="reduce embeddings with PCA before clustering (0 = off; 50-100 suits deep embeddings)")
    p.add_argument("--cluster-backend", default=defaults["cluster_backend"], choices=CLUSTER_BACKENDS,
                   help="k-means implementation: sklearn (MiniBatchKMeans, the original toolkit's labels; default), "
                        "faiss (needs faiss-cpu/faiss-gpu) or torch (GPU when the device is CUDA)")
    p.add_argument("--cluster-fit-sample", type=int, default=defaults["cluster_fit_sample"],
                   help="fit k-means on this many random rows and assign the rest to the nearest centre "
                        "(0 = fit on all rows; default: 0)")
    add_output_flags(p)
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace):
    from ..curate import CurateConfig
    from ..orderings import OrderingOptions
    from ..orderings.options import flag_fields

    values = {f.name: getattr(args, f.name) for f in flag_fields()}
    values["balance_fields"] = tuple(values["balance_fields"])
    options = OrderingOptions(seq_len=args.seq_len[0], seed=args.seed, **values)
    return CurateConfig(
        input=args.input, output=args.output, model_dir=args.model_dir, device=args.device, gpu=args.gpu,
        embed_batch_size=args.embed_batch_size, n_clusters=args.n_clusters, extra_seq_lens=tuple(args.seq_len[1:]),
        text_field=args.text_field, stats_only=args.stats_only, calibrate_k_samples=args.calibrate_k_samples,
        no_plot=args.no_plot, load_embeddings=args.load_embeddings, pca_components=args.pca_components,
        cluster_backend=args.cluster_backend, cluster_fit_sample=args.cluster_fit_sample,
        progress=not args.no_progress, ordering=args.ordering, compare_strategies=args.compare_strategies,
        ordering_options=options,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.verbose)
    from ..curate import calibrate, curate

    config = config_from_args(args)
    (calibrate if args.calibrate_k else curate)(config)
    return 0


def console() -> int:
    """The ``curate-dataset`` command."""
    return run_main(main)
