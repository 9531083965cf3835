"""Clustering: k-means labels, optional PCA, and k calibration by cosine silhouette.

k-means is scikit-learn's MiniBatchKMeans with the original toolkit's settings, so given the same
embeddings, k and seed, the labels are the original toolkit's. The silhouette used to calibrate k
is computed blockwise with BLAS (memory O(block * n), not an n x n matrix); it equals
``sklearn.metrics.silhouette_score(..., metric="cosine")`` on the same sample.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import caches, matrix
from .defaults import DEFAULT_SEED
from .matrix import Matrix
from .runtime import Progress

log = logging.getLogger(__name__)

CALIBRATION_K_VALUES = (5, 10, 15, 20, 25, 30, 40, 50, 75, 100)
# The recommended k is the highest whose silhouette is at least this share of the peak.
CALIBRATION_TOLERANCE = 0.95


CLUSTER_BACKENDS = ("sklearn", "faiss", "torch")
# Rows assigned to their nearest centre per batch (bounds memory at batch x k distances).
ASSIGN_BATCH_ROWS = 65536


def make_kmeans(n_clusters: int, seed: int):
    from sklearn.cluster import MiniBatchKMeans

    return MiniBatchKMeans(n_clusters=n_clusters, random_state=seed, batch_size=4096, n_init=3)


def kmeans_labels(embeddings: Matrix, n_clusters: int, seed: int = DEFAULT_SEED, backend: str = "sklearn",
                  fit_sample: int = 0, device=None) -> np.ndarray:
    """Cluster ids in [0, n_clusters) for every row.

    ``sklearn`` (default) is the original toolkit's MiniBatchKMeans, fitted on all rows: the same
    labels as the original toolkit. ``faiss`` and ``torch`` are faster Lloyd k-means (torch runs on
    ``device``, a GPU when given). ``fit_sample`` > 0 fits the centres on that many seeded
    random rows and assigns every row to its nearest centre, a block of rows at a time (the
    matrix may then be a file: only the sample is held in memory).
    """
    if backend not in CLUSTER_BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(CLUSTER_BACKENDS)}")
    n = matrix.shape(embeddings)[0]
    sample = sample_rows(n, fit_sample, seed) if 0 < fit_sample < n else None
    if sample is None and backend == "sklearn":
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1, user_api="blas"):
            return make_kmeans(n_clusters, seed).fit_predict(matrix.load(embeddings)).astype(np.int64)
    started = time.perf_counter()
    fit_rows = matrix.load(embeddings) if sample is None else matrix.read_rows(embeddings, sample)
    centres = fit_centres(fit_rows, n_clusters, seed, backend, device)
    fitted = time.perf_counter()
    log.info("k-means centres fitted on %d rows in %.1f s", fit_rows.shape[0], fitted - started)
    del fit_rows  # the sample is not needed to assign the rows: not held beside the blocks read for that
    labels = assign_to_centres(embeddings, centres, device)
    log.info("Every row assigned to its nearest centre in %.1f s", time.perf_counter() - fitted)
    return labels


def labels_key(embeddings: Matrix, fingerprints: np.ndarray, n_clusters: int, seed: int, backend: str,
               fit_sample: int, device=None) -> dict:
    """What ``kmeans_labels`` returns is a function of, to keep its labels for a rerun: every byte of the matrix
    (a digest of it: any edited, added or moved row changes it), the fit's settings, and the library that fits
    (another version, or torch on another device, may fit other centres); and the records' fingerprints in order,
    so labels are only ever taken for the rows they were fitted to (a cache lookup matches rows by text: the same
    --load-embeddings file beside the records shuffled took 467 of 600 labels from other rows)."""
    if isinstance(embeddings, matrix.MatrixFile):
        digest = caches.digest_file(embeddings.path)  # the .npy header holds the shape and dtype
    else:
        array = np.ascontiguousarray(embeddings)
        digest = f"{caches.digest_buffer(array)} {array.dtype.str} {list(array.shape)}"
    rows = caches.digest_buffer(np.ascontiguousarray(fingerprints, dtype=np.uint64))
    # Sampled fits assign every row with torch on the run's device, whatever fits the centres.
    assigned = f", assigned on {_device_type(device)}" if fit_sample else ""
    return {"kind": "kmeans_labels", "embeddings": digest, "rows": rows, "n_clusters": n_clusters, "seed": seed,
            "backend": backend, "fit_rows": fit_sample, "fitter": _fitter(backend, device) + assigned}


def _device_type(device) -> str:
    return getattr(device, "type", None) or str(device or "cpu").split(":")[0]


def _fitter(backend: str, device) -> str:
    if backend == "sklearn":
        from importlib.metadata import version

        return f"scikit-learn {version('scikit-learn')}"  # (not imported: a second of an unchanged rerun)
    if backend == "faiss":
        from importlib.metadata import PackageNotFoundError, version

        # By its distribution, not imported: its import logs which CPU build it loads, on every rerun.
        for distribution in ("faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu11", "faiss-cpu", "faiss"):
            try:
                return f"{distribution} {version(distribution)}"
            except PackageNotFoundError:
                continue
        return "faiss (version unknown)"
    import torch

    return f"torch {torch.__version__} {_device_type(device)}"


def kept_labels(found, n_clusters: int) -> np.ndarray | None:
    """The labels of a cache lookup (``caches.lookup`` under ``labels_key``) when it holds every row, each a
    cluster of ``n_clusters``; else None (fitted again)."""
    if found.data is None or not found.hit.all():
        return None
    labels = np.asarray(found.data, dtype=np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= n_clusters):
        log.info("k-means labels kept from an earlier run name clusters outside 0..%i: fitted again", n_clusters - 1)
        return None
    return labels


def fit_centres(rows: np.ndarray, n_clusters: int, seed: int = DEFAULT_SEED, backend: str = "sklearn",
                device=None) -> np.ndarray:
    """k-means centres fitted on ``rows`` (in memory) with ``backend``'s settings: what
    ``kmeans_labels(..., fit_sample=S)`` fits on its S sampled rows, for callers that hold only the
    sample (torchrun ranks)."""
    if backend == "sklearn":
        from threadpoolctl import threadpool_limits

        # One BLAS thread: MiniBatchKMeans's small batches gain nothing from more, and on a few cores
        # BLAS, OpenMP and torch threads spinning against each other made the fit 4x slower.
        with threadpool_limits(limits=1, user_api="blas"):
            return make_kmeans(n_clusters, seed).fit(rows).cluster_centers_
    if backend == "faiss":
        return _faiss_centres(rows, n_clusters, seed)
    return _torch_centres(rows, n_clusters, seed, device)


def assign_to_centres(embeddings: Matrix, centres: np.ndarray, device=None) -> np.ndarray:
    """Index of the nearest centre (squared Euclidean) for every row, a block of rows at a time."""
    labels = np.empty(matrix.shape(embeddings)[0], dtype=np.int64)
    for lo, hi, (block_labels,) in assign_blocks(embeddings, [centres], device):
        labels[lo:hi] = block_labels
    return labels


def assign_blocks(embeddings: Matrix, centre_sets: list[np.ndarray], device=None):
    """(lo, hi, [nearest centre of rows lo..hi for each set of centres]): one pass over the rows for
    several fitted models (a k sweep reads a file once, not once per k)."""
    import torch

    device = device or torch.device("cpu")
    prepared = []
    for centres in centre_sets:
        c = torch.as_tensor(np.asarray(centres, dtype=np.float32), device=device)
        prepared.append((c, (c * c).sum(1)))
    for lo, hi, block in matrix.blocks(embeddings, ASSIGN_BATCH_ROWS):
        x = torch.as_tensor(block, device=device)
        yield lo, hi, [(c_sq - 2 * x @ c.T).argmin(1).cpu().numpy() for c, c_sq in prepared]


# Out-of-core fits use at most this many sampled rows (and half the memory budget).
MAX_FIT_SAMPLE = 1_000_000
MIN_FIT_SAMPLE = 20_000


@dataclass(frozen=True)
class Plan:
    """How a step runs on a matrix: exactly on all rows in memory, or fitted on a sample (out of core)."""

    exact: bool
    sample: int  # rows the fit uses (all of them when exact)
    reason: str

    def as_dict(self) -> dict:
        return {"exact": self.exact, "fit_rows": self.sample, "reason": self.reason}


def plan_for(embeddings: Matrix, budget: int) -> Plan:
    """The exact path while the matrix (as float32) fits ``budget``; else a seeded sample of what fits in half."""
    return plan_for_shape(*matrix.shape(embeddings), budget)


def plan_for_shape(n: int, d: int, budget: int) -> Plan:
    """``plan_for`` an n x d matrix, before it exists."""
    size = n * d * 4
    if size <= budget:
        return Plan(True, n, f"{matrix.size_text(size)} of embeddings fit the memory budget of "
                             f"{matrix.size_text(budget)}")
    rows = int(min(n, max(MIN_FIT_SAMPLE, min(MAX_FIT_SAMPLE, budget // (2 * 4 * d)))))
    return Plan(False, rows, f"{matrix.size_text(size)} of embeddings exceed the memory budget of "
                             f"{matrix.size_text(budget)}: fitted on {rows:,} seeded sample rows, every row assigned "
                             "block by block (--memory-budget raises the budget)")


def sample_rows(n: int, size: int, seed: int) -> np.ndarray:
    """``size`` seeded distinct rows of ``n``, ascending (the same rows --cluster-fit-sample takes)."""
    return np.sort(np.random.RandomState(seed).choice(n, size, replace=False))


def inertia(embeddings: np.ndarray, labels: np.ndarray, n_clusters: int) -> float:
    """Sum of squared distances to the cluster means (lower is a tighter clustering)."""
    x = np.asarray(embeddings, dtype=np.float64)
    sums = np.zeros((n_clusters, x.shape[1]))
    np.add.at(sums, labels, x)
    sizes = np.bincount(labels, minlength=n_clusters)
    means = sums / np.maximum(sizes, 1)[:, None]
    return float(((x - means[labels]) ** 2).sum())


def _faiss_centres(x: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    # faiss's loader logs each CPU build it tries (a ModuleNotFoundError line apiece) at INFO, which the
    # run's log would show as if something had failed
    logging.getLogger("faiss").setLevel(logging.WARNING)
    try:
        import faiss
    except ImportError:
        from .errors import UserError

        raise UserError("--cluster-backend faiss needs faiss (pip install faiss-cpu, or faiss-gpu with a GPU)") from None
    x = np.ascontiguousarray(x, dtype=np.float32)
    gpu = hasattr(faiss, "get_num_gpus") and faiss.get_num_gpus() > 0
    # Three restarts, like n_init=3; faiss keeps the best. Train on every given row.
    kmeans = faiss.Kmeans(x.shape[1], n_clusters, niter=25, nredo=3, seed=seed, gpu=gpu,
                          max_points_per_centroid=max(256, -(-x.shape[0] // n_clusters)),
                          # its own unformatted "please provide at least 39 K points" line on stderr; the other
                          # backends fit few rows without one
                          min_points_per_centroid=1, verbose=False)
    kmeans.train(x)
    return kmeans.centroids


def _torch_centres(x: np.ndarray, n_clusters: int, seed: int, device=None, n_init: int = 3,
                   iterations: int = 50, tolerance: float = 1e-4) -> np.ndarray:
    """Lloyd's k-means, k-means++ seeding, ``n_init`` restarts keeping the lowest inertia;
    batched matrix products, on the GPU when ``device`` is one."""
    import torch

    device = torch.device(device or "cpu")
    generator = torch.Generator(device="cpu").manual_seed(seed)
    data = torch.as_tensor(np.asarray(x, dtype=np.float32))
    if device.type == "cuda" and data.numel() * data.element_size() < torch.cuda.mem_get_info(device)[0] // 2:
        data = data.to(device)  # once: copied batch by batch it crossed the bus every iteration of every restart
    n = data.shape[0]
    best, best_inertia = None, float("inf")
    for _ in range(n_init):
        centres = _kmeans_plus_plus(data, n_clusters, generator, device)
        for _ in range(iterations):
            sums = torch.zeros_like(centres)
            sizes = torch.zeros(n_clusters, device=device)
            # Summed where the batches are: one wait for the device per iteration, not one per batch.
            inertia = torch.zeros((), dtype=torch.float64, device=device)
            c_sq = (centres * centres).sum(1)
            for lo in range(0, n, ASSIGN_BATCH_ROWS):
                batch = data[lo : lo + ASSIGN_BATCH_ROWS].to(device)
                distances = c_sq - 2 * batch @ centres.T
                nearest = distances.argmin(1)
                inertia += (distances.gather(1, nearest[:, None]).sum() + (batch * batch).sum()).double()
                sums.index_add_(0, nearest, batch)
                sizes += torch.bincount(nearest, minlength=n_clusters)
            total = float(inertia)
            # An empty cluster keeps its old centre.
            updated = torch.where(sizes[:, None] > 0, sums / sizes.clamp(min=1)[:, None], centres)
            shift = ((updated - centres) ** 2).sum().item()
            centres = updated
            if shift <= tolerance**2:  # centres moved less than ~1e-4 in total: converged
                break
        if total < best_inertia:
            best, best_inertia = centres, total
    return best.cpu().numpy()


def _kmeans_plus_plus(data, n_clusters: int, generator, device):
    """k-means++ seeding on at most 20k rows: each new centre drawn by squared distance."""
    import torch

    rows = data[torch.randperm(data.shape[0], generator=generator)[: min(data.shape[0], 20000)]].to(device)
    centres = rows[int(torch.randint(rows.shape[0], (1,), generator=generator).item())][None]
    closest = ((rows - centres[0]) ** 2).sum(1)
    trials = 2 + int(np.log(n_clusters))  # greedy k-means++, as scikit-learn does
    for _ in range(1, n_clusters):
        weights = closest.clamp(min=0).double().cpu()
        if weights.sum() <= 0:
            candidates = torch.zeros(1, dtype=torch.int64)
        else:
            candidates = torch.multinomial(weights / weights.sum(), trials, replacement=True, generator=generator)
        # Keep the candidate that lowers the total squared distance most.
        options = torch.minimum(closest[None], torch.cdist(rows[candidates.to(device)], rows) ** 2)
        best = int(options.sum(1).argmin().item())
        centres = torch.cat([centres, rows[candidates[best]][None]])
        closest = options[best]
    return centres



@dataclass(frozen=True)
class PCAInfo:
    n_components: int
    explained_variance: float
    original_dim: int
    fit_rows: int | None = None  # rows PCA was fitted on when not all (out of core)

    def as_dict(self) -> dict:
        out = {
            "n_components": self.n_components,
            "explained_variance": self.explained_variance,
            "original_dim": self.original_dim,
        }
        if self.fit_rows is not None:
            out["fit_rows"] = self.fit_rows
        return out


def pca_components_kept(n_components: int, n_rows: int, dim: int) -> int:
    """The components PCA can keep of ``n_components`` asked: no more than the rows less one, nor the dimensions."""
    return min(n_components, n_rows - 1, dim)


def reduce_with_pca(embeddings: np.ndarray, n_components: int, seed: int = DEFAULT_SEED) -> tuple[np.ndarray, PCAInfo | None]:
    """PCA to min(n_components, N-1, D) dimensions, then each row back to unit length.

    Returns the input unchanged and None when no component can be kept (N == 1).
    """
    from sklearn.decomposition import PCA

    n_rows, dim = embeddings.shape
    kept = pca_components_kept(n_components, n_rows, dim)
    if kept < 1:
        log.warning("PCA skipped: %d document(s) leave no component to keep", n_rows)
        return embeddings, None
    pca = PCA(n_components=kept, random_state=seed)
    reduced = pca.fit_transform(embeddings)
    norms = np.linalg.norm(reduced, axis=1, keepdims=True)
    reduced = (reduced / np.maximum(norms, 1e-8)).astype(np.float32)
    info = PCAInfo(kept, round(float(pca.explained_variance_ratio_.sum()), 4), dim)
    return reduced, info


def reduce_matrix(embeddings: Matrix, n_components: int, seed: int, plan: Plan,
                  scratch: Path | None = None) -> tuple[Matrix, PCAInfo | None]:
    """``reduce_with_pca`` when the plan is exact; otherwise PCA fitted on the plan's seeded sample, and
    every row projected and re-normalised a block at a time into ``scratch`` (a ``.npy`` file)."""
    if plan.exact:
        return reduce_with_pca(matrix.load(embeddings), n_components, seed)
    from sklearn.decomposition import PCA

    n_rows, dim = matrix.shape(embeddings)
    kept = pca_components_kept(n_components, plan.sample, dim)
    if kept < 1:
        return embeddings, None
    # copy=False: the sample is read for the fit alone, so PCA may centre it in place (else it holds a
    # second copy: 2M x 2,880 rows sampled to half the budget peaked at 7.0 GB for a 5.9 GB budget).
    pca = PCA(n_components=kept, random_state=seed, copy=False).fit(
        matrix.read_rows(embeddings, sample_rows(n_rows, plan.sample, seed)))
    with open(scratch, "w+b") as handle:
        out = matrix.create_npy(handle, (n_rows, kept), np.float32)
        for lo, hi, block in matrix.blocks(embeddings):
            reduced = pca.transform(block)
            out[np.arange(lo, hi)] = reduced / np.maximum(np.linalg.norm(reduced, axis=1, keepdims=True), 1e-8)
    info = PCAInfo(kept, round(float(pca.explained_variance_ratio_.sum()), 4), dim, fit_rows=plan.sample)
    return matrix.MatrixFile.open(scratch), info


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


class CosineSilhouette:
    """Silhouette (cosine distance) of several labelings of one fixed sample of rows.

    The sample and its normalised rows are prepared once; the distance matrix is kept in
    memory when it is small enough (so a k sweep computes it once), else recomputed blockwise.
    """

    def __init__(self, embeddings: np.ndarray, sample_size: int | None, seed: int = DEFAULT_SEED,
                 block_rows: int = 2048, keep_matrix_bytes: int = 1 << 30, device=None):
        from sklearn.utils import check_random_state

        n = embeddings.shape[0]
        if sample_size is not None:
            # The same rows sklearn's silhouette_score(sample_size=..., random_state=seed) takes.
            self.rows = check_random_state(seed).permutation(n)[:sample_size]
        else:
            self.rows = np.arange(n)
        self.unit = _unit_rows(matrix.read_rows(embeddings, self.rows))
        self.block_rows = block_rows
        m = self.rows.size
        self._torch_unit = None
        if device is not None and getattr(device, "type", str(device)) != "cpu":
            import torch  # on a GPU the blocks and the per-cluster sums are computed there

            self._torch_unit = torch.as_tensor(self.unit, device=device)
            self._matrix = None
        else:
            self._matrix = self._distances(0, m) if m * m * 4 <= keep_matrix_bytes else None

    def _cluster_sums(self, lo: int, hi: int, onehot: np.ndarray) -> np.ndarray:
        """Sum of distances from rows lo..hi to each cluster's members: (hi - lo) x K, float64."""
        if self._torch_unit is not None:
            import torch

            unit = self._torch_unit
            dist = (1.0 - unit[lo:hi] @ unit.T).clamp_(0.0, 2.0)
            idx = torch.arange(lo, hi, device=unit.device)
            dist[idx - lo, idx] = 0.0
            return (dist.double() @ torch.as_tensor(onehot, device=unit.device)).cpu().numpy()
        block = self._matrix[lo:hi] if self._matrix is not None else self._distances(lo, hi)
        return block.astype(np.float64) @ onehot

    def _distances(self, lo: int, hi: int) -> np.ndarray:
        dist = 1.0 - self.unit[lo:hi] @ self.unit.T
        np.clip(dist, 0.0, 2.0, out=dist)
        # A row's distance to itself is exactly 0 (as sklearn sets it).
        idx = np.arange(lo, hi)
        dist[idx - lo, idx] = 0.0
        return dist

    def score(self, labels: np.ndarray) -> float | None:
        """Mean silhouette over the sample for ``labels`` (all rows); None if < 2 clusters."""
        return self.score_sample(np.asarray(labels)[self.rows])

    def score_sample(self, sample_labels: np.ndarray) -> float | None:
        """``score`` given the labels of the sample's rows only (``self.rows``, in that order)."""
        _, encoded = np.unique(sample_labels, return_inverse=True)
        n_labels = int(encoded.max()) + 1
        m = encoded.size
        if not 2 <= n_labels <= m - 1:
            return None
        sizes = np.bincount(encoded, minlength=n_labels).astype(np.float64)
        onehot = np.zeros((m, n_labels), dtype=np.float64)
        onehot[np.arange(m), encoded] = 1.0
        values = np.empty(m, dtype=np.float64)
        for lo in range(0, m, self.block_rows):
            hi = min(lo + self.block_rows, m)
            sums = self._cluster_sums(lo, hi, onehot)
            own = encoded[lo:hi]
            local = np.arange(hi - lo)
            own_size = sizes[own]
            intra = sums[local, own] / np.maximum(own_size - 1, 1)
            sums[local, own] = np.inf
            inter = (sums / sizes).min(axis=1)
            with np.errstate(invalid="ignore", divide="ignore"):
                s = (inter - intra) / np.maximum(intra, inter)
            s[own_size == 1] = 0.0
            values[lo:hi] = np.nan_to_num(s)
        return float(values.mean())


