"""Reorder a dataset (JSONL, Parquet or a datasets folder; plain text or chat conversations) so every packed
training sequence holds as many topic clusters as possible.

Stages: index the input -> token counts and shallow embeddings (cached, incremental) ->
optional PCA -> MiniBatchKMeans -> ordering (stratified greedy by default) -> window diversity before/after ->
the curated data (the input's format unless --output-format), metadata, labels/order arrays and plots. See
README.md for every flag and file.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from pathlib import Path

from . import ArgumentParser, add_input_flags, add_output_flags, input_values, run_command, setup_logging


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


def _add_data_flags(p) -> None:
    """The flags for what the trainer sees: output format and shards, special tokens, packing, packed export."""
    from ..packing import PACKING_MODELS
    from ..tokenizer import SPECIAL_TOKEN_MODES
    from ..writers import OUTPUT_FORMATS

    group = p.add_argument_group("the data as the trainer sees it (see README: 'Keep the order in your trainer')")
    group.add_argument("--output-format", default=None, choices=OUTPUT_FORMATS,
                       help="write the curated data as JSONL or Parquet whatever the input's format (default: the "
                            "input's format, or what the --output name says)")
    group.add_argument("--output-shards", type=int, default=1, metavar="N",
                       help="write N files B-00000-of-0000N.<ext>, consecutive slices of the curated order "
                            "(default: 1, one file B.<ext>)")
    group.add_argument("--count-special-tokens", default=SPECIAL_TOKEN_MODES[0], choices=SPECIAL_TOKEN_MODES,
                       help="tokens the trainer adds to each document, counted in every token count and window: "
                            "none (default); tokenizer (what add_special_tokens=True adds, e.g. BOS for Llama); eos "
                            "(one EOS separator: Megatron --append-eod, nanoGPT, TRL SFT); bos-eos (BOS and EOS: "
                            "torchtitan)")
    group.add_argument("--packing", default=PACKING_MODELS[0], choices=PACKING_MODELS,
                       help="how the trainer fills its --seq-len windows: whole (a document that does not fit starts "
                            "the next window; only one longer than --seq-len is cut, its last part starting the next; "
                            "the original toolkit's model, default) or split (concatenate and cut every --seq-len tokens: "
                            "Megatron, nanoGPT, torchtitan, HF group_texts, TRL packing 'wrapped'); the statistics, "
                            "plots and window-aware orderings follow it")
    group.add_argument("--export-packed", type=Path, default=None, metavar="DIR",
                       help="also write the curated order as ready training sequences: Parquet shards of input_ids "
                            "rows of exactly --seq-len tokens with document boundaries (needs --model-dir)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    from ..clustering import CLUSTER_BACKENDS
    from ..curate import CurateConfig
    from ..features import EMBEDDING_DTYPES
    from ..orderings import OrderingOptions

    defaults = {f.name: f.default for f in fields(CurateConfig) if not callable(f.default_factory)}
    options = OrderingOptions()
    p = ArgumentParser(description=__doc__, prog="curate_dataset.py")
    add_input_flags(p)
    p.add_argument("--output", required=True, type=Path,
                   help="curated data to write, in the input's format unless --output-format or the name says "
                        "otherwise (B.jsonl[.gz|.zst], B.parquet, or a datasets folder); caches and metadata go "
                        "beside it as B_*")
    _add_data_flags(p)
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
    p.add_argument("--stats-only", action="store_true",
                   help="compute and report everything but do not write the curated records (JSONL or Parquet)")
    p.add_argument("--calibrate-k", action="store_true",
                   help="sweep k = 5..100, report silhouette scores and a recommended k, then exit")
    p.add_argument("--calibrate-k-samples", type=int, default=defaults["calibrate_k_samples"],
                   help=f"rows sampled for the silhouette during --calibrate-k (0 = all; default: "
                        f"{defaults['calibrate_k_samples']})")
    p.add_argument("--no-plot", action="store_true",
                   help="skip the plots (B_ordering_comparison.png, B_cluster_cloud.png, B_strategies.png)")
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
    p.add_argument("--memory-budget", type=_size, default=None, metavar="SIZE",
                   help="memory the embeddings may take for the exact path, e.g. 8G (default: a quarter of RAM, or "
                        "of the cgroup's limit). While they fit, PCA, k-means and --calibrate-k run on all rows in "
                        "memory (the original toolkit's results); beyond it they are fitted on a seeded sample read "
                        "from the cache file and every row is assigned block by block. See README, 'Large inputs'")
    p.add_argument("--embedding-dtype", default=defaults["embedding_dtype"], choices=EMBEDDING_DTYPES,
                   help="how B_embeddings.npy stores the vectors (computed in float32 either way); float16 halves "
                        "the disk and I/O (default: float32)")
    add_output_flags(p)
    return p


def _size(text: str) -> int:
    from ..matrix import parse_size

    try:
        return parse_size(text)
    except (ValueError, KeyError):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a size such as 8G, 512M or 1000000 bytes") from None


def config_from_args(args: argparse.Namespace):
    from ..curate import CurateConfig
    from ..orderings import OrderingOptions
    from ..orderings.options import flag_fields

    values = {f.name: getattr(args, f.name) for f in flag_fields()}
    given = list(values["balance_fields"])
    values["balance_fields"] = tuple(dict.fromkeys(given))  # (a field given twice is one field, balanced once)
    if len(values["balance_fields"]) < len(given):
        import logging

        logging.getLogger("diversity_order").warning("--balance-field given more than once for %s: balanced once",
                                                     ", ".join(name for name in values["balance_fields"]
                                                               if given.count(name) > 1))
    options = OrderingOptions(seq_len=args.seq_len[0], seed=args.seed, packing=args.packing, **values)
    inputs, text_field = input_values(args)
    return CurateConfig(
        input=inputs, output=args.output, output_format=args.output_format, output_shards=args.output_shards,
        count_special_tokens=args.count_special_tokens, export_packed=args.export_packed,
        model_dir=args.model_dir, device=args.device, gpu=args.gpu,
        embed_batch_size=args.embed_batch_size, n_clusters=args.n_clusters, extra_seq_lens=tuple(args.seq_len[1:]),
        text_field=text_field, stats_only=args.stats_only, calibrate_k_samples=args.calibrate_k_samples,
        no_plot=args.no_plot, load_embeddings=args.load_embeddings, pca_components=args.pca_components,
        cluster_backend=args.cluster_backend, cluster_fit_sample=args.cluster_fit_sample,
        memory_budget=args.memory_budget, embedding_dtype=args.embedding_dtype,
        progress=not args.no_progress, ordering=args.ordering, compare_strategies=args.compare_strategies,
        ordering_options=options,
    )


# What --calibrate-k reads (it embeds, reduces and sweeps k): any other flag set is said to be unused.
CALIBRATION_READS = frozenset({
    "input", "text_field", "output", "model_dir", "device", "gpu", "embed_batch_size", "calibrate_k",
    "calibrate_k_samples", "seed", "load_embeddings", "pca_components", "cluster_backend", "cluster_fit_sample",
    "memory_budget", "embedding_dtype", "no_progress", "verbose", "help"})


def _warn_unused_with_calibration(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    import logging

    unused = [action.option_strings[0] for action in parser._actions
              if action.dest not in CALIBRATION_READS and getattr(args, action.dest, None) != action.default]
    if unused:
        logging.getLogger("diversity_order").warning(
            "%s not used with --calibrate-k, which sweeps k, prints the table and exits", ", ".join(unused) +
            (" is" if len(unused) == 1 else " are"))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    from ..curate import calibrate, calibration_report, curate

    config = config_from_args(args)
    if not args.calibrate_k:
        curate(config)
        return 0
    _warn_unused_with_calibration(parser, args)
    result = calibrate(config)
    if result is not None:  # rank 0 under torchrun
        print(calibration_report(result.calibration, result.recommended_k, len(result.token_counts)), flush=True)
    return 0


def console() -> int:
    """The ``curate-dataset`` command."""
    return run_command(main)
