"""JSONL indexing, validation messages, byte-exact output, atomic writes and row caches."""

import json
import logging
import re
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diversity_order import caches
from diversity_order.atomic import atomic_open, save_npy
from diversity_order.errors import UserError
from diversity_order.records import batch_bounds, check_output_path, iter_text_batches, scan_jsonl, write_reordered


def raw_lines(path):
    return [line for line in path.read_bytes().split(b"\n") if line.strip()]


def test_output_reproduces_every_record_byte_for_byte(tmp_path):
    src = tmp_path / "in.jsonl"
    records = [
        b'{"text": "caf\\u00e9 \xc3\xa9", "n": 1}',
        b'   ',  # blank line: not a record
        b'{"text": "windows line end"}\r',
        b'{"text": "dup"}',
        b'{"text": "dup"}',
        b'{"text": "", "empty": true}',
        b'{"text": "last line has no newline", "x": [1, 2, {"y": null}]}',
    ]
    src.write_bytes(b"\n".join(records))
    index = scan_jsonl(src, progress=False)
    assert len(index) == 6
    order = np.array([5, 3, 0, 4, 2, 1])
    out = tmp_path / "out.jsonl"
    write_reordered(index, order, out)
    data = out.read_bytes()
    assert data.endswith(b"\n") and data.count(b"\n") == 6
    written = data.split(b"\n")[:-1]
    originals = [r for r in records if r.strip()]
    assert written == [originals[i] for i in order]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["record", "blank", "spaces", "crlf"]), min_size=1, max_size=30),
       st.booleans())
def test_index_locations_and_line_numbers_equal_a_plain_loop_over_the_lines(tmp_path_factory, kinds, final_newline):
    """Where each record lies and its line number, with blank lines anywhere, against reading the lines one by one."""
    lines = {"record": None, "blank": b"", "spaces": b" \t ", "crlf": b"\r"}
    content = [lines[kind] if lines[kind] is not None else b'{"text": "t%d"}' % i for i, kind in enumerate(kinds)]
    if all(kind != "record" for kind in kinds):
        content.append(b'{"text": "only"}')
    src = tmp_path_factory.mktemp("lines") / "in.jsonl"
    data = b"\n".join(content) + (b"\n" if final_newline else b"")
    src.write_bytes(data)
    index = scan_jsonl(src, progress=False)
    expected, offset = [], 0  # (start, length, line number) of each record, plainly
    for number, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            expected.append((offset, len(line), number))
        offset += len(line) + 1
    assert list(zip(index.starts.tolist(), index.lengths.tolist(), index.line_numbers(np.arange(len(index))).tolist())) \
        == expected
    assert [index.where(row) for row in range(len(index))] == [f"{src}:{number}" for *_, number in expected]
    assert index.raw_hashes.tolist() == [zlib.crc32(data[a:a + n]) for a, n, _ in expected]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(["record", "long", "chat", "gpt", "blank", "spaces", "crlf"]), min_size=1, max_size=25),
       st.booleans(), st.booleans(), st.lists(st.floats(0, 1), max_size=5))
def test_indexing_byte_ranges_and_joining_them_equals_one_pass(tmp_path_factory, kinds, bom, final_newline, cuts):
    """Processes that each index one byte range (cut anywhere: inside a record, on a newline, in a
    run of blank lines) together build the index one pass builds; every record lands in one range."""
    from diversity_order.records import IndexPart, index_from_parts, index_of_part, scan_range

    lines = {"blank": b"", "spaces": b" \t ", "crlf": b"\r"}
    chat = {"chat": b'{"text": [{"role": "user", "content": "c%d"}]}',
            "gpt": b'{"text": [{"role": "human", "content": "h"}, {"role": "gpt", "content": "g%d"}]}'}
    content = [lines.get(kind, chat[kind] % i if kind in chat else
                         b'{"text": "t%d%s"}' % (i, b"x" * (300 if kind == "long" else 0)))
               for i, kind in enumerate(kinds)]
    content.append(b'{"text": "last"}')
    src = tmp_path_factory.mktemp("ranges") / "in.jsonl"
    data = (b"\xef\xbb\xbf" if bom else b"") + b"\n".join(content) + (b"\n" if final_newline else b"")
    src.write_bytes(data)
    whole = scan_jsonl(src, progress=False)
    bounds = sorted({0, len(data), *(int(c * len(data)) for c in cuts)})
    parts = [scan_range(src, "text", lo, hi, progress=False) for lo, hi in zip(bounds[:-1], bounds[1:])]
    joined = index_from_parts(src, "text", parts)
    for name in IndexPart.COLUMNS:
        assert getattr(joined, name).tolist() == getattr(whole, name).tolist(), name
        assert getattr(joined, name).dtype == getattr(whole, name).dtype
    assert joined.identity == whole.identity
    assert sum(len(part) for part in parts) == len(whole)
    # conversations or plain texts: the count and each kind's first record, as a plain loop over the records
    record_kinds = [kind for kind in kinds if kind not in lines] + ["record"]
    chats = [row for row, kind in enumerate(record_kinds) if kind in ("chat", "gpt")]
    texts = [row for row, kind in enumerate(record_kinds) if kind not in ("chat", "gpt")]
    # and the roles a chat template may not know: [conversations holding each, the first]
    gpt = [row for row, kind in enumerate(record_kinds) if kind == "gpt"]
    roles = {"human": [len(gpt), gpt[0]], "gpt": [len(gpt), gpt[0]]} if gpt else {}
    for index in (whole, joined):
        assert (index.kinds.conversations, index.kinds.first_conversation_row, index.kinds.first_text_row) == \
            (len(chats), chats[0] if chats else -1, texts[0])
        assert index.kinds.unknown_roles == roles
    first = 0  # each range on its own (a torchrun rank's own records): the same records, lines and texts
    for part in parts:
        own = index_of_part(src, "text", part)
        rows = np.arange(first, first + len(part))
        assert own.line_numbers(np.arange(len(part))).tolist() == whole.line_numbers(rows).tolist()
        assert [t for _, texts in own.iter_documents() for t in texts] == \
            [t for _, texts in whole.iter_documents(rows) for t in texts]
        first += len(part)


