"""JSONL records: a byte-offset index of the input, text batches read from it, and the output writer.

Texts are never all held in memory. One validating pass records where every record's line
starts and ends and a 64-bit fingerprint of its text; later stages read just the rows they
need, and the curated file is written by copying byte ranges of the input in the new order, so
every record is reproduced byte for byte (and newline-terminated, even the input's last line).
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import json
import math
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .atomic import atomic_open
from .errors import UserError
from .runtime import Progress

# Bytes read per block when streaming texts; the block holds whole lines only.
_READ_BLOCK_BYTES = 16 << 20


COMPRESSED_SUFFIXES = (".gz", ".zst")


def is_compressed(path: Path) -> bool:
    return path.suffix in COMPRESSED_SUFFIXES


def open_binary(path: Path):
    """A binary reader of ``path``'s content: .gz and .zst are decompressed as a stream.

    Compressed streams can only seek forward cheaply, so callers read them in ascending
    offset order (offsets are positions in the decompressed content).
    """
    if path.suffix == ".gz":
        import gzip

        return gzip.open(path, "rb")
    if path.suffix == ".zst":
        return _zstandard(path).ZstdDecompressor().stream_reader(open(path, "rb"), closefd=True)
    return open(path, "rb")


def _zstandard(path: Path):
    try:
        import zstandard
    except ImportError:
        raise UserError(f"{path}: reading or writing .zst needs the zstandard package (pip install zstandard)") from None
    return zstandard


def text_fingerprint(text: str) -> int:
    """64-bit fingerprint of a document's text: identical text, identical fingerprint."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass
class RecordIndex:
    """Where each record of a JSONL file lies, by input position (blank lines are not records)."""

    path: Path
    text_field: str
    starts: np.ndarray  # int64, byte offset of the record's first byte
    ends: np.ndarray  # int64, byte offset just past the record (its newline excluded)
    line_numbers: np.ndarray  # int64, 1-based line number in the file, for messages
    fingerprints: np.ndarray  # uint64, text_fingerprint of the text field

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    @property
    def total_bytes(self) -> int:
        return int((self.ends - self.starts).sum())


def _record_text(raw: bytes, path: Path, line_number: int, text_field: str) -> str:
    """Decode and validate one line; raise a UserError naming the file and line."""
    where = f"{path}:{line_number}"
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{where}: invalid UTF-8 (byte {exc.start} of the line)") from None
    try:
        record = json.loads(decoded)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where}: not valid JSON ({exc.msg}; column {exc.colno})") from None
    if not isinstance(record, dict):
        raise UserError(f"{where}: expected a JSON object, found a JSON {type(record).__name__}")
    if text_field not in record:
        keys = _keys_text(record)
        raise UserError(
            f"{where}: no field '{text_field}' (this record has keys: {keys}); "
            f"choose the text field with --text-field"
        )
    text = record[text_field]
    if not isinstance(text, str):
        raise UserError(
            f"{where}: field '{text_field}' is a JSON {type(text).__name__}, expected a string"
        )
    return text


def _iter_lines(path: Path) -> Iterator[tuple[int, int, bytes]]:
    """Yield (line number, start offset, content without the newline) for every line."""
    import io

    offset = 0
    with open_binary(path) as raw, io.BufferedReader(raw, buffer_size=1 << 20) as handle:
        for line_number, line in enumerate(handle, start=1):
            length = len(line)
            content = line[:-1] if line.endswith(b"\n") else line
            yield line_number, offset, content
            offset += length


