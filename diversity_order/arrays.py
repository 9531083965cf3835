"""The ``.npy`` arrays users hand to the scripts (embeddings, token counts, labels, orders), checked;
and per-record arrays kept in a file rather than in memory.

Each loader returns the array or raises a one-line ``UserError`` naming the flag and the file:
a wrong shape or dtype is caught here rather than deep inside a kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import UserError

# The file a curate run writes for each flag that reads one back (B_labels.npy for --labels, ...).
_FILE_OF_FLAG = {"--labels": "_labels.npy", "--order": "_order.npy", "--token-counts": "_token_counts",
                 "--umap": "_umap2d.npy"}


def load_npy(path: Path, flag: str) -> np.ndarray:
    """A ``.npy`` file, memory-mapped, or a one-line error naming ``flag``."""
    path = Path(path)
    if path.is_dir():
        # (not a cache's fingerprints or a checkpoint's mask: the data arrays, first the one a run writes for
        # this flag, --labels its _labels.npy, else its embeddings)
        own = _FILE_OF_FLAG.get(flag, "_embeddings.npy")
        npys = sorted((p for p in path.glob("*.npy") if not p.name.endswith((".fingerprints.npy", ".done.npy"))),
                      key=lambda p: (own not in p.name, not p.name.endswith("_embeddings.npy"), p.name))
        raise UserError(f"{flag} {path}: is a folder; give the .npy file{f' (e.g. {npys[0]})' if npys else ''}")
    if not path.is_file():
        raise UserError(f"{flag} {path}: file not found")
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot read it ({exc.strerror})") from None
    if not head.startswith(b"\x93NUMPY"):  # else numpy takes it for a pickle and advises allow_pickle
        from .records import describe_start

        raise UserError(f"{flag} {path}: not a .npy array: it looks like {describe_start(head)}; pass an array "
                        f"saved with numpy.save")
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError) as exc:
        raise UserError(f"{flag} {path}: not a readable .npy file ({exc})") from None


def load_matrix(path: Path, flag: str, as_float32: bool = True) -> np.ndarray:
    """An N x D float matrix from ``.npy`` (memory-mapped; converted to float32 in memory unless not
    ``as_float32``), or a one-line error naming ``flag``."""
    matrix = load_npy(path, flag)
    if matrix.ndim != 2 or matrix.shape[1] < 1:
        raise UserError(f"{flag} {path}: expected a 2-D N x D matrix, found shape {matrix.shape}")
    if not np.issubdtype(matrix.dtype, np.floating):
        raise UserError(f"{flag} {path}: expected floating-point values, found {matrix.dtype}")
    return np.asarray(matrix, dtype=np.float32) if as_float32 else matrix


def check_token_counts(counts: np.ndarray, what: str) -> np.ndarray:
    """A 1-D array of non-negative integers, as int64."""
    counts = np.asarray(counts)
    if counts.ndim != 1 or not np.issubdtype(counts.dtype, np.integer) or (counts.size and counts.min() < 0):
        raise UserError(f"{what}: expected a 1-D array of non-negative integers, found shape {counts.shape} "
                        f"({counts.dtype})")
    return counts.astype(np.int64)


def check_labels(labels: np.ndarray, n: int, what: str) -> np.ndarray:
    """``n`` non-negative integer cluster ids, as int64."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.shape[0] != n:
        raise UserError(f"{what}: {labels.shape} labels, but there are {n} documents")
    if not np.issubdtype(labels.dtype, np.integer) or (n and labels.min() < 0):
        raise UserError(f"{what}: expected non-negative integer cluster ids")
    return labels.astype(np.int64)


def check_order(order: np.ndarray, n: int, what: str) -> np.ndarray:
    """A permutation of 0..n-1, as int64."""
    order = np.asarray(order)
    if order.ndim != 1 or order.shape[0] != n or not np.issubdtype(order.dtype, np.integer):
        raise UserError(f"{what}: expected a permutation of {n:,} document indices, found shape {order.shape} "
                        f"({order.dtype})")
    seen = np.zeros(n, dtype=bool)
    if n and (order.min() < 0 or order.max() >= n):
        raise UserError(f"{what}: indices outside 0..{n - 1}")
    seen[order] = True
    if not seen.all():
        raise UserError(f"{what}: not a permutation ({int((~seen).sum()):,} document(s) missing)")
    return order.astype(np.int64)


def file_backed(size: int, dtype, folder: Path) -> np.ndarray:
    """A zeroed 1-D array whose pages live in an unnamed file in ``folder``: per-record state that
    would otherwise stay in memory for the whole run. The kernel writes cold pages back to the file
    and reclaims them, so the array costs page cache, not the process's own memory; the file has no
    name (it vanishes with the process, even a killed one)."""
    import tempfile

    dtype = np.dtype(dtype)
    if size == 0:
        return np.zeros(0, dtype)
    with tempfile.TemporaryFile(dir=folder) as handle:  # the map keeps the file alive once it is closed
        handle.truncate(size * dtype.itemsize)
        return np.memmap(handle, dtype=dtype, mode="r+", shape=(size,))


def distinct(values: np.ndarray) -> np.ndarray:
    """``np.unique(values)``, by sorting: numpy 2.4's ``np.unique`` hashes, and on millions of distinct integers
    took 100-200 x a sort's time (10M row numbers: 15 s against 0.1)."""
    ordered = np.sort(np.asarray(values).ravel())
    return ordered[np.r_[True, ordered[1:] != ordered[:-1]]] if ordered.size else ordered


def member(values: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.isin(values, pool)``, by sorting both and one merged search: numpy 2.4's ``np.isin`` dedupes with its
    hashing ``np.unique`` (5M fingerprints against 5M: 7-12 s, against 1-2). Arrays of another dtype each are
    left to ``np.isin`` (a search across them would compare as floats)."""
    values, pool = np.asarray(values), np.asarray(pool)
    if values.dtype != pool.dtype:
        return np.isin(values, pool)
    found = np.zeros(values.shape, dtype=bool)
    if not values.size or not pool.size:
        return found
    pool = np.sort(pool.ravel())
    order = np.argsort(values.ravel())
    ordered = values.ravel()[order]
    at = np.minimum(np.searchsorted(pool, ordered), pool.size - 1)
    found.ravel()[order] = pool[at] == ordered
    return found
