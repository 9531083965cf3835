"""The curate pipeline: records -> token counts + embeddings -> labels -> order -> stats and outputs.

``curate(config)`` runs the stages in order; each stage is one call into its module, and
per-document state stays in flat arrays indexed by input position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import caches, clustering, distributed, diversity, ordering, plots, records, strategies
from .atomic import save_json, save_npy
from .cli import StageTimer, load_matrix, resolve_device
from .errors import UserError

log = logging.getLogger(__name__)

SHALLOW_METHOD = "base_model_embed_tokens_mean_pool"
EXTERNAL_METHOD = "external_precomputed"


@dataclass
class CurateConfig:
    input: Path
    output: Path
    model_dir: Path | None = None
    device: str = "auto"
    gpu: int = 0
    embed_batch_size: int = 1024
    n_clusters: int = 30
    seq_len: int = 131072
    text_field: str = "text"
    stats_only: bool = False
    calibrate_k: bool = False
    calibrate_k_samples: int = 10000
    no_plot: bool = False
    within_cluster_sort: str = "original"
    seed: int = 42
    load_embeddings: Path | None = None
    pca_components: int = 0
    cluster_backend: str = "sklearn"
    cluster_fit_sample: int = 0
    progress: bool = True
    ordering: str = "stratified"
    # More packed lengths for --compare-strategies (seq_len is always compared first).
    extra_seq_lens: tuple[int, ...] = ()
    compare_strategies: bool = False
    score_field: str | None = None
    balance_fields: tuple[str, ...] = ()
    length_bins: int = 16
    length_weight: float = 1.0
    folds: int = 3
    sections: int = 3
    transition_ratio: float = 0.1
    segment_percentages: tuple[float, ...] = (30.0, 40.0, 30.0)
    jitter_window: int = 0

    def validate(self) -> None:
        checks = [
            (self.n_clusters >= 1, f"--n-clusters {self.n_clusters}: must be at least 1"),
            (self.seq_len >= 1, f"--seq-len {self.seq_len}: must be at least 1 token"),
            (self.embed_batch_size >= 1, f"--embed-batch-size {self.embed_batch_size}: must be at least 1"),
            (self.calibrate_k_samples >= 0, f"--calibrate-k-samples {self.calibrate_k_samples}: must be 0 (all) or more"),
            (self.pca_components >= 0, f"--pca-components {self.pca_components}: must be 0 (off) or more"),
            (self.cluster_fit_sample >= 0, f"--cluster-fit-sample {self.cluster_fit_sample}: must be 0 (all) or more"),
            (self.cluster_backend in clustering.CLUSTER_BACKENDS,
             f"--cluster-backend {self.cluster_backend}: choose one of {', '.join(clustering.CLUSTER_BACKENDS)}"),
            (self.within_cluster_sort in ordering.WITHIN_CLUSTER_SORTS,
             f"--within-cluster-sort {self.within_cluster_sort}: choose one of {', '.join(ordering.WITHIN_CLUSTER_SORTS)}"),
            (self.ordering in ordering.ORDERINGS,
             f"--ordering {self.ordering}: choose one of {', '.join(ordering.ORDERINGS)}"),
            (self.ordering not in ordering.SCORE_ORDERINGS or self.score_field is not None,
             f"--ordering {self.ordering} orders by a per-document score: name its JSON field with --score-field"),
            (not self.extra_seq_lens or self.compare_strategies,
             "--seq-len takes several values only with --compare-strategies (the curated file follows the first)"),
            (all(v >= 1 for v in self.extra_seq_lens), "--seq-len: every value must be at least 1 token"),
            (self.length_bins >= 1, f"--length-bins {self.length_bins}: must be at least 1 (1 = off)"),
            (0 <= self.length_weight < float("inf"),
             f"--length-weight {self.length_weight}: must be a finite number, 0 (off) or more"),
            (self.folds >= 1, f"--folds {self.folds}: must be at least 1"),
            (self.sections >= 1, f"--sections {self.sections}: must be at least 1"),
            (0 <= self.transition_ratio <= 0.5, f"--transition-ratio {self.transition_ratio}: must be within 0..0.5"),
            (len(self.segment_percentages) >= 1 and all(0 < v < float("inf") for v in self.segment_percentages),
             "--segment-percentages: give one or more positive finite numbers, e.g. 30,40,30"),
            (self.jitter_window >= 0, f"--jitter-window {self.jitter_window}: must be 0 (off) or more"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(message)
        records.check_output_path(self.input, self.output)


def output_stem(output: Path) -> Path:
    """``dir/name.jsonl[.gz|.zst]`` -> ``dir/name``: the prefix of the files written beside it."""
    name = output.name
    for compressed in ("", *records.COMPRESSED_SUFFIXES):
        for suffix in (".jsonl", ".json", ".ndjson"):
            if name.endswith(suffix + compressed):
                return output.with_name(name[: -len(suffix + compressed)])
    return output


def output_paths(config: CurateConfig) -> dict[str, Path]:
    out_stem, in_stem = output_stem(config.output), output_stem(config.input)
    folder = config.output.parent
    return {
        "embeddings": Path(f"{out_stem}_embeddings.npy"),
        "token_counts": Path(f"{in_stem}_token_counts.npy"),
        "meta": Path(f"{out_stem}_meta.json"),
        "labels": Path(f"{out_stem}_labels.npy"),
        "order": Path(f"{out_stem}_order.npy"),
        "umap": Path(f"{out_stem}_umap2d.npy"),
        "calibration": Path(f"{out_stem}_calibration.json"),
        "ordering_plot": folder / "ordering_comparison.png",
        "cloud_plot": folder / "cluster_cloud.png",
    }


@dataclass
class CurateResult:
    meta: dict
    labels: np.ndarray
    order: np.ndarray
    token_counts: np.ndarray
    embeddings: np.ndarray
    paths: dict[str, Path]
    calibration: list | None = None
    recommended_k: int | None = None
    timings: dict = field(default_factory=dict)


def load_external_embeddings(path: Path, n_records: int) -> np.ndarray:
    """A precomputed N x D float matrix; NaN rows become zero vectors (warned)."""
    matrix = load_matrix(path, "--load-embeddings")
    if matrix.shape[0] != n_records:
        raise UserError(f"--load-embeddings {path}: {matrix.shape[0]} rows, but the input has {n_records} records")
    embeddings = np.array(matrix, dtype=np.float32)  # a writable copy: NaN rows are zeroed below
    bad = ~np.isfinite(embeddings).all(axis=1)
    if bad.any():
        log.warning("%d row(s) of %s are NaN/inf (e.g. documents skipped by deep extraction); "
                    "they become zero vectors", int(bad.sum()), path.name)
        embeddings[bad] = 0.0
    return embeddings


class _ModelParts:
    """Tokenizer and embedding table, loaded on first use (a cached run needs neither)."""

    def __init__(self, model_dir: Path | None, device):
        self.model_dir = model_dir
        self.device = device
        self._tokenizer = None
        self._table = None

    def require_dir(self, why: str) -> Path:
        if self.model_dir is None:
            raise UserError(f"--model-dir is required {why}")
        if not self.model_dir.is_dir():
            raise UserError(f"--model-dir {self.model_dir}: folder not found")
        return self.model_dir

    def tokenizer(self, why: str):
        if self._tokenizer is None:
            from .tokenizer import DocumentTokenizer

            self._tokenizer = DocumentTokenizer(self.require_dir(why))
        return self._tokenizer

    def table(self):
        if self._table is None:
            import torch

            from .embedding_table import load_embedding_table

            self._table = load_embedding_table(self.require_dir("to embed the documents (or pass --load-embeddings FILE)"),
                                               device=self.device, dtype=torch.float32)
        return self._table


def _token_count_key(tokenizer_fp: str, text_field: str) -> dict:
    return {"kind": "token_counts", "tokenizer": tokenizer_fp, "text_field": text_field}


def _embedding_key(tokenizer_fp: str, table, text_field: str) -> dict:
    return {"kind": SHALLOW_METHOD, "tokenizer": tokenizer_fp, "table": table.fingerprint,
            "tensor": table.tensor_name, "dim": table.dim, "text_field": text_field}


def _tokenize_rows(ctx: distributed.DistContext, config: CurateConfig, index: records.RecordIndex,
                   rows: np.ndarray, tokenizer, table, out: np.ndarray | None = None):
    """Tokenize (and embed, with a table) ``rows``; under torchrun each rank takes a share by
    bytes and rank 0 gets everything back in row order. Other ranks get (None, None).

    In a single process the vectors are written straight into ``out[rows]``."""
    from . import embed

    share = distributed.my_share(ctx, rows, index.ends[rows] - index.starts[rows])
    if ctx.active:
        log.info("Rank %d of %d: %d of the %d records", ctx.rank, ctx.world_size, share.size, rows.size)
    vectors, counts, stats = embed.embed_and_count(index, share, tokenizer, table, batch_docs=config.embed_batch_size,
                                                   progress=config.progress and ctx.is_main,
                                                   out=None if ctx.active else out)
    if table is not None:
        log.info("Embedded %d documents, %s tokens, in %.1f s (%.0f tokens/s%s)", stats.documents,
                 f"{stats.tokens:,}", stats.seconds, stats.tokens / max(stats.seconds, 1e-9),
                 " on this rank" if ctx.active else "")
    if not ctx.active:
        return vectors, counts
    device = table.device if table is not None and table.device.type == "cuda" else None
    all_counts = distributed.gather_to_main(ctx, counts, device)
    all_vectors = distributed.gather_to_main(ctx, vectors, device) if table is not None else None
    if not ctx.is_main:
        return None, None
    return (np.concatenate(all_vectors) if all_vectors is not None else None), np.concatenate(all_counts)


def compute_counts_and_embeddings(config: CurateConfig, index: records.RecordIndex, paths: dict, model: _ModelParts,
                                  need_embeddings: bool, ctx: distributed.DistContext | None = None
                                  ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """Token counts (always) and shallow embeddings (when asked), reusing valid cached rows.

    Under torchrun, only rank 0 gets the arrays (and writes the caches); other ranks get None.
    """
    ctx = ctx or distributed.DistContext()

    fps = index.fingerprints
    have_model = config.model_dir is not None
    why_tokenizer = "to count tokens: the token-count cache does not cover every record"
    tokenizer = model.tokenizer(why_tokenizer) if (have_model or need_embeddings) else None
    count_key = _token_count_key(tokenizer.fingerprint if tokenizer else "", config.text_field)
    counts_found = caches.lookup(paths["token_counts"], count_key, fps, accept_any_key=tokenizer is None)
    log.info("Token counts: %s", counts_found.reason)
    count_rows = counts_found.missing_rows
    if count_rows.size and tokenizer is None:
        raise UserError(f"--model-dir is required to count tokens: {count_rows.size} of {len(index)} records "
                        f"have no cached count in {paths['token_counts']} (a folder with the tokenizer is enough)")

    embed_rows = np.zeros(0, dtype=np.int64)
    emb_found = None
    if need_embeddings:
        table = model.table()
        emb_key = _embedding_key(tokenizer.fingerprint, table, config.text_field)
        emb_found = caches.lookup(paths["embeddings"], emb_key, fps)
        log.info("Embeddings: %s", emb_found.reason)
        embed_rows = emb_found.missing_rows

    counts = counts_found.data if counts_found.data is not None else np.zeros(len(index), dtype=np.int64)
    counts = counts.astype(np.int64)
    embeddings = None
    if need_embeddings:
        embeddings = emb_found.data if emb_found.data is not None else np.zeros((len(index), model.table().dim), np.float32)
    if embed_rows.size:
        log.info("Embedding %d new or changed record(s) of %d (tokenized once for counts and vectors)",
                 embed_rows.size, len(index))
        vectors, new_counts = _tokenize_rows(ctx, config, index, embed_rows, tokenizer, model.table().weight,
                                             out=embeddings)
        count_rows = np.setdiff1d(count_rows, embed_rows)
        if ctx.is_main:
            if vectors is not embeddings:
                embeddings[embed_rows] = vectors
            counts[embed_rows] = new_counts
    if count_rows.size:
        log.info("Counting tokens of %d new or changed record(s) of %d", count_rows.size, len(index))
        _, new_counts = _tokenize_rows(ctx, config, index, count_rows, tokenizer, None)
        if ctx.is_main:
            counts[count_rows] = new_counts
    if not ctx.is_main:
        return None, None
    if not counts_found.hit.all():  # only reachable with a tokenizer (else missing rows raised above)
        caches.store(paths["token_counts"], count_key, fps, counts)
    if need_embeddings and not emb_found.hit.all():
        caches.store(paths["embeddings"], emb_key, fps, embeddings)
    return counts, embeddings


def _log_calibration(rows, recommended) -> None:
    log.info("%5s  %10s  %26s", "k", "silhouette", "cluster size min/median/max")
    for row in rows:
        score = "n/a" if row.silhouette is None else f"{row.silhouette:.4f}"
        log.info("%5d  %10s  %26s", row.k, score, f"{row.size_min} / {row.size_median:g} / {row.size_max}")
    if recommended is None:
        log.info("No k could be scored (too few documents or clusters)")
    else:
        log.info("Recommended k = %d (the highest k whose silhouette is within 5%% of the peak); "
                 "use --n-clusters %d", recommended, recommended)


def curate(config: CurateConfig) -> CurateResult | None:
    """Run the pipeline; under torchrun, ranks other than 0 return None after embedding."""
    config.validate()
    device = resolve_device(config.device, config.gpu)
    ctx = distributed.init_from_env(device.type == "cuda")
    if ctx.active and device.type == "cuda":
        device = resolve_device(f"cuda:{ctx.local_rank}", ctx.local_rank)
    if not ctx.is_main:
        logging.getLogger("diversity_order").setLevel(logging.WARNING)
    try:
        return _curate(config, device, ctx)
    finally:
        distributed.shutdown(ctx)


def _curate(config: CurateConfig, device, ctx: distributed.DistContext) -> CurateResult | None:
    timer = StageTimer()
    paths = output_paths(config)

    model = _ModelParts(config.model_dir, device)
    if config.load_embeddings is None:
        # Fail before the long work: the folder must exist and hold an embedding table.
        with timer.stage("Loading the embedding table"):
            model.table()
    elif config.model_dir is not None:
        model.require_dir("")
    with timer.stage("Indexing input"):
        index = records.scan_jsonl(config.input, config.text_field, progress=config.progress)
    n = len(index)
    log.info("%s: %d records, %.1f MB", config.input, n, index.total_bytes / 1e6)
    if config.n_clusters > n and not config.calibrate_k:
        raise UserError(f"--n-clusters {config.n_clusters}: larger than the number of records ({n}); "
                        f"choose at most {n}")
    if not config.calibrate_k and ctx.is_main:  # read score/balance fields now: a bad field fails fast
        options = _ordering_options(config, index)

    with timer.stage("Token counts and embeddings"):
        if config.load_embeddings is not None:
            embeddings = load_external_embeddings(config.load_embeddings, n)
            counts, _ = compute_counts_and_embeddings(config, index, paths, model, False, ctx)
            method = EXTERNAL_METHOD
        else:
            counts, embeddings = compute_counts_and_embeddings(config, index, paths, model, True, ctx)
            method = SHALLOW_METHOD
    if not ctx.is_main:
        return None  # rank 0 clusters, orders and writes; the other ranks' work is done
    empty = int((counts == 0).sum())

    pca_info = None
    if config.pca_components > 0:
        with timer.stage(f"PCA to {config.pca_components} components"):
            embeddings, pca_info = clustering.reduce_with_pca(embeddings, config.pca_components, config.seed)
        if pca_info is not None:
            log.info("PCA kept %d of %d dimensions, %.1f%% of the variance", pca_info.n_components,
                     pca_info.original_dim, 100 * pca_info.explained_variance)

    if config.calibrate_k:
        # Unlike the reference, calibrate on what will be clustered: after PCA when it is on.
        samples = config.calibrate_k_samples
        with timer.stage(f"Calibrating k (silhouette on {'all' if samples == 0 else min(samples, n)} rows)"):
            rows, recommended = clustering.calibrate_k(embeddings, samples, config.seed, progress=config.progress,
                                                       device=device)
        _log_calibration(rows, recommended)
        used = n if samples == 0 else min(samples, n)
        save_json(paths["calibration"], {"input": str(config.input), "samples": used, "seed": config.seed,
                                         "pca": pca_info.as_dict() if pca_info else None,
                                         "rows": [r.as_dict() for r in rows], "recommended_k": recommended})
        log.info("Calibration table written to %s", paths["calibration"])
        return CurateResult({}, np.zeros(0, np.int64), np.zeros(0, np.int64), counts, embeddings, paths,
                            calibration=rows, recommended_k=recommended, timings=timer.seconds)

    backend_name = {"sklearn": "MiniBatchKMeans", "faiss": "faiss k-means", "torch": "torch k-means"}[config.cluster_backend]
    fitted_on = f", fitted on {config.cluster_fit_sample:,} rows" if 0 < config.cluster_fit_sample < n else ""
    with timer.stage(f"Clustering ({backend_name}, k={config.n_clusters}{fitted_on})"):
        labels = clustering.kmeans_labels(embeddings, config.n_clusters, config.seed, config.cluster_backend,
                                          config.cluster_fit_sample, device)
    comparison = None
    if config.compare_strategies:
        seq_lens = list(dict.fromkeys([config.seq_len, *config.extra_seq_lens]))
        names = strategies.applicable_orderings(options.scores is not None)
        if options.scores is None:
            log.info("Score orderings (%s) are left out of the comparison: give --score-field NAME to include them",
                     ", ".join(ordering.SCORE_ORDERINGS))
        with timer.stage(f"Comparing {len(names)} orderings at seq-len {', '.join(f'{v:,}' for v in seq_lens)}"):
            rows, curves = strategies.compare_strategies(labels, counts, config.n_clusters, seq_lens, options, names)
            report, table = strategies.write_report(output_stem(config.output), rows, curves, config.n_clusters,
                                                    config.input.name, _comparison_options(config),
                                                    plot=not config.no_plot)
        print(table, flush=True)
        log.info("Strategy comparison: %s", ", ".join(str(path) for path in report.values()))
        comparison = {"seq_lens": seq_lens, "orderings": names, "files": {k: str(v) for k, v in report.items()}}
    with timer.stage(f"Ordering ({config.ordering})"):
        order = ordering.ORDERINGS[config.ordering](labels, counts, config.n_clusters, options)
    with timer.stage("Diversity statistics"):
        before = diversity.window_diversity(labels, counts, config.seq_len)
        after = diversity.window_diversity(labels, counts, config.seq_len, order)
        shuffled = ordering.random_order(labels, counts, config.n_clusters, options)
        orders = {"original": None, "curated": order, "random_shuffle": shuffled}
        windows = {"original": before, "curated": after, "random_shuffle": None}
        quality = {name: diversity.ordering_quality(labels, counts, config.seq_len, o, config.n_clusters, windows[name])
                   for name, o in orders.items()}
        summary_before, summary_after = quality["original"]["diversity"], quality["curated"]["diversity"]
        similarity = diversity.similarity_stats(embeddings, config.seed)
    _log_improvement(summary_before, summary_after, config)
    _log_quality(quality)
    field_quality = _balance_field_quality(config, options, counts, orders)

    if not config.stats_only:
        with timer.stage(f"Writing {config.output}"):
            written = records.write_reordered(index, order, config.output)
        log.info("Wrote %d records (%.1f MB) to %s", n, written / 1e6, config.output)
    elif config.output.exists():
        log.warning("--stats-only: %s was not written; the file there is from an earlier run and does not "
                    "follow this run's %s", config.output, paths["order"].name)
    else:
        log.info("--stats-only: the curated JSONL was not written")
    save_npy(paths["labels"], labels)
    save_npy(paths["order"], order)

    if not config.no_plot:
        with timer.stage("Plots"):
            plots.plot_ordering_comparison(paths["ordering_plot"], labels, counts, order, config.n_clusters, before, after,
                                           summary_before, summary_after, config.seq_len, quality, config.ordering)
            projection = _projection_or_none(paths["umap"], embeddings, index.fingerprints, config.seed)
            plots.plot_cluster_cloud(paths["cloud_plot"], labels, config.n_clusters, projection)
        log.info("Plots: %s, %s", paths["ordering_plot"], paths["cloud_plot"])

    sizes = np.bincount(labels, minlength=config.n_clusters)
    by_size = sorted(np.flatnonzero(sizes).tolist(), key=lambda k: (-sizes[k], k))
    meta = {
        "input": str(config.input),
        "output": str(config.output),
        "input_count": n,
        "final_count": n,
        "n_clusters": config.n_clusters,
        "ordering": ordering.ordering_meta_name(config.ordering),
        "ordering_options": _options_meta(config),
        "within_cluster_sort": config.within_cluster_sort,
        "seed": config.seed,
        "sequence_length": config.seq_len,
        "total_tokens": int(counts.sum()),
        "n_training_sequences": summary_after["n_sequences"],
        "embedding_method": method,
        "load_embeddings_path": str(config.load_embeddings) if config.load_embeddings else None,
        "model_dir": str(config.model_dir) if config.model_dir else None,
        "text_field": config.text_field,
        "pca": pca_info.as_dict() if pca_info else None,
        "clustering": {"backend": config.cluster_backend, "fit_sample": config.cluster_fit_sample},
        "token_window_diversity": {"original": summary_before, "curated": summary_after},
        "ordering_quality": quality,
        "balance_field_quality": field_quality or None,
        "strategy_comparison": comparison,
        "similarity_stats": similarity,
        "cluster_sizes": {str(k): int(sizes[k]) for k in by_size},
        "empty_documents": empty,
        "stats_only": config.stats_only,
        "labels_file": str(paths["labels"]),
        "order_file": str(paths["order"]),
        "timings_seconds": timer.seconds,
        "peak_rss_mb": timer.peak_rss_mb,
    }
    save_json(paths["meta"], meta)
    log.info("Metadata: %s", paths["meta"])
    return CurateResult(meta, labels, order, counts, embeddings, paths, timings=timer.seconds)


def _projection_or_none(path: Path, embeddings: np.ndarray, fingerprints: np.ndarray, seed: int):
    try:
        import umap  # noqa: F401
    except ImportError:
        log.warning("umap-learn is not installed: cluster_cloud.png shows cluster sizes instead")
        return None
    if embeddings.shape[0] < 4:
        log.warning("Too few documents for a 2-D projection: cluster_cloud.png shows cluster sizes instead")
        return None
    return plots.cached_umap(path, embeddings, fingerprints, seed)


def _log_improvement(before: dict, after: dict, config: CurateConfig) -> None:
    gain = (after["mean"] / before["mean"] - 1) * 100 if before["mean"] else float("nan")
    log.info("Unique clusters per %s-token window (of K=%d): input order mean %.2f (min %d, std %.2f, %d windows) "
             "-> curated mean %.2f (min %d, std %.2f, %d windows): %+.0f%%",
             f"{config.seq_len:,}", config.n_clusters, before["mean"], before["min"], before["std"],
             before["n_sequences"], after["mean"], after["min"], after["std"], after["n_sequences"], gain)


# Which orderings read each ordering flag (CurateConfig field -> flag, orderings).
_FLAG_USERS = {
    "within_cluster_sort": ("--within-cluster-sort", ("stratified", "round-robin", "bin-packing")),
    "score_field": ("--score-field", ordering.SCORE_ORDERINGS),
    "jitter_window": ("--jitter-window", ordering.SCORE_ORDERINGS),
    "folds": ("--folds", ("folding", "zigzag", "stair", "saw")),
    "sections": ("--sections", ("stair", "saw")),
    "transition_ratio": ("--transition-ratio", ("stair", "saw")),
    "segment_percentages": ("--segment-percentages", ("segment",)),
    "length_bins": ("--length-bins", ("token-balanced",)),
    "length_weight": ("--length-weight", ("token-balanced",)),
    "balance_fields": ("--balance-field", ("token-balanced", "balanced")),
}


def _warn_unused_flags(config: CurateConfig) -> None:
    """A flag set away from its default that the chosen ordering never reads is almost always a mistake."""
    if config.compare_strategies:
        return  # the comparison runs every ordering, so every flag is read by one of them
    defaults = CurateConfig(input=config.input, output=config.output)
    for name, (flag, users) in _FLAG_USERS.items():
        if getattr(config, name) != getattr(defaults, name) and config.ordering not in users:
            log.warning("%s is not used by --ordering %s (it is read by %s)", flag, config.ordering, ", ".join(users))


def _ordering_options(config: CurateConfig, index: records.RecordIndex) -> ordering.OrderingOptions:
    """OrderingOptions from the flags, with scores and balance-field categories read from the records."""
    _warn_unused_flags(config)
    scores = None
    wants_scores = config.compare_strategies or config.ordering in ordering.SCORE_ORDERINGS
    if config.score_field is not None and wants_scores:
        scores = records.read_scores(index, config.score_field)
        log.info("Scores from '%s': min %g, median %g, max %g", config.score_field, scores.min(), np.median(scores),
                 scores.max())
    groups = None
    if config.balance_fields and (config.compare_strategies or config.ordering in ("token-balanced", "balanced")):
        columns = []
        for name in config.balance_fields:
            ids, categories = records.read_categories(index, name)
            shown = ", ".join(c if len(c) <= 30 else c[:27] + "..." for c in categories[:8])
            log.info("Balancing field '%s': %d %s (%s%s)", name, len(categories),
                     "category" if len(categories) == 1 else "categories", shown, ", ..." if len(categories) > 8 else "")
            columns.append(ids)
        groups = np.stack(columns, axis=1)
    return ordering.OrderingOptions(
        within_cluster_sort=config.within_cluster_sort, seed=config.seed, seq_len=config.seq_len,
        length_bins=config.length_bins, length_weight=config.length_weight, balance_groups=groups, scores=scores,
        folds=config.folds, sections=config.sections, transition_ratio=config.transition_ratio,
        segment_percentages=tuple(config.segment_percentages), jitter_window=config.jitter_window)


def _balance_field_quality(config: CurateConfig, options: ordering.OrderingOptions, counts: np.ndarray,
                           orders: dict) -> dict:
    """Uniformity and boundary shift of each --balance-field's categories (instead of clusters), per order."""
    if options.balance_groups is None:
        return {}
    out = {}
    for column, name in enumerate(config.balance_fields):
        ids = options.balance_groups[:, column]
        k = int(ids.max()) + 1
        out[name] = {key: {m: v for m, v in diversity.ordering_quality(ids, counts, config.seq_len, o, k).items()
                           if m in ("uniformity_mean", "uniformity_max", "boundary_shift")}
                     for key, o in orders.items()}
        q = out[name]
        log.info("Field '%s' token shares: uniformity mean %s, boundary shift %s (input / curated / random shuffle)",
                 name, " / ".join(f"{q[k]['uniformity_mean']:.4f}" for k in q),
                 " / ".join(f"{q[k]['boundary_shift']:.4f}" for k in q))
    return out