def scan_jsonl(path: Path | str, text_field: str = "text", progress: bool = True) -> RecordIndex:
    """Validate every record of ``path`` and index it (one streaming pass, no texts kept)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: input file not found")
    # The bar counts decompressed bytes; for compressed input the total is unknown.
    size = None if is_compressed(path) else path.stat().st_size
    # Compact typed arrays: 32 bytes per record, not ~120 as Python int lists would take.
    starts, ends = array.array("q"), array.array("q")
    line_numbers, fingerprints = array.array("q"), array.array("Q")
    done = 0
    with Progress(size, f"Indexing {path.name}", unit="MB", rate_unit="MB", bar=progress, scale=1 << 20) as bar:
        for line_number, start, content in _iter_lines(path):
            if content.strip():
                text = _record_text(content, path, line_number, text_field)
                starts.append(start)
                ends.append(start + len(content))
                line_numbers.append(line_number)
                fingerprints.append(text_fingerprint(text))
            if start - done > (8 << 20):
                bar.update(start - done)
                done = start
    if not starts:
        raise UserError(f"{path}: no records (the file is empty or holds only blank lines)")
    return RecordIndex(
        path=path,
        text_field=text_field,
        starts=np.frombuffer(starts, dtype=np.int64).copy(),
        ends=np.frombuffer(ends, dtype=np.int64).copy(),
        line_numbers=np.frombuffer(line_numbers, dtype=np.int64).copy(),
        fingerprints=np.frombuffer(fingerprints, dtype=np.uint64).copy(),
    )


def batch_bounds(sizes: np.ndarray, max_batch_bytes: int, max_batch_rows: int) -> np.ndarray:
    """Cut points splitting consecutive items into batches of at most ``max_batch_rows`` items
    and about ``max_batch_bytes`` bytes (a single bigger item makes a batch of its own)."""
    bounds = [0]
    total = 0
    for i, size in enumerate(sizes.tolist()):
        if i > bounds[-1] and (total + size > max_batch_bytes or i - bounds[-1] >= max_batch_rows):
            bounds.append(i)
            total = 0
        total += size
    bounds.append(int(sizes.size))
    return np.asarray(bounds, dtype=np.int64)


def iter_text_batches(
    index: RecordIndex, rows: np.ndarray | None = None, max_batch_bytes: int = 4 << 20,
    max_batch_rows: int = 1 << 30,
) -> Iterator[tuple[np.ndarray, list[str]]]:
    """Yield (row positions, texts) for ``rows`` (default all), in increasing row order."""
    for batch, raws in _iter_raw_batches(index, rows, max_batch_bytes, max_batch_rows):
        yield batch, [_record_text(raw, index.path, int(index.line_numbers[row]), index.text_field)
                      for row, raw in zip(batch.tolist(), raws)]


def _iter_raw_batches(
    index: RecordIndex, rows: np.ndarray | None, max_batch_bytes: int = 4 << 20, max_batch_rows: int = 1 << 30,
) -> Iterator[tuple[np.ndarray, list[bytes]]]:
    """Yield (row positions, raw record bytes) for ``rows`` (default all), in increasing row order.

    Each batch is read with one contiguous read when its rows lie close together in the
    file, else record by record.
    """
    rows = np.arange(len(index), dtype=np.int64) if rows is None else np.sort(np.asarray(rows, dtype=np.int64))
    if rows.size == 0:
        return
    sizes = index.ends[rows] - index.starts[rows]
    bounds = batch_bounds(sizes, max_batch_bytes, max_batch_rows)
    with open_binary(index.path) as handle:  # rows ascend, so compressed input only seeks forward
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            batch = rows[lo:hi]
            first, last = index.starts[batch[0]], index.ends[batch[-1]]
            if last - first <= 2 * int(sizes[lo:hi].sum()) + (1 << 16):
                handle.seek(first)
                block = handle.read(last - first)
                raws = [block[index.starts[row] - first : index.ends[row] - first] for row in batch]
            else:
                raws = []
                for row in batch:
                    handle.seek(index.starts[row])
                    raws.append(handle.read(index.ends[row] - index.starts[row]))
            yield batch, raws


_MISSING = object()


def read_field_values(index: RecordIndex, field: str) -> list:
    """The JSON value of ``field`` in every record, in input order (a sentinel where it is absent).

    Records were validated by ``scan_jsonl``, so each line is a JSON object.
    """
    values: list = []
    for _, raws in _iter_raw_batches(index, None):
        values.extend(json.loads(raw).get(field, _MISSING) for raw in raws)
    return values


def _keys_text(record: dict) -> str:
    return ", ".join(sorted(record)[:10]) or "none"


def _record_keys(index: RecordIndex, row: int) -> str:
    """The keys of record ``row``, read again from the file (for error messages only)."""
    with open_binary(index.path) as handle:
        handle.seek(int(index.starts[row]))
        return _keys_text(json.loads(handle.read(int(index.ends[row] - index.starts[row]))))


def _finite_number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)  # a JSON integer past float range raises
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def read_scores(index: RecordIndex, field: str) -> np.ndarray:
    """A finite number per record from ``field`` (float64); a missing or non-numeric value is a UserError."""
    values = read_field_values(index, field)
    scores = np.empty(len(values), dtype=np.float64)
    for row, value in enumerate(values):
        number = _finite_number(value)
        if number is None:
            where = f"{index.path}:{int(index.line_numbers[row])}"
            found = (f"no such field (this record has keys: {_record_keys(index, row)})" if value is _MISSING
                     else f"the value {json.dumps(value)[:40]}")
            raise UserError(f"{where}: --score-field {field} needs a finite number in every record; found {found}")
        scores[row] = number
    return scores


def read_categories(index: RecordIndex, field: str) -> tuple[np.ndarray, list[str]]:
    """A category id per record from ``field`` (any JSON value; absent -> its own "(missing)" category).

    Returns (ids in input order, category names by id, most frequent first). A field that no
    record has is a UserError (most likely a misspelt name).
    """
    values = read_field_values(index, field)
    if values and all(v is _MISSING for v in values):
        raise UserError(f"--balance-field {field}: no record has this field (the first record has keys: "
                        f"{_record_keys(index, 0)})")
    keys = ["(missing)" if v is _MISSING else (v if isinstance(v, str) else json.dumps(v, sort_keys=True))
            for v in values]
    names, ids, sizes = np.unique(np.asarray(keys, dtype=object), return_inverse=True, return_counts=True)
    by_size = np.argsort(-sizes, kind="stable")
    rank = np.empty_like(by_size)
    rank[by_size] = np.arange(by_size.size)
    return rank[ids].astype(np.int64), [str(names[i]) for i in by_size]


def write_reordered(index: RecordIndex, order: np.ndarray, output: Path | str, max_pass_bytes: int = 1 << 30) -> int:
    """Write the input records in ``order`` to ``output`` atomically; return bytes written.

    Each record is copied byte for byte from the input and followed by exactly one newline.
    Plain input is copied through a memory map. Compressed input cannot be read at random,
    so the output is assembled in pieces of at most ``max_pass_bytes``, one forward pass over
    the input per piece. An output named ``.gz`` or ``.zst`` is compressed.
    """
    output = Path(output)
    order = np.asarray(order, dtype=np.int64)
    if order.shape[0] != len(index) or not np.array_equal(np.sort(order), np.arange(len(index))):
        raise ValueError("order must be a permutation of the record positions")
    pieces = _record_pieces(index, order, max_pass_bytes)
    written = 0
    with atomic_open(output, "wb") as target, _compressing(output, target) as sink:
        buffer = _OutputBuffer(sink)
        for piece in pieces:
            for record in piece:
                buffer.add(record)
        written = buffer.close()
    return written


class _OutputBuffer:
    """Joins records into big writes, one newline after each record."""

    def __init__(self, sink) -> None:
        self.sink, self.parts, self.pending, self.total = sink, [], 0, 0

    def add(self, record: bytes) -> None:
        self.parts += (record, b"\n")
        self.pending += len(record) + 1
        if self.pending >= _READ_BLOCK_BYTES:
            self.flush()

    def flush(self) -> None:
        self.sink.write(b"".join(self.parts))
        self.total += self.pending
        self.parts, self.pending = [], 0

    def close(self) -> int:
        self.flush()
        return self.total


def _record_pieces(index: RecordIndex, order: np.ndarray, max_pass_bytes: int):
    """Yield, piece by piece, iterables of the records' bytes in output order."""
    starts, ends = index.starts[order], index.ends[order]
    if not is_compressed(index.path):
        with open(index.path, "rb") as source, mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as data:
            yield (data[a:b] for a, b in zip(starts.tolist(), ends.tolist()))
        return
    bounds = batch_bounds(ends - starts, max_pass_bytes, 1 << 62)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        wanted = np.argsort(starts[lo:hi], kind="stable")  # read in file order, emit in output order
        records: list[bytes] = [b""] * int(hi - lo)
        with open_binary(index.path) as source:
            for j in wanted.tolist():
                source.seek(int(starts[lo + j]))
                records[j] = source.read(int(ends[lo + j] - starts[lo + j]))
        yield records


@contextlib.contextmanager
def _compressing(output: Path, handle):
    if output.suffix == ".gz":
        import gzip

        with gzip.GzipFile(fileobj=handle, mode="wb", filename="", mtime=0) as sink:
            yield sink
    elif output.suffix == ".zst":
        with _zstandard(output).ZstdCompressor().stream_writer(handle, closefd=False) as sink:
            yield sink
    else:
        yield handle


def check_output_path(input_path: Path, output_path: Path) -> None:
    """Refuse to overwrite the input with its own reordering (it is read while writing)."""
    same = os.path.abspath(input_path) == os.path.abspath(output_path)
    if not same and output_path.exists():
        same = os.path.samefile(input_path, output_path)
    if same:
        raise UserError(f"--output {output_path} is the input file; choose another output path")
