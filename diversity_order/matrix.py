"""Embedding matrices that need not fit in memory: read in row blocks, non-finite rows as zero vectors.

A stage that gets a matrix may get a numpy array (small data: the exact, faithful path) or a
``.npy`` file on disk (10M x 2,880 floats is 115 GB). The functions here read either the same
way, a block of rows at a time. A file is mapped afresh for each block and the map dropped after
it, so the pages read do not accumulate in the process's resident memory (a long-lived map of a
file that is read once through counts all of it, up to the file's size).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BLOCK_ROWS = 65536
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
        del header
        return cls(Path(path), tuple(int(v) for v in shape), np.dtype(dtype), int(offset))

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def block(self, lo: int, hi: int) -> np.ndarray:
        mapped = np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset, shape=self.shape)
        try:
            return np.array(mapped[lo:hi])
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


def read_rows(matrix: Matrix, rows: np.ndarray, block_rows: int = BLOCK_ROWS) -> np.ndarray:
    """The given rows (any order) as float32, non-finite rows zeroed; read block by block from a file."""
    rows = np.asarray(rows, dtype=np.int64)
    if not isinstance(matrix, MatrixFile):
        return _finite_float32(matrix[rows])
    out = np.empty((rows.size, shape(matrix)[1]), dtype=np.float32)
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    for lo in range(0, shape(matrix)[0], block_rows):
        a, b = np.searchsorted(sorted_rows, [lo, lo + block_rows])
        if a < b:
            block = read_block(matrix, lo, min(lo + block_rows, shape(matrix)[0]))
            out[order[a:b]] = block[sorted_rows[a:b] - lo]
    return out


def load(matrix: Matrix) -> np.ndarray:
    """The whole matrix in memory as float32 (non-finite rows zeroed)."""
    if isinstance(matrix, MatrixFile):
        return read_block(matrix, 0, matrix.shape[0])
    return _finite_float32(matrix)


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