def test_a_bad_record_in_a_later_range_is_named_by_its_line_in_the_file(tmp_path):
    from diversity_order.records import scan_range

    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "a"}\n\n{"text": "b"}\n{"text": broken}\n{"text": "c"}\n')
    with pytest.raises(UserError, match=r"in\.jsonl:4: not valid JSON") as whole:
        scan_jsonl(src, progress=False)
    with pytest.raises(UserError) as ranged:
        scan_range(src, "text", 20, None, progress=False)
    assert str(ranged.value) == str(whole.value)


def test_scan_fingerprints_depend_on_text_only(tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "same", "id": 1}\n{"id": 2, "text": "same"}\n{"text": "other"}\n')
    fp = scan_jsonl(src, progress=False).fingerprints
    assert fp[0] == fp[1] != fp[2]


@pytest.mark.parametrize("content,expected", [
    (b'{"text": "ok"}\n{"text": broken}\n', r"in\.jsonl:2: not valid JSON"),
    (b'{"text": "ok"}\n\n{"body": "x", "id": 3}\n', r"in\.jsonl:3: no field 'text' \(this record has keys: body, id\)"),
    (b'{"text": 12}\n', r"in\.jsonl:1: field 'text' is a JSON number, expected a string \(or a conversation"),
    (b'{"text": null}\n', r"in\.jsonl:1: field 'text' is null, expected a string \(or a conversation"),
    (b'{"text": {"a": 1}}\n', r"in\.jsonl:1: field 'text' is a JSON object, expected a string \(or a conversation"),
    (b'["text"]\n', r"in\.jsonl:1: expected a JSON object, found a JSON array"),
    (b'{"text": "ok"}\n{"text": "\xff\xfe"}\n', r"in\.jsonl:2: invalid UTF-8"),
    (b'{"text": "ok", "n": ' + b"7" * 5000 + b"}\n", r"in\.jsonl:1: a JSON integer with more than 4300 digits"),
    (b'{"text": "ok", "deep": ' + b"[" * 50000 + b"]" * 50000 + b"}\n", r"in\.jsonl:1: JSON nested too deeply"),
    (b'{"body": "x", "a\\nb": 1}\n', r"in\.jsonl:1: no field 'text' \(this record has keys: \"a\\nb\", body\)"),
    (b"", r"in\.jsonl: no records"),
    (b"\n  \n", r"in\.jsonl: no records"),
])
def test_bad_input_names_file_and_line(tmp_path, content, expected):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    with pytest.raises(UserError, match=expected) as caught:
        scan_jsonl(src, progress=False)
    assert "\n" not in str(caught.value)


def test_missing_input_file(tmp_path):
    with pytest.raises(UserError, match="not found"):
        scan_jsonl(tmp_path / "nope.jsonl", progress=False)


def test_output_equal_to_input_is_refused(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "x"}\n')
    with pytest.raises(UserError, match="is the input file"):
        check_output_path(src, tmp_path / "." / "in.jsonl")


def test_text_batches_cover_requested_rows_in_order(tmp_path):
    src = tmp_path / "in.jsonl"
    texts = [f"document {i} " * (i % 7 + 1) for i in range(50)]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    index = scan_jsonl(src, progress=False)
    rows = np.array([49, 3, 4, 5, 20, 0])
    seen = []
    for batch_rows, batch_texts in iter_text_batches(index, rows, max_batch_bytes=64, max_batch_rows=2):
        assert len(batch_rows) <= 2
        seen += list(zip(batch_rows.tolist(), batch_texts))
    assert seen == [(r, texts[r]) for r in sorted(rows.tolist())]


def test_batch_bounds():
    sizes = np.array([5, 5, 50, 1, 1, 1, 1])
    assert batch_bounds(sizes, 10, 3).tolist() == [0, 2, 3, 6, 7]


def test_atomic_write_interrupted_leaves_old_file(tmp_path):
    target = tmp_path / "file.bin"
    target.write_bytes(b"old complete content")
    with pytest.raises(KeyboardInterrupt):
        with atomic_open(target, "wb") as handle:
            handle.write(b"new partial")
            raise KeyboardInterrupt
    assert target.read_bytes() == b"old complete content"
    assert list(tmp_path.iterdir()) == [target]  # no temp file left behind


