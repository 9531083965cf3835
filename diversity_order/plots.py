"""Plots: ``ordering_comparison.png`` (before/after) and ``cluster_cloud.png`` (2-D map of clusters).

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

# UMAP is fitted on at most this many rows; the rest are placed with ``transform``.
UMAP_FIT_SAMPLE = 20000


def cluster_colors(n_clusters: int) -> np.ndarray:
    """RGBA per cluster: matplotlib's tab20 resampled to K colours, as the reference."""
    import matplotlib

    return matplotlib.colormaps["tab20"].resampled(max(n_clusters, 1))(np.arange(max(n_clusters, 1)))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, dpi: int = 120) -> None:
    with atomic_open(path, "wb") as handle:
        fig.savefig(handle, format="png", dpi=dpi, bbox_inches="tight")


def _colour_strip(labels_in_order: np.ndarray, colors: np.ndarray, width: int = 4000) -> np.ndarray:
    """An RGBA strip, one column per document (or per bucket of documents past ``width``)."""
    n = labels_in_order.size
    if n > width:
        # Show the document at the start of each bucket: still exact for long runs of a cluster.
        labels_in_order = labels_in_order[np.linspace(0, n - 1, width).astype(np.int64)]
    return colors[labels_in_order][np.newaxis, :, :]


def plot_ordering_comparison(path: Path, labels: np.ndarray, order: np.ndarray, n_clusters: int,
                             diversity_before: np.ndarray, diversity_after: np.ndarray,
                             summary_before: dict, summary_after: dict, seq_len: int) -> None:
    plt = _pyplot()
    colors = cluster_colors(n_clusters)
    fig, axes = plt.subplots(3, 1, figsize=(14, 8), gridspec_kw={"height_ratios": [1, 1, 3]})

    def title(name: str, s: dict) -> str:
        return f"{name}: mean diversity {s['mean']:.2f}, min {s['min']}, std {s['std']:.2f} ({s['n_sequences']:,} windows)"

    for ax, labels_in_order, text in (
        (axes[0], labels, title("Input order", summary_before)),
        (axes[1], labels[order], title("Curated order", summary_after)),
    ):
        ax.imshow(_colour_strip(labels_in_order, colors), aspect="auto", interpolation="nearest")
        ax.set_yticks([])
        ax.set_xticks([])
        ax.set_title(text, fontsize=10)
    ax = axes[2]
    ax.plot(np.arange(1, diversity_before.size + 1), diversity_before, lw=1, color="tab:red", label="input order")
    ax.plot(np.arange(1, diversity_after.size + 1), diversity_after, lw=1, color="tab:blue", label="curated order")
    ax.axhline(n_clusters, ls="--", color="grey", lw=1, label=f"K = {n_clusters}")
    ax.set_xlabel(f"training sequence ({seq_len:,} tokens each)")
    ax.set_ylabel("unique clusters in sequence")
    ax.set_ylim(0, n_clusters * 1.08 + 0.5)
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.suptitle(f"Documents coloured by cluster (K = {n_clusters}), in input and curated order")
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


def umap_projection(embeddings: np.ndarray, seed: int = 42, progress: bool = True) -> np.ndarray:
    """PCA(50) -> UMAP(2, n_neighbors=15, min_dist=0.1), fitted on a sample for big inputs."""
    import umap
    from sklearn.decomposition import PCA

    n, dim = embeddings.shape
    components = min(50, dim, max(n - 1, 1))
    reduced = PCA(n_components=components, random_state=seed).fit_transform(embeddings) if components < dim else embeddings
    # random_state makes UMAP single-threaded anyway; saying n_jobs=1 silences its warning.
    reducer = umap.UMAP(n_components=2, n_neighbors=min(15, max(n - 1, 2)), min_dist=0.1, random_state=seed, n_jobs=1)
    if n <= UMAP_FIT_SAMPLE:
        return reducer.fit_transform(reduced).astype(np.float32)
    sample = np.sort(np.random.RandomState(seed).choice(n, UMAP_FIT_SAMPLE, replace=False))
    reducer.fit(reduced[sample])
    out = np.empty((n, 2), dtype=np.float32)
    for lo in range(0, n, 100_000):
        out[lo : lo + 100_000] = reducer.transform(reduced[lo : lo + 100_000])
    return out


def cached_umap(path: Path, embeddings: np.ndarray, fingerprints: np.ndarray, seed: int) -> np.ndarray:
    """The UMAP projection, reused from ``path`` when the embeddings are the same."""
    key = {"kind": "umap2d", "embeddings": embeddings_key(embeddings), "seed": seed}
    found = caches.lookup(path, key, fingerprints)
    if found.hit.all():
        log.info("2-D projection reused from %s", path.name)
        return found.data
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
        point = float(np.clip(20000 / max(n, 1), 0.2, 8))
        ax.scatter(projection[:, 0], projection[:, 1], c=colors[labels], s=point, lw=0, alpha=0.7, rasterized=True)
        for k in np.flatnonzero(sizes):
            centre = np.median(projection[labels == k], axis=0)
            ax.annotate(f"c{k} ({sizes[k]})", centre, fontsize=8, ha="center", va="center",
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "alpha": 0.7, "lw": 0})
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"{n:,} documents, PCA -> UMAP, coloured by cluster (K = {n_clusters})")
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)
