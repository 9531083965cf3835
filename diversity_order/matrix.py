"""Embedding matrices that need not fit in memory: read in row blocks, non-finite rows as zero vectors.

A stage that gets a matrix may get a numpy array (small data: the exact, faithful path) or a
``.npy`` file on disk (10M x 2,880 floats is 115 GB). The functions here read either the same
way, a block of rows at a time. A file is mapped afresh for each block and the map dropped after
it, so the pages read do not accumulate in the process's resident memory (a long-lived map of a
file that is read once through counts all of it, up to the file's size).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK_ROWS = 65536
# A block holding fewer than 1/this of its rows wanted is read row by row (only those rows' pages).
SPARSE_READ_SHARE = 8
# ``load`` copies this many rows at a time into its array (a small transient beside a big array).
LOAD_BLOCK_ROWS = 8192
# Without --memory-budget, a matrix is held in memory when it takes at most this share of RAM.
DEFAULT_RAM_SHARE = 0.25


@dataclass(frozen=True)
class MatrixFile:
    """A 2-D ``.npy`` file read in blocks (see the module doc); ``shape`` and ``dtype`` as stored."""

    path: Path
    shape: tuple[int, int]
    dtype: np.dtype
    offset: int

    @classmethod
    def open(cls, path: Path | str) -> MatrixFile:
        header = np.load(path, mmap_mode="r")
        offset, shape, dtype = header.offset, header.shape, header.dtype
        plain = header.ndim == 2 and header.flags.c_contiguous
        del header
        if not plain:
            raise ValueError(f"{path}: not a 2-D C-ordered matrix")
        return cls(Path(path), tuple(int(v) for v in shape), np.dtype(dtype), int(offset))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def row_bytes(self) -> int:
        return self.shape[1] * self.dtype.itemsize

    def block(self, lo: int, hi: int) -> np.ndarray:
        """Rows lo..hi as stored, read with one ``readinto`` (no map: nothing stays resident)."""
        out = np.empty((max(hi - lo, 0), self.shape[1]), dtype=self.dtype)
        with open(self.path, "rb") as handle:
            handle.seek(self.offset + lo * self.row_bytes)
            if handle.readinto(out.reshape(-1).view(np.uint8)) != out.nbytes:
                raise OSError(f"{self.path}: shorter than its header says")
        return out

    def rows(self, lo: int, hi: int, picked: np.ndarray) -> np.ndarray:
        """Rows ``picked`` (ascending, within lo..hi) as stored, through a map dropped afterwards, so only
        the pages of those rows are read."""
        mapped = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)
        try:
            return np.array(mapped[picked])
        finally:
            del mapped


Matrix = np.ndarray | MatrixFile


def shape(matrix: Matrix) -> tuple[int, int]:
    return tuple(matrix.shape)


def nbytes_float32(matrix: Matrix) -> int:
    """Bytes the matrix takes as float32 in memory."""
    n, d = shape(matrix)
    return n * d * 4


def non_finite_rows(block: np.ndarray, step: int = 8192) -> np.ndarray:
    """Indices of the rows holding a NaN or inf (checked ``step`` rows at a time: no N x D mask)."""
    bad = [lo + np.flatnonzero(~np.isfinite(block[lo: lo + step]).all(axis=1)) for lo in range(0, len(block), step)]
    return np.concatenate(bad) if bad else np.zeros(0, dtype=np.int64)


def _finite_float32(block: np.ndarray) -> np.ndarray:
    block = np.asarray(block, dtype=np.float32)
    bad = non_finite_rows(block)
    if bad.size:
        block = block if block.flags.writeable else block.copy()
        block[bad] = 0.0
    return block


def read_block(matrix: Matrix, lo: int, hi: int) -> np.ndarray:
    """Rows lo..hi as float32, non-finite rows zeroed (a copy when the matrix is a file)."""
    raw = matrix.block(lo, hi) if isinstance(matrix, MatrixFile) else matrix[lo:hi]
    return _finite_float32(raw)


def blocks(matrix: Matrix, block_rows: int = BLOCK_ROWS) -> Iterator[tuple[int, int, np.ndarray]]:
    """(lo, hi, float32 rows lo..hi) over the whole matrix."""
    n = shape(matrix)[0]
    for lo in range(0, n, block_rows):
        hi = min(lo + block_rows, n)
        yield lo, hi, read_block(matrix, lo, hi)


def count_non_finite_rows(matrix: Matrix, block_rows: int = BLOCK_ROWS) -> int:
    """Rows holding a NaN or inf (the rows every read here turns into zero vectors), one block at a time."""
    n = shape(matrix)[0]
    raw = matrix.block if isinstance(matrix, MatrixFile) else (lambda lo, hi: matrix[lo:hi])
    return sum(non_finite_rows(raw(lo, min(lo + block_rows, n))).size for lo in range(0, n, block_rows))


def read_rows(matrix: Matrix, rows: np.ndarray, block_rows: int = BLOCK_ROWS) -> np.ndarray:
    """The given rows (any order) as float32, non-finite rows zeroed; read block by block from a file
    (a block with few wanted rows reads only their pages)."""
    rows = np.asarray(rows, dtype=np.int64)
    if not isinstance(matrix, MatrixFile):
        return _finite_float32(matrix[rows])
    out = np.empty((rows.size, shape(matrix)[1]), dtype=np.float32)
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    for lo in range(0, shape(matrix)[0], block_rows):
        a, b = np.searchsorted(sorted_rows, [lo, lo + block_rows])
        if a < b:
            hi = min(lo + block_rows, shape(matrix)[0])
            if (b - a) * SPARSE_READ_SHARE < hi - lo:
                out[order[a:b]] = _finite_float32(matrix.rows(lo, hi, sorted_rows[a:b]))
            else:
                out[order[a:b]] = read_block(matrix, lo, hi)[sorted_rows[a:b] - lo]
    return out


def load(matrix: Matrix) -> np.ndarray:
    """The whole matrix in memory as float32 (non-finite rows zeroed); a file is read a block at a
    time into the one array, so the peak is the array and one block."""
    if not isinstance(matrix, MatrixFile):
        return _finite_float32(matrix)
    out = np.empty(matrix.shape, dtype=np.float32)
    for lo, hi, block in blocks(matrix, LOAD_BLOCK_ROWS):
        out[lo:hi] = block
    return out


def return_freed_memory() -> None:
    """Hand memory freed by the process back to the system (glibc keeps freed heap for reuse: after
    tokenizing millions of documents that is hundreds of MB the next stage's big array adds to)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: nothing to do


class RowWriter:
    """Rows written into a ``.npy`` file open for writing (see ``create_npy``) with ``pwrite``, one call
    per run of consecutive rows, never through a writable map: the rows written do not stay in the
    process's resident memory, and only their own bytes are written (a map writes back whole pages,
    which, in a file ranks on several nodes fill at once, could overwrite another node's rows)."""

    def __init__(self, fd: int, offset: int, shape: tuple[int, int], dtype):
        self.fd, self.offset, self.shape, self.dtype = fd, offset, tuple(shape), np.dtype(dtype)

    @classmethod
    def open(cls, path, offset: int, shape: tuple[int, int], dtype) -> RowWriter:
        """A writer of an existing file's rows (its header already written); ``close`` it when done."""
        return cls(os.open(path, os.O_WRONLY), offset, shape, dtype)

    def close(self) -> None:
        """Flush the rows to disk and close the file (for writers made by ``open``)."""
        os.fsync(self.fd)
        os.close(self.fd)

    def __setitem__(self, rows, values) -> None:
        self.write(rows, values)

    def write(self, rows, values) -> np.ndarray:
        """``self[rows] = values``; returns the values as written (the file's dtype, in the order given)."""
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        values = np.ascontiguousarray(np.asarray(values).reshape(rows.size, self.shape[1]), dtype=self.dtype)
        if rows.size == 0:
            return values
        written = values
        if rows.size > 1 and not bool((np.diff(rows) > 0).all()):
            by_row = np.argsort(rows, kind="stable")
            rows, values = rows[by_row], values[by_row]
        row_bytes = self.shape[1] * self.dtype.itemsize
        cuts = (np.flatnonzero(np.diff(rows) != 1) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, rows.size]):
            view = memoryview(values[a:b].reshape(-1).view(np.uint8))
            at = self.offset + int(rows[a]) * row_bytes
            while view:  # pwrite may write less than asked (signals, very large writes)
                done = os.pwrite(self.fd, view, at)
                view, at = view[done:], at + done
        return written