def test_cache_reuses_rows_by_fingerprint_wherever_they_moved(tmp_path):
    path = tmp_path / "x_embeddings.npy"
    key = {"model": "a", "text_field": "text"}
    fps = np.array([11, 22, 33, 44], dtype=np.uint64)
    data = np.arange(8, dtype=np.float32).reshape(4, 2)
    caches.store(path, key, fps, data)
    assert np.load(path).tolist() == data.tolist()  # plain .npy
    # Reordered, one edited (99), one removed (22), one appended (55).
    found = caches.lookup(path, key, np.array([44, 11, 99, 33, 55], dtype=np.uint64))
    assert found.hit.tolist() == [True, True, False, True, False]
    assert found.data[[0, 1, 3]].tolist() == [data[3].tolist(), data[0].tolist(), data[2].tolist()]
    assert found.missing_rows.tolist() == [2, 4]
    other = caches.lookup(path, {"model": "b", "text_field": "text"}, fps)
    assert not other.hit.any() and "different model" in other.reason
    assert caches.lookup(path, {"model": "b", "text_field": "text"}, fps, accept_any_key=True).hit.all()


def test_cache_without_marker_or_with_inconsistent_files_is_not_trusted(tmp_path):
    path = tmp_path / "c.npy"
    fps = np.array([1, 2, 3], dtype=np.uint64)
    caches.store(path, {"k": 1}, fps, np.ones((3, 2), np.float32))
    # A crash after the data was rewritten with fewer rows but before the marker was updated.
    save_npy(path, np.ones((2, 2), np.float32))
    assert not caches.lookup(path, {"k": 1}, fps).hit.any()
    # A reference-style cache (no fingerprints, no marker) is recomputed, not trusted.
    caches.sidecar_paths(path)[1].unlink()
    found = caches.lookup(path, {"k": 1}, fps)
    assert not found.hit.any() and "no fingerprints" in found.reason


def test_atomic_files_get_ordinary_permissions(tmp_path):
    import os

    target = tmp_path / "perm.bin"
    with atomic_open(target) as handle:
        handle.write(b"x")
    plain = tmp_path / "plain.bin"
    plain.write_bytes(b"x")
    assert os.stat(target).st_mode & 0o777 == os.stat(plain).st_mode & 0o777


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize("out_suffix", ["", ".gz", ".zst"])
def test_compressed_input_and_output_give_the_same_records(tmp_path, suffix, out_suffix, caplog):
    import gzip

    import zstandard

    lines = [json.dumps({"text": f"doc {i} " + "é" * (i % 5), "i": i}).encode() for i in range(300)]
    plain = tmp_path / "in.jsonl"
    plain.write_bytes(b"\n".join(lines))  # no final newline
    packed = tmp_path / f"in.jsonl{suffix}"
    data = plain.read_bytes()
    packed.write_bytes(gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data))
    with caplog.at_level(logging.INFO):
        index = scan_jsonl(packed, progress=False)
    # No total for compressed input, and its MB are neither file's size: the progress line says what they are.
    assert re.search(r"Indexing in\.jsonl\.(gz|zst): [\d.]+ MB decompressed so far, ", caplog.text)
    plain_index = scan_jsonl(plain, progress=False)
    assert np.array_equal(index.fingerprints, plain_index.fingerprints)
    assert [t for _, batch in iter_text_batches(index, np.array([299, 7, 150])) for t in batch] == [
        json.loads(lines[i])["text"] for i in (7, 150, 299)]
    order = np.random.default_rng(0).permutation(300)
    out = tmp_path / f"out.jsonl{out_suffix}"
    # A small pass budget forces several forward passes over the compressed input.
    write_reordered(index, order, out, max_pass_bytes=4096)
    raw = out.read_bytes()
    if out_suffix == ".gz":
        raw = gzip.decompress(raw)
    elif out_suffix == ".zst":
        raw = zstandard.ZstdDecompressor().stream_reader(raw).read()
    assert raw == b"".join(lines[i] + b"\n" for i in order)


# --- Compressed input: verified to its end, never read as a shorter dataset --------------------------------

def _corpus(n=300):
    """Varied records (hard to compress, so the compressed file spans many blocks)."""
    import random

    rng = random.Random(1)
    return [json.dumps({"text": " ".join(f"w{rng.randrange(10**6)}" for _ in range(40)), "i": i}).encode()
            for i in range(n)]


def _compress(data, suffix, checksum=True):
    import gzip

    import zstandard

    if suffix == ".gz":
        return gzip.compress(data)
    return zstandard.ZstdCompressor(write_checksum=checksum).compress(data)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize("fraction", [0.3, 0.9, 0.999])
