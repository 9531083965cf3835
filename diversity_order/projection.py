"""The 2-D projection behind the cluster cloud: PCA -> UMAP, fitted on a sample for big inputs, cached.

UMAP on a million points takes minutes and a copy of the embeddings; above ``UMAP_FIT_SAMPLE``
rows PCA and UMAP are fitted on a seeded sample and every other point is placed among its
nearest sample points. The projection is cached beside the output (keyed by the embeddings), so
a re-run only redraws. What the layout was fitted on is kept too (``B_umap2d.fit.npz``), so that after
records are added or edited a re-run places only those among the fitted points instead of fitting UMAP
again, as long as the fitted texts still make up the input's larger part and embed as they did.
"""

from __future__ import annotations

import hashlib
import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import arrays, atomic, caches, matrix
from .defaults import DEFAULT_SEED
from .runtime import Progress, heartbeat

log = logging.getLogger(__name__)

# UMAP is fitted on at most this many rows; the rest are placed among their nearest neighbours.
UMAP_FIT_SAMPLE = 10000
# A re-run places new records among a kept fit while the input has at most this many times the records fitted
# on, and at least this share of the fitted texts is still there; else the layout is fitted again.
REFIT_GROWTH = 2.0
REFIT_SAMPLE_LEFT = 0.5
# Placing at most this many points takes seconds: no progress shown.
PLACED_QUIETLY = 100_000


@dataclass
class LayoutFit:
    """What a 2-D layout was fitted on, kept to place later records among its points."""

    fingerprints: np.ndarray  # uint64 per fitted point: its text
    anchors: np.ndarray  # float32, the fitted points as UMAP saw them (after the PCA)
    anchor_xy: np.ndarray  # float32, UMAP's positions for them
    sample_xy: np.ndarray  # float32, their positions in the projection stored with this fit
    mean: np.ndarray | None  # the PCA (None: none, the embeddings themselves)
    components: np.ndarray | None
    rows: int  # records of the input fitted on
    seed: int

    def project(self, rows) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.float32)
        return rows if self.components is None else ((rows - self.mean) @ self.components.T).astype(np.float32)

    def place(self, embeddings, rows: np.ndarray, out: np.ndarray, block: int = 100_000, progress: bool = True
              ) -> None:
        """``out[rows]``: where records ``rows`` of ``embeddings`` sit among the fitted points. Many rows show
        progress (a bar with ``progress``, else log lines): 1M of them take a minute or more, after UMAP's fit."""
        with Progress(int(rows.size), f"Placing points among the {self.fingerprints.size:,} UMAP was fitted on",
                      unit="points", rate_unit="points", bar=progress, silent=rows.size <= PLACED_QUIETLY) as bar:
            for lo in range(0, rows.size, block):
                chunk = rows[lo : lo + block]
                out[chunk] = place_by_neighbours(self.project(matrix.read_rows(embeddings, chunk)), self.anchors,
                                                 self.anchor_xy)
                bar.update(int(chunk.size))


def fit_path(path: Path) -> Path:
    """Where the fit behind the projection cached at ``path`` is kept."""
    return Path(path).with_name(Path(path).stem + ".fit.npz")


def save_fit(path: Path, fit: LayoutFit) -> None:
    """Written atomically; a fit that cannot be written only means a later re-run fits again."""
    arrays = {name: getattr(fit, name) for name in ("fingerprints", "anchors", "anchor_xy", "sample_xy")}
    if fit.components is not None:
        arrays.update(mean=fit.mean, components=fit.components)
    try:
        with atomic.atomic_open(path, "wb") as handle:
            np.savez(handle, rows=np.int64(fit.rows), seed=np.int64(fit.seed), **arrays)
    except OSError as exc:
        log.info("%s not written (%s): a re-run after records change fits the 2-D layout again", path,
                 exc.strerror or exc)


