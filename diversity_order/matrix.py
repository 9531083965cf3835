"""Embedding matrices that need not fit in memory: read in row blocks, non-finite rows as zero vectors.

A stage that gets a matrix may get a numpy array (small data: the exact, faithful path) or a
``.npy`` file on disk (10M x 2,880 floats is 115 GB). The functions here read either the same
way, a block of rows at a time. A file is mapped afresh for each block and the map dropped after
it, so the pages read do not accumulate in the process's resident memory (a long-lived map of a
file that is read once through counts all of it, up to the file's size).
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from .errors import NO_ROOM, UserError

BLOCK_ROWS = 65536
# A block holding fewer than 1/this of its rows wanted is read row by row (only those rows' pages).
SPARSE_READ_SHARE = 8
# Reads of scattered rows kept in flight at once (a disk answers several faster than one at a time).
READ_THREADS = 8
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
    # Rows kept in memory as they were written, for the first ``read_rows`` that asks for exactly them.
    held: HeldRows | None = field(default=None, compare=False, repr=False)

    def holding(self, held: HeldRows | None) -> MatrixFile:
        """This file, with ``held``'s rows answered from memory (when complete)."""
        return replace(self, held=held if held is not None and held.complete else None)

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
        """Rows lo..hi as stored, read with one read (no map: nothing stays resident), bypassing
        the page cache where the filesystem allows (see ``read_direct``)."""
        rows = max(hi - lo, 0)
        start, nbytes = self.offset + lo * self.row_bytes, rows * self.row_bytes
        raw = read_direct(self.path, start, nbytes) if nbytes >= DIRECT_READ_BYTES else None
        if raw is not None:
            return raw.view(self.dtype).reshape(rows, self.shape[1])
        out = np.empty((rows, self.shape[1]), dtype=self.dtype)
        with open(self.path, "rb") as handle:
            handle.seek(start)
            if handle.readinto(out.reshape(-1).view(np.uint8)) != out.nbytes:
                raise OSError(f"{self.path}: shorter than its header says")
        return out

    def rows(self, picked: np.ndarray) -> np.ndarray:
        """Rows ``picked`` (ascending) as stored. Each run of consecutive rows is one read, several
        in flight at once, from a handle told the access is random: a map's page faults come one at
        a time, each with read-ahead around it (5,000 scattered rows of a cold 23 GB file took 11.6 s
        that way)."""
        from concurrent.futures import ThreadPoolExecutor

        picked = np.asarray(picked, dtype=np.int64)
        out = np.empty((picked.size, self.shape[1]), dtype=self.dtype)
        if picked.size == 0:
            return out
        breaks = np.flatnonzero(np.diff(picked) != 1) + 1
        firsts = np.concatenate(([0], breaks)).tolist()
        ends = np.concatenate((breaks, [picked.size])).tolist()
        row_bytes = self.row_bytes
        flat = memoryview(out.reshape(-1).view(np.uint8))
        fd = os.open(self.path, os.O_RDONLY)

        def read_run(run: int) -> None:
            a, b = firsts[run], ends[run]
            _pread_all(fd, flat[a * row_bytes: b * row_bytes], self.offset + int(picked[a]) * row_bytes, self.path)

        try:
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            if len(firsts) == 1:
                read_run(0)
            else:
                with ThreadPoolExecutor(min(READ_THREADS, len(firsts))) as pool:
                    list(pool.map(read_run, range(len(firsts))))
        finally:
            os.close(fd)
        return out


def _pread_all(fd: int, view: memoryview, position: int, path: Path) -> None:
    done = 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], position + done)
        if got == 0:
            raise OSError(f"{path}: shorter than its header says")
        done += got


Matrix = np.ndarray | MatrixFile


class HeldRows:
    """Rows of a matrix file kept as they are written, so the stage that reads exactly those rows
    first (the seeded sample an out-of-core PCA or k-means fit reads) need not read them back: a
    1M-row sample spread over a 23 GB file is a pass over all of it (19 s from this machine's disk).
    Taken once: ``read_rows`` hands them over and drops them."""

    def __init__(self, rows: np.ndarray, width: int, dtype):
        self.rows = np.asarray(rows, dtype=np.int64)  # ascending
        self.values: np.ndarray | None = np.empty((self.rows.size, width), dtype=dtype)
        self._seen = np.zeros(self.rows.size, dtype=bool)

    def capture(self, rows: np.ndarray, values: np.ndarray) -> None:
        """Keep those of ``rows`` (written with ``values``, as stored) that are held rows."""
        if self.values is None or rows.size == 0:
            return
        at = np.searchsorted(self.rows, rows)
        hit = at < self.rows.size
        hit[hit] = self.rows[at[hit]] == rows[hit]
        if hit.any():
            self.values[at[hit]] = values[hit]
            self._seen[at[hit]] = True

    @property
    def complete(self) -> bool:
        return self.values is not None and bool(self._seen.all())

    def take(self, rows: np.ndarray) -> np.ndarray | None:
        """The held values, once, when ``rows`` are exactly the held rows (in the same order)."""
        if not self.complete or not np.array_equal(rows, self.rows):
            return None
        values, self.values = self.values, None
        return values