def test_truncated_compressed_input_is_an_error_naming_the_offset(tmp_path, suffix, fraction):
    packed = _compress(b"\n".join(_corpus()) + b"\n", suffix)
    cut = int(len(packed) * fraction)
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(packed[:cut])
    with pytest.raises(UserError, match=rf"in\.jsonl\{suffix}: truncated .* ends at compressed byte {cut:,} "):
        scan_jsonl(src, progress=False)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_corrupt_compressed_input_is_an_error(tmp_path, suffix):
    packed = bytearray(_compress(b"\n".join(_corpus()) + b"\n", suffix))
    packed[len(packed) // 2] ^= 0x55
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(bytes(packed))
    with pytest.raises(UserError, match=rf"in\.jsonl\{suffix}: corrupt .* starts at compressed byte 0"):
        scan_jsonl(src, progress=False)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_checksum_mismatch_is_an_error(tmp_path, suffix):
    packed = bytearray(_compress(b"\n".join(_corpus()) + b"\n", suffix))
    packed[-5 if suffix == ".gz" else -1] ^= 0x01  # gzip: the CRC-32; zstd: the content checksum
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(bytes(packed))
    with pytest.raises(UserError, match=r"corrupt .*(incorrect data check|checksum)"):
        scan_jsonl(src, progress=False)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_garbage_after_compressed_data_is_an_error(tmp_path, suffix):
    packed = _compress(b"\n".join(_corpus()) + b"\n", suffix)
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(packed + b"this is not compressed data\n")
    with pytest.raises(UserError, match=rf"unexpected data after the end of the .* at compressed byte {len(packed):,}"):
        scan_jsonl(src, progress=False)


@pytest.mark.parametrize("suffix,data_suffix,looks", [
    (".gz", ".zst", "zstd data: rename it in.jsonl.zst"),
    (".zst", ".gz", "gzip data: rename it in.jsonl.gz"),
    ("", ".gz", "gzip data: rename it in.jsonl.gz"),
    ("", ".zst", "zstd data: rename it in.jsonl.zst"),
])
def test_compressed_data_under_the_wrong_name_is_named(tmp_path, suffix, data_suffix, looks):
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(_compress(b"\n".join(_corpus(5)) + b"\n", data_suffix))
    with pytest.raises(UserError, match=rf"in\.jsonl{suffix.replace('.', chr(92) + '.')}: .*looks like {looks}"):
        scan_jsonl(src, progress=False)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_plain_text_named_compressed_is_named(tmp_path, suffix):
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(b'{"text": "x"}\n')
    with pytest.raises(UserError, match=r"looks like uncompressed text: rename it in\.jsonl\b"):
        scan_jsonl(src, progress=False)


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_concatenated_members_and_frames_are_one_stream(tmp_path, suffix):
    import zstandard

    lines = _corpus(40)
    parts = [_compress(b"\n".join(lines[:10]) + b"\n", suffix), _compress(b"", suffix),
             _compress(b"\n".join(lines[10:]) + b"\n", suffix, checksum=False)]
    if suffix == ".zst":  # a skippable frame (metadata some tools write) carries no content
        parts.insert(1, (0x184D2A5E).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc")
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(b"".join(parts))
    index = scan_jsonl(src, progress=False)
    assert len(index) == 40
    out = tmp_path / "out.jsonl"
    write_reordered(index, np.arange(40)[::-1], out)
    assert out.read_bytes() == b"".join(line + b"\n" for line in lines[::-1])
    assert zstandard  # imported for the skippable-frame magic's sake only


def test_zstd_long_window_is_read(tmp_path):
    """`zstd --long` frames declare windows past zstd's default decoding limit (128 MB)."""
    import zstandard

    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=29, enable_ldm=True)
    packer = zstandard.ZstdCompressor(compression_params=params).compressobj()  # streaming: the window stays 512 MB
    src = tmp_path / "in.jsonl.zst"
    src.write_bytes(packer.compress(b"\n".join(_corpus(20)) + b"\n") + packer.flush())
    assert zstandard.get_frame_parameters(src.read_bytes()).window_size == 1 << 29
    assert len(scan_jsonl(src, progress=False)) == 20


def test_gzip_zero_padding_is_accepted_like_gzip_does(tmp_path):
    lines = _corpus(5)
    src = tmp_path / "in.jsonl.gz"
    src.write_bytes(_compress(b"\n".join(lines) + b"\n", ".gz") + bytes(512))  # tape-style padding
    assert len(scan_jsonl(src, progress=False)) == 5


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_open_binary_reads_verify_to_the_end(tmp_path, suffix):
    from diversity_order.records import open_binary

    packed = _compress(b"\n".join(_corpus()) + b"\n", suffix)
    src = tmp_path / f"in.jsonl{suffix}"
    src.write_bytes(packed[: len(packed) - 20])
    with pytest.raises(UserError, match="truncated"):
        with open_binary(src) as handle:
            handle.read()


# --- Texts that JSON accepts but Unicode does not ------------------------------------------------------

def test_lone_surrogate_in_text_is_a_user_error_naming_the_line(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "pair \\ud83d\\ude00 is fine"}\n{"text": "lone \\ud800 here"}\n')
    with pytest.raises(UserError, match=r"in\.jsonl:2: field 'text' holds a lone surrogate \(\\ud800"):
        scan_jsonl(src, progress=False)
    src.write_bytes(b'{"text": "pair \\ud83d\\ude00 is fine", "other": "\\udc00 elsewhere is copied as is"}\n')
    assert len(scan_jsonl(src, progress=False)) == 1


# --- The wrong kind of input -------------------------------------------------------------------------

def test_directory_input_says_so(tmp_path):
    with pytest.raises(UserError, match=r": is a directory"):
        scan_jsonl(tmp_path, progress=False)


def test_fifo_and_device_inputs_say_they_are_read_more_than_once(tmp_path):
    import os

    fifo = tmp_path / "pipe.jsonl"
    os.mkfifo(fifo)
    for path in (fifo, "/dev/null"):
        with pytest.raises(UserError, match=r"is not a regular file \(a pipe or device; the input is read more than "
                                            r"once: write it to a file first\)"):
            scan_jsonl(path, progress=False)


@pytest.mark.parametrize("content", [
    b"text,label\nhello,1\n",  # CSV
    b"text\tlabel\nhello\t1\n",  # TSV
    b"Just some plain text.\n",
    b'[\n  {"text": "a JSON array, not JSONL"}\n]\n',
    b'["a JSON array on one line"]\n',
])
def test_first_record_not_jsonl_gets_a_hint(tmp_path, content):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content)
    with pytest.raises(UserError, match=r"in\.jsonl:1: .*; the input must be JSONL: one JSON object per line "
                                        r"\(\.jsonl, \.json or \.ndjson, each also \.gz or \.zst\)"):
        scan_jsonl(src, progress=False)


