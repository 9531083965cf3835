"""The curated data: the records in the curated order, in the input's format or another, in one
file or in ``--output-shards N`` consecutive slices of the order.

- JSONL in, JSONL out: every record byte for byte (``records``); Parquet or a datasets folder in,
  the same format out, same schema (``arrow_sources``).
- ``--output-format`` converts: Parquet/datasets rows to JSONL (one JSON object per row), JSONL
  records to Parquet (columns inferred from all records, one schema for every shard of the set; objects whose
  keys differ from record to record held as JSON text, as datasets holds them: ``arrow_json``).
- ``--output-shards N`` names the files ``B-00000-of-0000N.<ext>`` (the naming of Hugging Face
  datasets and datatrove); shard i holds the i-th of N consecutive slices of the order, of
  near-equal record counts. ``write_shard`` writes one of them from its slice alone, so the
  shards can be written by different processes.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import numpy as np

from . import arrow_json, records
from .atomic import atomic_path, replaced_together
from .errors import UserError
from .sources import PARQUET_SUFFIX, record_bytes

log = logging.getLogger(__name__)

OUTPUT_FORMATS = ("jsonl", "parquet")
# File suffixes with digits in them (the others are letters alone): --output refuses them as it refuses .csv.
_FILE_SUFFIXES_WITH_DIGITS = (".bz2", ".mp4", ".mp3", ".h5", ".hdf5", ".7z", ".m4a", ".mp2", ".jp2", ".x3d")
# Records converted per Parquet row group / per JSON piece: bounds the converter's memory.
CONVERT_PIECE_BYTES = 256 << 20


def output_kind(source_kind: str, output: Path, requested: str | None) -> str:
    """The format written: --output-format if given, else the output's suffix, else the input's."""
    named = "parquet" if output.name.endswith(PARQUET_SUFFIX) else (
        "jsonl" if _jsonl_name(output.name) else None)
    if named is None:
        # Any other file suffix names something else (a CSV, a model's .safetensors or chat template, a cache's
        # .npy): JSONL written there would be mistaken for it, or replace it. No suffix, or a dotted part that is
        # no file suffix (curated.v2, data-2024.11.27): the input's format (a datasets folder for a datasets folder).
        lowered = output.name.lower()
        if lowered.endswith(PARQUET_SUFFIX) or _jsonl_name(lowered):
            from .outputs import data_suffix_length

            cut = len(output.name) - data_suffix_length(output.name)
            named_so = output.name[:cut] + output.name[cut:].lower()  # the name kept as typed, its suffix lowered
            raise UserError(f"--output {output}: write its suffix in lower case ({named_so}), as the files "
                            "beside it and the shards are named")
        base = lowered
        for compressed in records.COMPRESSED_SUFFIXES:
            base = base.removesuffix(compressed)
        if base.endswith(PARQUET_SUFFIX):
            raise UserError(f"--output {output}: Parquet compresses inside the file; name it .parquet")
        other = Path(base).suffix
        if other and (other[1:].isalpha() or other in _FILE_SUFFIXES_WITH_DIGITS):
            raise UserError(f"--output {output}: {other} is not a format this writes; name it .jsonl (or .json, "
                            ".ndjson, each optionally .gz or .zst) or .parquet")
    if requested is not None:
        if requested not in OUTPUT_FORMATS:
            raise UserError(f"--output-format {requested}: choose one of {', '.join(OUTPUT_FORMATS)}")
        if named is not None and named != requested:
            raise UserError(f"--output {output}: its name says {named}, but --output-format is {requested}; "
                            "make them agree")
        return requested
    return named or source_kind


def _jsonl_name(name: str) -> bool:
    """An output named as JSONL, in lower case (the files beside it and the shards are named so; an input's
    suffix may be in any case)."""
    from .sources import JSONL_SUFFIXES

    return any(name.endswith(suffix + compressed) for suffix in JSONL_SUFFIXES
               for compressed in ("", *records.COMPRESSED_SUFFIXES))


def _stem_and_suffix(output: Path) -> tuple[Path, str]:
    """``B.ext`` as (``B``, ``.ext``): where shard numbers go in its name."""
    from .outputs import output_stem

    stem = output_stem(output)
    return stem, output.name[len(stem.name):]


def data_suffix(output: Path) -> str:
    """The suffix every file of ``output``'s set ends with (``.jsonl.zst``), shard numbers before it."""
    return _stem_and_suffix(output)[1]


