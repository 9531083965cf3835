"""Arrow-backed inputs: Parquet files and Hugging Face ``datasets`` folders (``save_to_disk``).

Both are tables read a piece at a time: a Parquet row group, or a record batch of the Arrow IPC
stream files a ``save_to_disk`` folder holds (memory-mapped). Nothing reads a whole file into
memory. Each record is a row, known by (file, row); its document comes out of the row's columns
by the same rules as a JSONL record's (``fields.extract``: dotted paths, joined fields,
conversations), and its fingerprint is the same as a JSONL record's with the same text, so the
caches serve a corpus whatever format it arrives in.

The curated output keeps the input's format and schema (``write_reordered``): rows are gathered
in the curated order a bounded piece at a time (each piece reads only the row groups or batches
that hold its rows) and written to a temp file renamed when complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import arrow_json
from . import fields as fields_mod
from .atomic import atomic_path, give_plain_permissions
from .errors import UserError
from .records import BadRecords, DocumentKinds

log = logging.getLogger(__name__)

# Rows gathered per output piece (and at most about this many bytes): bounds the writer's memory.
OUTPUT_PIECE_BYTES = 512 << 20
DATASET_STATE = "state.json"
DATASET_INFO = "dataset_info.json"


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise UserError("Parquet and datasets folders need pyarrow (pip install pyarrow)") from None
    return pyarrow


@dataclass
class _Piece:
    """A row group (Parquet) or a record batch (Arrow stream) of one file: rows [first, first + rows)."""

    file: int
    index: int
    first: int
    rows: int


@dataclass
class ArrowTableSource:
    """One or more Arrow-readable files of one schema (or of schemas one joined schema holds), as one sequence of
    rows."""

    files: list[Path]
    kind: str  # "parquet" or "arrow" (a save_to_disk folder's IPC stream files)
    text_fields: tuple[str, ...]
    folder: Path | None = None  # the save_to_disk folder
    pieces: list[_Piece] = field(default_factory=list)
    fingerprints: np.ndarray | None = None
    row_sizes: np.ndarray | None = None
    kinds: DocumentKinds | None = None  # conversations or plain texts, as the scan found them
    stats: list = field(default_factory=list)  # (size, mtime_ns, inode) per file when indexed
    _opened: dict = field(default_factory=dict, repr=False)  # file -> (memory map, record batches): Arrow streams
    _schema_cache: object = field(default=None, repr=False)
    _columns_of: dict = field(default_factory=dict, repr=False)  # file -> its own column names

    @property
    def name(self) -> Path:
        return self.folder or self.files[0]

    def __len__(self) -> int:
        return int(self.fingerprints.shape[0])

    @property
    def total_bytes(self) -> int:
        return int(self.row_sizes.sum())

    def file_rows(self) -> list[tuple[Path, int, int]]:
        """(file, first row, end row) of each file that holds rows, in row order."""
        spans: dict[int, tuple[int, int]] = {}
        for piece in self.pieces:
            lo, hi = spans.get(piece.file, (piece.first, piece.first))
            spans[piece.file] = (min(lo, piece.first), max(hi, piece.first + piece.rows))
        return [(self.files[f], lo, hi) for f, (lo, hi) in sorted(spans.items()) if hi > lo]

    def where(self, row: int) -> str:
        piece = self.pieces[self._piece_of(np.asarray([row]))[0]]
        return f"{self.files[piece.file]} row {row - self._file_first(piece.file)}"

    # --- reading ------------------------------------------------------------------------------

    def _file_first(self, file: int) -> int:
        return next(p.first for p in self.pieces if p.file == file)

    def _piece_of(self, rows: np.ndarray) -> np.ndarray:
        starts = np.asarray([p.first for p in self.pieces], dtype=np.int64)
        return np.searchsorted(starts, rows, side="right") - 1

    def _read_piece(self, piece: _Piece, columns: list[str] | None = None):
        pa = _pyarrow()
        path = self.files[piece.file]
        try:
            if self.kind == "parquet":
                return without_views(pa.parquet.ParquetFile(path).read_row_group(piece.index, columns=columns))
            if piece.file not in self._opened:  # a stream has no index: map it once, keep its batches (zero-copy)
                mapped = pa.memory_map(str(path))
                self._opened[piece.file] = (mapped, list(pa.ipc.open_stream(mapped)))
            table = pa.Table.from_batches([self._opened[piece.file][1][piece.index]])
            return without_views(table.select(columns) if columns else table)
        except (OSError, pa.ArrowException) as exc:
            raise UserError(f"{path}: cannot read {self._unit(piece)} ({str(exc).splitlines()[0]})") from None

    def _unit(self, piece: _Piece) -> str:
        return f"row group {piece.index}" if self.kind == "parquet" else f"record batch {piece.index}"

    def _top_columns(self, names: list[str]) -> list[str]:
        """The columns (of ``names``, a file's or table's) a document is read from: its fields', and those a
        conversation's template is called with. Per file: where schemas were joined, ``meta.body`` may be a column
        of one file and a member of another's struct ``meta``."""
        names = set(names)
        return sorted(({_column_of(f, names) for f in self.text_fields} | set(fields_mod.TEMPLATE_ARGUMENTS)) & names)

    def _file_columns(self, file: int) -> list[str]:
        if file not in self._columns_of:
            self._columns_of[file] = _file_schema(self.files[file], self.kind, _pyarrow()).names
        return self._columns_of[file]

    def _schema(self):
        if self._schema_cache is None:
            self._schema_cache = _file_schema(self.files[0], self.kind, _pyarrow())
        return self._schema_cache

    def _text_table(self, piece: _Piece):
        """``piece`` with only the columns its documents are read from."""
        return self._read_piece(piece, self._top_columns(self._file_columns(piece.file)) or None)

    def _documents(self, piece: _Piece, local_rows: np.ndarray | None = None) -> list:
        table = self._text_table(piece)
        if local_rows is not None:
            table = table.take(local_rows)
        plain = self._plain_text_column()
        # One string column: no per-row dict (6x faster). (A file whose schema was joined to another's may hold
        # the field as a struct's member instead, ``meta`` -> ``body`` for ``meta.body``: read as a record.)
        if plain is not None and plain in table.column_names and table.column(plain).null_count == 0:
            return table.column(plain).to_pylist()
        records = arrow_json.rows(table)
        first = piece.first
        picked = range(len(records)) if local_rows is None else local_rows.tolist()
        return [fields_mod.extract(record, self.text_fields, lambda i=i: self.where(first + i), self._columns_text)
                for record, i in zip(records, picked)]

    def _bad_rows(self, piece: _Piece) -> list[tuple[int, str]]:
        """(row, error) of each row of ``piece`` whose document cannot be read, as ``_documents`` says it."""
        bad = []
        for i, record in enumerate(arrow_json.rows(self._text_table(piece))):
            try:
                fields_mod.extract(record, self.text_fields, lambda i=i: self.where(piece.first + i), self._columns_text)
            except UserError as exc:
                bad.append((piece.first + i, str(exc)))
        return bad

    def _columns_text(self, record: dict) -> str:
        """A row's keys, for errors: the file's columns (a piece is read with its text columns only)."""
        return ", ".join(self._schema().names[:10]) or "none"

    def _plain_text_column(self) -> str | None:
        """The column name when the document is one top-level string column, else None."""
        pa = _pyarrow()
        if len(self.text_fields) != 1 or self.text_fields[0] not in self._schema().names:
            return None
        kind = self._schema().field(self.text_fields[0]).type
        return self.text_fields[0] if pa.types.is_string(kind) or pa.types.is_large_string(kind) else None

    def iter_documents(self, rows: np.ndarray | None = None, max_batch_bytes: int = 4 << 20,
                       max_batch_rows: int = 1 << 30) -> Iterator[tuple[np.ndarray, list]]:
        """(rows, documents) for ``rows`` (default all), ascending, a piece (or part of one) at a time."""
        rows = np.arange(len(self), dtype=np.int64) if rows is None else np.sort(np.asarray(rows, dtype=np.int64))
        if rows.size == 0:
            return
        owner = self._piece_of(rows)
        for p in np.unique(owner).tolist():
            piece = self.pieces[p]
            mine = rows[owner == p]
            documents = self._documents(piece, mine - piece.first)
            for lo in range(0, mine.size, max_batch_rows):
                yield mine[lo: lo + max_batch_rows], documents[lo: lo + max_batch_rows]

    def field_values(self, name: str) -> list:
        """The value at dotted path ``name`` of every row (a sentinel where absent), in row order."""
        top = _column_of(name, set(self._schema().names))
        if top not in self._schema().names:
            return [fields_mod.MISSING] * len(self)
        values: list = []
        for piece in self.pieces:
            for record in arrow_json.rows(self._read_piece(piece, [top])):
                values.append(fields_mod.lookup(record, name))
        return values

    # --- integrity ----------------------------------------------------------------------------

    def check_unchanged(self) -> None:
        for path, stat in zip(self.files, self.stats):
            try:
                now = path.stat()
            except OSError:
                now = None
            if now is None or (now.st_size, now.st_mtime_ns, now.st_ino) != stat:
                raise UserError(f"{path} changed while this run was going (it was indexed at the start); "
                                "nothing was written: run again on the final file")

    # --- writing ------------------------------------------------------------------------------

    def write_reordered(self, order: np.ndarray, output: Path, output_kind: str | None = None) -> int:
        """Rows in ``order`` to ``output`` (a Parquet file, or a save_to_disk folder); returns bytes written."""
        order = np.asarray(order, dtype=np.int64)
        if order.shape[0] != len(self) or not np.array_equal(np.sort(order), np.arange(len(self))):
            raise ValueError("order must be a permutation of the record positions")
        return self.write_rows(order, output, output_kind)

    def write_rows(self, rows: np.ndarray, output: Path, output_kind: str | None = None) -> int:
        """Rows ``rows`` (in that order; any part of the rows, e.g. a shard) to ``output``."""
        self.check_unchanged()
        rows = np.asarray(rows, dtype=np.int64)
        kind = output_kind or self.kind
        if kind == "parquet":
            return self._write_parquet(rows, Path(output))
        if kind == "arrow":
            return self._write_dataset_folder(rows, Path(output))
        raise ValueError(f"cannot write {kind} from a {self.kind} input")

    def record_keys(self, row: int) -> str:
        return ", ".join(self._schema().names[:10]) or "none"

    def ordered_tables(self, rows: np.ndarray) -> Iterator:
        """Tables of ``rows`` in that order, a bounded piece at a time, each row checked against its fingerprint."""
        self.check_unchanged()
        return self._ordered_pieces(np.asarray(rows, dtype=np.int64))

    def _ordered_pieces(self, order: np.ndarray) -> Iterator:
        """Tables of rows in ``order``, a bounded piece at a time; each row checked against its fingerprint."""
        pa = _pyarrow()
        if order.size == 0:
            return
        bounds = [0]
        sizes = self.row_sizes[order]
        total = 0
        for i, size in enumerate(sizes.tolist()):
            if total + size > OUTPUT_PIECE_BYTES and i > bounds[-1]:
                bounds.append(i)
                total = 0
            total += size
        bounds.append(order.size)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            wanted = order[lo:hi]
            owner = self._piece_of(wanted)
            parts, positions = [], []
            for p in np.unique(owner).tolist():
                piece = self.pieces[p]
                at = np.flatnonzero(owner == p)
                table = self._read_piece(piece).take(wanted[at] - piece.first)
                self._verify(table, wanted[at])
                parts.append(table)
                positions.append(at)
            # each file's part in the joined schema first (a dictionary-encoded column beside a plain one: no
            # promotion joins those)
            schema = self._schema()
            gathered = pa.concat_tables([_conformed(part, schema) for part in parts])
            yield gathered.take(np.argsort(np.concatenate(positions), kind="stable"))

    def _verify(self, table, rows: np.ndarray) -> None:
        from .records import text_fingerprint

        for record, row in zip(arrow_json.rows(table.select(self._top_columns(table.column_names))), rows.tolist()):
            value = fields_mod.extract(record, self.text_fields, lambda row=row: self.where(row), self._columns_text)
            if text_fingerprint(fields_mod.fingerprint_text(value)) != int(self.fingerprints[row]):
                raise UserError(f"{self.where(row)} changed while this run was going; nothing was written: run "
                                "again on the final data")

    def _write_parquet(self, order: np.ndarray, output: Path) -> int:
        pa = _pyarrow()
        with atomic_path(output) as tmp:
            writer = None
            for table in self._ordered_pieces(order):
                if writer is None:
                    writer = pa.parquet.ParquetWriter(tmp, table.schema)
                writer.write_table(table)
            if writer is None:  # no rows (an empty shard): the schema alone
                writer = pa.parquet.ParquetWriter(tmp, self._schema())
            writer.close()
        return output.stat().st_size

    def _write_dataset_folder(self, order: np.ndarray, output: Path) -> int:
        """A folder ``datasets.load_from_disk`` opens: one Arrow stream file, the input's info, a new state."""
        pa = _pyarrow()
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent))
        data_name = "data-00000-of-00001.arrow"
        try:
            writer = None
            with pa.OSFile(str(staging / data_name), "wb") as sink:
                for table in self._ordered_pieces(order):
                    if writer is None:
                        writer = pa.ipc.new_stream(sink, table.schema)
                    writer.write_table(table)
                if writer is None:
                    writer = pa.ipc.new_stream(sink, self._schema())
                writer.close()
            if self.folder is not None and (self.folder / DATASET_INFO).is_file():
                shutil.copyfile(self.folder / DATASET_INFO, staging / DATASET_INFO)
            state = {"_data_files": [{"filename": data_name}], "_fingerprint": os.urandom(8).hex(),
                     "_format_columns": None, "_format_kwargs": {}, "_format_type": None,
                     "_output_all_columns": False, "_split": None}
            (staging / DATASET_STATE).write_text(json.dumps(state, indent=2))
            for child in [staging, *staging.iterdir()]:
                give_plain_permissions(child) if child.is_file() else os.chmod(child, 0o755)
            replace_folder(staging, output)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return sum(p.stat().st_size for p in output.iterdir())