def _flag_value(config: CurateConfig, name: str):
    value = getattr(config, name)
    return list(value) if isinstance(value, tuple) else value


def _comparison_options(config: CurateConfig) -> dict:
    """The flags that shape the compared orderings, for the report."""
    return {**{name: _flag_value(config, name) for name in _FLAG_USERS}, "seed": config.seed}


def _options_meta(config: CurateConfig) -> dict:
    """The flags that shaped this ordering (only those it reads), for the metadata."""
    meta = {name: _flag_value(config, name) for name, (_, users) in _FLAG_USERS.items() if config.ordering in users}
    if config.ordering in ordering.SEQ_LEN_AWARE:
        meta["seq_len"] = config.seq_len
    return meta


def _log_quality(quality: dict) -> None:
    names = {"original": "input", "curated": "curated", "random_shuffle": "random shuffle"}
    log.info("Token-share uniformity (per window, max |cluster share - global share|; mean / max over windows, "
             "lower is better): %s", ", ".join(f"{names[k]} {q['uniformity_mean']:.4f} / {q['uniformity_max']:.4f}"
                                               for k, q in quality.items()))
    log.info("Epoch-boundary shift (cluster mix of the first vs last 5%% of tokens, total variation; lower is "
             "better): %s", ", ".join(f"{names[k]} {q['boundary_shift']:.4f}" for k, q in quality.items()))
    log.info("Coverage (share of tokens before every cluster has appeared): %s",
             ", ".join(f"{names[k]} {100 * q['coverage']:.1f}%" for k, q in quality.items()))