def test_later_record_not_json_gets_no_format_hint(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"text": "ok"}\nnot json\n')
    with pytest.raises(UserError) as caught:
        scan_jsonl(src, progress=False)
    assert "in.jsonl:2: not valid JSON" in str(caught.value) and "must be JSONL" not in str(caught.value)


@pytest.mark.parametrize("head,looks", [
    (b"PAR1\x15\x04\x15\x10", "a Parquet file"),
    (b'\xff\xfe{\x00"\x00t\x00', "UTF-16 text"),
    (b'{\x00"\x00t\x00e\x00', "UTF-16 text"),
    (b"\xfd7zXZ\x00\x00", "xz data"),
])
def test_binary_formats_are_named(tmp_path, head, looks):
    src = tmp_path / "in.jsonl"
    src.write_bytes(head + b"\n" + bytes(range(256)))
    with pytest.raises(UserError, match=rf"in\.jsonl: looks like {looks}"):
        scan_jsonl(src, progress=False)


def test_utf8_bom_is_skipped_not_copied(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'\xef\xbb\xbf{"text": "a"}\n{"text": "b"}\n')
    index = scan_jsonl(src, progress=False)
    out = tmp_path / "out.jsonl"
    write_reordered(index, np.array([1, 0]), out)
    assert out.read_bytes() == b'{"text": "b"}\n{"text": "a"}\n'
    # Said, where a byte-for-byte check of the records would otherwise find it without a word (compressed too).
    import gzip

    from diversity_order.sources import files_with_byte_order_mark, resolve_inputs

    (tmp_path / "z.jsonl.gz").write_bytes(gzip.compress(src.read_bytes()))
    (tmp_path / "plain.jsonl").write_bytes(b'{"text": "c"}\n')
    assert files_with_byte_order_mark(resolve_inputs(tmp_path / "*.jsonl*")) == [src, tmp_path / "z.jsonl.gz"]


# --- The input must not change while a run uses it --------------------------------------------------------

def _indexed(tmp_path, n=20):
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(b'{"text": "record %03d"}\n' % i for i in range(n)))
    return src, scan_jsonl(src, progress=False)


def test_index_records_the_input_identity_and_record_hashes(tmp_path):
    import os

    src, index = _indexed(tmp_path)
    st = os.stat(src)
    assert (index.identity.size, index.identity.mtime_ns, index.identity.inode) == (st.st_size, st.st_mtime_ns,
                                                                                    st.st_ino)
    assert index.raw_hashes.dtype == np.uint32 and index.raw_hashes.shape == (20,)
    assert np.unique(index.raw_hashes).size == 20


@pytest.mark.parametrize("change", ["rewritten", "replaced", "appended"])
def test_writer_refuses_an_input_changed_since_indexing(tmp_path, change):
    import os

    from diversity_order.records import check_unchanged

    src, index = _indexed(tmp_path)
    if change == "rewritten":
        src.write_bytes(b'{"text": "something else entirely"}\n' * 30)
    elif change == "replaced":  # a new file renamed over the old one: same size, another inode
        other = tmp_path / "new.jsonl"
        other.write_bytes(src.read_bytes().replace(b"record", b"RECORD"))
        os.replace(other, src)
    else:
        with open(src, "ab") as handle:
            handle.write(b'{"text": "appended"}\n')
    out = tmp_path / "out.jsonl"
    with pytest.raises(UserError, match=r"in\.jsonl: the input changed since it was indexed"):
        check_unchanged(index)
    with pytest.raises(UserError, match=r"in\.jsonl: the input changed since it was indexed"):
        write_reordered(index, np.arange(20)[::-1], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]  # no output, no temp file


def _packed_to_size(data, suffix, size=None):
    """``data`` as the file ``suffix`` names, ``size`` bytes long (stored gzip blocks; zstd padded with a
    skippable frame, 64 bytes by default), so an edit of the same length can keep the file's size."""
    import gzip

    import zstandard

    if suffix == "":
        packed = data
    elif suffix == ".gz":
        packed = gzip.compress(data, compresslevel=0, mtime=0)
    else:
        frame = zstandard.ZstdCompressor(write_checksum=True).compress(data)
        pad = 64 if size is None else size - len(frame) - 8
        packed = frame + (0x184D2A50).to_bytes(4, "little") + pad.to_bytes(4, "little") + bytes(pad)
    assert size is None or len(packed) == size
    return packed


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_in_place_edit_keeping_size_and_mtime_is_caught_record_by_record(tmp_path, suffix):
    import os

    lines = [b'{"text": "record %03d"}' % i for i in range(20)]
    src = tmp_path / f"in.jsonl{suffix}"
    data = b"\n".join(lines) + b"\n"
    src.write_bytes(_packed_to_size(data, suffix))
    index = scan_jsonl(src, progress=False)
    st = os.stat(src)
    with open(src, "r+b") as handle:  # same inode, same size, and the mtime put back
        handle.write(_packed_to_size(data.replace(b"record 007", b"RECORD 007"), suffix, st.st_size))
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    out = tmp_path / "out.jsonl"
    with pytest.raises(UserError, match=r"in\.jsonl(\.gz|\.zst)?:8: this record changed since the input was indexed"):
        write_reordered(index, np.arange(20)[::-1], out)
    assert sorted(p.name for p in tmp_path.iterdir()) == [src.name]
    with pytest.raises(UserError, match=r":8: this record changed"):
        list(iter_text_batches(index))