def replace_folder(staging: Path, output: Path) -> None:
    """Put ``staging`` at ``output``; an earlier folder there is moved aside first, then removed."""
    old = None
    if output.exists():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.replace(output, old)
    os.replace(staging, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)




# --- opening and indexing -------------------------------------------------------------------------


def is_dataset_folder(path: Path) -> bool:
    return path.is_dir() and (path / DATASET_STATE).is_file()


def dataset_folder_files(folder: Path) -> list[Path]:
    """The Arrow files of a ``save_to_disk`` folder, in order; a DatasetDict folder is refused with its splits."""
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits", [])
        raise UserError(f"--input {folder} holds several splits ({', '.join(splits)}): pass one, e.g. "
                        f"--input {folder / (splits[0] if splits else 'train')}")
    try:
        state = json.loads((folder / DATASET_STATE).read_text())
        names = [entry["filename"] for entry in state["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"--input {folder}: not a readable datasets folder ({DATASET_STATE}: {exc})") from None
    files = [folder / name for name in names]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise UserError(f"--input {folder}: {DATASET_STATE} lists {', '.join(missing)}, which is missing")
    return files


def schema_difference(first, other) -> str:
    """The first way ``other`` differs from ``first``, in words: a column one lacks, another type, another order."""
    for column in first:
        if column.name not in other.names:
            return f"no column '{column.name}'"
        found = next(f for f in other if f.name == column.name)
        if not found.type.equals(column.type):
            return f"'{column.name}' is {found.type}, not {column.type}"
    extra = [name for name in other.names if name not in first.names]
    if extra:
        return f"a column '{extra[0]}' the first lacks"
    if other.names != first.names:
        return f"the columns in another order: {', '.join(other.names[:8])}"
    return "the same columns, other metadata or nullability"


def open_arrow_source(files: list[Path], kind: str, text_fields: tuple[str, ...], folder: Path | None = None,
                      progress=None) -> ArrowTableSource:
    """Index ``files``: their pieces, and each row's fingerprint and size (one streaming pass)."""
    pa = _pyarrow()
    source = ArrowTableSource(list(files), kind, tuple(text_fields), folder)
    sizes: list[int] = []
    first = 0
    schema = None
    unsigned: dict[tuple[str, ...], list[Path]] = {}  # the files holding unsigned 64-bit integers at each path
    largest: dict = {}  # their largest values there, as read (``_unsigned_made_signed``)
    rowless: list[Path] = []
    for number, path in enumerate(source.files):
        stat = path.stat()
        source.stats.append((stat.st_size, stat.st_mtime_ns, stat.st_ino))
        before = first
        for index, rows in enumerate(_rows_of_pieces(path, kind, pa)):
            source.pieces.append(_Piece(number, index, first, rows))
            first += rows
        if first == before and (schema is not None or number < len(source.files) - 1):
            # A file of no rows (an empty part a job wrote, often with columns of no type) adds nothing to read:
            # its columns neither join the others' nor block them.
            rowless.append(path)
            continue
        file_schema = _file_schema(path, kind, pa)
        twice = sorted({name for name in file_schema.names if file_schema.names.count(name) > 1})
        if twice:
            named = f"the column '{twice[0]}'" if len(twice) == 1 else f"{len(twice)} columns ('{twice[0]}' ...)"
            raise UserError(f"--input {path}: holds {named} twice: a record cannot hold a field twice; give each "
                            "column its own name")
        inner = _inner_field_twice(file_schema, pa)
        if inner:
            raise UserError(f"--input {path}: its column '{inner[0]}' holds the field '{inner[1]}' twice: a record "
                            "cannot hold a field twice; give each field its own name")
        for steps in _unsigned_paths(file_schema, pa):
            unsigned.setdefault(steps, []).append(path)
        missing = [f for f in text_fields if f.split(".")[0] not in file_schema.names and f not in file_schema.names]
        if missing:
            raise UserError(f"--input {path}: no column '{missing[0]}' (columns: "
                            f"{', '.join(file_schema.names[:10])}); choose the text field with --text-field"
                            + _conversation_hint(file_schema, pa))
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema):
            # Files that differ only where one schema holds the other (a column or a message key some files
            # lack, a narrower number type) are read as one: rows are written with the joined schema, nulls where
            # their file had nothing. Others (a string where the first has a number) cannot be one table.
            joined = _joined(schema, file_schema, pa)
            lossy = None if joined is None else (_lossy_widening(schema, joined, pa)
                                                 or _lossy_widening(file_schema, joined, pa)
                                                 or _unsigned_made_signed(unsigned, joined, kind, pa, largest))
            if joined is None or lossy:
                difference = lossy or schema_difference(schema, file_schema)
                raise UserError(f"--input {path}: its columns differ from {source.files[0]}'s "
                                f"({difference}); give files of one schema") from None
            schema = joined
    source._schema_cache = schema
    if rowless:
        log.info("%d input file(s) hold no rows (%s%s): their columns are not compared with the others'", len(rowless),
                 rowless[0], f" ... {rowless[-1].name}" if len(rowless) > 1 else "")
    digests = bytearray()
    kinds = DocumentKinds()
    if progress is not None:
        progress.set_total(first)
    bad: list[tuple[int, str]] = []  # (row, error) of the rows whose document cannot be read, in one file
    bad_file = -1
    for piece in source.pieces:
        if bad and piece.file != bad_file:
            break  # one file's bad rows are counted, as for JSONL
        documents = None
        if not bad:
            try:
                documents = source._documents(piece)
            except UserError:
                bad_file = piece.file
        if documents is None:  # past a bad row the rest of its file is only read, to count the bad ones
            bad += source._bad_rows(piece)
            if progress is not None:
                progress.update(piece.rows)
            continue
        for document in documents:
            kinds.saw(len(sizes), document)
            # Each text encoded once, for its fingerprint (records.text_fingerprint's bytes) and its size.
            encoded = fields_mod.fingerprint_text(document).encode("utf-8", "surrogatepass")
            digests += hashlib.blake2b(encoded, digest_size=8).digest()
            sizes.append(len(encoded) + 16)
        if progress is not None:
            progress.update(piece.rows)
    if bad:
        raise BadRecords(bad[0][1], len(bad), source.where(bad[-1][0]))
    if not sizes:
        raise UserError(f"--input {source.name}: no rows")
    source.kinds = kinds
    source.fingerprints = np.frombuffer(bytes(digests), dtype="<u8").astype(np.uint64)
    source.row_sizes = np.asarray(sizes, dtype=np.int64)
    return source


def _lossy_widening(schema, joined, pa) -> str | None:
    """Where joining made a column's integers floating point (large integers would change: 2**60 + 1 has no
    float64), said; else None."""
    def widened(old, new) -> bool:
        if pa.types.is_integer(old) and pa.types.is_floating(new):
            return True
        if pa.types.is_struct(old) and pa.types.is_struct(new):
            inner = {new.field(i).name: new.field(i).type for i in range(new.num_fields)}
            return any(widened(old.field(i).type, inner[old.field(i).name]) for i in range(old.num_fields)
                       if old.field(i).name in inner)
        if (pa.types.is_list(old) or pa.types.is_large_list(old)) and (pa.types.is_list(new)
                                                                        or pa.types.is_large_list(new)):
            return widened(old.value_type, new.value_type)
        return False

    for column in schema:
        if widened(column.type, joined.field(column.name).type):
            return f"'{column.name}' holds integers in one file and floating point numbers in another"
    return None


def _inner_field_twice(schema, pa) -> tuple[str, str] | None:
    """(column, field) of the first struct inside a column that holds a field name twice (no record can), or None."""
    def walk(kind):
        names = [step for step, _ in arrow_json.type_children(kind) if pa.types.is_struct(kind)]
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice is not None:
            return twice
        return next((found for _, child in arrow_json.type_children(kind) if (found := walk(child)) is not None), None)

    return next(((column.name, found) for column in schema if (found := walk(column.type)) is not None), None)


def _unsigned_paths(schema, pa) -> list[tuple[str, ...]]:
    """The paths (column, then fields and "[]" for list items) at which ``schema`` holds unsigned 64-bit integers."""
    found = []

    def walk(kind, steps):
        if kind == pa.uint64():
            found.append(steps)
        for step, child in arrow_json.type_children(kind):
            walk(child, (*steps, step))

    for column in schema:
        walk(column.type, (column.name,))
    return found


def _type_at(schema, steps: tuple[str, ...], pa):
    """The type at a path of ``schema`` (see ``_unsigned_paths``), or None where it has none."""
    if steps[0] not in schema.names:
        return None
    kind = schema.field(steps[0]).type
    for step in steps[1:]:
        kind = dict(arrow_json.type_children(kind)).get(step)
        if kind is None:
            return None
    return kind


def _unsigned_made_signed(unsigned: dict[tuple[str, ...], list[Path]], joined, kind: str, pa,
                          largest: dict) -> str | None:
    """Where joining made unsigned 64-bit integers signed (another file holds them signed) and a file holds a value
    past 2**63 - 1 there, which no signed integer holds, said; else None. Inside structs and lists too: rows were
    joined when they were written, after the whole run. ``largest``: each (file, path)'s largest value once read (a
    file is joined with every later one: read again each time, a thousand shards read the first a thousand times)."""
    for steps, paths in unsigned.items():
        now = _type_at(joined, steps, pa)
        if now is not None and pa.types.is_signed_integer(now):
            for path in paths:
                if (path, steps) not in largest:
                    largest[path, steps] = _largest_at(path, kind, steps, pa)
                if largest[path, steps] >= 1 << 63:
                    named = ".".join(steps).replace(".[]", "[]")
                    return (f"'{named}' holds unsigned 64-bit integers past 2**63 - 1 in {path.name} and signed "
                            "integers in another: no one integer type holds both")
    return None


def _largest_at(path: Path, kind: str, steps: tuple[str, ...], pa) -> int:
    """The largest integer at a path of ``path``'s rows (0 for none)."""
    import pyarrow.compute as pc

    if kind == "parquet":
        values = pa.parquet.read_table(path, columns=[steps[0]]).column(steps[0])
    else:
        with pa.memory_map(str(path)) as mapped:
            values = pa.ipc.open_stream(mapped).read_all().column(steps[0])
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    for step in steps[1:]:
        values = values.flatten() if step == arrow_json.ITEMS else pc.struct_field(values, [values.type.get_field_index(step)])
    largest = pc.max(values).as_py() if len(values) else None
    return 0 if largest is None else int(largest)


def _column_of(field: str, names: set[str]) -> str:
    """The column a dotted field path is read from: a column named with the dot itself (``meta.body``, as a JSON key
    holding the dot wins), else the path's first part (a struct)."""
    return field if field in names else field.split(".")[0]


def _joined(schema, file_schema, pa):
    """One schema for two files' (Arrow's permissive unification; None where there is none). Where one file's
    column is dictionary-encoded and the other's plain, the values' type: the same values, read alike."""
    for pair in ((schema, file_schema), (_decoded_schema(schema, pa), _decoded_schema(file_schema, pa))):
        try:
            return pa.unify_schemas(list(pair), promote_options="permissive")
        except (pa.ArrowException, TypeError, ValueError):
            continue
    return None


def _conversation_hint(schema, pa) -> str:
    """Where a column holds conversations (a list of structs with a role), how to read it; else ""."""
    for column in schema:
        kind = column.type
        if (pa.types.is_list(kind) or pa.types.is_large_list(kind)) and pa.types.is_struct(kind.value_type) and \
                any(kind.value_type.field(i).name in ("role", "from") for i in range(kind.value_type.num_fields)):
            return f" (its '{column.name}' holds conversations, which --text-field {column.name} reads)"
    return ""


def _conformed(table, schema):
    """``table`` with exactly ``schema``'s columns, in its order and types (a column it lacks: nulls), so pieces read
    from files of different but joinable schemas are written as one."""
    if table.schema.equals(schema):
        return table
    pa = _pyarrow()
    for name in schema.names:
        if name not in table.column_names:
            table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
    return table.select(schema.names).cast(schema)


def _file_schema(path: Path, kind: str, pa):
    """The columns of ``path`` as this tool reads them (``without_views``)."""
    if kind == "parquet":
        return _viewless_schema(pa.parquet.ParquetFile(path).schema_arrow, pa)
    with pa.memory_map(str(path)) as source:
        return _viewless_schema(pa.ipc.open_stream(source).schema, pa)


def without_views(table):
    """``table`` with its string and binary views as large strings and binaries: Arrow has no kernel to take rows
    of a view (a Parquet file of ``string_view`` failed after the whole run, as it was written)."""
    pa = _pyarrow()
    plain = _viewless_schema(table.schema, pa)
    return table if plain is table.schema else table.cast(plain)


def _viewless_schema(schema, pa):
    """``schema`` (itself where it has no view) with every string or binary view, nested ones too, as a large string
    or binary."""
    def plain(kind):
        if pa.types.is_string_view(kind):
            return pa.large_string()
        if pa.types.is_binary_view(kind):
            return pa.large_binary()
        return kind

    return _with_leaves(schema, pa, plain)


def _decoded_schema(schema, pa):
    """``schema`` with every dictionary-encoded type, nested ones too, as its values' type (how the values read, a
    file written from pandas categoricals beside one of plain strings). A dictionary's values are a plain type in
    what Parquet and pandas write, so a decoded leaf is one."""
    return _with_leaves(schema, pa, lambda kind: kind.value_type if pa.types.is_dictionary(kind) else kind)


def _with_leaves(schema, pa, leaf):
    """``schema`` (itself where nothing changes) with ``leaf`` applied to every type that holds no other (inside
    structs, maps and lists too)."""
    def mapped(kind):
        if pa.types.is_struct(kind):
            return pa.struct([kind.field(i).with_type(mapped(kind.field(i).type)) for i in range(kind.num_fields)])
        if pa.types.is_map(kind):
            return pa.map_(kind.key_field.with_type(mapped(kind.key_type)), kind.item_field.with_type(mapped(kind.item_type)),
                           kind.keys_sorted)
        if pa.types.is_large_list(kind):
            return pa.large_list(kind.value_field.with_type(mapped(kind.value_type)))
        if pa.types.is_fixed_size_list(kind):
            return pa.list_(kind.value_field.with_type(mapped(kind.value_type)), kind.list_size)
        if pa.types.is_list(kind):
            return pa.list_(kind.value_field.with_type(mapped(kind.value_type)))
        return leaf(kind)

    fields = [field.with_type(mapped(field.type)) for field in schema]
    if all(new.type.equals(old.type) for new, old in zip(fields, schema)):
        return schema
    return pa.schema(fields, metadata=schema.metadata)


def _rows_of_pieces(path: Path, kind: str, pa) -> list[int]:
    """The rows of each row group or record batch of ``path``."""
    try:
        if kind == "parquet":
            meta = pa.parquet.ParquetFile(path).metadata
            return [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        with pa.memory_map(str(path)) as source:
            return [b.num_rows for b in pa.ipc.open_stream(source)]
    except (OSError, pa.ArrowException) as exc:
        what = "a Parquet file" if kind == "parquet" else "an Arrow stream file"
        raise UserError(f"{path}: not {what} that can be read ({str(exc).splitlines()[0]})") from None
