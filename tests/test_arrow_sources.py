"""Parquet files and datasets folders: the same documents and fingerprints as JSONL, outputs in the
input's format and schema, rows in the curated order, and clear errors."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from conftest import topical_records, write_jsonl
from diversity_order import fields
from diversity_order.arrow_sources import dataset_folder_files, open_arrow_source
from diversity_order.errors import UserError
from diversity_order.records import scan_jsonl, text_fingerprint

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _records():
    records = topical_records(per_topic=12)
    for i, r in enumerate(records):
        r["meta"] = {"body": r["text"].upper(), "n": i}
        r["messages"] = [{"role": "user", "content": f"tell me about {r['topic']}"},
                         {"role": "assistant", "content": r["text"]}]
    return records


@pytest.fixture()
def parquet_file(tmp_path):
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(_records()), path, row_group_size=17)
    return path


def test_parquet_documents_and_fingerprints_equal_jsonl(tmp_path, parquet_file):
    records = _records()
    source = open_arrow_source([parquet_file], "parquet", ("text",))
    jsonl = scan_jsonl(write_jsonl(tmp_path / "same.jsonl", records), "text", progress=False)
    assert len(source) == len(records) and len(source.pieces) == -(-len(records) // 17)
    np.testing.assert_array_equal(source.fingerprints, jsonl.fingerprints)
    rows = np.array([0, 16, 17, 18, 50, len(records) - 1])
    got = [d for _, batch in source.iter_documents(rows, max_batch_rows=4) for d in batch]
    assert got == [records[i]["text"] for i in rows]
    assert source.where(20) == f"{parquet_file} row 20"


def test_parquet_output_keeps_schema_and_follows_the_order(tmp_path, parquet_file):
    source = open_arrow_source([parquet_file], "parquet", ("text",))
    order = np.random.default_rng(0).permutation(len(source))
    out = tmp_path / "out" / "curated.parquet"
    source.write_reordered(order, out)
    table = pq.read_table(out)
    assert table.schema.equals(pq.read_schema(parquet_file))
    original = pq.read_table(parquet_file).to_pylist()
    assert table.to_pylist() == [original[i] for i in order]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp left


def test_dotted_joined_and_conversation_fields(parquet_file):
    records = _records()
    nested = open_arrow_source([parquet_file], "parquet", ("meta.body",))
    assert [d for _, b in nested.iter_documents(np.array([3])) for d in b] == [records[3]["meta"]["body"]]
    joined = open_arrow_source([parquet_file], "parquet", ("topic", "text"))
    assert next(joined.iter_documents(np.array([5])))[1] == [records[5]["topic"] + fields.JOIN + records[5]["text"]]
    chats = open_arrow_source([parquet_file], "parquet", ("messages",))
    document = next(chats.iter_documents(np.array([7])))[1][0]
    assert isinstance(document, fields.Conversation) and document.messages == records[7]["messages"]
    expected = fields.extract(json.loads(json.dumps(records[7])), ("messages",), lambda: "", str)
    assert chats.fingerprints[7] == text_fingerprint(fields.fingerprint_text(expected))
    assert chats.kinds.conversations == len(records) and chats.kinds.unknown_roles == {}


def test_a_column_named_with_a_dot_is_read_as_a_jsonl_key_holding_the_dot(tmp_path):
    """A column "meta.body" (alone, or beside a struct "meta" with a field "body"): the field meta.body reads it, as a
    JSON key that itself holds the dot wins; it was a KeyError traceback (the struct "meta" was looked for, or read
    in its place), and --balance-field a.b said the field was in no record while naming it among the keys."""
    rows = [{"meta.body": f"text {i}", "a.b": f"s{i % 3}", "meta": {"body": "the struct's"}} for i in range(30)]
    for columns in (("meta.body", "a.b"), ("meta.body", "a.b", "meta")):
        table = pa.Table.from_pylist([{name: row[name] for name in columns} for row in rows])
        path = tmp_path / f"{len(columns)}.parquet"
        pq.write_table(table, path, row_group_size=7)
        source = open_arrow_source([path], "parquet", ("meta.body",))
        assert [d for _, batch in source.iter_documents() for d in batch] == [row["meta.body"] for row in rows]
        jsonl = scan_jsonl(write_jsonl(tmp_path / f"{len(columns)}.jsonl", [{name: row[name] for name in columns}
                                                                            for row in rows]), "meta.body",
                           progress=False)
        np.testing.assert_array_equal(source.fingerprints, jsonl.fingerprints)
        assert source.field_values("a.b") == [row["a.b"] for row in rows]


def test_a_dotted_column_in_one_file_and_a_struct_in_another_are_read_alike(tmp_path):
    """Files joined into one schema, ``meta.body`` a column of one and a member of the struct ``meta`` in the other
    (either first): each row's document is what its JSONL record's ``meta.body`` reads, and the rows are written
    out (a KeyError traceback: the dotted column was looked for in every file)."""
    dotted = [{"meta.body": f"dotted {i}", "id": i} for i in range(9)]
    nested = [{"meta": {"body": f"nested {i}"}, "id": 100 + i} for i in range(11)]
    for name, rows in (("d", dotted), ("n", nested)):
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet", row_group_size=4)
    for files, records in (("dn", dotted + nested), ("nd", nested + dotted)):
        source = open_arrow_source([tmp_path / f"{f}.parquet" for f in files], "parquet", ("meta.body",))
        expected = [r["meta.body"] if "meta.body" in r else r["meta"]["body"] for r in records]
        assert [d for _, batch in source.iter_documents() for d in batch] == expected
        jsonl = scan_jsonl(write_jsonl(tmp_path / f"{files}.jsonl", records), "meta.body", progress=False)
        np.testing.assert_array_equal(source.fingerprints, jsonl.fingerprints)
        order = np.random.default_rng(0).permutation(len(records))
        written = pa.concat_tables(list(source.ordered_tables(order)))
        assert written.column("id").to_pylist() == [records[i]["id"] for i in order.tolist()]


def test_files_of_no_rows_neither_join_nor_block_the_others_columns(tmp_path, caplog):
    """A reviewer's folder held an empty part whose columns had other types (a job's empty output: text of no type,
    id a string): "its columns differ", and the folder could not be read. Files of no rows are said and passed over,
    first, last or between; the rows of the others are read and written with their own columns."""
    import logging

    rows = [{"text": f"document {i}", "id": i} for i in range(7)]
    pq.write_table(pa.Table.from_pylist(rows[:4]), tmp_path / "b.parquet")
    pq.write_table(pa.Table.from_pylist(rows[4:]), tmp_path / "d.parquet")
    pq.write_table(pa.table({"text": pa.array([], pa.null()), "id": pa.array([], pa.string())}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"other": pa.array([], pa.int8())}), tmp_path / "c.parquet")  # not even the text column
    pq.write_table(pa.table({}), tmp_path / "e.parquet")
    files = sorted(tmp_path.glob("*.parquet"))
    with caplog.at_level(logging.INFO):
        source = open_arrow_source(files, "parquet", ("text",))
    assert "3 input file(s) hold no rows (" + str(tmp_path / "a.parquet") + " ... e.parquet)" in caplog.text
    assert [d for _, batch in source.iter_documents() for d in batch] == [r["text"] for r in rows]
    written = pa.concat_tables(list(source.ordered_tables(np.arange(7)[::-1].copy())))
    assert written.schema.field("id").type == pa.int64() and written.column("id").to_pylist() == list(range(7))[::-1]
    # Only files of no rows: refused as before, for holding none.
    with pytest.raises(UserError, match=": no rows"):
        open_arrow_source([tmp_path / "a.parquet", tmp_path / "c.parquet"], "parquet", ("other",))


def test_roles_a_template_may_not_know_are_counted_in_every_file(tmp_path):
    """ShareGPT roles in the second file only: counted there, the first row given in the whole input."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def chat(user, assistant):
        return {"messages": [{"role": user, "content": "q"}, {"role": assistant, "content": "a"}]}

    pq.write_table(pa.Table.from_pylist([chat("user", "assistant")] * 5), tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist([chat("user", "assistant"), chat("human", "gpt"), chat("human", "assistant")]),
                   tmp_path / "b.parquet")
    source = open_arrow_source([tmp_path / "a.parquet", tmp_path / "b.parquet"], "parquet", ("messages",))
    assert source.kinds.unknown_roles == {"human": [2, 6], "gpt": [1, 6]}


