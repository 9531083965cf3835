"""Plots: ``ordering_comparison.png`` (before/after), ``cluster_cloud.png`` (2-D map of clusters) and
the strategy comparison's diversity curves.

Matplotlib runs headless (Agg). The colour bars are drawn as one image each, however many
documents there are; scatter points are rasterised so the PNG stays light at any N.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from . import caches
from .atomic import atomic_open

log = logging.getLogger(__name__)

# UMAP is fitted on at most this many rows; the rest are placed among their nearest neighbours.
UMAP_FIT_SAMPLE = 10000


def cluster_colors(n_clusters: int) -> np.ndarray:
    """RGBA per cluster, all distinct up to 60 clusters.

    The reference resamples ``tab20`` to K colours, which repeats colours past K = 20 (at
    the default K = 30, ten pairs of clusters look the same). Up to 20 clusters this is tab20
    as in the reference; up to 60, tab20 + tab20b + tab20c; beyond, a shuffled sweep of turbo.
    """
    import matplotlib

    k = max(n_clusters, 1)
    if k <= 20:
        return matplotlib.colormaps["tab20"].resampled(k)(np.arange(k))
    if k <= 60:
        palette = np.concatenate([matplotlib.colormaps[name](np.arange(20)) for name in ("tab20", "tab20b", "tab20c")])
        return palette[:k]
    shuffled = np.random.RandomState(0).permutation(k)
    return matplotlib.colormaps["turbo"](shuffled / max(k - 1, 1))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int = 120) -> None:
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=dpi, bbox_inches="tight")


def _colour_strip(labels_in_order: np.ndarray, counts_in_order: np.ndarray, colors: np.ndarray,
                  width: int = 4000) -> np.ndarray:
    """An RGBA strip along the token axis: column j shows the document at that token position,
    so the strip lines up with the per-window chart below it."""
    ends = np.cumsum(counts_in_order, dtype=np.int64)
    total = int(ends[-1]) if ends.size else 0
    if total == 0:
        return colors[labels_in_order[:1]][np.newaxis, :, :] if labels_in_order.size else np.ones((1, 1, 4))
    positions = (np.arange(width) + 0.5) * total / width
    doc = np.minimum(np.searchsorted(ends, positions, side="right"), labels_in_order.size - 1)
    return colors[labels_in_order[doc]][np.newaxis, :, :]


def plot_ordering_comparison(path: Path, labels: np.ndarray, token_counts: np.ndarray, order: np.ndarray,
                             n_clusters: int, diversity_before: np.ndarray, diversity_after: np.ndarray,
                             summary_before: dict, summary_after: dict, seq_len: int,
                             quality: dict | None = None, ordering_name: str = "stratified") -> None:
    """``quality``: {"original": .., "curated": .., "random_shuffle": ..} from diversity.ordering_quality,
    shown as a line per order under the strips."""
    plt = _pyplot()
    colors = cluster_colors(n_clusters)
    fig, axes = plt.subplots(3, 1, figsize=(14, 8), gridspec_kw={"height_ratios": [1, 1, 3]}, sharex=True)
    total_windows = float(token_counts.sum()) / seq_len

    def title(name: str, s: dict) -> str:
        return f"{name}: mean diversity {s['mean']:.2f}, min {s['min']}, std {s['std']:.2f} ({s['n_sequences']:,} windows)"

    for ax, order_here, text, n_windows in (
        (axes[0], np.arange(labels.size), title("Input order", summary_before), diversity_before.size),
        (axes[1], order, title(f"Curated order ({ordering_name})", summary_after), diversity_after.size),
    ):
        strip = _colour_strip(labels[order_here], token_counts[order_here], colors)
        # Packing never splits a document, so windows end part-empty: stretch the token axis over
        # the packed windows so the strip lines up with the per-window curve below.
        ax.imshow(strip, aspect="auto", interpolation="nearest", extent=(0, max(n_windows, total_windows), 0, 1))
        ax.set_yticks([])
        ax.set_title(text, fontsize=10)
    ax = axes[2]
    ax.plot(np.arange(diversity_before.size) + 0.5, diversity_before, lw=1, color="tab:red", label="input order")
    ax.plot(np.arange(diversity_after.size) + 0.5, diversity_after, lw=1, color="tab:blue", label="curated order")
    ax.axhline(n_clusters, ls="--", color="grey", lw=1, label=f"K = {n_clusters}")
    ax.set_xlabel(f"position in the data, in training sequences of {seq_len:,} tokens")
    ax.set_ylabel("unique clusters in sequence")
    ax.set_ylim(0, n_clusters * 1.08 + 0.5)
    ax.set_xlim(0, max(total_windows, diversity_before.size, diversity_after.size))
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.suptitle(f"Documents coloured by cluster (K = {n_clusters}) along the token stream, input vs curated order")
    if quality:
        names = {"original": "input", "curated": "curated", "random_shuffle": "random shuffle"}
        text = "      ".join(
            f"{names[key]}: {q['uniformity_mean']:.3f} (max {q['uniformity_max']:.2f}), shift {q['boundary_shift']:.3f}"
            for key, q in quality.items() if key in names)
        fig.text(0.5, -0.005, "Token-share uniformity, mean over windows (max), and epoch-boundary shift; lower is "
                 "better\n" + text, ha="center", va="top", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def embeddings_key(embeddings: np.ndarray) -> str:
    """A hash of the embedding matrix (strided for big ones) to key the 2-D projection cache."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(str(embeddings.shape).encode())
    stride = max(1, embeddings.shape[0] // 65536)
    digest.update(np.ascontiguousarray(embeddings[::stride]).tobytes())
    return digest.hexdigest()


def _enable_umap_jit_cache() -> None:
    """Let numba cache umap's and pynndescent's compiled functions on disk.

    They are compiled without ``cache=True``, so every new process spent ~40 s compiling
    before its first projection (on the 2-core CI machine); with the cache a later process
    starts in ~10 s. ``Dispatcher.enable_caching`` is numba's public switch for this; the
    cache is invalidated by numba when the library's source changes.
    """
    import sys
    import warnings

    from numba.core.dispatcher import Dispatcher

    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("umap", "pynndescent")):
            continue
        for value in list(vars(module).values()):
            if isinstance(value, Dispatcher) and not getattr(value, "_cache_enabled_by_us", False):
                try:
                    value.enable_caching()
                    value._cache_enabled_by_us = True
                except Exception:  # e.g. no writable cache folder: compile as before
                    return
    # Functions numba cannot cache (closures) warn once each; that is expected here.
    warnings.filterwarnings("ignore", message=".*Cannot cache compiled function.*")
    warnings.filterwarnings("ignore", category=Warning, module="numba.*")