def shard_paths(output: Path, shards: int) -> list[Path]:
    """``B.ext`` as ``shards`` files ``B-00000-of-0000N.ext`` (itself when there is one)."""
    if shards == 1:
        return [output]
    stem, suffix = _stem_and_suffix(output)
    return [stem.with_name(f"{stem.name}-{i:05d}-of-{shards:05d}{suffix}") for i in range(shards)]


def other_shard_sets(output: Path, shards: int) -> list[Path]:
    """Files beside ``output`` that an earlier run with another shard count wrote for it (``B-0000i-of-0000M.ext``
    for M other than ``shards``, and ``B.ext`` itself when this run writes shards): the same records again."""
    stem, suffix = _stem_and_suffix(output)
    pattern = re.compile(rf"{re.escape(stem.name)}-\d{{5}}-of-\d{{5}}{re.escape(suffix)}")
    current = set(shard_paths(output, shards))
    found = [path for path in sorted(stem.parent.iterdir()) if pattern.fullmatch(path.name) and path not in current]
    return found + ([output] if shards > 1 and output.is_file() else [])


def shard_names_with_temps(output: Path) -> list[Path]:
    """The shard names of ``output``, of any count and any data suffix (a killed run may have written .jsonl.zst
    where this one writes .jsonl), that temp or staged files beside it are named after: ``atomic.remove_stale_temps``
    beside those names removes a dead run's."""
    stem, _ = _stem_and_suffix(output)
    pattern = re.compile(rf"\.({re.escape(stem.name)}-\d{{5}}-of-\d{{5}}\.[a-z]+(?:\.(?:gz|zst))?)\.")
    try:
        names = {found.group(1) for entry in os.scandir(stem.parent) if (found := pattern.match(entry.name))}
    except OSError:
        return []
    return [stem.with_name(name) for name in sorted(names)]


def shard_slices(n: int, shards: int) -> list[tuple[int, int]]:
    """Consecutive (lo, hi) positions of the order, one per shard, near-equal in record count."""
    bounds = np.linspace(0, n, shards + 1).round().astype(np.int64)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def write_curated(source, order: np.ndarray, output: Path, kind: str, shards: int = 1,
                  schema=None, before_commit=None) -> list[tuple[Path, int]]:
    """The records in ``order`` (a permutation of them) as ``kind``: (path, bytes) per file written. ``schema``:
    JSONL converted to Parquet, the records' columns when already inferred (``parquet_schema``).

    The files are written under staged names and renamed together at the end (``before_commit()`` first), so a run
    stopped part-way leaves the earlier files as they were: no new shards beside an earlier set, no set half of one
    order and half of another."""
    order = np.asarray(order, dtype=np.int64)
    if order.shape[0] != len(source) or not np.array_equal(np.sort(order), np.arange(len(source))):
        raise ValueError("order must be a permutation of the record positions")
    paths = shard_paths(output, shards)
    if schema is None and converts_to_parquet(source, kind):
        # Inferred over the input order, as curate infers it: the columns in the order the input first has them.
        schema = parquet_schema(source, np.arange(len(source)))
    slices = shard_slices(order.size, shards)
    if kind == "arrow":  # one datasets folder, which its writer swaps in whole
        if before_commit is not None:
            before_commit()
        return [(path, write_shard(source, order[lo:hi], path, kind, schema)) for path, (lo, hi) in zip(paths, slices)]
    with replaced_together(paths, data_suffix(output), before_commit) as staged:
        sizes = [write_shard(source, order[lo:hi], target, kind, schema, shown=path)
                 for target, path, (lo, hi) in zip(staged, paths, slices)]
    return list(zip(paths, sizes))


def converts_to_parquet(source, kind: str) -> bool:
    """JSONL records written as Parquet: the columns are inferred from the records (``parquet_schema``)."""
    return kind == "parquet" and source.kind == "jsonl"


