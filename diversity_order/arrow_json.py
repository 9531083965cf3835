"""Objects whose keys differ from record to record, held in Arrow as JSON text (the ``arrow.json`` extension type).

Arrow types an object column as one struct of every key any object has, so an object that lacks a key reads back
with it as null: tool-call arguments of different functions (``{"city": ...}`` beside ``{"query": ...}``) become
``{"city": ..., "query": null}`` each, which a chat template that prints them (through ``tojson``) prints. The
datasets library (5.x) stores such objects as JSON text instead, in the ``arrow.json`` extension type, and decodes
them when read. So here: JSONL written as Parquet holds the objects at such a path as JSON text
(``uneven_object_paths``, ``with_json_at``, ``encoded``), and Arrow rows read as records decode it (``rows``), so
a record reads back as it was written, and as datasets reads it.

A path is a tuple of the keys from the record down, ``"[]"`` for a list's items. Objects whose keys come in
another order count as differing: their order reaches a template that prints them.
"""

from __future__ import annotations

import json

JSON_EXTENSION = "arrow.json"
ITEMS = "[]"
_UNSEEN = False  # keys of a path no object has been seen at (a plain value: survives pickling between ranks)


def is_json(arrow_type) -> bool:
    return getattr(arrow_type, "extension_name", None) == JSON_EXTENSION


def note_object_keys(records: list[dict], into: dict) -> None:
    """Walk ``records`` and note in ``into``, for each path, the keys of its objects in their order (None once two
    differ in them) and the JSON kinds of its values. The order counts: a template printing an object through
    ``tojson`` prints its keys in it, and one struct would give every object one order. Below a path held whole as
    JSON text nothing is walked further."""
    for record in records:
        for name, value in record.items():
            if isinstance(value, dict | list):  # a plain value is a column's: Arrow types it, and says a clash
                _note(value, (name,), into)
            elif type(value) is int or type(value) is float:
                # A number column's shape: whether it is unsigned (``integer_columns``: values past 2**63 - 1, and
                # none negative), and whether doubles hold integers of it (``writers.finished_schema`` says so).
                kind = FRACTION if type(value) is float else NEGATIVE_INTEGER if -(1 << 63) <= value < 0 else \
                    INTEGER if value < 1 << 63 else json_kind(value)
                entry = into.setdefault((name,), [_UNSEEN, frozenset()])
                if kind not in entry[1]:
                    entry[1] = entry[1] | {kind}


HUGE_INTEGER = "an integer past 64 bits"
# 2**63 .. 2**64 - 1: a column holds it as an unsigned 64-bit integer (64-bit hashes, ids), unless the column also
# holds a negative integer; inside an object or a list it is held as JSON text, as an integer past 64 bits is.
UNSIGNED_INTEGER = "an integer past 2**63 - 1"
NEGATIVE_INTEGER = "a negative integer"
# Numbers as ``note_object_keys`` tells them apart (JSON writes 1 and 1.0 apart; a double column reads both as 1.0).
INTEGER, FRACTION = "an integer", "a floating-point number"


def type_children(kind) -> list[tuple[str, object]]:
    """(step, type) of what an Arrow type holds: a struct's fields by name, a list's items as ``ITEMS`` (a map:
    nothing)."""
    import pyarrow as pa

    if pa.types.is_struct(kind):
        return [(kind.field(i).name, kind.field(i).type) for i in range(kind.num_fields)]
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return [(ITEMS, kind.value_type)]
    return []


def json_kind(value) -> str | None:
    """A JSON value's kind as Arrow types it, in the words errors say it ("a number": integers and fractions are
    both); None for null, which fits any column."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int) and not -(1 << 63) <= value < 1 << 63:
        return UNSIGNED_INTEGER if 0 <= value < 1 << 64 else HUGE_INTEGER
    if isinstance(value, int | float):
        return "a number"
    return "a string" if isinstance(value, str) else "a list" if isinstance(value, list) else \
        "an object" if isinstance(value, dict) else type(value).__name__


def _note(value, path: tuple, into: dict) -> None:
    kind = json_kind(value)
    if kind is None:
        return
    if kind == "a number":  # integers beside fractions inside a field: JSON text, so 1 reads back as 1, not 1.0
        kind = FRACTION if isinstance(value, float) else INTEGER
    entry = into.setdefault(path, [_UNSEEN, frozenset()])
    entry[1] = entry[1] | {kind}
    if isinstance(value, dict):
        entry[0] = _joined_keys(entry[0], tuple(value))
    if _as_text(path, entry):
        return
    if isinstance(value, dict):
        for name, item in value.items():
            _note(item, (*path, name), into)
    elif isinstance(value, list):
        for item in value:
            _note(item, (*path, ITEMS), into)


def _as_text(path: tuple, entry) -> bool:
    """Whether the values at ``path`` are held as JSON text: objects whose keys differ, or that are always ``{}`` (a
    struct of no fields, which Parquet cannot write); below the record's own fields, also values of two kinds (a
    string in one tool call's arguments, an object in another's; integers beside fractions, which doubles would read
    back as 1.0) and integers past 2**63 - 1, which datasets holds as JSON too. (A record's own field of two kinds is
    refused: it is a column.)"""
    keys, kinds = entry
    if keys is None or keys == ():
        return True
    return len(path) > 1 and (len(kinds) > 1 or HUGE_INTEGER in kinds or UNSIGNED_INTEGER in kinds)


def merge_object_keys(parts: list[dict]) -> dict:
    """``note_object_keys`` of parts of the records (pieces, ranks) as one."""
    merged: dict = {}
    for part in parts:
        for path, (keys, kinds) in part.items():
            if path not in merged:
                merged[path] = [keys, kinds]
                continue
            seen = merged[path]
            if keys is not _UNSEEN:
                seen[0] = _joined_keys(seen[0], keys)
            seen[1] = seen[1] | kinds
    return merged


def _joined_keys(seen, keys):
    """A path's keys once ``keys`` (a tuple, or None: already differing) are seen there too: None where they differ."""
    return keys if seen is _UNSEEN else (None if seen is None or keys is None or seen != keys else keys)


