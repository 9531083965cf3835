"""JSONL records: a byte-offset index of the input, text batches read from it, and the output writer.

Texts are never all held in memory. One validating pass records where every record's line
starts and ends and a 64-bit fingerprint of its text; later stages read just the rows they
need, and the curated file is written by copying byte ranges of the input in the new order, so
every record is reproduced byte for byte (and newline-terminated, even the input's last line).
"""

from __future__ import annotations

import array
import contextlib
import datetime
import decimal
import hashlib
import io
import json
import logging
import math
import mmap
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, NamedTuple

import numpy as np
import orjson

from . import fields
from .atomic import atomic_open
from .errors import UserError
from .runtime import MB, Progress, usable_cores

COMPRESSED_SUFFIXES = (".gz", ".zst")

PARQUET_MAGIC = b"PAR1"  # a Parquet file's first (and last) four bytes
# What a file's first bytes say it is, for files that cannot be JSONL (a JSONL file starts with
# whitespace, "{" or a UTF-8 byte order mark, which none of these do).
_SIGNATURES = (
    (b"\x1f\x8b", "gzip data", ".gz"),
    (b"\x28\xb5\x2f\xfd", "zstd data", ".zst"),
    (b"\xfd7zXZ\x00", "xz data", None),
    (b"BZh", "bzip2 data", None),
    (b"PK\x03\x04", "a zip archive", None),
    (PARQUET_MAGIC, "a Parquet file", None),
    (b"ARROW1", "an Arrow file", None),
    (b"\x93NUMPY", "a .npy array", None),
    (b"SQLite format 3\x00", "an SQLite database", None),
    (b"\xff\xfe", "UTF-16 text", None),
    (b"\xfe\xff", "UTF-16 text", None),
)
UTF8_BOM = b"\xef\xbb\xbf"
_MISSING = fields.MISSING
log = logging.getLogger(__name__)
_JSONL_HINT = "the input must be JSONL: one JSON object per line (.jsonl, .json or .ndjson, each also .gz or .zst)"


def is_compressed(path: Path) -> bool:
    """Named as compressed: .gz or .zst, in any case (a.jsonl.GZ)."""
    return path.suffix.lower() in COMPRESSED_SUFFIXES


def looks_like(head: bytes) -> tuple[str, str | None] | None:
    """(what the bytes look like, the file suffix that format takes) for a known non-JSONL start, else None."""
    for magic, what, suffix in _SIGNATURES:
        if head.startswith(magic):
            return what, suffix
    if _is_skippable_frame(head):  # zstd metadata some tools write before the data
        return "zstd data", ".zst"
    if len(head) >= 4 and head[0] != 0 and head[1] == 0 and head[3] == 0:
        return "UTF-16 text", None  # little-endian without a byte order mark: every other byte NUL
    return None


