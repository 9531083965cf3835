"""The 2-D projection behind the cluster cloud: PCA -> UMAP, fitted on a sample for big inputs, cached.

UMAP on a million points takes minutes and a copy of the embeddings; above ``UMAP_FIT_SAMPLE``
rows PCA and UMAP are fitted on a seeded sample and every other point is placed among its
nearest sample points. The projection is cached beside the output (keyed by the embeddings), so
a re-run only redraws.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from . import caches, matrix
from .defaults import DEFAULT_SEED
from .runtime import heartbeat

log = logging.getLogger(__name__)

# UMAP is fitted on at most this many rows; the rest are placed among their nearest neighbours.
UMAP_FIT_SAMPLE = 10000


def embeddings_key(embeddings: np.ndarray) -> str:
    """A hash of the embedding matrix (strided for big ones) to key the 2-D projection cache."""
    digest = hashlib.blake2b(digest_size=8)
    n = matrix.shape(embeddings)[0]
    digest.update(str(tuple(matrix.shape(embeddings))).encode())
    stride = max(1, n // 65536)
    digest.update(np.ascontiguousarray(matrix.read_rows(embeddings, np.arange(0, n, stride))).tobytes())
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


def umap_projection(embeddings: np.ndarray, seed: int = DEFAULT_SEED, progress: bool = True) -> np.ndarray:
    """PCA(50) -> UMAP(2, n_neighbors=15, min_dist=0.1), fitted on a sample for big inputs."""
    from sklearn.decomposition import PCA

    with heartbeat("Loading UMAP (its first import on a machine compiles numba kernels: up to a minute)"):
        import umap

    _enable_umap_jit_cache()

    n, dim = matrix.shape(embeddings)
    components = min(50, dim, max(n - 1, 1))
    # random_state makes UMAP single-threaded anyway; saying n_jobs=1 silences its warning.
    reducer = umap.UMAP(n_components=2, n_neighbors=min(15, max(n - 1, 2)), min_dist=0.1, random_state=seed, n_jobs=1)
    if n <= UMAP_FIT_SAMPLE:
        embeddings = matrix.load(embeddings)
        reduced = PCA(components, random_state=seed).fit_transform(embeddings) if components < dim else embeddings
        with heartbeat(f"Fitting UMAP on {n:,} points"):
            return _fit_umap(reducer, reduced)
    # Big inputs: PCA and UMAP are fitted on a seeded sample; every other point is projected
    # with that PCA and placed at the distance-weighted mean of its nearest sample points'
    # positions, batch by batch (BLAS; seconds per million points, where UMAP's own transform
    # takes minutes and a PCA of every row would hold another copy of the embeddings).
    sample = np.sort(np.random.RandomState(seed).choice(n, UMAP_FIT_SAMPLE, replace=False))
    sampled = matrix.read_rows(embeddings, sample)
    pca = PCA(components, random_state=seed).fit(sampled) if components < dim else None
    project = (lambda rows: pca.transform(rows).astype(np.float32)) if pca else (lambda rows: np.asarray(rows, np.float32))
    anchors = project(sampled)
    with heartbeat(f"Fitting UMAP on a sample of {UMAP_FIT_SAMPLE:,} points"):
        anchor_xy = _fit_umap(reducer, anchors)
    out = np.empty((n, 2), dtype=np.float32)
    for lo, hi, block in matrix.blocks(embeddings, 100_000):
        out[lo:hi] = place_by_neighbours(project(block), anchors, anchor_xy)
    return out


def _fit_umap(reducer, points: np.ndarray) -> np.ndarray:
    """``reducer.fit_transform(points)`` as float32, its warnings logged one line each: on many identical
    documents UMAP's spectral start fails and it prints several lines and a source line to stderr
    before starting from random positions, which only changes the cloud plot's layout."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # the filters set so far still apply
        xy = reducer.fit_transform(points).astype(np.float32)
    said = dict.fromkeys(" ".join(str(w.message).split()) for w in caught)  # in order, once each
    for message in said:
        log.info("UMAP (the cluster cloud's layout only): %s", message)
    return xy


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
        # The reason names where the rows came from: this output's cache, or another run's (the registry).
        log.info("2-D projection: %s", found.reason)
        if not path.exists():  # found elsewhere: a copy beside this output, as a computed one would be
            caches.store(path, key, fingerprints, np.asarray(found.data))
        return found.data
    log.info("Computing the 2-D projection (PCA -> UMAP) for the cluster cloud plot: %s; --no-plot skips it",
             "no cached projection" if found.data is None and "no cache" in found.reason
             else "the embeddings changed since it was cached")
    projection = umap_projection(embeddings, seed)
    caches.store(path, key, fingerprints, projection)
    return projection


def projection_or_none(path: Path, embeddings: np.ndarray, fingerprints: np.ndarray, seed: int):
    """The cached 2-D projection, or None (with a warning) when umap-learn is missing or N < 4."""
    import importlib.util

    # Found, not imported: its first import compiles numba code (up to a minute), which belongs after the
    # line saying a projection is being computed, and is not needed when one is cached.
    try:
        missing = importlib.util.find_spec("umap") is None
    except ValueError:  # an entry of None in sys.modules: blocked, as good as missing
        missing = True
    if missing:
        log.warning("umap-learn is not installed: cluster_cloud.png shows cluster sizes instead")
        return None
    if matrix.shape(embeddings)[0] < 4:
        log.warning("Too few documents for a 2-D projection: cluster_cloud.png shows cluster sizes instead")
        return None
    return cached_umap(path, embeddings, fingerprints, seed)