def test_writer_locating_records_a_chunk_at_a_time_writes_the_same_bytes(tmp_path, monkeypatch):
    from diversity_order import records

    src = tmp_path / "in.jsonl"
    lines = [b'{"text": "record %d %s"}' % (i, b"x" * (i * 7 % 50)) for i in range(50)]
    src.write_bytes(b"\n".join(lines[:20]) + b"\n\n" + b"\n".join(lines[20:]) + b"\n")
    index = scan_jsonl(src, progress=False)
    order = np.random.default_rng(3).permutation(50)
    monkeypatch.setattr(records, "_WRITE_CHUNK_ROWS", 3)
    monkeypatch.setattr(records, "_WRITE_GROUP_BYTES", 100)
    write_reordered(index, order, tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_bytes() == b"".join(lines[i] + b"\n" for i in order)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=5)), min_size=1, max_size=12), st.data())
def test_a_slice_of_the_index_reads_and_names_its_records_as_the_whole_does(tmp_path_factory, lines, data):
    """``rows_slice`` and ``sources.RecordPieces`` (what torchrun ranks hand each other): any row range
    of a file with blank lines reads the same texts and gives the same "file:line" as the whole index."""
    from diversity_order import sources

    path = tmp_path_factory.mktemp("slice") / "d.jsonl"
    path.write_text("".join("\n" if text is None else json.dumps({"text": text}) + "\n" for text in lines))
    if all(text is None for text in lines):
        return
    whole = scan_jsonl(path, progress=False)
    n = len(whole)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), min_size=2, max_size=4)))
    pieces = [(a, whole.rows_slice(a, b)) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]
    held = np.concatenate([np.arange(a, b) for a, b in zip(cuts[:-1], cuts[1:])] or [np.zeros(0, np.int64)])
    source = sources.RecordPieces(pieces, n, path)
    assert [source.where(int(r)) for r in held] == [whole.where(int(r)) for r in held]
    assert [t for _, ts in source.iter_documents(held) for t in ts] == \
        [t for _, ts in whole.iter_documents(held) for t in ts]
    assert source.row_bytes(held).tolist() == whole.row_sizes[held].tolist()
    for a, part in pieces:
        assert sources.records_slice(source, a, a + len(part))[0].starts.tolist() == part.starts.tolist()
    outside = np.setdiff1d(np.arange(n), held)
    if outside.size:
        with pytest.raises(ValueError, match="not among the records held here"):
            source.where(int(outside[0]))


def test_a_slice_across_files_holds_one_index_per_file(tmp_path):
    from diversity_order import sources

    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    paths[0].write_text("".join(json.dumps({"text": f"a{i}"}) + "\n" for i in range(3)))
    paths[1].write_text("\n" + "".join(json.dumps({"text": f"b{i}"}) + "\n" for i in range(4)))
    whole = sources.open_source([str(p) for p in paths], ("text",), progress=False)
    parts = sources.records_slice(whole, 1, 6)
    assert [part.path.name for part in parts] == ["a.jsonl", "b.jsonl"] and [len(p) for p in parts] == [2, 3]
    held = sources.RecordPieces([(1, parts[0]), (3, parts[1])], len(whole), tmp_path)
    rows = np.arange(1, 6)
    assert [t for _, ts in held.iter_documents(rows) for t in ts] == ["a1", "a2", "b0", "b1", "b2"]
    assert [held.where(int(r)) for r in rows] == [whole.where(int(r)) for r in rows]
    assert held.where(3).endswith("b.jsonl:2")  # the blank first line counted


# ---- indexing in several processes ---------------------------------------------------------------


def _index_columns(index) -> dict:
    from diversity_order.records import IndexPart

    return {name: getattr(index, name).tolist() for name in IndexPart.COLUMNS} | {"first_line": index.first_line}


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["record", "long", "blank", "spaces"]), min_size=1, max_size=30),
                min_size=1, max_size=3), st.integers(2, 4), st.integers(40, 400))