# Blocks of at least this many bytes are read with O_DIRECT: a file of many GB read once through the
# page cache cost ~1 CPU-s per GB in page allocation and reclaim (23 GB cache, cold: 23 CPU-s), the
# disk alone ~0.1; a smaller read gains nothing from it.
DIRECT_READ_BYTES = 4 << 20


def read_direct(path: Path, start: int, nbytes: int) -> np.ndarray | None:
    """Bytes start..start+nbytes of ``path`` read with O_DIRECT (into page-aligned memory, the
    aligned span around them read whole), as a uint8 array; None where O_DIRECT is refused."""
    import mmap

    if not hasattr(os, "O_DIRECT"):
        return None
    align = DirectAppender.ALIGN
    first = start - start % align
    span = -(-(start + nbytes - first) // align) * align
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:  # a filesystem without O_DIRECT (tmpfs: EINVAL)
        return None
    try:
        buffer = mmap.mmap(-1, span)
        done = 0
        try:
            with memoryview(buffer) as view:
                while done < start + nbytes - first:
                    got = os.preadv(fd, [view[done:]], first + done)
                    if got == 0:
                        raise OSError(f"{path}: shorter than its header says")
                    done += got
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            buffer.close()
            return None  # the device wants a larger alignment: read through the page cache
        return np.frombuffer(buffer, dtype=np.uint8, count=nbytes, offset=start - first)
    finally:
        os.close(fd)


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
    """(lo, hi, float32 rows lo..hi) over the whole matrix; from a file, the next block is read
    while the caller works on this one (direct reads have no kernel read-ahead to hide the disk)."""
    from .runtime import prefetched

    n = shape(matrix)[0]
    spans = [(lo, min(lo + block_rows, n)) for lo in range(0, n, block_rows)]
    reads = (read_block(matrix, lo, hi) for lo, hi in spans)
    if isinstance(matrix, MatrixFile) and len(spans) > 1:
        reads = prefetched(reads, depth=1)
    for (lo, hi), block in zip(spans, reads):
        yield lo, hi, block


def count_unusable_rows(matrix: Matrix, block_rows: int = BLOCK_ROWS) -> tuple[int, int]:
    """(rows holding a NaN or inf, which every read here turns into zero vectors; rows of zeros only), one
    block at a time."""
    n = shape(matrix)[0]
    raw = matrix.block if isinstance(matrix, MatrixFile) else (lambda lo, hi: matrix[lo:hi])
    non_finite = zeros = 0
    for lo in range(0, n, block_rows):
        block = raw(lo, min(lo + block_rows, n))
        non_finite += non_finite_rows(block).size
        zeros += int(np.count_nonzero(~block.any(axis=1)))
    return non_finite, zeros


def read_rows(matrix: Matrix, rows: np.ndarray, block_rows: int = BLOCK_ROWS) -> np.ndarray:
    """The given rows (any order) as float32, non-finite rows zeroed; read block by block from a file
    (a block with few wanted rows reads only their pages)."""
    rows = np.asarray(rows, dtype=np.int64)
    if not isinstance(matrix, MatrixFile):
        return _finite_float32(matrix[rows])
    held = matrix.held.take(rows) if matrix.held is not None else None
    if held is not None:
        return _finite_float32(held)
    out = np.empty((rows.size, shape(matrix)[1]), dtype=np.float32)
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    sparse = []  # positions in sorted_rows of rows read one run at a time, all together
    for lo in range(0, shape(matrix)[0], block_rows):
        a, b = np.searchsorted(sorted_rows, [lo, lo + block_rows])
        if a < b:
            hi = min(lo + block_rows, shape(matrix)[0])
            if (b - a) * SPARSE_READ_SHARE < hi - lo:
                sparse.append(np.arange(a, b))
            else:
                out[order[a:b]] = read_block(matrix, lo, hi)[sorted_rows[a:b] - lo]
    if sparse:
        at = np.concatenate(sparse)
        out[order[at]] = _finite_float32(matrix.rows(sorted_rows[at]))
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


def _libc_fallocate():
    """libc's ``fallocate`` (Linux), or None. Not ``os.posix_fallocate``: where the filesystem cannot
    reserve space, glibc emulates that by writing into every block of the range, which on a network
    filesystem and a file of many GB takes longer than the rows' own writes would."""
    try:
        import ctypes

        function = ctypes.CDLL(None, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    function.restype = ctypes.c_int
    return function


_FALLOCATE = _libc_fallocate()


def reserve(fd: int, offset: int, nbytes: int) -> None:
    """Allocate the disk space of bytes [offset, offset + nbytes) of the open file ``fd`` now.

    Rows written later into reserved space cost the copy alone; written into a sparse file, every
    page also costs the filesystem a block allocation, in the writer's time (ext4 here: pwrite of
    2.4 GB took 4.1 CPU-s sparse, 0.36 reserved; the 10M-document cache is 23 GB). A full disk fails
    here, at the start, with an OSError of ``NO_ROOM``; a filesystem that cannot reserve space
    (EOPNOTSUPP, EINVAL) leaves the file sparse, its rows taking space as they are written.
    """
    if nbytes <= 0 or _FALLOCATE is None:
        return
    if _FALLOCATE(fd, 0, offset, nbytes) != 0:
        import ctypes

        code = ctypes.get_errno()
        if code in NO_ROOM:
            raise OSError(code, os.strerror(code))


def no_room(name: Path | str, nbytes: int, exc: OSError) -> UserError:
    """The one-line error for a file whose rows ``reserve`` found no room for."""
    return UserError(f"{name}: no room on its disk for {size_text(nbytes)} of rows ({exc.strerror}); free "
                     "space or choose another --output folder")


class RowWriter:
    """Rows written into a ``.npy`` file open for writing (see ``create_npy``) with ``pwrite``, one call
    per run of consecutive rows, never through a writable map: the rows written do not stay in the
    process's resident memory, and only their own bytes are written (a map writes back whole pages,
    which, in a file ranks on several nodes fill at once, could overwrite another node's rows)."""

    def __init__(self, fd: int, offset: int, shape: tuple[int, int], dtype):
        self.fd, self.offset, self.shape, self.dtype = fd, offset, tuple(shape), np.dtype(dtype)
        self._appender: DirectAppender | None = None
        self._next_row = 0  # while appending: the row the next write must start at

    def append_directly(self) -> bool:
        """Write rows that come in file order, from row 0, with O_DIRECT (see ``DirectAppender``),
        until a write breaks that order; for a file this process alone writes. False where the
        filesystem refuses O_DIRECT (the rows then go through the page cache, as always)."""
        self._appender = DirectAppender.open(self.fd, self.offset)
        return self._appender is not None

    def finish(self, write: bool = True) -> None:
        """Write out what the appender still holds (before the file is read, synced or digested);
        ``write=False``: drop it (the file is being abandoned)."""
        appender, self._appender = self._appender, None
        if appender is not None:
            appender.close() if write else appender.discard()

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
        if self._appender is not None:
            if int(rows[0]) == self._next_row and (rows.size == 1 or bool((np.diff(rows) == 1).all())):
                self._appender.append(memoryview(values.reshape(-1).view(np.uint8)))
                self._next_row += rows.size
                return written
            self.finish()  # out of order: the rest goes through pwrite
        if rows.size > 1 and not bool((np.diff(rows) > 0).all()):
            by_row = np.argsort(rows, kind="stable")
            rows, values = rows[by_row], values[by_row]
        row_bytes = self.shape[1] * self.dtype.itemsize
        cuts = (np.flatnonzero(np.diff(rows) != 1) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, rows.size]):
            _pwrite_all(self.fd, memoryview(values[a:b].reshape(-1).view(np.uint8)), self.offset + int(rows[a]) * row_bytes)
        return written


class DirectAppender:
    """Bytes written one after another from a file offset on, with O_DIRECT: the disk takes them
    from this process's memory, so they are not copied into the page cache, which needs no pages
    allocated (or, once memory is full, reclaimed) for them. Filling the 10M-document cache (23 GB)
    through the page cache cost the writer ~25 CPU-s on cores the tokenizer needs.

    The bytes are gathered in an aligned buffer and written a block-aligned ``STAGE`` at a time;
    the first block also holds the file's bytes before ``start`` (its header), read back; ``close``
    writes the unaligned rest through the ordinary descriptor. Reads of the file see every byte
    once ``close`` has returned (the kernel drops cached pages a direct write overwrites)."""

    ALIGN = 4096
    STAGE = 8 << 20

    def __init__(self, fd: int, direct_fd: int, start: int):
        import mmap

        self.fd, self.direct_fd = fd, direct_fd
        self.at = start - start % self.ALIGN  # file offset of the buffer's first byte
        self.buffer = mmap.mmap(-1, self.STAGE + self.ALIGN)  # page-aligned, as O_DIRECT wants
        self.filled = start - self.at
        head = os.pread(fd, self.filled, self.at)
        if len(head) != self.filled:
            raise OSError(errno.EIO, "the file is shorter than its header")
        self.buffer[: self.filled] = head

    @classmethod
    def open(cls, fd: int, start: int) -> DirectAppender | None:
        """An appender at ``start`` of the open file ``fd``, or None where O_DIRECT is refused."""
        if not hasattr(os, "O_DIRECT"):
            return None
        try:
            direct_fd = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_DIRECT)
        except OSError:  # no /proc, or a filesystem without O_DIRECT (tmpfs: EINVAL)
            return None
        try:
            return cls(fd, direct_fd, start)
        except OSError:  # the file is not readable through fd: its header cannot be carried
            os.close(direct_fd)
            return None

    def append(self, data: memoryview) -> None:
        while data:
            take = min(len(data), self.STAGE - self.filled)
            self.buffer[self.filled: self.filled + take] = data[:take]
            self.filled, data = self.filled + take, data[take:]
            if self.filled == self.STAGE:
                self._write(self.STAGE)

    def _write(self, nbytes: int) -> None:
        """Write the buffer's first ``nbytes`` (a multiple of ALIGN); keep the rest."""
        with memoryview(self.buffer) as view:
            done = 0
            try:
                while done < nbytes and self.direct_fd >= 0:
                    done += os.pwrite(self.direct_fd, view[done:nbytes], self.at + done)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                # The device wants a larger alignment than ALIGN: the page cache takes the rest.
                self._close_direct()
            _pwrite_all(self.fd, view[done:nbytes], self.at + done)
        rest = self.filled - nbytes
        self.buffer[:rest] = self.buffer[nbytes: self.filled]
        self.at, self.filled = self.at + nbytes, rest

    def close(self) -> None:
        """Write what is left and release the buffer."""
        aligned = self.filled - self.filled % self.ALIGN
        if aligned:
            self._write(aligned)
        if self.filled:
            with memoryview(self.buffer) as view:
                _pwrite_all(self.fd, view[: self.filled], self.at)
        self.discard()

    def discard(self) -> None:
        """Release the buffer without writing what it holds (the file is being abandoned)."""
        self._close_direct()
        self.buffer.close()

    def _close_direct(self) -> None:
        if self.direct_fd >= 0:
            os.close(self.direct_fd)
            self.direct_fd = -1