def write_shard(source, rows: np.ndarray, path: Path, kind: str, schema=None, shown: Path | None = None) -> int:
    """Records ``rows`` (a slice of the curated order), in that order, to ``path`` as ``kind``; bytes written.
    ``schema``: JSONL converted to Parquet takes this one (every shard of a set must have the same columns
    to be read back as one input; see ``parquet_schema``), else one inferred from ``rows``. ``shown``: the name
    the log gives the file (``path`` may be a staged one)."""
    if kind == source.kind or (kind == "parquet" and source.kind == "arrow"):
        if source.kind == "jsonl":
            return source.write_rows(rows, path)
        return source.write_rows(rows, path, kind)
    if kind == "jsonl":
        return _arrow_to_jsonl(source, rows, path, shown or path)
    if kind == "parquet":
        return _jsonl_to_parquet(source, rows, path, schema)
    raise ValueError(f"cannot write {kind} from a {source.kind} input")


def _json_value(value):
    """What JSON cannot hold as it is (dates, decimals, bytes): its text."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)


def _arrow_to_jsonl(source, rows: np.ndarray, path: Path, shown: Path) -> int:
    written, said, maps = 0, _AsText(), []
    with records.open_output(path) as sink:
        for table in source.ordered_tables(rows):
            maps = maps or map_columns(table.schema)
            lines = [said.line(row) for row in arrow_json.rows(table)]
            data = ("\n".join(lines) + "\n").encode("utf-8", "surrogatepass")
            sink.write(data)
            written += len(data)
    if said.non_finite:
        log.warning("%s: %d record(s) hold NaN or Infinity, which JSON has no word for: written as Python's json writes "
                    "them (NaN, Infinity), which it and this tool read back, but strict JSON readers (pyarrow.json, "
                    "datasets' json loader) refuse", shown, said.non_finite)
    if said.binary:
        log.warning("%s: %d record(s) hold binary values, which JSON has no type for: written as text, bytes that are "
                    "not UTF-8 escaped (\\xff), so they read back as strings, not as the bytes", shown, said.binary)
    if maps:
        log.warning("%s: %s %s Arrow map%s, which JSON has no type for: written as lists of [key, value] pairs (keys "
                    "may repeat and need not be text), so they read back as lists, not as maps", shown,
                    ", ".join(maps), "is an" if len(maps) == 1 else "are", "" if len(maps) == 1 else "s")
    return written


def map_columns(schema) -> list[str]:
    """The dotted names of the map-typed fields of an Arrow schema, nested ones too (a map inside a list is
    named by the list's field)."""
    import pyarrow as pa

    found = []

    def visit(name, kind):
        if pa.types.is_map(kind):
            found.append(name)
        for step, child in arrow_json.type_children(kind):
            visit(name if step == arrow_json.ITEMS else f"{name}.{step}", child)

    for field in schema:
        visit(field.name, field.type)
    return found


class _AsText:
    """Arrow rows as JSON lines, counting the rows whose values JSON cannot hold as they are (said after the file)."""

    def __init__(self):
        self.non_finite = self.binary = 0
        self._binary_in_row = False

    def line(self, row: dict) -> str:
        self._binary_in_row = False
        try:
            text = json.dumps(row, ensure_ascii=False, default=self._value, allow_nan=False)
        except ValueError:
            self.non_finite += 1
            self._binary_in_row = False  # counted again by the second dump
            text = json.dumps(row, ensure_ascii=False, default=self._value)
        self.binary += self._binary_in_row
        return text

    def _value(self, value):
        self._binary_in_row |= isinstance(value, bytes)
        return _json_value(value)


def _jsonl_pieces(source, rows: np.ndarray):
    bounds = records.batch_bounds(record_bytes(source, rows), CONVERT_PIECE_BYTES, 1 << 62)
    for lo, hi in zip(bounds[:-1], bounds[1:]) if rows.size else ():
        yield [json.loads(raw) for raw in source.read_raw(rows[lo:hi])]


def parquet_schema(source, rows: np.ndarray):
    """One Parquet schema for JSONL records ``rows``: ``inferred_columns``, finished and checked writable."""
    return finished_schema(source, *inferred_columns(source, rows))


def inferred_columns(source, rows: np.ndarray):
    """(schema, object keys) of JSONL records ``rows``: each piece's inferred columns, unified in row order, and
    the keys of the objects at each path (``arrow_json.note_object_keys``). Parts of the records (a torchrun
    rank's each) are put together with ``unify_parquet_schemas`` and ``arrow_json.merge_object_keys``."""
    source.check_unchanged()
    schemas, parts = [], []
    try:
        for piece in _jsonl_pieces(source, rows):
            part: dict = {}
            arrow_json.note_object_keys(piece, part)
            # What this piece holds as JSON text is typed as the text (a value of two kinds there types as none).
            unsigned = {name for name, kinds in own_field_kinds(part).items() if arrow_json.UNSIGNED_INTEGER in kinds}
            schemas.append(_piece_schema(arrow_json.encoded(piece, arrow_json.uneven_object_paths(part)), unsigned))
            parts.append(part)
        object_keys = arrow_json.merge_object_keys(parts)
        # A path held as JSON text in one piece, or only once the pieces are put together, is so in every piece.
        schema = _unified([arrow_json.with_json_at(piece_schema, arrow_json.uneven_object_paths(object_keys))
                           for piece_schema in schemas])
        both = signed_and_unsigned(object_keys)
        if both:
            raise ValueError(f"no Parquet integer holds the values of {', '.join(both)}")
    except _conversion_errors() as exc:
        detail = _first_unencodable(source, rows) if isinstance(exc, UnicodeEncodeError) else _first_clash(source, rows)
        raise _not_one_table(source, exc, detail) from None
    return schema, object_keys


def finished_schema(source, schema, object_keys: dict, say: bool = True):
    """The records' schema, objects whose keys differ held as JSON text (said), checked writable (not a struct of
    no fields, from records holding ``{}`` only). ``say``: whether to log what it says (under torchrun, rank 0
    alone does)."""
    uneven = arrow_json.uneven_object_paths(object_keys)
    if uneven:
        schema = arrow_json.with_json_at(schema, uneven)
        named = [".".join(path).replace(".[]", "[]") for path in arrow_json.json_paths(schema)]
        (log.info if say else log.debug)(
                 "Parquet: the values at %s differ from record to record (in their keys, their order or their kind; "
                 "or are integers past 2**63 - 1): "
                 "held as JSON text (Arrow's JSON type, which datasets reads back as the values), not as one struct of "
                 "every key, which would give each object the keys it lacks as null",
                 ", ".join(named[:5]) + (" ..." if len(named) > 5 else ""))
    mixed = [name for name, kinds in own_field_kinds(object_keys).items()
             if arrow_json.FRACTION in kinds and kinds & _INTEGER_KINDS]
    if mixed and say:
        log.warning("Parquet: %s hold%s integers in some records and fractions in others: the column is of doubles, "
                    "so its integers read back as 1.0 where the JSONL had 1 (inside a field such values are held as "
                    "JSON text, and read back as written)", ", ".join(f"'{name}'" for name in mixed[:5])
                    + (" ..." if len(mixed) > 5 else ""), "s" if len(mixed) == 1 else "")
    return writable_schema(source, integer_columns(schema, object_keys))


# What a record's own number field holds as ``arrow_json.note_object_keys`` notes it, integers of every size.
_INTEGER_KINDS = frozenset({arrow_json.INTEGER, arrow_json.NEGATIVE_INTEGER, arrow_json.UNSIGNED_INTEGER})


def own_field_kinds(object_keys: dict) -> dict[str, frozenset]:
    """The kinds ``arrow_json.note_object_keys`` noted at each of the records' own fields (their numbers' shapes)."""
    return {path[0]: kinds for path, (_, kinds) in object_keys.items() if len(path) == 1}


def signed_and_unsigned(object_keys: dict) -> list[str]:
    """The record's own fields holding both an integer past 2**63 - 1 and a negative one: no Parquet integer type
    holds both."""
    both = {arrow_json.UNSIGNED_INTEGER, arrow_json.NEGATIVE_INTEGER}
    return sorted(name for name, kinds in own_field_kinds(object_keys).items() if both <= kinds)


def refuse_signed_and_unsigned(source, object_keys: dict, find_clash) -> None:
    """Refuse records (parts typed apart, as torchrun ranks') whose own field holds an integer past 2**63 - 1 and a
    negative one, said with the places ``find_clash(names)`` gives (``unify_parquet_schemas``)."""
    both = signed_and_unsigned(object_keys)
    if both:
        raise _not_one_table(source, ValueError(f"no Parquet integer holds the values of {', '.join(both)}"),
                             find_clash(set(both)))


def integer_columns(schema, object_keys: dict):
    """``schema`` with each integer column of the records' own fields unsigned where it holds an integer past
    2**63 - 1 and signed otherwise (pieces are typed apart, and unsigned where they needed it)."""
    import pyarrow as pa

    unsigned = {name for name, kinds in own_field_kinds(object_keys).items() if arrow_json.UNSIGNED_INTEGER in kinds}
    for i, column in enumerate(schema):
        if column.type in (pa.int64(), pa.uint64()):
            wanted = pa.uint64() if column.name in unsigned else pa.int64()
            if column.type != wanted:
                schema = schema.set(i, column.with_type(wanted))
    return schema


def writable_schema(source, schema):
    """``schema``, if Parquet can hold its columns (not a struct of no fields, from records holding ``{}`` only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    try:
        pq.ParquetWriter(sink, schema).close()
    except _conversion_errors() as exc:
        raise _not_one_table(source, exc) from None
    try:  # what Parquet writes and no reader opens: fields nested past the readers' depth limit (a list of lists ...)
        pq.read_schema(pa.BufferReader(sink.getvalue()))
    except (OSError, *_conversion_errors()) as exc:
        raise _not_one_table(source, exc, f"a Parquet file of these columns could not be read back: "
                                          f"{str(exc).splitlines()[0]}") from None
    return schema


def _piece_schema(piece: list[dict], unsigned: set[str]):
    """The columns of records ``piece``: every field any record has (in order of first appearance), each typed
    from all its values. (``pa.Table.from_pylist`` takes the fields of the first record only and drops the rest.)
    ``unsigned``: the fields holding an integer past 2**63 - 1 (noted while the piece was walked)."""
    import pyarrow as pa

    fields = dict.fromkeys(name for record in piece for name in record)
    values = {name: [record.get(name) for record in piece] for name in fields}
    return pa.Table.from_pydict({name: _unsigned_column(pa, column) if name in unsigned else column
                                 for name, column in values.items()}).schema


def _unsigned_column(pa, values: list):
    """A column holding an integer past 2**63 - 1 as unsigned integers (Arrow would infer signed ones and overflow);
    where it holds anything else (a negative integer, a fraction) the values as they are, for Arrow to type or
    refuse."""
    if all(value is None or type(value) is int for value in values):
        try:
            return pa.array(values, pa.uint64())
        except _conversion_errors():
            pass
    return values


def unify_parquet_schemas(source, schemas: list, find_clash=None):
    """Schemas of consecutive pieces of ``source``'s records as one (fields in order of first appearance).
    ``find_clash(names)``: where they fail, the records that disagree (see ``clash_in``), given the top-level
    fields typed differently in two pieces."""

    try:
        return _unified(schemas)
    except _conversion_errors() as exc:
        detail = None
        if find_clash is not None:
            detail = find_clash(_fields_typed_differently(schemas))
        raise _not_one_table(source, exc, detail) from None


def _fields_typed_differently(schemas: list) -> set[str]:
    types: dict[str, set[str]] = {}
    for schema in schemas:
        for schema_field in schema:
            types.setdefault(schema_field.name, set()).add(str(schema_field.type))
    return {name for name, seen in types.items() if len(seen) > 1}


def _unified(schemas: list):
    import pyarrow as pa

    schemas = [schema for schema in schemas if len(schema)]  # a piece of no records says nothing
    return pa.unify_schemas(schemas, promote_options="permissive") if schemas else pa.schema([])


def _conversion_errors() -> tuple:
    """What pyarrow raises for records it cannot type or write (an integer past 64 bits: OverflowError)."""
    import pyarrow as pa

    return pa.ArrowException, TypeError, ValueError, OverflowError


def _first_unencodable(source, rows: np.ndarray) -> str | None:
    """Where records ``rows`` first hold text UTF-8 cannot encode (a lone surrogate, ``"\\udc00"``, which JSON
    escapes can spell and Parquet's strings cannot hold): the field and the record's place."""
    at = 0
    for piece in _jsonl_pieces(source, rows):
        for record in piece:
            row = int(rows[at])
            at += 1
            path = _unencodable_path(record, "")
            if path is not None:
                return (f"{'a key' if path.endswith(' (a key)') else 'field'} {path.removesuffix(' (a key)')!r} at "
                        f"{source.where(row)} holds a lone surrogate (a \\ud800-\\udfff escape alone), which UTF-8, "
                        "and so Parquet's text, cannot hold")
    return None


def _unencodable_path(value, path: str) -> str | None:
    if isinstance(value, str):
        return None if _encodes(value) else path
    if isinstance(value, list):
        for item in value:
            found = _unencodable_path(item, f"{path}[]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for name, item in value.items():
            inner = f"{path}.{name}" if path else name
            if not _encodes(name):
                return f"{inner} (a key)"
            found = _unencodable_path(item, inner)
            if found is not None:
                return found
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _first_clash(source, rows: np.ndarray) -> str | None:
    """Where records ``rows`` first disagree on a field's JSON type (a number in one, a string in another), said
    with both records' places; read again only when a conversion has failed, to say which record to mend."""
    return clash_in([kinds_at_fields(source, rows, stop_at_clash=True)])


def kinds_at_fields(source, rows: np.ndarray, fields: set[str] | None = None, stop_at_clash: bool = False) -> dict:
    """For each field path of records ``rows`` (of the top-level ``fields`` only, when given), the first row holding
    each JSON kind there and its place: ``{path: {kind: (row, "file:line")}}``, what ``clash_in`` says a clash from.
    ``stop_at_clash``: return after the first record that gives a path a second kind, or holds an integer past 64 bits."""
    found: dict[str, dict[str, tuple[int, str]]] = {}
    at = 0
    for piece in _jsonl_pieces(source, rows):
        for record in piece:
            row = int(rows[at])
            at += 1
            clash = False
            for name, value in record.items():
                if fields is not None and name not in fields:
                    continue
                for path, kind in _json_kinds(value, name):
                    kinds = found.setdefault(path, {})
                    if kind not in kinds:
                        kinds[kind] = (row, source.where(row))
                        clash |= kind == arrow_json.HUGE_INTEGER \
                            or len(set(kinds) - set(_NUMBER_SHAPES + _INTEGER_SIGNS)) > 1 \
                            or set(_NUMBER_SHAPES) <= set(kinds) or set(_INTEGER_SIGNS) <= set(kinds)
            if clash and stop_at_clash:
                return found
    return found


def clash_in(parts: list[dict]) -> str | None:
    """The first record (by row) whose value at a field is of another JSON kind than the field's first value, or an
    integer past 64 bits, said with the places; ``parts``: ``kinds_at_fields`` of parts of the records (a torchrun
    rank's each)."""
    merged: dict[str, dict[str, tuple[int, str]]] = {}
    for part in parts:
        for path, kinds in part.items():
            into = merged.setdefault(path, {})
            for kind, seen in kinds.items():
                if kind not in into or seen[0] < into[kind][0]:
                    into[kind] = seen
    said = []  # (row, what is said), each field's first
    for path, kinds in merged.items():
        if arrow_json.HUGE_INTEGER in kinds:
            row, where = kinds[arrow_json.HUGE_INTEGER]
            said.append((row, f"field {path!r} is {arrow_json.HUGE_INTEGER} at {where}, which Parquet cannot hold"))
        if {arrow_json.UNSIGNED_INTEGER, arrow_json.NEGATIVE_INTEGER} <= set(kinds):
            (row, where), (negative_row, negative_where) = (kinds[arrow_json.UNSIGNED_INTEGER],
                                                            kinds[arrow_json.NEGATIVE_INTEGER])
            said.append((max(row, negative_row), f"field {path!r} holds {arrow_json.UNSIGNED_INTEGER} at {where} and "
                                                 f"{arrow_json.NEGATIVE_INTEGER} at {negative_where}: no Parquet "
                                                 "integer holds both"))
        if set(_NUMBER_SHAPES) <= set(kinds):
            (_, fraction_where), (row, where) = kinds[_FRACTION], kinds[_INEXACT_INTEGER]
            said.append((max(row, kinds[_FRACTION][0]), f"field {path!r} holds {_INEXACT_INTEGER} at {where} and "
                                                        f"{_FRACTION} at {fraction_where}: Parquet would hold both as "
                                                        "doubles, which cannot hold that integer exactly"))
        typed = sorted(((seen, kind) for kind, seen in kinds.items()
                        if kind != arrow_json.HUGE_INTEGER and kind not in _NUMBER_SHAPES + _INTEGER_SIGNS),
                       key=lambda k: k[0][0])
        if len(typed) > 1:
            ((_, first_where), first), ((row, where), other) = typed[:2]
            said.append((row, f"field {path!r} is {other} at {where} but {first} at {first_where}"))
    return min(said, key=lambda candidate: candidate[0])[1] if said else None


# Besides its kind, a number's shape where it matters: a field of fractions and integers is typed as doubles, which
# hold integers exactly only up to 2**53 (Arrow refused 9007199254740993 beside 0.5 naming no field).
_FRACTION, _INEXACT_INTEGER = arrow_json.FRACTION, "an integer past 2**53"
_NUMBER_SHAPES = (_FRACTION, _INEXACT_INTEGER)
# A record's own field of integers is unsigned if one is past 2**63 - 1, and cannot be if another is negative.
_INTEGER_SIGNS = (arrow_json.UNSIGNED_INTEGER, arrow_json.NEGATIVE_INTEGER)


def _json_kinds(value, path: str, own_field: bool = True):
    """(path, kind) of a JSON value and of every value inside it (a list's items at ``path[]``); nulls have none:
    a null fits any column (``arrow_json.json_kind``). A fraction, and an integer a double cannot hold, also give
    their shape (``_NUMBER_SHAPES``); an integer of the record's own field (``own_field``) past 2**63 - 1, or below 0,
    its sign (``_INTEGER_SIGNS``)."""
    kind = arrow_json.json_kind(value)
    if kind is None:
        return
    if kind == arrow_json.UNSIGNED_INTEGER:
        yield path, kind
        if not own_field:  # held as JSON text there, beside anything
            return
        kind = "a number"
    elif own_field and kind == "a number" and isinstance(value, int) and value < 0:
        yield path, arrow_json.NEGATIVE_INTEGER
    yield path, kind
    if isinstance(value, float):
        yield path, _FRACTION
    elif kind == "a number" and isinstance(value, int) and abs(value) > 1 << 53:
        yield path, _INEXACT_INTEGER
    if isinstance(value, list):
        for item in value:
            yield from _json_kinds(item, f"{path}[]", False)
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _json_kinds(item, f"{path}.{name}", False)


def _not_one_table(source, exc: Exception, detail: str | None = None) -> UserError:
    detail = detail or str(exc).splitlines()[0]
    return UserError(f"{source.name}: the records cannot be one Parquet table ({detail}); "
                     "write JSONL instead (--output-format jsonl)")


def _jsonl_to_parquet(source, rows: np.ndarray, path: Path, schema=None) -> int:
    """JSONL records as Parquet rows of ``schema`` (by default inferred from these records: a first pass)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = parquet_schema(source, rows) if schema is None else schema
    source.check_unchanged()
    as_text, storage = arrow_json.json_paths(schema), arrow_json.storage_schema(schema)
    try:
        with atomic_path(path) as tmp, pq.ParquetWriter(tmp, schema) as writer:
            for piece in _jsonl_pieces(source, rows):
                table = pa.Table.from_pylist(arrow_json.encoded(piece, as_text), schema=storage)
                writer.write_table(table.cast(schema) if as_text else table)
    except _conversion_errors() as exc:  # e.g. a field holding {} only: no Parquet type
        raise _not_one_table(source, exc, _first_unencodable(source, rows) if isinstance(exc, UnicodeEncodeError)
                             else None) from None
    return path.stat().st_size