def umap_projection(embeddings: np.ndarray, seed: int = 42, progress: bool = True) -> np.ndarray:
    """PCA(50) -> UMAP(2, n_neighbors=15, min_dist=0.1), fitted on a sample for big inputs."""
    import umap
    from sklearn.decomposition import PCA

    _enable_umap_jit_cache()

    n, dim = embeddings.shape
    components = min(50, dim, max(n - 1, 1))
    # random_state makes UMAP single-threaded anyway; saying n_jobs=1 silences its warning.
    reducer = umap.UMAP(n_components=2, n_neighbors=min(15, max(n - 1, 2)), min_dist=0.1, random_state=seed, n_jobs=1)
    if n <= UMAP_FIT_SAMPLE:
        reduced = PCA(components, random_state=seed).fit_transform(embeddings) if components < dim else embeddings
        return reducer.fit_transform(reduced).astype(np.float32)
    # Big inputs: PCA and UMAP are fitted on a seeded sample; every other point is projected
    # with that PCA and placed at the distance-weighted mean of its nearest sample points'
    # positions, batch by batch (BLAS; seconds per million points, where UMAP's own transform
    # takes minutes and a PCA of every row would hold another copy of the embeddings).
    sample = np.sort(np.random.RandomState(seed).choice(n, UMAP_FIT_SAMPLE, replace=False))
    pca = PCA(components, random_state=seed).fit(embeddings[sample]) if components < dim else None
    project = (lambda rows: pca.transform(rows).astype(np.float32)) if pca else (lambda rows: np.asarray(rows, np.float32))
    anchors = project(embeddings[sample])
    anchor_xy = reducer.fit_transform(anchors).astype(np.float32)
    out = np.empty((n, 2), dtype=np.float32)
    for lo in range(0, n, 100_000):
        out[lo : lo + 100_000] = place_by_neighbours(project(embeddings[lo : lo + 100_000]), anchors, anchor_xy)
    return out


def place_by_neighbours(points: np.ndarray, anchors: np.ndarray, anchor_xy: np.ndarray, k: int = 10,
                        batch: int = 2048) -> np.ndarray:
    """2-D position of each point: inverse-distance-weighted mean of its k nearest anchors' positions."""
    k = min(k, anchors.shape[0])
    anchor_sq = (anchors * anchors).sum(1)
    out = np.empty((points.shape[0], 2), dtype=np.float32)
    for lo in range(0, points.shape[0], batch):
        chunk = points[lo : lo + batch]
        dist_sq = np.maximum(anchor_sq[None, :] - 2 * chunk @ anchors.T + (chunk * chunk).sum(1)[:, None], 0)
        nearest = np.argpartition(dist_sq, k - 1, axis=1)[:, :k]
        weights = 1.0 / (np.sqrt(np.take_along_axis(dist_sq, nearest, axis=1)) + 1e-6)
        out[lo : lo + batch] = (anchor_xy[nearest] * weights[:, :, None]).sum(1) / weights.sum(1, keepdims=True)
    return out