def uneven_object_paths(object_keys: dict) -> list[tuple]:
    """The outermost paths held as JSON text (``_as_text``)."""
    uneven = sorted(path for path, entry in object_keys.items() if _as_text(path, entry))
    held = set(uneven)
    return [path for path in uneven if not any(path[:i] in held for i in range(1, len(path)))]


def with_json_at(schema, paths: list[tuple]):
    """``schema`` with the type at each of ``paths`` replaced by JSON text (paths the schema lacks are skipped)."""
    import pyarrow as pa

    def retyped(arrow_type, path: tuple, wanted: list[tuple]):
        if any(len(p) == len(path) for p in wanted):
            return pa.json_()
        deeper = [p for p in wanted if len(p) > len(path)]
        if pa.types.is_struct(arrow_type):
            return pa.struct([field.with_type(retyped(field.type, (*path, field.name),
                                                      [p for p in deeper if p[len(path)] == field.name]))
                              for field in arrow_type])
        if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
            items = [p for p in deeper if p[len(path)] == ITEMS]
            value = retyped(arrow_type.value_type, (*path, ITEMS), items)
            return pa.large_list(value) if pa.types.is_large_list(arrow_type) else pa.list_(value)
        return arrow_type

    fields = []
    for field in schema:
        wanted = [path for path in paths if path[0] == field.name]
        fields.append(field.with_type(retyped(field.type, (field.name,), wanted)) if wanted else field)
    return pa.schema(fields, metadata=schema.metadata)


def json_paths(schema) -> list[tuple]:
    """The paths of ``schema`` typed as JSON text."""
    import pyarrow as pa

    found = []

    def walk(arrow_type, path: tuple) -> None:
        if is_json(arrow_type):
            found.append(path)
        elif pa.types.is_struct(arrow_type):
            for field in arrow_type:
                walk(field.type, (*path, field.name))
        elif pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type):
            walk(arrow_type.value_type, (*path, ITEMS))

    for field in schema:
        walk(field.type, (field.name,))
    return found


def storage_schema(schema):
    """``schema`` with JSON text typed as the strings it is stored in (what records encoded here convert to)."""
    import pyarrow as pa

    def plain(arrow_type):
        if is_json(arrow_type):
            return arrow_type.storage_type
        if pa.types.is_struct(arrow_type):
            return pa.struct([field.with_type(plain(field.type)) for field in arrow_type])
        if pa.types.is_large_list(arrow_type):
            return pa.large_list(plain(arrow_type.value_type))
        if pa.types.is_list(arrow_type):
            return pa.list_(plain(arrow_type.value_type))
        return arrow_type

    return pa.schema([field.with_type(plain(field.type)) for field in schema], metadata=schema.metadata)


def encoded(records: list[dict], paths: list[tuple]) -> list[dict]:
    """``records`` with the values at ``paths`` as compact JSON text (as datasets writes it); the rest shared."""
    if not paths:
        return records
    return [_transform(record, paths, _to_text) for record in records]


def rows(table) -> list[dict]:
    """A table's rows as records, JSON text decoded back into the values it holds."""
    records = table.to_pylist()
    paths = json_paths(table.schema)
    return [_transform(record, paths, _from_text) for record in records] if paths else records


def _to_text(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _from_text(value):
    return json.loads(value) if isinstance(value, str) else value


def _transform(record: dict, paths: list[tuple], change) -> dict:
    """A copy of ``record`` with ``change`` applied to the (non-null) value at each path; untouched parts shared."""
    out = dict(record)
    for name in {path[0] for path in paths}:
        if name in out:
            out[name] = _at(out[name], [path[1:] for path in paths if path[0] == name], change)
    return out


def _at(value, rests: list[tuple], change):
    if value is None:
        return None
    if any(not rest for rest in rests):
        return change(value)
    if isinstance(value, list):
        inner = [rest[1:] for rest in rests if rest[0] == ITEMS]
        return [_at(item, inner, change) for item in value] if inner else value
    if isinstance(value, dict):
        out = dict(value)
        for name in {rest[0] for rest in rests}:
            if name in out:
                out[name] = _at(out[name], [rest[1:] for rest in rests if rest[0] == name], change)
        return out
    return value