def create_npy(handle, shape: tuple[int, int], dtype) -> RowWriter:
    """Write a ``.npy`` header for ``shape`` and ``dtype`` into the empty file ``handle`` and size the
    file (sparse: unwritten rows read as zeros); the writer of its rows."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(int(v) for v in shape)}
    np.lib.format.write_array_header_1_0(handle, header) if _header_fits_1_0(header) else \
        np.lib.format.write_array_header_2_0(handle, header)
    handle.flush()
    offset = handle.tell()
    os.ftruncate(handle.fileno(), offset + int(np.prod(shape)) * np.dtype(dtype).itemsize)
    return RowWriter(handle.fileno(), offset, shape, dtype)


def _header_fits_1_0(header: dict) -> bool:
    try:
        np.lib.format.write_array_header_1_0(io.BytesIO(), header)
    except ValueError:
        return False
    return True


def total_memory_bytes() -> int:
    """RAM this process may use: the machine's, or the cgroup's limit when lower (containers, Slurm)."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit_file).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return int(total)


def memory_budget(explicit_bytes: int | None = None) -> int:
    """Bytes a matrix may take in memory for the exact path: ``--memory-budget``, else a quarter of RAM."""
    return int(explicit_bytes) if explicit_bytes else int(DEFAULT_RAM_SHARE * total_memory_bytes())


def parse_size(text: str) -> int:
    """``"8G"``, ``"512M"``, ``"1.5T"``, ``"1000000"`` -> bytes (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units and text[-1] != "" else (text, "")
    value = float(number) * units[unit]
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{text!r}: not a positive size")
    return int(value)