def cached_umap(path: Path, embeddings: np.ndarray, fingerprints: np.ndarray, seed: int) -> np.ndarray:
    """The UMAP projection, reused from ``path`` when the embeddings are the same."""
    key = {"kind": "umap2d", "embeddings": embeddings_key(embeddings), "seed": seed}
    found = caches.lookup(path, key, fingerprints)
    if found.hit.all():
        log.info("2-D projection reused from %s", path.name)
        return found.data
    log.info("Computing the 2-D projection (PCA -> UMAP) for cluster_cloud.png: %s; --no-plot skips it",
             "no cached projection" if found.data is None and "no cache" in found.reason
             else "the embeddings changed since it was cached")
    projection = umap_projection(embeddings, seed)
    caches.store(path, key, fingerprints, projection)
    return projection


def plot_cluster_cloud(path: Path, labels: np.ndarray, n_clusters: int, projection: np.ndarray | None) -> None:
    """Scatter of the 2-D projection coloured by cluster; a bar chart of sizes without one."""
    plt = _pyplot()
    colors = cluster_colors(n_clusters)
    sizes = np.bincount(labels, minlength=n_clusters)
    if projection is None:
        fig, ax = plt.subplots(figsize=(12, 6))
        by_size = np.argsort(-sizes, kind="stable")
        ax.bar(np.arange(n_clusters), sizes[by_size], color=colors[by_size])
        ax.set_xticks(np.arange(n_clusters), [f"c{k}" for k in by_size], rotation=90, fontsize=8)
        ax.set_ylabel("documents")
        ax.set_title(f"Cluster sizes (K = {n_clusters}); install umap-learn for the 2-D cluster cloud")
    else:
        fig, ax = plt.subplots(figsize=(12, 10))
        n = labels.size
        point = float(np.clip(60000 / max(n, 1), 0.5, 20))
        ax.scatter(projection[:, 0], projection[:, 1], c=colors[labels], s=point, lw=0, alpha=0.8, rasterized=True)
        # Frame the bulk of the points: a few far outliers would otherwise squeeze the picture.
        lo, hi = np.percentile(projection, [0.5, 99.5], axis=0)
        pad = (hi - lo) * 0.05
        ax.set_xlim(lo[0] - pad[0], hi[0] + pad[0])
        ax.set_ylim(lo[1] - pad[1], hi[1] + pad[1])
        for k in np.flatnonzero(sizes):
            centre = np.clip(np.median(projection[labels == k], axis=0), lo, hi)
            ax.annotate(f"c{k} ({sizes[k]})", centre, fontsize=8, ha="center", va="center",
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.7, "lw": 0})
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{n:,} documents, PCA -> UMAP, coloured by cluster (K = {n_clusters})")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def plot_strategy_curves(path: Path, curves: dict, n_clusters: int, title: str) -> None:
    """One panel per seq_len: unique clusters per window along the order, one line per ordering.

    ``curves``: {(ordering, seq_len): per-window diversity}. Lines are smoothed over ~2% of the
    windows so a dozen orderings stay readable; x is the position as a fraction of the order.
    """
    plt = _pyplot()
    seq_lens = sorted({seq_len for _, seq_len in curves})
    names = list(dict.fromkeys(name for name, _ in curves))
    # A fixed colour per ordering, distinct within each family; score orderings dotted. The three
    # the README compares (balanced, stratified, random) are drawn thick.
    style = {
        "balanced": ("#1f77b4", "-"), "stratified": ("#ff7f0e", "-"), "random": ("#222222", "--"),
        "token-balanced": ("#2ca02c", "-"), "bin-packing": ("#d62728", "-"), "round-robin": ("#9467bd", "-"),
        "original": ("#8c564b", "-"), "sorted": ("#e377c2", ":"), "folding": ("#7f7f7f", ":"),
        "zigzag": ("#bcbd22", ":"), "segment": ("#17becf", ":"), "stair": ("#393b79", ":"), "saw": ("#ad494a", ":"),
    }
    fixed = ("balanced", "stratified", "random")
    fig, axes = plt.subplots(len(seq_lens), 1, figsize=(13, 3.6 * len(seq_lens)), squeeze=False)
    for ax, seq_len in zip(axes[:, 0], seq_lens):
        for i, name in enumerate(names):
            values = np.asarray(curves[(name, seq_len)], dtype=np.float64)
            width = max(1, values.size // 50)
            smooth = np.convolve(values, np.ones(width) / width, mode="valid") if values.size >= width else values
            x = (np.arange(smooth.size) + width / 2) / max(values.size, 1)
            bold = name in fixed
            color, line = style.get(name, (plt.get_cmap("tab20")(i % 20), "-"))
            ax.plot(x, smooth, lw=2.2 if bold else 1.2, alpha=1.0 if bold else 0.85, color=color, ls=line,
                    label=f"{name} ({values.mean():.2f})", zorder=3 if bold else 2)
        ax.set_title(f"seq-len {seq_len:,}: unique clusters per window, moving average over ~2% of the windows "
                     f"(mean of all windows in the legend)", fontsize=10)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, None)
        ax.set_ylabel("unique clusters")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7.5, ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes[-1, 0].set_xlabel("position in the order (fraction of windows)")
    fig.suptitle(f"Ordering strategies on {title} (K = {n_clusters})")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