def test_files_indexed_by_several_processes_equal_one_pass_each(tmp_path_factory, files, workers, range_bytes):
    """Files cut into byte ranges (and spread over processes) give the indexes one pass per file gives."""
    from diversity_order import records

    folder = tmp_path_factory.mktemp("parallel")
    paths = []
    for f, kinds in enumerate(files):
        lines = [b"" if kind == "blank" else b"  " if kind == "spaces" else
                 b'{"text": "f%d r%d%s"}' % (f, i, b"y" * (200 if kind == "long" else 0)) for i, kind in enumerate(kinds)]
        paths.append(folder / f"in{f}.jsonl")
        paths[-1].write_bytes(b"\n".join(lines + [b'{"text": "end"}']) + b"\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(records, "PARALLEL_RANGE_BYTES", range_bytes)
        together = records.scan_files(paths, "text", progress=False, workers=workers)
    for path, index in zip(paths, together):
        assert _index_columns(index) == _index_columns(records.scan_files([path], "text", progress=False, workers=1)[0])
        assert index.identity == records.scan_jsonl(path, progress=False, workers=1).identity


def test_several_processes_report_the_first_bad_record_in_file_order(tmp_path, monkeypatch):
    from diversity_order import records

    monkeypatch.setattr(records, "PARALLEL_RANGE_BYTES", 64)
    src = tmp_path / "in.jsonl"
    good = [b'{"text": "record %d"}' % i for i in range(40)]
    for bad_lines in ([30], [5, 30], [0, 39], [3, 11, 12, 37]):
        lines = list(good)
        for line in bad_lines:
            lines[line] = b'{"text": broken %d}' % line
        src.write_bytes(b"\n".join(lines) + b"\n")
        with pytest.raises(UserError) as one_pass:
            records.scan_files([src], "text", progress=False, workers=1)
        with pytest.raises(UserError) as together:
            records.scan_files([src], "text", progress=False, workers=4)
        assert str(together.value) == str(one_pass.value)
        assert f"in.jsonl:{bad_lines[0] + 1}:" in str(together.value)
        if bad_lines[0] > 0 and len(bad_lines) > 1:  # (a bad first line is a file that is likely not JSONL at all)
            # Every bad record is counted in one pass, with the last (a new user fixed them one run at a time).
            assert str(together.value).endswith(f" ({len(bad_lines)} records of this file cannot be read; the last: "
                                                f"{src}:{bad_lines[-1] + 1})")


def _dying_scan_piece(path, text_field, lo, hi):
    import os

    os._exit(3)


def test_an_indexing_process_that_dies_stops_the_run_instead_of_hanging(tmp_path, monkeypatch):
    from concurrent.futures.process import BrokenProcessPool

    from diversity_order import records

    monkeypatch.setattr(records, "PARALLEL_RANGE_BYTES", 64)
    monkeypatch.setattr(records, "_scan_piece", _dying_scan_piece)  # forked processes see the patched module
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(b'{"text": "record %d"}\n' % i for i in range(100)))
    with pytest.raises(BrokenProcessPool):
        records.scan_files([src], "text", progress=False, workers=2)


def test_indexing_in_processes_logs_one_progress_line_for_all(tmp_path, monkeypatch, caplog):
    import logging

    from diversity_order import records

    monkeypatch.setattr(records, "PARALLEL_RANGE_BYTES", 64)
    monkeypatch.setenv("DIVERSITY_ORDER_PROGRESS_SECONDS", "0")
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(b'{"text": "record %d %s"}\n' % (i, b"z" * 4000) for i in range(5000)))  # 20 MB
    with caplog.at_level(logging.INFO, logger="diversity_order"):
        index = records.scan_files([src], "text", progress=False, workers=2)[0]
    assert len(index) == 5000
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Indexing in.jsonl (2 processes)")]
    assert lines and lines[-1].split(": ")[1].startswith("20 of 20 MB (100%)"), lines  # 20.1 MB (10^6 bytes)


def test_conversations_written_as_json_strings_are_counted_once_one_is_seen():
    from diversity_order.records import DocumentKinds

    encoded = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}])
    kinds = DocumentKinds()
    for row, text in enumerate(["plain"] * 5 + [encoded] + ["plain", "[{ not json"] * 800 + [encoded] * 3):
        kinds.saw(row, text)
    assert kinds.encoded == 4 and kinds.first_encoded_row == 5  # every one, also past the first 1,000 texts
    late = DocumentKinds()
    for row, text in enumerate(["plain"] * 1000 + [encoded]):
        late.saw(row, text)
    assert late.encoded == 0  # checked in a field's first 1,000 plain texts only, while none is one
    joined = DocumentKinds.joined([(0, late), (1001, kinds)])
    assert joined.encoded == 4 and joined.first_encoded_row == 1006


_FIELD_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.sampled_from(["1", "null", "(missing)", "true",
                                                                                         "\x01a", "a", "", '"1"']),
                          st.lists(st.integers(0, 1), max_size=2), st.just("ABSENT"))


@settings(max_examples=100, deadline=None)
@given(st.lists(_FIELD_VALUES, min_size=1, max_size=20).filter(lambda values: any(v != "ABSENT" for v in values)))
def test_balance_categories_are_the_json_values_kinds_kept_apart(tmp_path_factory, values):
    """A tester's 1 and "1" were one --balance-field category (as were null and "null", and an absent field and the
    string "(missing)"). Records share a category exactly when a plain comparison of their JSON values (an absent
    field apart from every value) says they are equal, and every category has its own name."""
    from diversity_order.records import read_categories

    path = tmp_path_factory.mktemp("categories") / "d.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", **({} if v == "ABSENT" else {"f": v})}) + "\n"
                            for i, v in enumerate(values)))
    ids, names = read_categories(scan_jsonl(path, progress=False), "f")
    plain = [("absent",) if v == "ABSENT" else (type(v).__name__, json.dumps(v)) for v in values]
    assert all((ids[i] == ids[j]) == (plain[i] == plain[j]) for i in range(len(values)) for j in range(len(values)))
    assert len(set(names)) == len(names) == len(set(plain))
    for i, v in enumerate(values):  # an absent field is "(missing)"; a string as it is unless that name is taken
        name = names[ids[i]]
        if v == "ABSENT":
            assert name == "(missing)"
        elif isinstance(v, str):
            assert name in (v, json.dumps(v))
        else:
            assert name == json.dumps(v)