def _pwrite_all(fd: int, view: memoryview, at: int) -> None:
    while view:  # pwrite may write less than asked (signals, very large writes)
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


def create_npy(handle, shape: tuple[int, int], dtype, name: Path | str | None = None) -> RowWriter:
    """Write a ``.npy`` header for ``shape`` and ``dtype`` into the empty file ``handle``, size the file
    and reserve its rows' disk space (``reserve``; unwritten rows read as zeros); the writer of its rows.
    A disk without room for the rows is a UserError naming ``name`` (default: the handle's file)."""
    header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False,
              "shape": tuple(int(v) for v in shape)}
    np.lib.format.write_array_header_1_0(handle, header) if _header_fits_1_0(header) else \
        np.lib.format.write_array_header_2_0(handle, header)
    handle.flush()
    offset = handle.tell()
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    os.ftruncate(handle.fileno(), offset + nbytes)
    try:
        reserve(handle.fileno(), offset, nbytes)
    except OSError as exc:
        raise no_room(name or getattr(handle, "name", "a matrix file"), nbytes, exc) from None
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


def size_text(nbytes: int) -> str:
    """Bytes for the log, in the largest unit (of 1024) that leaves at least 1: a 2 MB budget beside a 12 MB matrix
    read "0.00 GiB" against "0.01 GiB" in GiB alone, as if they were the same."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{int(nbytes)} bytes"
