"""The curate pipeline: records -> token counts + embeddings -> labels -> order -> stats and outputs.

``curate(config)`` runs the stages in order; each stage is one call into its module, and
per-document state stays in flat arrays indexed by input position.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import caches, clustering, distributed, diversity, ordering, plots, records
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
    with timer.stage("Ordering (stratified greedy)"):
        options = ordering.OrderingOptions(config.within_cluster_sort, config.seed)
        order = ordering.stratified_order(labels, counts, config.n_clusters, options)
    with timer.stage("Diversity statistics"):
        before = diversity.window_diversity(labels, counts, config.seq_len)
        after = diversity.window_diversity(labels, counts, config.seq_len, order)
        summary_before, summary_after = diversity.summarize_windows(before), diversity.summarize_windows(after)
        similarity = diversity.similarity_stats(embeddings, config.seed)
    _log_improvement(summary_before, summary_after, config)

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
                                           summary_before, summary_after, config.seq_len)
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
        "ordering": ordering.ORDERING_META_NAMES["stratified"],
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