@given(st.lists(st.one_of(st.integers(-2**62, 2**62), st.floats(-1e19, 1e19, allow_nan=False),
                          st.integers(2**60, 2**60 + 5), st.none()), min_size=1, max_size=30))
@settings(max_examples=150, deadline=None)
def test_integer_scores_past_a_floats_range_keep_their_order(tmp_path_factory, values):
    """Nanosecond timestamps (1.7e18 + i) read as float64 were one score: --ordering sorted kept the input order.
    Past 2**53 the records are scored by their rank among the exact values; either way, sorting the scores sorts
    the records as their exact values do (a plain sort of Python numbers, missing ones given the default)."""
    from diversity_order.records import read_scores

    path = tmp_path_factory.mktemp("scores") / "s.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}", **({} if v is None else {"s": v})}) + "\n"
                            for i, v in enumerate(values)))
    scores, lacking = read_scores(scan_jsonl(path, "text", progress=False), "s", default=0.5)
    exact = [0.5 if v is None else v for v in values]
    assert lacking == values.count(None)
    for i in range(len(values)):
        for j in range(len(values)):
            assert (scores[i] < scores[j]) == (exact[i] < exact[j]), (exact[i], exact[j])


def test_parquet_decimals_times_and_durations_score_and_balance(tmp_path, caplog):
    """A reviewer's Parquet score column of decimals (or times) was a TypeError traceback (json.dumps of a Decimal)
    in the error line, and with --score-default every record took the default: the input order, sorted. They are
    numbers now, in the order of their values (times to the nanosecond, with or without a zone, dates, durations),
    and --balance-field takes them as categories."""
    import datetime
    import decimal
    import logging

    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from diversity_order.arrow_sources import open_arrow_source
    from diversity_order.records import read_categories, read_scores

    utc = datetime.UTC
    columns = {
        "dec": pa.array([decimal.Decimal("2.50"), decimal.Decimal("-1.25"), None,
                         decimal.Decimal("12345678901234567890.12345678")], pa.decimal128(38, 8)),
        "ns": pa.array([1_700_000_000_000_000_003, 1_700_000_000_000_000_001, None, 1_700_000_000_000_000_002],
                       pa.timestamp("ns")),
        "zoned": pa.array([datetime.datetime(2024, 1, 1, 12, tzinfo=utc), datetime.datetime(2023, 6, 1, tzinfo=utc),
                           None, datetime.datetime(2024, 1, 1, 11, 59, 59, 999999, tzinfo=utc)],
                          pa.timestamp("us", tz="UTC")),
        "day": pa.array([datetime.date(2020, 1, 3), datetime.date(1960, 1, 1), None, datetime.date(2020, 1, 2)]),
        "wait": pa.array([5, -1, None, 3], pa.duration("s")),
    }
    pq.write_table(pa.table({"text": ["a", "b", "c", "d"], **columns}), tmp_path / "s.parquet")
    source = open_arrow_source([tmp_path / "s.parquet"], "parquet", ("text",))
    for name, column in columns.items():
        values = column.to_pylist()
        with caplog.at_level(logging.INFO):
            scores, lacking = read_scores(source, name, default=0.0)
        assert lacking == 1
        present = [i for i, v in enumerate(values) if v is not None]
        assert sorted(present, key=lambda i: scores[i]) == sorted(present, key=lambda i: values[i]), name
        ids, names = read_categories(source, name)
        assert len(set(ids.tolist())) == 4
    assert "times scored as nanoseconds since 1970-01-01 UTC" in caplog.text
    assert "numbers a float64 does not hold exactly" in caplog.text  # the nanoseconds 1 apart: ranked, said
    # Values a float rounds apart stay values (a reviewer's decimal 0.1 ... 0.9 was logged as ranks 0 ... 9).
    scores, _ = read_scores(source, "dec", default=0.0)
    assert scores.tolist() == [2.5, -1.25, 0.0, 12345678901234567890.12345678]
    scores, _ = read_scores(source, "day", default=0.0)
    assert scores[0] == 18264 * 86_400 * 10**9  # 2020-01-03, in nanoseconds since 1970
    with pytest.raises(UserError, match=r"s\.parquet row 2: --score-field dec needs a finite number in every record"):
        read_scores(source, "dec")
    pq.write_table(pa.table({"text": ["a"], "raw": pa.array([b"\x00\x01"])}), tmp_path / "b.parquet")
    with pytest.raises(UserError, match=r"b\.parquet row 0: --score-field raw needs a finite number .* found the value"):
        read_scores(open_arrow_source([tmp_path / "b.parquet"], "parquet", ("text",)), "raw")


def test_parts_of_a_file_that_saw_different_files_say_both_causes():
    """A reviewer's relative --input resolved to another file on each node: "the input changed while it was being
    indexed", which it had not. The line names both causes; parts that saw one file pass."""
    from pathlib import Path

    from diversity_order.records import FileIdentity, check_one_identity

    same = FileIdentity(10, 5, 7)
    check_one_identity(Path("a.jsonl"), [same, same])
    with pytest.raises(UserError) as refused:
        check_one_identity(Path("a.jsonl"), [same, FileIdentity(12, 5, 9)])
    assert str(refused.value).startswith("a.jsonl: the processes that indexed its parts saw different files: it "
                                         "changed while it was being indexed")
    assert "the nodes read different files under this path" in str(refused.value)