def load_fit(path: Path) -> LayoutFit | None:
    """The fit kept at ``path``; None (said when the file is there) when absent or unreadable."""
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            pca = "components" in stored.files
            fit = LayoutFit(stored["fingerprints"], stored["anchors"], stored["anchor_xy"], stored["sample_xy"],
                            stored["mean"] if pca else None, stored["components"] if pca else None,
                            int(stored["rows"]), int(stored["seed"]))
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        log.info("%s unreadable (%s): the 2-D layout is fitted again", path, exc)
        return None
    problem = _fit_problem(fit)
    if problem:
        log.info("%s: %s; the 2-D layout is fitted again", path, problem)
        return None
    return fit


def _fit_problem(fit: LayoutFit) -> str | None:
    """Why the arrays of a kept fit cannot be one fit (a damaged or hand-edited file); None when they can."""
    m = fit.fingerprints.shape[0] if fit.fingerprints.ndim == 1 else -1
    width = fit.anchors.shape[1] if fit.anchors.ndim == 2 else -1
    if m < 1 or fit.fingerprints.dtype != np.uint64:
        return "no fitted texts"
    if width < 1 or fit.anchors.shape[0] != m or fit.anchor_xy.shape != (m, 2) or fit.sample_xy.shape != (m, 2):
        return "its arrays disagree on the points fitted"
    if fit.components is not None and (fit.components.ndim != 2 or fit.components.shape[0] != width
                                       or fit.mean is None or fit.mean.shape != (fit.components.shape[1],)):
        return "its PCA does not match its points"
    if not (np.isfinite(fit.anchors).all() and np.isfinite(fit.anchor_xy).all() and np.isfinite(fit.sample_xy).all()):
        return "it holds values that are not finite"
    return None


def _fit_width(fit: LayoutFit) -> int:
    """The width of the embeddings a fit projects."""
    return fit.anchors.shape[1] if fit.components is None else fit.components.shape[1]


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


def umap_projection(embeddings: np.ndarray, seed: int = DEFAULT_SEED, fingerprints: np.ndarray | None = None
                    ) -> np.ndarray:
    """PCA(50) -> UMAP(2, n_neighbors=15, min_dist=0.1), fitted on a sample for big inputs."""
    return fitted_projection(embeddings, seed, fingerprints)[0]