@dataclass(frozen=True)
class CalibrationRow:
    k: int
    silhouette: float | None
    size_min: int
    size_median: float
    size_max: int

    def as_dict(self) -> dict:
        rounded = None if self.silhouette is None else round(self.silhouette, 4)
        return {"k": self.k, "silhouette": rounded, "size_min": self.size_min,
                "size_median": self.size_median, "size_max": self.size_max}


def calibrate_k(embeddings: Matrix, sample_size: int = 10000, seed: int = DEFAULT_SEED,
                k_values=CALIBRATION_K_VALUES, progress: bool = True,
                device=None, fit_sample: int = 0) -> tuple[list[CalibrationRow], int | None]:
    """Sweep k: k-means on all rows (or ``fit_sample`` seeded rows, out of core), silhouette on a
    sample (0 = all rows).

    k >= N is skipped. Returns the table and the recommended k: the highest k whose
    silhouette is at least 95% of the peak (the peak's own k when every score is negative).
    Out of core, every k is fitted on the one sample, then a single pass over the rows assigns them
    for every k (the labels each k-means run alone would give, as ``kmeans_labels`` with ``fit_sample``).
    """
    n = matrix.shape(embeddings)[0]
    candidates = [k for k in k_values if k < n]
    silhouette = CosineSilhouette(embeddings, sample_size if sample_size else None, seed, device=device)
    sampled = 0 < fit_sample < n
    fit_rows = matrix.read_rows(embeddings, sample_rows(n, fit_sample, seed)) if sampled else None
    rows, centre_sets = [], []
    with Progress(len(candidates), "Calibrating k", unit="values of k", rate_unit="k", bar=progress) as bar:
        for k in candidates:
            if sampled:
                centre_sets.append(fit_centres(fit_rows, k, seed))
            else:
                labels = kmeans_labels(embeddings, k, seed)
                rows.append(_calibration_row(k, silhouette.score(labels), np.bincount(labels, minlength=k),
                                             len(rows) + 1, len(candidates)))
            bar.update(1)
    if sampled:
        del fit_rows
        sizes = [np.zeros(k, dtype=np.int64) for k in candidates]
        picked = [np.empty(silhouette.rows.size, dtype=np.int64) for _ in candidates]
        order = np.argsort(silhouette.rows)
        sorted_rows = silhouette.rows[order]
        for lo, hi, labels_per_k in assign_blocks(embeddings, centre_sets, device):
            a, b = np.searchsorted(sorted_rows, [lo, hi])
            for i, labels in enumerate(labels_per_k):
                sizes[i] += np.bincount(labels, minlength=candidates[i])
                picked[i][order[a:b]] = labels[sorted_rows[a:b] - lo]
        rows = [_calibration_row(k, silhouette.score_sample(picked[i]), sizes[i], i + 1, len(candidates))
                for i, k in enumerate(candidates)]
    return rows, recommend_k(rows)


def _calibration_row(k: int, score: float | None, sizes: np.ndarray, done: int, total: int) -> CalibrationRow:
    # One line per k as it completes: a sweep takes minutes, and it should not look stalled.
    log.info("k = %i: silhouette %s, cluster sizes %d / %g / %d (%d of %d)", k,
             "n/a" if score is None else f"{score:.4f}", sizes.min(), np.median(sizes), sizes.max(), done, total)
    return CalibrationRow(k, score, int(sizes.min()), float(np.median(sizes)), int(sizes.max()))


def recommend_k(rows: list[CalibrationRow]) -> int | None:
    """The highest k whose silhouette is within ``CALIBRATION_TOLERANCE`` of the peak, among the ks whose clusters all
    hold documents (a k with empty ones only names clusters no document is in), where there are such ks."""
    scored = [r for r in rows if r.silhouette is not None]
    if not scored:
        return None
    scored = [r for r in scored if r.size_min > 0] or scored
    peak = max(scored, key=lambda r: r.silhouette)
    good = [r.k for r in scored if r.silhouette >= CALIBRATION_TOLERANCE * peak.silhouette]
    return max(good) if good else peak.k