def describe_start(head: bytes) -> str:
    """What a file seems to be from its first bytes, for messages ("gzip data", "text", ...)."""
    found = looks_like(head)
    if found is not None:
        return found[0]
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "a Python pickle (torch.save or pickle.dump)"
    if not head:
        return "an empty file"
    try:
        text = head.removeprefix(UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 3:  # not just a character cut off at the end of ``head``
            return f"binary data (it starts with the bytes {head[:8].hex(' ')})"
        text = head[: exc.start].decode("utf-8")
    if text.lstrip().startswith(("{", "[")):
        return "JSON or JSONL text"
    if all(c.isprintable() or c.isspace() for c in text):
        return "text"
    return f"binary data (it starts with the bytes {head[:8].hex(' ')})"


def _renamed(path: Path, suffix: str | None) -> Path:
    """``path`` with its compression suffix replaced by ``suffix`` (None: no compression suffix)."""
    stem = path.with_suffix("") if is_compressed(path) else path
    return stem if suffix is None else stem.with_name(stem.name + suffix)


def _format_advice(path: Path, head: bytes, decompressed: bool = False) -> str | None:
    """'looks like X: rename it Y' (or what to do instead) for content whose first bytes are another format's."""
    found = looks_like(head)
    if found is None:
        return None
    what, suffix = found
    if decompressed:
        return f"its decompressed content looks like {what}, not JSONL; {_JSONL_HINT}"
    if suffix is not None:
        return f"looks like {what}: rename it {_renamed(path, suffix).name}"
    if what == "UTF-16 text":
        return f"looks like {what}: JSONL must be UTF-8 (convert it, e.g. iconv -f UTF-16 -t UTF-8)"
    return f"looks like {what}, not JSONL; {_JSONL_HINT}"


class FileIdentity(NamedTuple):
    """What says a file is still the one that was indexed."""

    size: int
    mtime_ns: int
    inode: int


def _identity(st: os.stat_result) -> FileIdentity:
    return FileIdentity(st.st_size, st.st_mtime_ns, st.st_ino)


def _check_identity(path: Path, now: FileIdentity, indexed: FileIdentity) -> None:
    if now == indexed:
        return
    changes = []
    if now.inode != indexed.inode:
        changes.append("replaced by another file")
    if now.size != indexed.size:
        changes.append(f"size {indexed.size:,} -> {now.size:,} bytes")
    if now.mtime_ns != indexed.mtime_ns:
        changes.append("modified")
    raise UserError(f"{path}: the input changed since it was indexed ({', '.join(changes)}); its records can no "
                    f"longer be read back as indexed: re-run once the file stays unchanged for the whole run")


def check_input(path: Path | str) -> None:
    """The input must be an existing regular file: it is read several times (index, texts, output)."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{path}: input file not found") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot read the input ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UserError(f"{path}: is a directory; {_JSONL_HINT}")
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{path}: is not a regular file (a pipe or device; the input is read more than once: "
                        f"write it to a file first)")


def open_binary(path: Path | str, expect: FileIdentity | None = None,
                buffer_size: int = io.DEFAULT_BUFFER_SIZE) -> BinaryIO:
    """A binary reader of ``path``'s content: .gz and .zst are decompressed as a stream and verified.

    With ``expect``, the file opened must still be the one indexed (else a UserError). A small
    buffer suits reads of scattered records; a streaming pass wants a big one. Compressed
    streams can only seek forward cheaply, so callers read them in ascending offset order
    (offsets are positions in the decompressed content).
    """
    path = Path(path)
    try:
        source = open(path, "rb", buffering=0)
    except OSError as exc:
        raise UserError(f"{path}: cannot open the input ({exc.strerror})") from None
    try:
        if expect is not None:
            _check_identity(path, _identity(os.fstat(source.fileno())), expect)
        raw = _Decompressed(source, path) if is_compressed(path) else source
    except BaseException:
        source.close()
        raise
    return io.BufferedReader(raw, buffer_size=buffer_size)


class _CompressedDataError(UserError):
    """A .gz/.zst file that is not complete, intact compressed data."""


class _Decompressed(io.RawIOBase):
    """The content of a .gz or .zst file, checked to its end.

    Every gzip member / zstd frame must be complete and intact (gzip CRC-32 and size; zstd
    content checksums where a frame has them), one may follow another, and nothing else may
    follow the last; any fault is one UserError naming the compressed byte offset. A truncated
    file can therefore never read as a shorter dataset.
    """

    def __init__(self, source, path: Path) -> None:
        super().__init__()
        self._source, self._path = source, path
        self._gzip = path.suffix.lower() == ".gz"
        self._kind, self._unit = ("gzip", "member") if self._gzip else ("zstd", "frame")
        if self._gzip:
            self._errors = zlib.error
        else:
            zstandard = _zstandard(path)
            # Up to the 2 GB window of `zstd --long=31`: the memory is taken only by a frame that declares it.
            self._decompressor = zstandard.ZstdDecompressor(max_window_size=1 << 31)
            self._errors = zstandard.ZstdError
        self._rewind()

    def _rewind(self) -> None:
        self._source.seek(0)
        self._input = b""  # compressed bytes read, not yet fed to the decoder
        self._at = 0  # file offset of self._input[0]
        self._decoder = None  # the current member's / frame's decoder; None between them
        self._unit_start = 0
        self._output = memoryview(b"")  # content decoded, not yet returned
        self._position = 0  # content offset of self._output[0]
        self._finished = False
        # Compressed bytes fed per call, adapted so one call yields a few MB: zstd has no output
        # limit per call, and a highly compressible chunk could otherwise expand to gigabytes.
        self._chunk = 1 << 15

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._source.fileno()

    def tell(self) -> int:
        return self._position

    def close(self) -> None:
        if not self.closed:
            self._source.close()
        super().close()

    def readinto(self, buffer) -> int:
        while not self._output:
            if self._finished:
                return 0
            self._decode_some()
        n = min(len(buffer), len(self._output))
        buffer[:n] = self._output[:n]
        self._output = self._output[n:]
        self._position += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_CUR:
            offset += self._position
        elif whence != io.SEEK_SET:
            raise io.UnsupportedOperation("a compressed stream seeks from its start or the current position only")
        if offset < self._position:
            self._rewind()
        while self._position < offset:
            if not self._output:
                if self._finished:
                    break
                self._decode_some()
                continue
            skip = min(offset - self._position, len(self._output))
            self._output = self._output[skip:]
            self._position += skip
        return self._position

    def check_ahead(self, limit: int) -> None:
        """Decode on to the end of the current member/frame (at most ``limit`` compressed bytes) to
        find corrupt data there: a record that fails to parse may be its first symptom, since a
        gzip member's CRC (a zstd frame's checksum) is only checked at its end."""
        end = self._at + limit
        while self._decoder is not None and not self._finished and self._at < end:
            self._output = memoryview(b"")
            self._decode_some()

    def _read(self) -> bytes:
        return self._source.read(self._chunk)

    def _decode_some(self) -> None:
        if not self._input:
            self._input = self._read()
            if not self._input:
                if self._decoder is not None:
                    raise self._truncated(self._at, self._unit_start)
                self._finished = True
                return
        if self._decoder is None:
            self._begin_unit()
            if self._decoder is None:
                return
        data = self._input
        try:
            out = self._decoder.decompress(data)
        except self._errors as exc:
            raise _CompressedDataError(
                f"{self._path}: corrupt {self._kind} data in the {self._unit} that starts at compressed byte "
                f"{self._unit_start:,}, found by byte {self._at + len(data):,} ({exc})") from None
        rest = b""
        if self._decoder.eof:
            rest = self._decoder.unused_data
            self._decoder = None
        used = len(data) - len(rest)
        self._at += used
        self._input = rest
        self._output = memoryview(out)
        if used:
            self._chunk = max(1 << 12, min(1 << 18, used * (4 << 20) // max(len(out), 1)))

    def _begin_unit(self) -> None:
        """A member/frame starts at ``self._at``: check its magic bytes (the file's, at offset 0)."""
        while len(self._input) < 4:
            more = self._read()
            if not more:
                break
            self._input += more
        head = self._input
        magic = b"\x1f\x8b" if self._gzip else b"\x28\xb5\x2f\xfd"
        if head.startswith(magic) or (not self._gzip and _is_skippable_frame(head)):
            self._unit_start = self._at
            # gzip framing makes zlib check each member's CRC-32 and size; zstd checks a frame's
            # content checksum when it has one.
            self._decoder = (zlib.decompressobj(16 + zlib.MAX_WBITS) if self._gzip
                             else self._decompressor.decompressobj())
        elif len(head) < len(magic) and magic.startswith(head):
            raise self._truncated(self._at + len(head), self._at)
        elif self._at == 0:
            advice = _format_advice(self._path, head[:16])
            if advice is None and (head[:1] in b"{[ \t\r\n" or head.startswith(UTF8_BOM)):
                advice = f"looks like uncompressed text: rename it {_renamed(self._path, None).name}"
            raise _CompressedDataError(f"{self._path}: not {self._kind} data: "
                                       + (advice or f"it starts with the bytes {head[:8].hex(' ')}"))
        elif self._gzip and not head.strip(b"\x00") and self._zeros_to_end():
            self._finished = True  # zero padding after the last member: gzip itself accepts it
        else:
            raise _CompressedDataError(
                f"{self._path}: unexpected data after the end of the {self._kind} data at compressed byte "
                f"{self._at:,} (not a {self._kind} {self._unit}): the file is damaged or has something appended")

    def _truncated(self, end: int, unit_start: int) -> UserError:
        return _CompressedDataError(
            f"{self._path}: truncated {self._kind} data: the file ends at compressed byte {end:,} inside the "
            f"{self._unit} that starts at byte {unit_start:,} (an interrupted download or copy?); only a complete "
            f"file can be read")

    def _zeros_to_end(self) -> bool:
        while True:
            more = self._read()
            if not more:
                return True
            if more.strip(b"\x00"):
                return False


def _is_skippable_frame(head: bytes) -> bool:
    return len(head) >= 4 and head[0] & 0xF0 == 0x50 and head[1:4] == b"\x2a\x4d\x18"


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


def raw_hash(raw: bytes) -> int:
    """32-bit check of a record's bytes (CRC-32): catches a record that changed.

    Not a fingerprint (the text fingerprint keys the caches): a change it could miss (one in 2**32
    at random; none of 32 bits or fewer) would also have to keep the file's size, mtime and inode,
    which are checked first. Four bytes per record, held for every record of the input.
    """
    return zlib.crc32(raw)


# Bytes of one record are held as uint32: a longer JSON line is refused with its line number.
MAX_RECORD_BYTES = (1 << 32) - 1


@dataclass
class DocumentKinds:
    """How many records' text field holds a conversation, and the first row holding each kind (-1: none),
    rows counted from the index's (or range's) first record: a field should hold one kind throughout. And the
    roles a chat template may not know (``fields.unknown_roles``), each with [conversations holding it, the
    first such row], counted as the records are indexed: a mix may name its roles differently source by source."""

    conversations: int = 0
    first_text_row: int = -1
    first_conversation_row: int = -1
    unknown_roles: dict = field(default_factory=dict)
    # the same for what a chat trainer reads otherwise (``fields.trainer_notes``): [conversations, the first row]
    trainer_notes: dict = field(default_factory=dict)
    encoded: int = 0  # plain texts that are a conversation written as a JSON string (a column of JSON)
    first_encoded_row: int = -1
    # Plain texts are checked for that until this many are not (a column of JSON shows in its first records);
    # once one is, all are, so the count is exact. It keeps the indexing loop as fast as without the check.
    unchecked: int = 1000

    def saw(self, row: int, document: str | fields.Conversation) -> None:
        if isinstance(document, str):
            if self.first_text_row < 0:
                self.first_text_row = row
            if self.unchecked:
                self.unchecked -= 1
                if document.startswith("[{") and fields.is_encoded_conversation(document):
                    self.encoded += 1
                    self.unchecked = -1  # (never reaches 0 again: every later text is checked)
                    if self.first_encoded_row < 0:
                        self.first_encoded_row = row
            return
        self.conversations += 1
        if self.first_conversation_row < 0:
            self.first_conversation_row = row
        for role in fields.unknown_roles(document):
            self.unknown_roles.setdefault(role, [0, row])[0] += 1
        for note in fields.trainer_notes(document):
            self.trainer_notes.setdefault(note, [0, row])[0] += 1

    @staticmethod
    def joined(parts: list[tuple[int, DocumentKinds]]) -> DocumentKinds:
        """Consecutive parts' kinds as one, each part given with its first row."""
        out = DocumentKinds(conversations=sum(kinds.conversations for _, kinds in parts),
                            encoded=sum(kinds.encoded for _, kinds in parts))
        for first, kinds in parts:
            if out.first_encoded_row < 0 <= kinds.first_encoded_row:
                out.first_encoded_row = first + kinds.first_encoded_row
            if out.first_text_row < 0 <= kinds.first_text_row:
                out.first_text_row = first + kinds.first_text_row
            if out.first_conversation_row < 0 <= kinds.first_conversation_row:
                out.first_conversation_row = first + kinds.first_conversation_row
            for found, joined in ((kinds.unknown_roles, out.unknown_roles), (kinds.trainer_notes, out.trainer_notes)):
                for key, (count, row) in found.items():
                    joined.setdefault(key, [0, first + row])[0] += count
        return out


@dataclass
class RecordIndex:
    """Where each record of a JSONL file lies, by input position (blank lines are not records)."""

    path: Path
    text_field: str
    # 24 bytes per record, held by every process (and every torchrun rank) for the whole run.
    starts: np.ndarray  # int64, byte offset of the record's first byte
    lengths: np.ndarray  # uint32, the record's bytes (its newline excluded)
    fingerprints: np.ndarray  # uint64, text_fingerprint of the text field
    raw_hashes: np.ndarray  # uint32, raw_hash of the record's bytes: every later read is checked against it
    identity: FileIdentity  # the indexed file's size, mtime and inode: later reads must find the same
    # One entry per line that is not a record (blank or whitespace), the row of the record after it:
    # line numbers (for messages) follow from it without 8 bytes per record.
    non_record_lines: np.ndarray  # int64, ascending
    first_line: int = 1  # the line of row 0's part of the file (not 1 for a torchrun rank's own range)
    kinds: DocumentKinds = field(default_factory=DocumentKinds)  # conversations or plain texts

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    @property
    def total_bytes(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    def line_numbers(self, rows: np.ndarray) -> np.ndarray:
        """The 1-based line number in the file of each record ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        return rows + self.first_line + np.searchsorted(self.non_record_lines, rows, side="right")

    def line_number(self, row: int) -> int:
        return int(self.line_numbers(np.asarray([row]))[0])

    def rows_slice(self, a: int, b: int) -> RecordIndex:
        """Records ``a`` to ``b`` - 1 as an index of their own (row 0: record ``a``), with their line
        numbers in the file: what one torchrun rank hands another to read."""
        after = self.non_record_lines[self.non_record_lines > a] - a
        return RecordIndex(path=self.path, text_field=self.text_field, identity=self.identity,
                           first_line=self.line_number(a) if a < len(self) else self.first_line + a,
                           non_record_lines=after[after < b - a] if b > a else after[:0],
                           **{name: np.array(getattr(self, name)[a:b]) for name in
                              ("starts", "lengths", "fingerprints", "raw_hashes")})

    # The source interface (see sources.py): what every input format offers the pipeline.
    kind = "jsonl"

    @property
    def name(self) -> Path:
        return self.path

    @property
    def files(self) -> list[Path]:
        return [self.path]

    @property
    def row_sizes(self) -> np.ndarray:
        """Bytes of each record: what torchrun shares and batches are balanced by (the index's own
        array: no copy of N sizes per call)."""
        return self.lengths

    def where(self, row: int) -> str:
        return f"{self.path}:{self.line_number(row)}"

    def iter_documents(self, rows: np.ndarray | None = None, max_batch_bytes: int = 4 << 20,
                       max_batch_rows: int = 1 << 30):
        return iter_text_batches(self, rows, max_batch_bytes, max_batch_rows)

    def field_values(self, name: str) -> list:
        return read_field_values(self, name)

    def check_unchanged(self) -> None:
        check_unchanged(self)

    def read_raw(self, rows: np.ndarray) -> list[bytes]:
        return read_records(self, rows)

    def write_rows(self, rows: np.ndarray, output: Path) -> int:
        return write_rows(self, rows, output)


class _NotJsonl(UserError):
    """A line that is not a UTF-8 JSON object: on the first record, most likely not a JSONL file at all."""


class BadRecords(UserError):
    """Records of one file that cannot be read: the first one's error, and how many there are with the last
    (a range goes on past its first bad record, so one run names them all rather than one per run)."""

    def __init__(self, first: str, count: int, last: str):
        super().__init__(first)
        self.first, self.count, self.last = first, count, last

    def __str__(self) -> str:
        more = f" ({self.count:,} records of this file cannot be read; the last: {self.last})" if self.count > 1 else ""
        return self.first + more

    def __reduce__(self):  # pickled between processes with its fields
        return BadRecords, (self.first, self.count, self.last)

    @staticmethod
    def joined(parts: list[BadRecords]) -> BadRecords:
        """Consecutive ranges' bad records of one file, in file order, as one."""
        return BadRecords(parts[0].first, sum(part.count for part in parts), parts[-1].last)


_scan_json = json.decoder.JSONDecoder().scan_once  # json.loads's own C scanner, without its Python wrappers


def _parse_json(decoded: str):
    """``json.loads(decoded)``, a third faster on the usual line, which starts with its value."""
    try:
        value, end = _scan_json(decoded, 0)
    except StopIteration:  # leading whitespace, or not JSON: json.loads gives the value or the message
        return json.loads(decoded)
    if end != len(decoded) and decoded[end:].strip(" \t\n\r"):
        return json.loads(decoded)  # raises "Extra data", with its column
    return value


def _record_text(raw: bytes, path: Path, line_number: int, text_field: str | tuple[str, ...]):
    """Decode and validate one line; its document (a text, or a ``fields.Conversation``).

    ``text_field`` is one field name or several (see ``fields``); raises a UserError naming the file and line.
    """
    try:
        record = _parse_json(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _NotJsonl(f"{path}:{line_number}: invalid UTF-8 (byte {exc.start} of the line)") from None
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unexpected UTF-8 BOM"):  # (json's advice, "decode using utf-8-sig", is Python's)
            raise _NotJsonl(f"{path}:{line_number}: starts with a UTF-8 byte order mark, which only a file's first "
                            "line may (files with one each joined into one, as cat a.jsonl b.jsonl does?); remove "
                            "it") from None
        # json's messages that end "... starting at" expect the position right after them.
        where = f" column {exc.colno}" if exc.msg.endswith(" at") else f"; column {exc.colno}"
        raise _NotJsonl(f"{path}:{line_number}: not valid JSON ({exc.msg}{where})") from None
    except ValueError:  # valid JSON that Python refuses: an integer past its 4300-digit conversion limit
        raise UserError(f"{path}:{line_number}: a JSON integer with more than {sys.get_int_max_str_digits()} "
                        f"digits, more than Python reads; write it as a string or drop the field") from None
    except RecursionError:
        raise UserError(f"{path}:{line_number}: JSON nested too deeply to read (more than about "
                        f"{sys.getrecursionlimit()} levels)") from None
    if not isinstance(record, dict):
        raise _NotJsonl(f"{path}:{line_number}: expected a JSON object, found a JSON {fields.json_type(record)}")
    if isinstance(text_field, str):  # the usual case, kept fast: one top-level field holding a string
        text = record.get(text_field, _MISSING)
        if isinstance(text, str):
            return text
        if text is _MISSING and "." not in text_field:
            raise UserError(f"{path}:{line_number}: no field '{text_field}' (this record has keys: "
                            f"{fields.shown_keys(record)}); choose the text field with --text-field"
                            + fields.missing_field_hint(record))
        text_field = (text_field,)  # a conversation, or a value fields.extract refuses in the same words
    return fields.extract(record, text_field, lambda: f"{path}:{line_number}", fields.shown_keys)


class TextReader:
    """``_record_text`` for one text field, reading the usual record (the field a string) with orjson,
    ~4x faster than json. What orjson accepts, json reads to the same string; what it refuses but json
    accepts (NaN, lone surrogates) or what is not that usual record goes to ``_record_text``. Only the one
    string is taken from orjson (it reads integers past 64 bits as floats, which json keeps exact), so
    after a record whose field is not a string (conversations) orjson is not tried again: it would
    only parse each record twice."""

    def __init__(self, path: Path, text_field: str | tuple[str, ...]):
        self.path, self.text_field = path, text_field
        self.fast = isinstance(text_field, str)

    def __call__(self, raw: bytes, line_number: int):
        if self.fast:
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError:
                record = None
            if isinstance(record, dict):
                text = record.get(self.text_field)
                if isinstance(text, str):
                    return text
                self.fast = text is None  # a missing field is an error on the way below, not a pattern
        return _record_text(raw, self.path, line_number, self.text_field)


def _surrogate_error(text: str, exc: UnicodeEncodeError, where: str, text_field) -> UserError:
    """A JSON \\ud800-\\udfff escape without its pair decodes to a string no tokenizer can encode."""
    text_field = text_field if isinstance(text_field, str) else "+".join(text_field)
    return UserError(f"{where}: field '{text_field}' holds a lone surrogate (\\u{ord(text[exc.start]):04x} at "
                     f"character {exc.start}): valid JSON but not Unicode text, which no tokenizer can read; "
                     f"fix or remove the record")


def _skip_preamble(handle, path: Path) -> int:
    """Refuse content that is plainly not JSONL; skip a UTF-8 byte order mark. Returns bytes skipped."""
    head = handle.read(16)  # read, not peek: a first gzip member or zstd frame may hold a single byte
    handle.seek(0)
    advice = _format_advice(path, head, decompressed=is_compressed(path))
    if advice is not None:
        raise UserError(f"{path}: {advice}")
    if head.startswith(UTF8_BOM):  # some editors write one; it is not part of the first record
        return handle.seek(len(UTF8_BOM))
    return 0


def scan_jsonl(path: Path | str, text_field: str | tuple[str, ...] = "text", progress: bool = True,
               workers: int | None = None) -> RecordIndex:
    """Validate every record of ``path`` and index it (one streaming pass, no texts kept); see ``scan_files``."""
    return scan_files([Path(path)], text_field, progress, workers)[0]


# A plain file is cut into byte ranges indexed by several processes when each range would hold at
# least this much (below it, starting a process costs about what it saves).
PARALLEL_RANGE_BYTES = 32 << 20


def index_workers() -> int:
    """Processes that index at once: one per core this process may use, at most 8 (past that the
    disk, not the parsing, sets the pace)."""
    return max(1, min(8, usable_cores()))


def scan_files(paths: list[Path], text_field: str | tuple[str, ...] = "text", progress: bool = True,
               workers: int | None = None) -> list[RecordIndex]:
    """Validate and index every record of ``paths``: one index per file.

    With more than one worker (default ``index_workers()``), the files are indexed by that many
    processes at once: a plain file is cut into byte ranges (``scan_range``; at least
    ``PARALLEL_RANGE_BYTES`` each) and several files go to different processes; the parts are
    joined into the index one pass gives (10M short records, 1.8 GB: 18.5 s in one process). A bad
    record stops them all with the message one pass gives (the first in file order)."""
    for path in paths:
        check_input(path)
    workers = index_workers() if workers is None else workers
    sizes = [os.stat(path).st_size for path in paths]
    pieces = []  # (file number, lo, hi): the file's byte ranges, whole for a compressed file
    for f, (path, size) in enumerate(zip(paths, sizes)):
        n = 1 if is_compressed(path) else max(1, min(workers, size // PARALLEL_RANGE_BYTES))
        cuts = np.linspace(0, size, n + 1).astype(np.int64).tolist()
        pieces += [(f, cuts[i], None if i == n - 1 else cuts[i + 1]) for i in range(n)]
    if workers <= 1 or len(pieces) == 1 or sum(sizes) < 2 * PARALLEL_RANGE_BYTES or not can_index_in_processes():
        if len(paths) == 1:
            indexes = [index_from_parts(paths[0], text_field, [scan_range(paths[0], text_field, 0, None, progress)])]
        else:  # one progress line for all the files (a folder of 2,000 shards gave 2,000 lines)
            compressed = any(is_compressed(path) for path in paths)
            with Progress(None if compressed else sum(sizes), f"Indexing {len(paths):,} files",
                          unit="MB decompressed so far" if compressed else "MB", rate_unit="MB", bar=progress,
                          scale=MB) as bar:
                indexes = [index_from_parts(path, text_field, [scan_range(path, text_field, 0, None, progress,
                                                                          report=bar.update)])
                           for path in paths]
    else:
        parts = _scan_in_processes(paths, text_field, pieces, min(workers, len(pieces)), progress, sizes)
        indexes = [index_from_parts(path, text_field, [part for (g, _, _), part in zip(pieces, parts) if g == f],
                                    consume=True) for f, path in enumerate(paths)]
    require_records(paths, [len(index) for index in indexes])
    return indexes


def require_records(paths: list[Path], counts: list[int]) -> None:
    """Files of no records (empty, or blank lines only) are accepted among others, as an empty shard
    of a sharded output is; the input as a whole must hold a record."""
    if any(counts):
        return
    if len(paths) == 1:
        raise UserError(f"{paths[0]}: no records (the file is empty or holds only blank lines)")
    raise UserError(f"--input: none of the {len(paths)} files holds a record (they are empty or hold only "
                    f"blank lines; the first is {paths[0]})")


_bytes_done = None  # in an indexing process: the counter of bytes indexed that every process adds to


def _start_indexing_process(counter, parent: int) -> None:
    global _bytes_done
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the processes
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the parent's handler, forked with it: a worker just ends
    _end_with_parent(parent)
    _bytes_done = counter


def _end_with_parent(parent: int) -> None:
    """Have Linux end this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``): a parent killed by SIGKILL or
    an out-of-memory kill runs no clean-up, and its workers (a few hundred MB each) waited forever, adopted by init.
    Elsewhere nothing is set up."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG
            return
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request was made
        os._exit(1)


def _count_bytes(n: int) -> None:
    with _bytes_done.get_lock():
        _bytes_done.value += n


def _scan_piece(path: Path, text_field, lo: int, hi: int | None) -> IndexPart:
    return scan_range(path, text_field, lo, hi, progress=False, report=_count_bytes)


def _scan_in_processes(paths: list[Path], text_field, pieces: list[tuple], workers: int, progress: bool,
                       sizes: list[int]) -> list[IndexPart]:
    """``scan_range`` of every piece, in ``workers`` forked processes; one progress bar for all.

    Forked, not spawned: a spawned process imports the caller's main module again, which a script
    without a main guard (or code run from stdin) cannot survive. The children only parse, hash and
    build arrays (no torch, no logging), so the parent's other threads do not matter to them."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, TimeoutError

    context = multiprocessing.get_context("fork")
    counter = context.Value("q", 0)
    compressed = any(is_compressed(path) for path in paths)
    name = paths[0].name if len(paths) == 1 else f"{len(paths)} files"
    parts = []
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_indexing_process,
                             initargs=(counter, os.getpid())) as pool, \
            Progress(None if compressed else sum(sizes), f"Indexing {name} ({workers} processes)",
                     unit="MB decompressed so far" if compressed else "MB", rate_unit="MB", bar=progress,
                     scale=MB) as bar:
        try:
            pending = [pool.submit(_scan_piece, paths[f], text_field, lo, hi) for f, lo, hi in pieces]
            # In file order: a piece's error is raised once every piece before it is done without one
            # (theirs come first); bad records are counted on through the rest of their file's pieces, as one
            # pass counts them.
            bad, bad_file = [], None
            for (f, _, _), future in zip(pieces, pending):
                if bad and f != bad_file:
                    break
                while True:
                    try:
                        parts.append(future.result(timeout=0.25))
                        break
                    except TimeoutError:
                        if counter.value > bar.done:
                            bar.update(counter.value - bar.done)
                    except BadRecords as exc:
                        bad.append(exc)
                        bad_file = f
                        break
                    except UserError:
                        if not bad:
                            raise
                        break
            if bad:
                raise BadRecords.joined(bad)
            bar.update(counter.value - bar.done)
        except BaseException:
            for process in list(pool._processes.values()):  # the pieces still running are not wanted
                process.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return parts


def can_index_in_processes() -> bool:
    import multiprocessing

    return "fork" in multiprocessing.get_all_start_methods()


@dataclass
class IndexPart:
    """The records whose first byte lies in one byte range of a file: ``RecordIndex``'s arrays for
    them, with ``non_record_lines`` counted from the range's first record (see ``index_from_parts``)."""

    starts: np.ndarray
    lengths: np.ndarray
    fingerprints: np.ndarray
    raw_hashes: np.ndarray
    non_record_lines: np.ndarray
    identity: FileIdentity
    first_line: int = 1  # the line number of the range's first line
    kinds: DocumentKinds = field(default_factory=DocumentKinds)

    COLUMNS = {"starts": np.int64, "lengths": np.uint32, "fingerprints": np.uint64, "raw_hashes": np.uint32,
               "non_record_lines": np.int64}

    def __len__(self) -> int:
        return int(self.starts.shape[0])


def check_one_identity(path: Path, identities: list[FileIdentity]) -> None:
    """Parts of one file indexed at different moments (by torchrun's ranks, on several nodes) must have seen the same
    file."""
    if any(identity != identities[0] for identity in identities):
        raise UserError(f"{path}: the processes that indexed its parts saw different files: it changed while it was "
                        "being indexed (re-run once it stays unchanged), or the nodes read different files under this "
                        "path (a relative path from another folder, a copy per node; give every node the same file)")


def index_from_parts(path: Path, text_field, parts: list[IndexPart], consume: bool = False) -> RecordIndex:
    """One file's index from the parts of its consecutive byte ranges (in file order): the index a
    single pass over the whole file gives. ``consume``: the parts' columns are dropped as they are
    joined (one column is held twice at most; the parts are no use afterwards)."""
    check_one_identity(path, [part.identity for part in parts])
    before = np.cumsum([0] + [len(part) for part in parts[:-1]])
    lines = [part.non_record_lines + first for part, first in zip(parts, before.tolist())]
    joined = {}
    for name in IndexPart.COLUMNS:
        if name == "non_record_lines":
            continue
        joined[name] = getattr(parts[0], name) if len(parts) == 1 else np.concatenate([getattr(p, name) for p in parts])
        if consume:
            for part in parts:
                setattr(part, name, None)
    return RecordIndex(path=path, text_field=text_field, identity=parts[0].identity,
                       non_record_lines=lines[0] if len(lines) == 1 else np.concatenate(lines),
                       kinds=DocumentKinds.joined(list(zip(before.tolist(), [part.kinds for part in parts]))), **joined)


def index_of_part(path: Path, text_field, part: IndexPart) -> RecordIndex:
    """One range's records as an index of their own (row 0: the range's first record), with their
    line numbers in the file: a torchrun rank that reads only its own range."""
    return RecordIndex(path=path, text_field=text_field, identity=part.identity, first_line=part.first_line,
                       kinds=part.kinds, **{name: getattr(part, name) for name in IndexPart.COLUMNS})


def count_lines_before(path: Path, offset: int, chunk: int = 16 << 20) -> int:
    """Newlines in the first ``offset`` bytes of a plain file (a few GB/s: a range's first line number)."""
    count = 0
    with open(path, "rb", buffering=0) as handle:
        while offset > 0:
            block = handle.read(min(chunk, offset))
            if not block:
                break
            count += block.count(b"\n")
            offset -= len(block)
    return count


def scan_range(path: Path, text_field, lo: int = 0, hi: int | None = None, progress: bool = True,
               report=None) -> IndexPart:
    """Validate and index the records whose first byte lies in ``[lo, hi)`` of ``path`` (``hi``
    None: to the end). Ranges that meet cover every record once, so processes can index one file
    together. A range other than the whole file needs a plain (uncompressed) file: a compressed
    one cannot be entered in the middle. ``report(n)``, when given, is told of every n bytes
    indexed instead of a progress bar of this range's own."""
    # Compact typed arrays, handed to numpy without a copy: 24 bytes per record, not ~150 as Python
    # int lists would take.
    starts, lengths, raw_hashes = array.array("q"), array.array("I"), array.array("I")
    fingerprints, non_record_lines = bytearray(), array.array("q")
    blake2b, crc32 = hashlib.blake2b, zlib.crc32
    read = TextReader(path, text_field)
    kinds = DocumentKinds()
    with open_binary(path, buffer_size=1 << 20) as handle:
        identity = _identity(os.fstat(handle.fileno()))
        if lo == 0:
            offset = _skip_preamble(handle, path)
            first_line = 1
        else:  # the line holding byte lo - 1 belongs to the range before: its records start before lo
            handle.seek(lo - 1)
            offset = lo - 1 + len(handle.readline())
            first_line = 1 + count_lines_before(path, offset)
        # The bar counts decompressed bytes; for compressed input the total is unknown.
        end = None if is_compressed(path) else (identity.size if hi is None else min(hi, identity.size))
        done = offset
        # A part of the file (a torchrun rank's byte range) says so: its total is that part's, which the rank reads
        # past to finish its last record.
        part = "" if lo == 0 and hi is None else " (this rank's part)"
        # (compressed: no total, and the MB are of decompressed data, which neither file size says)
        with Progress(None if end is None else end - offset, f"Indexing {path.name}{part}",
                      unit="MB" if end is not None else "MB decompressed so far", rate_unit="MB", bar=progress,
                      scale=MB, silent=report is not None) as bar:
            advance = bar.update if report is None else report
            first_bad, bad, last_bad = None, 0, ""
            try:
                for line_number, line in enumerate(handle, start=first_line):
                    start = offset
                    if hi is not None and start >= hi and line_number > 1:  # line 1 begins at byte 0, before a BOM
                        break
                    offset += len(line)
                    content = line[:-1] if line.endswith(b"\n") else line
                    if not content or content.isspace():
                        non_record_lines.append(len(starts))
                    else:
                        try:
                            if len(content) > MAX_RECORD_BYTES:
                                raise UserError(f"{path}:{line_number}: a line of {len(content):,} bytes, more than "
                                                f"the {MAX_RECORD_BYTES:,} one record may hold; split the record")
                            text = read(content, line_number)
                            if not isinstance(text, str):  # a conversation: its canonical JSON
                                fingerprinted = fields.fingerprint_text(text)
                            else:
                                fingerprinted = text
                            try:  # the fingerprint's strict encoding is the lone-surrogate check, at no extra cost
                                encoded = fingerprinted.encode("utf-8")
                            except UnicodeEncodeError as exc:
                                raise _surrogate_error(fingerprinted, exc, f"{path}:{line_number}", text_field) from None
                        except _CompressedDataError:
                            raise
                        except UserError as exc:
                            if first_bad is None:
                                if isinstance(handle.raw, _Decompressed):  # corrupt data is the likelier cause
                                    handle.raw.check_ahead(64 << 20)
                                if isinstance(exc, _NotJsonl) and not starts and first_line == 1:
                                    raise  # the first record: most likely not a JSONL file at all
                                first_bad = str(exc)
                            bad, last_bad = bad + 1, f"{path}:{line_number}"
                        if not bad:  # past a bad record the rest are only read, to count the bad ones
                            kinds.saw(len(starts), text)
                            starts.append(start)
                            lengths.append(len(content))
                            # Little-endian digest bytes: the same uint64 as int.from_bytes(digest, "little").
                            fingerprints += blake2b(encoded, digest_size=8).digest()
                            raw_hashes.append(crc32(content))
                    if start - done > (8 << 20):
                        advance(start - done)
                        done = start
                advance(offset - done)
                if bad:
                    raise BadRecords(first_bad, bad, last_bad)
            except _CompressedDataError:
                raise
            except UserError as exc:
                if isinstance(handle.raw, _Decompressed):  # corrupt data is the likelier cause
                    handle.raw.check_ahead(64 << 20)
                if isinstance(exc, _NotJsonl) and not starts and first_line == 1:
                    raise UserError(f"{exc}; {_JSONL_HINT}") from None
                raise
        if _identity(os.fstat(handle.fileno())) != identity:
            raise UserError(f"{path}: the input changed while it was being indexed; re-run once it stays unchanged")
    columns = IndexPart.COLUMNS
    return IndexPart(
        starts=np.frombuffer(starts, dtype=columns["starts"]),
        lengths=np.frombuffer(lengths, dtype=columns["lengths"]),
        # Little-endian digests: the same uint64 as int.from_bytes(digest, "little") on any machine.
        fingerprints=np.frombuffer(fingerprints, dtype="<u8").astype(columns["fingerprints"], copy=False),
        raw_hashes=np.frombuffer(raw_hashes, dtype=columns["raw_hashes"]),
        non_record_lines=np.frombuffer(non_record_lines, dtype=columns["non_record_lines"]),
        identity=identity,
        first_line=first_line,
        kinds=kinds,
    )


def check_unchanged(index: RecordIndex) -> None:
    """Raise a UserError if the indexed file is no longer as it was (size, mtime, inode).

    Every read of the records checks this and each record's bytes; call it before long work
    ends so a changed input is reported before its results are stored.
    """
    try:
        st = os.stat(index.path)
    except OSError as exc:
        raise UserError(f"{index.path}: the input changed since it was indexed (it cannot be read now: "
                        f"{exc.strerror}); re-run once the file stays unchanged for the whole run") from None
    _check_identity(index.path, _identity(st), index.identity)


def _verify(index: RecordIndex, rows: np.ndarray, raws: list) -> None:
    """Every record read back must be the bytes that were indexed."""
    n = len(raws)
    found = np.fromiter(map(raw_hash, raws), np.uint32, n)
    bad = np.flatnonzero(found != index.raw_hashes[rows])
    if bad.size:
        line = index.line_number(int(rows[bad[0]]))
        raise UserError(f"{index.path}:{line}: this record changed since the input was indexed ({bad.size} of "
                        f"{len(raws)} records read together differ): the file was modified during the run; re-run "
                        f"once it stays unchanged")


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
    read = TextReader(index.path, index.text_field)
    for batch, raws in _iter_raw_batches(index, rows, max_batch_bytes, max_batch_rows):
        yield batch, [read(raw, line) for line, raw in zip(index.line_numbers(batch).tolist(), raws)]


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
    sizes = index.lengths[rows].astype(np.int64)
    bounds = batch_bounds(sizes, max_batch_bytes, max_batch_rows)
    # The file must be the one indexed, and every record the bytes indexed; rows ascend, so
    # compressed input only seeks forward.
    with open_binary(index.path, expect=index.identity) as handle:
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            batch = rows[lo:hi]
            starts, ends = index.starts[batch], index.starts[batch] + sizes[lo:hi]
            first, last = int(starts[0]), int(ends[-1])
            if last - first <= 2 * int(sizes[lo:hi].sum()) + (1 << 16):
                handle.seek(first)
                block = handle.read(last - first)
                raws = [block[a - first : b - first] for a, b in zip(starts.tolist(), ends.tolist())]
            else:
                raws = []
                for a, size in zip(starts.tolist(), sizes[lo:hi].tolist()):
                    handle.seek(a)
                    raws.append(handle.read(size))
            _verify(index, batch, raws)
            yield batch, raws



def read_field_values(index: RecordIndex, field: str) -> list:
    """The JSON value at ``field`` (a dotted path, see ``fields.lookup``) in every record, in input
    order (``fields.MISSING`` where it is absent).

    Records were validated by ``scan_jsonl``, so each line is a JSON object.
    """
    values: list = []
    for _, raws in _iter_raw_batches(index, None):
        values.extend(fields.lookup(json.loads(raw), field) for raw in raws)
    return values


def record_keys(source, row: int) -> str:
    """The keys (columns) of record ``row`` of any source, read again (for error messages only)."""
    keys = getattr(source, "record_keys", None)
    if keys is not None:
        return keys(row)
    with open_binary(source.path) as handle:
        handle.seek(int(source.starts[row]))
        return fields.shown_keys(json.loads(handle.read(int(source.lengths[row]))))


def _finite_number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float | decimal.Decimal):
        return None
    try:
        number = float(value)  # a JSON integer past float range raises (a Decimal gives inf)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _as_score(value):
    """What a Parquet column's value that JSON has no word for scores as, exactly: a decimal as itself; a time as
    nanoseconds since 1970-01-01 UTC (a time without a zone read as UTC; a date at its midnight); a duration as
    nanoseconds. Any other value as it is."""
    if isinstance(value, datetime.datetime):
        nanoseconds = getattr(value, "nanosecond", 0)  # (pandas' Timestamp, which Arrow gives nanosecond times as)
        since = (value if value.tzinfo else value.replace(tzinfo=datetime.UTC)) - _EPOCH
        return since // datetime.timedelta(microseconds=1) * 1000 + nanoseconds
    if isinstance(value, datetime.date):
        return (value - _EPOCH.date()).days * 86_400 * 10**9
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(microseconds=1) * 1000 + getattr(value, "nanoseconds", 0)
    return value


def read_scores(index, field: str, default: float | None = None) -> tuple[np.ndarray, int]:
    """A finite number per record from ``field`` (float64), and how many records lacked one: a missing or
    non-numeric value is ``default``, or without one a UserError. Parquet's decimals, times and durations are
    numbers too (``_as_score``); those and integers a float64 cannot hold exactly are scored by rank."""
    values = index.field_values(field)
    given = values
    values = [_as_score(value) for value in values]
    times = any(value is not was for value, was in zip(values, given))
    if times:
        log.info("--score-field %s: times scored as nanoseconds since 1970-01-01 UTC (a date at its midnight), "
                 "durations as nanoseconds", field)
    scores = np.empty(len(values), dtype=np.float64)
    bad = []  # every record without a number: fixing them one run at a time is what a user should not have to do
    for row, value in enumerate(values):
        number = _finite_number(value)
        if number is None:
            bad.append(row)
        else:
            scores[row] = number
    if bad and default is not None:
        scores[bad] = default
    if not bad or default is not None:
        inexact = [row for row, value in enumerate(values) if isinstance(value, int | decimal.Decimal)
                   and not isinstance(value, bool) and _finite_number(value) is not None and float(value) != value]
        if inexact and _rounding_merges(values, scores, inexact):
            return _exact_ranks(values, scores, field, index.where(inexact[0]), said=not times), len(bad)
    if bad and default is None:
        row, value = bad[0], given[bad[0]]
        found = (f"no such field (this record has keys: {record_keys(index, row)})" if value is _MISSING
                 else f"the value {_shortened(json.dumps(value, default=str))}")
        more = f" ({len(bad):,} of the {len(values):,} records lack one; the last: {index.where(bad[-1])})" \
            if len(bad) > 1 else ""
        raise UserError(f"{index.where(row)}: --score-field {field} needs a finite number in every record; found "
                        f"{found}{more}; --score-default X gives such records the score X")
    return scores, len(bad)



def _rounding_merges(values: list, scores: np.ndarray, inexact: list[int]) -> bool:
    """Whether two different exact values among rows ``inexact`` (those a float64 does not hold) and the others
    read as one float score: only then do the scores need ranks (rounding to nearest keeps every other order; 0.1 as
    a Parquet decimal, or times a microsecond apart, keep their values)."""
    held: dict[float, object] = {}
    inexact_rows = set(inexact)
    for row in range(len(values)):
        exact = values[row] if row in inexact_rows else float(scores[row])
        if held.setdefault(float(scores[row]), exact) != exact:
            return True
    return False


def _exact_ranks(values: list, scores: np.ndarray, field: str, where: str, said: bool = True) -> np.ndarray:
    """Scores holding numbers float64 does not hold exactly, as the ranks of the exact values (Python compares ints,
    decimals and floats exactly), so the score orderings keep their order (1,700,000,000,000,000,001 and ...002,
    past 2**53, read as one float)."""
    exact = [value if isinstance(value, int | decimal.Decimal) and not isinstance(value, bool)
             and _finite_number(value) is not None else float(scores[row]) for row, value in enumerate(values)]
    ranks = np.empty(len(exact), dtype=np.float64)
    previous, rank = None, -1
    for row in sorted(range(len(exact)), key=exact.__getitem__):
        if previous is None or exact[row] != previous:
            rank += 1
            previous = exact[row]
        ranks[row] = rank
    say = log.warning if said else log.info  # (times: their line said how they score; that they are ranked, here)
    say("--score-field %s: numbers a float64 does not hold exactly (%s: integers past 2**53, times in nanoseconds, "
        "long decimals), which it may round together: the records are scored by their rank among the exact values "
        "(ties tied), so the score orderings keep their order", field, where)
    return ranks


def read_categories(index, field: str) -> tuple[np.ndarray, list[str]]:
    """A category id per record from ``field`` (any JSON value; absent -> its own "(missing)" category).

    Returns (ids in input order, category names by id, most frequent first). A field that no
    record has is a UserError (most likely a misspelt name).
    """
    values = index.field_values(field)
    if values and all(v is _MISSING for v in values):
        raise UserError(f"--balance-field {field}: no record has this field (the first record has keys: "
                        f"{record_keys(index, 0)})")
    keys = [_category_key(v) for v in values]
    names, ids, sizes = np.unique(np.asarray(keys, dtype=object), return_inverse=True, return_counts=True)
    by_size = np.argsort(-sizes, kind="stable")
    rank = np.empty_like(by_size)
    rank[by_size] = np.arange(by_size.size)
    return rank[ids].astype(np.int64), _category_names([str(names[i]) for i in by_size])


# A category's key: a string as it is, another JSON value as its JSON text after _OTHER, an absent field _ABSENT, so
# 1 and "1", null and "null", an absent field and "(missing)" are each two categories (a tester's were one). A string
# that starts with one of these marks gets _ESCAPED before it.
_ESCAPED, _OTHER, _ABSENT = "\x00", "\x01", "\x02"


def _category_key(value) -> str:
    if value is _MISSING:
        return _ABSENT
    if isinstance(value, str):
        return _ESCAPED + value if value[:1] in (_ESCAPED, _OTHER, _ABSENT) else value
    return _OTHER + json.dumps(value, sort_keys=True, default=str)  # (a Parquet time or decimal as its text)


def _category_names(keys: list[str]) -> list[str]:
    """Each category's name as the log and the metadata say it: a string as it is, another value as its JSON text,
    an absent field "(missing)"; where two would read alike, every string as JSON ("1")."""
    shown = ["(missing)" if key == _ABSENT else key[1:] if key[:1] in (_OTHER, _ESCAPED) else key for key in keys]
    if len(set(shown)) == len(shown):
        return shown
    # Two read alike (1 and "1"): every string is said as JSON then, so no two can ("1" and "\"1\"" stay apart).
    return [name if key[:1] in (_OTHER, _ABSENT) else json.dumps(name, ensure_ascii=False)
            for key, name in zip(keys, shown)]


def write_reordered(index: RecordIndex, order: np.ndarray, output: Path | str, max_pass_bytes: int = 1 << 30) -> int:
    """Write the input records in ``order`` (a permutation of them) to ``output`` atomically; return bytes written."""
    order = np.asarray(order, dtype=np.int64)
    if order.shape[0] != len(index) or not np.array_equal(np.sort(order), np.arange(len(index))):
        raise ValueError("order must be a permutation of the record positions")
    return write_rows(index, order, output, max_pass_bytes)


def write_rows(index: RecordIndex, rows: np.ndarray, output: Path | str, max_pass_bytes: int = 1 << 30) -> int:
    """Write the records ``rows`` (in that order) to ``output`` atomically; return bytes written.

    Each record is copied byte for byte from the input and followed by exactly one newline.
    The input must still be the file indexed (checked before anything is written), and every
    record copied must hash as indexed, else a UserError and no output. Plain input is copied
    through a memory map. Compressed input cannot be read at random, so the output is assembled
    in pieces of at most ``max_pass_bytes``, one forward pass over the input per piece. An output
    named ``.gz`` or ``.zst`` is compressed. ``rows`` may be any part of the records (a shard).
    """
    output = Path(output)
    rows = np.asarray(rows, dtype=np.int64)
    check_unchanged(index)
    written = 0
    with open_output(output) as sink:
        for batch, records in _record_pieces(index, rows, max_pass_bytes) if rows.size else ():
            _verify(index, batch, records)
            sink.write(b"\n".join(records))
            sink.write(b"\n")
            written += sum(map(len, records)) + len(records)
    return written


@contextlib.contextmanager
def open_output(output: Path):
    """A binary sink that becomes ``output`` only when complete (compressed for .gz / .zst names)."""
    with atomic_open(output, "wb") as target, _compressing(output, target) as sink:
        yield sink


def read_records(index: RecordIndex, rows: np.ndarray) -> list[bytes]:
    """The bytes of records ``rows``, in that order (read in file order; each checked as indexed)."""
    rows = np.asarray(rows, dtype=np.int64)
    by_offset = np.argsort(index.starts[rows], kind="stable")
    found: list[bytes] = [b""] * rows.size
    with open_binary(index.path, expect=index.identity) as source:
        for j in by_offset.tolist():
            source.seek(int(index.starts[rows[j]]))
            found[j] = source.read(int(index.lengths[rows[j]]))
    _verify(index, rows, found)
    return found


_WRITE_GROUP_BYTES = 16 << 20  # records joined per write (and verified together)
_WRITE_CHUNK_ROWS = 1 << 20  # records located at a time


def _groups(sizes: np.ndarray, group_bytes: int) -> list[tuple[int, int]]:
    """Consecutive (lo, hi) groups of about ``group_bytes`` (a bigger item is a group of its own)."""
    before = np.cumsum(sizes) - sizes  # bytes before each item
    cuts = np.flatnonzero(np.diff(before // group_bytes)) + 1
    bounds = [0, *cuts.tolist(), int(sizes.size)]
    return list(zip(bounds[:-1], bounds[1:]))


def _record_pieces(index: RecordIndex, order: np.ndarray, max_pass_bytes: int):
    """Yield (rows, their records' bytes) in output order, a group at a time."""
    if not is_compressed(index.path):
        with open_binary(index.path, expect=index.identity) as source, \
                mmap.mmap(source.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for first in range(0, order.size, _WRITE_CHUNK_ROWS):  # no N-long copies of the locations
                rows = order[first:first + _WRITE_CHUNK_ROWS]
                starts = index.starts[rows]
                ends = starts + index.lengths[rows]
                for lo, hi in _groups(ends - starts + 1, _WRITE_GROUP_BYTES):
                    yield rows[lo:hi], [data[a:b] for a, b in zip(starts[lo:hi].tolist(), ends[lo:hi].tolist())]
        return
    starts = index.starts[order]
    ends = starts + index.lengths[order]
    bounds = batch_bounds(ends - starts, max_pass_bytes, 1 << 62)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        wanted = np.argsort(starts[lo:hi], kind="stable")  # read in file order, emit in output order
        records: list[bytes] = [b""] * int(hi - lo)
        with open_binary(index.path, expect=index.identity) as source:
            for j in wanted.tolist():
                source.seek(int(starts[lo + j]))
                records[j] = source.read(int(ends[lo + j] - starts[lo + j]))
        for a, b in _groups(ends[lo:hi] - starts[lo:hi] + 1, _WRITE_GROUP_BYTES):
            yield order[lo + a:lo + b], records[a:b]


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


def _shortened(text: str, most: int = 40) -> str:
    """``text`` cut to ``most`` characters, the cut said (10**400 cut bare read as 1e39)."""
    return text if len(text) <= most else f"{text[:most]}... ({len(text):,} characters)"