def test_datasets_folder_in_and_out(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = _records()
    folder = tmp_path / "ds"
    datasets.Dataset.from_list(records).save_to_disk(str(folder))
    source = open_arrow_source(dataset_folder_files(folder), "arrow", ("text",), folder=folder)
    assert len(source) == len(records)
    order = np.random.default_rng(1).permutation(len(records))
    out = tmp_path / "curated_ds"
    source.write_reordered(order, out)
    loaded = datasets.load_from_disk(str(out))
    assert loaded.to_list() == [records[i] for i in order]
    assert loaded.features == datasets.load_from_disk(str(folder)).features


def test_clear_errors(tmp_path, parquet_file):
    with pytest.raises(UserError, match="no column 'body'"):
        open_arrow_source([parquet_file], "parquet", ("body",))
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(parquet_file.read_bytes()[:200])
    with pytest.raises(UserError, match="not a Parquet file that can be read"):
        open_arrow_source([broken], "parquet", ("text",))
    bad_chat = tmp_path / "bad_chat.parquet"
    pq.write_table(pa.Table.from_pylist([{"messages": [{"role": "user", "content": "hi"}]},
                                         {"messages": [{"role": "user", "content": None}]}]), bad_chat)
    with pytest.raises(UserError, match=r"row 1: field 'messages\[0\]' has a content that is null"):
        open_arrow_source([bad_chat], "parquet", ("messages",))


def test_a_file_changed_after_indexing_is_refused(tmp_path, parquet_file):
    source = open_arrow_source([parquet_file], "parquet", ("text",))
    table = pq.read_table(parquet_file)
    pq.write_table(table.slice(0, len(source) - 1), parquet_file)
    os.utime(parquet_file, ns=(1, 1))
    with pytest.raises(UserError, match="changed while this run was going"):
        source.write_reordered(np.arange(len(source)), tmp_path / "o.parquet")
    assert not (tmp_path / "o.parquet").exists()


def test_a_null_in_a_plain_string_column_is_one_clear_error(tmp_path):
    path = tmp_path / "nulls.parquet"
    pq.write_table(pa.table({"text": ["a", "b", None, "d"]}), path, row_group_size=2)
    with pytest.raises(UserError, match=r"nulls\.parquet row 2: field 'text' is null, expected a string"):
        open_arrow_source([path], "parquet", ("text",))


def test_a_folder_of_two_formats_is_refused_with_a_glob_that_matches(tmp_path):
    """The hint names a glob for each format that finds its files (it named the top folder's before)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from diversity_order.sources import resolve_inputs

    (tmp_path / "sub").mkdir()
    pq.write_table(pa.Table.from_pylist([{"text": "a"}]), tmp_path / "sub" / "a.parquet")
    (tmp_path / "b.jsonl.gz").write_bytes(b"")
    with pytest.raises(UserError, match="holds both") as refused:
        resolve_inputs([tmp_path])
    globs = [word.rstrip(")") for word in str(refused.value).split() if "*" in word]
    assert [len(list(Path(g).parent.glob(Path(g).name))) for g in globs] == [1, 1]