def fitted_projection(embeddings: np.ndarray, seed: int = DEFAULT_SEED, fingerprints: np.ndarray | None = None,
                      progress: bool = True) -> tuple[np.ndarray, LayoutFit]:
    """``umap_projection`` and what it was fitted on (``fingerprints``: the records' texts, for the fit to name
    its points by; their positions when None)."""
    from sklearn.decomposition import PCA

    with heartbeat("Loading UMAP (its first import on a machine compiles numba kernels: up to a minute)"):
        import umap

    _enable_umap_jit_cache()

    n, dim = matrix.shape(embeddings)
    components = min(50, dim, max(n - 1, 1))
    # random_state makes UMAP single-threaded anyway; saying n_jobs=1 silences its warning.
    reducer = umap.UMAP(n_components=2, n_neighbors=min(15, max(n - 1, 2)), min_dist=0.1, random_state=seed, n_jobs=1)
    # Big inputs: PCA and UMAP are fitted on a seeded sample; every other point is projected
    # with that PCA and placed at the distance-weighted mean of its nearest sample points'
    # positions, batch by batch (BLAS; seconds per million points, where UMAP's own transform
    # takes minutes and a PCA of every row would hold another copy of the embeddings).
    sample = (np.arange(n) if n <= UMAP_FIT_SAMPLE
              else np.sort(np.random.RandomState(seed).choice(n, UMAP_FIT_SAMPLE, replace=False)))
    sampled = matrix.read_rows(embeddings, sample)
    pca = PCA(components, random_state=seed).fit(sampled) if components < dim else None
    names = sample.astype(np.uint64) if fingerprints is None else np.asarray(fingerprints, dtype=np.uint64)[sample]
    no_points = np.zeros((0, 2), np.float32)  # set below, once the PCA can project
    fit = LayoutFit(names, no_points, no_points, no_points, None if pca is None else pca.mean_.astype(np.float32),
                    None if pca is None else pca.components_.astype(np.float32), n, seed)
    fit.anchors = fit.project(sampled)
    what = f"{n:,} points" if n <= UMAP_FIT_SAMPLE else f"a sample of {UMAP_FIT_SAMPLE:,} points"
    with heartbeat(f"Fitting UMAP on {what}"):
        fit.anchor_xy = _fit_umap(reducer, fit.anchors)
    if n <= UMAP_FIT_SAMPLE:
        out = fit.anchor_xy.copy()
    else:
        out = np.empty((n, 2), dtype=np.float32)
        fit.place(embeddings, np.arange(n), out, progress=progress)
    fit.sample_xy = out[sample]
    return out, fit


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
    anchors = np.asarray(anchors, dtype=np.float32)
    anchor_sq = (anchors * anchors).sum(1)
    minus_twice = np.ascontiguousarray(-2.0 * anchors.T, dtype=np.float32)
    out = np.empty((points.shape[0], 2), dtype=np.float32)
    for lo in range(0, points.shape[0], batch):
        chunk = np.asarray(points[lo : lo + batch], dtype=np.float32)
        # Squared distances less each point's own squared norm, which ranks its anchors alike: two passes over the
        # batch x anchors block, where the whole distance took five (choosing the 10 nearest costs more still).
        partial = chunk @ minus_twice
        partial += anchor_sq
        nearest = np.argpartition(partial, k - 1, axis=1)[:, :k]
        # The k distances themselves computed directly: expanded, a point a hair from an anchor lost its distance
        # to cancellation, and with it the weight that puts it there.
        distances = np.sqrt(((chunk[:, None, :] - anchors[nearest]) ** 2).sum(2))
        weights = 1.0 / (distances + 1e-6)
        out[lo : lo + batch] = (anchor_xy[nearest] * weights[:, :, None]).sum(1) / weights.sum(1, keepdims=True)
    return out


def cached_umap(path: Path, embeddings: np.ndarray, fingerprints: np.ndarray, seed: int, progress: bool = True
                ) -> np.ndarray:
    """The UMAP projection, reused from ``path`` when the embeddings are the same; after records changed, the
    earlier one with only the changed records placed among the points fitted (``placed_among_earlier_fit``)."""
    key = {"kind": "umap2d", "embeddings": embeddings_key(embeddings), "seed": seed}
    found = caches.lookup(path, key, fingerprints)
    if found.hit.all():
        # The reason names where the rows came from: this output's cache, or another run's (the registry).
        log.info("2-D projection: %s", found.reason)
        if not path.exists():  # found elsewhere: a copy beside this output, as a computed one would be
            caches.store(path, key, fingerprints, np.asarray(found.data))
        if found.origin is not None:
            _adopt_fit(fit_path(found.origin), fit_path(path))
        return found.data
    projection = placed_among_earlier_fit(path, embeddings, fingerprints, seed, progress)
    if projection is None:
        if found.data is None and "no cache" in found.reason:
            why = "no cached projection"
        elif path.exists() and not fit_path(path).exists():
            why = f"the records changed, and no layout fit is kept ({fit_path(path).name}) to place them among"
        else:
            why = "the embeddings or --seed changed since it was cached"
        log.info("Computing the 2-D projection (PCA -> UMAP) for the cluster cloud plot: %s; --no-plot skips it", why)
        projection, fit = fitted_projection(embeddings, seed, fingerprints, progress)
        save_fit(fit_path(path), fit)
    caches.store(path, key, fingerprints, projection)
    return projection


def _adopt_fit(source: Path, target: Path) -> None:
    """The fit behind a projection taken whole from another run, kept beside this run's too, so that a later
    append places its new records rather than fitting again (``placed_among_earlier_fit`` checks it is the one
    behind those positions before using it)."""
    if source == target or not source.is_file():
        return
    try:
        data = source.read_bytes()
        if target.is_file() and target.read_bytes() == data:
            return
        with atomic.atomic_open(target, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        log.info("%s not copied beside this output (%s): a re-run after records change fits the 2-D layout again",
                 source, exc.strerror or exc)
        return
    log.info("2-D layout fit: %s, copied from %s", target.name, source)


def placed_among_earlier_fit(path: Path, embeddings, fingerprints: np.ndarray, seed: int, progress: bool = True
                             ) -> np.ndarray | None:
    """The projection cached at ``path`` for the records it has, the others placed among the points its UMAP
    was fitted on; None (said why) unless the fit kept beside it is the one behind those positions, its texts
    are still most of the fitted ones and embed as they did, and the input has not outgrown it."""
    fit = load_fit(fit_path(path))
    if fit is None or fit.seed != seed:
        return None
    n = fingerprints.shape[0]

    def refit(why: str) -> None:
        log.info("The kept 2-D layout fit (%s) is not reused: %s", fit_path(path).name, why)

    if n > REFIT_GROWTH * fit.rows:
        return refit(f"{n:,} records where it was fitted for {fit.rows:,}")
    width = matrix.shape(embeddings)[1]
    if width != _fit_width(fit):
        return refit(f"the embeddings are {width} wide, where it was fitted on {_fit_width(fit)} (another model or "
                     "--load-embeddings)")
    earlier = caches.lookup(path, None, fingerprints, accept_any_key=True, dtype=np.float32, row_shape=(2,),
                            registry=False)
    where = caches.match_rows(fingerprints, fit.fingerprints)  # each fitted text's row now (-1: gone)
    left = where >= 0
    if left.sum() < REFIT_SAMPLE_LEFT * where.size:
        texts = arrays.distinct(fit.fingerprints)
        return refit(f"{int(arrays.member(texts, fingerprints).sum()):,} of the {texts.size:,} texts it was fitted on "
                     "are left")
    # Records sharing a text share a fingerprint but may sit a hair apart (placed in other batches): the positions
    # of the fitted texts are compared by their median difference, which another layout's far exceeds.
    extent = float(np.ptp(fit.sample_xy, axis=0).max(initial=0.0)) or 1.0
    if earlier.data is None or (earlier.key or {}).get("seed") != seed or not earlier.hit[where[left]].all() \
            or np.median(np.abs(earlier.data[where[left]] - fit.sample_xy[left])) > 1e-4 * extent:
        return refit("the cached projection is not the one made with it")
    rows = where[left]
    by_row = np.argsort(rows, kind="stable")
    now = np.empty((rows.size, fit.anchors.shape[1]), dtype=np.float32)
    now[by_row] = fit.project(matrix.read_rows(embeddings, rows[by_row]))
    scale = float(np.abs(fit.anchors).max(initial=0.0)) or 1.0
    if not np.allclose(now, fit.anchors[left], rtol=0, atol=1e-4 * scale):
        return refit("the texts it was fitted on embed differently now (another model or embeddings)")
    out = np.array(earlier.data, dtype=np.float32)
    new = earlier.missing_rows
    try:
        fit.place(embeddings, new, out, progress=progress)
    except (ValueError, IndexError) as exc:  # a fit file edited into another consistent-looking one
        return refit(f"it cannot place these records ({exc})")
    placed = (f"{new.size:,} new or edited record(s) placed among the {fit.fingerprints.size:,} points UMAP was "
              "fitted on, without fitting it again" if new.size else
              "no new or edited records to place (records were removed or moved), the layout kept")
    log.info("2-D projection: %s; %s (for a new layout, delete %s and %s)", earlier.reason, placed, path.name,
             fit_path(path).name)
    return out


def projection_or_none(path: Path, embeddings: np.ndarray, fingerprints: np.ndarray, seed: int, progress: bool = True):
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
    return cached_umap(path, embeddings, fingerprints, seed, progress)
