"""Fuzz the reader: any input either fails with one UserError or comes out whole, byte for byte.

Hypothesis builds files from good and bad JSONL lines (bad JSON, non-objects, missing or
non-string text fields, lone surrogates, invalid UTF-8, NUL bytes, huge numbers, deep nesting,
very long lines), frames them (LF/CRLF, blank lines, a missing final newline, a UTF-8 BOM, the
whole file in UTF-16), and stores them plain, .gz or .zst (in one or several members/frames,
intact, truncated, with a flipped byte or with garbage appended). Whatever it builds:

* no exception but UserError ever escapes, and its message is one line;
* an input an independent check finds valid is read, and ``write_reordered`` under a random
  order writes every record exactly once, byte for byte; texts read back match;
* damaged compressed data is never read as a different (e.g. shorter) dataset.
"""

import gzip
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import zstandard
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from diversity_order.errors import UserError
from diversity_order.records import iter_text_batches, scan_jsonl, write_reordered

BOM = b"\xef\xbb\xbf"

# JSON string bodies: plain text of any script, and escapes (a lone surrogate among them).
_ESCAPES = ["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\u00e9", "\\n", "\\\\u", "\\\"", "\\t", "\\u0000"]
json_string = st.builds(
    lambda s, esc, ascii_only: '"' + json.dumps(s, ensure_ascii=ascii_only)[1:-1] + "".join(esc) + '"',
    st.text(max_size=40), st.lists(st.sampled_from(_ESCAPES), max_size=2), st.booleans())
json_scalar = st.one_of(st.sampled_from(["null", "true", "false", "NaN", "1e999"]), st.integers(-10**20, 10**20).map(str),
                        st.floats().map(json.dumps), json_string)


def _obj(pairs):
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"


nested = st.recursive(json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.lists(st.tuples(st.text(max_size=5), inner), max_size=3).map(_obj)), max_leaves=8)

good_record = st.builds(lambda text, extra: _obj([("text", text), *extra]),
                        json_string, st.lists(st.tuples(st.sampled_from(["id", "meta", "a\nb", "é"]), nested),
                                              max_size=2)).map(lambda s: s.encode("utf-8", "surrogatepass"))
surely_good_record = st.builds(lambda text, ascii_only: json.dumps({"text": text}, ensure_ascii=ascii_only).encode(),
                               st.text(max_size=40), st.booleans())  # hypothesis text holds no surrogates
lone_surrogate = st.builds(lambda a, b, esc: json.dumps({"text": a + "@" + b}).replace("@", esc).encode(),
                           st.text(max_size=5), st.text(max_size=5), st.sampled_from(["\\ud800", "\\udfff", "\\uDBFF"]))
bad_line = st.one_of(
    nested.map(lambda s: s.encode("utf-8", "surrogatepass")),  # a non-object, or an object without text
    st.builds(lambda v: _obj([("text", v)]).encode("utf-8", "surrogatepass"), nested),  # text not (always) a string
    st.binary(max_size=30),  # raw bytes: invalid UTF-8, NUL bytes, stray newlines
    st.builds(lambda r, at: r[:at] + b"\x00" + r[at:], good_record, st.integers(0, 30)),
    st.just(b'{"text": "x", "n": ' + b"9" * 5000 + b"}"),  # past Python's integer digit limit
    st.just(b'{"text": "x", "deep": ' + b"[" * 3000 + b"]" * 3000 + b"}"),  # past the recursion limit
    st.just(b'{"text": "cut'), st.just(b'text,label'), st.just(b"\x0b\x0c"),
)
long_record = st.integers(10**4, 3 * 10**5).map(lambda n: b'{"text": "' + b"long " * (n // 5) + b'"}')
blank_line = st.sampled_from([b"", b"  ", b"\t", b"\r"])
line = st.one_of(good_record, good_record, good_record, blank_line, bad_line, long_record)


@st.composite
def contents(draw):
    """(file content, its lines) before any compression."""
    lines = draw(st.lists(line, min_size=0, max_size=12))
    mode = draw(st.sampled_from(["valid", "valid", "one bad line", "any"]))
    if mode != "any":  # valid lines (the success path runs as often as the errors), or just one bad one
        lines = [x for x in lines if x in (b"", b"  ", b"\t", b"\r") or _valid_record(x)]
        lines.insert(draw(st.integers(0, len(lines))), draw(surely_good_record))
        if mode == "one bad line":
            lines.insert(draw(st.integers(0, len(lines))), draw(st.one_of(bad_line, lone_surrogate)))
    crlf = draw(st.booleans())
    body = b"".join(x + (b"\r\n" if crlf else b"\n") for x in lines)
    if lines and draw(st.booleans()):
        body = body[: -2 if crlf else -1]  # no final newline
    encoding = draw(st.sampled_from(["utf-8"] * 4 + ["utf-8-bom", "utf-16"]))
    if encoding == "utf-8-bom":
        body = BOM + body
    elif encoding == "utf-16":
        body = body.decode("utf-8", "replace").encode("utf-16")
    return body


def _valid_record(raw: bytes) -> bool:
    """An independent statement of what a record must be."""
    try:
        record = json.loads(raw.decode("utf-8"))
        record["text"].encode("utf-8")  # str only: a lone surrogate fails here
    except (ValueError, RecursionError, TypeError, KeyError, AttributeError):
        return False
    return isinstance(record, dict) and isinstance(record["text"], str)


def _expected(content: bytes) -> tuple[list[bytes], bool]:
    """The records of decompressed ``content`` and whether the file is valid."""
    if content.startswith(BOM):
        content = content[len(BOM):]
    records = [x for x in content.split(b"\n") if x.strip()]
    return records, bool(records) and all(_valid_record(r) for r in records)


def _pack(content: bytes, suffix: str, cuts: list[int], level: int) -> tuple[bytes, list[int]]:
    """``content`` compressed in several members/frames (split at ``cuts``); returns the data and unit ends."""
    bounds = [0, *sorted({min(c, len(content)) for c in cuts}), len(content)]
    data, ends = b"", []
    for a, b in zip(bounds[:-1], bounds[1:]):
        piece = content[a:b]
        data += (gzip.compress(piece, compresslevel=level, mtime=0) if suffix == ".gz"
                 else zstandard.ZstdCompressor(level=level, write_checksum=True).compress(piece))
        ends.append(len(data))
    return data, ends


def _unpack(data: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.decompress(data)
    if suffix == ".zst":
        return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True).read()
    return data


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(content=contents(), suffix=st.sampled_from(["", ".gz", ".zst"]), out_suffix=st.sampled_from(["", ".gz", ".zst"]),
       damage=st.sampled_from(["none", "none", "truncate", "flip", "garbage"]), cuts=st.lists(st.integers(0, 4000), max_size=2),
       level=st.integers(1, 6), where=st.floats(0, 1), garbage=st.binary(max_size=20), seed=st.integers(0, 2**32 - 1),
       pass_bytes=st.sampled_from([64, 4096, 1 << 30]))
def test_any_input_is_one_user_error_or_every_record_byte_for_byte(content, suffix, out_suffix, damage, cuts, level,
                                                                 where, garbage, seed, pass_bytes):
    records, valid = _expected(content)
    data, unit_ends = _pack(content, suffix, cuts, level) if suffix else (content, [])
    if not suffix:
        damage = "none"  # damage to a plain file is just other content
    if damage == "truncate":
        # Cut inside a member/frame: a cut exactly between two would be a valid shorter file.
        positions = [p for p in range(1, len(data)) if p not in unit_ends]
        data = data[: positions[int(where * (len(positions) - 1))]]
    elif damage == "flip":
        at = int(where * (len(data) - 1))
        data = data[:at] + bytes([data[at] ^ (1 + seed % 255)]) + data[at + 1:]
    elif damage == "garbage":
        data += b"X" + garbage  # "X" starts no gzip member, zstd frame or zero padding
    must_fail = damage in ("truncate", "garbage") or not valid

    with tempfile.TemporaryDirectory() as folder:
        src = Path(folder) / f"in.jsonl{suffix}"
        src.write_bytes(data)
        out = Path(folder) / f"out.jsonl{out_suffix}"
        try:
            index = scan_jsonl(src, progress=False)
            order = np.random.default_rng(seed).permutation(len(index))
            write_reordered(index, order, out, max_pass_bytes=pass_bytes)
            texts = [t for _, batch in iter_text_batches(index, max_batch_bytes=pass_bytes) for t in batch]
        except UserError as exc:
            event(f"{damage}: UserError")  # --hypothesis-show-statistics: how often each path ran
            assert "\n" not in str(exc), str(exc)
            assert must_fail or damage == "flip", f"a valid input was refused: {exc}"
            return
        event(f"{damage}: read, {'1 record' if len(index) == 1 else 'several records'}")
        assert not must_fail, "an invalid or damaged input was read"
        # A flipped byte the format cannot see (a gzip header's mtime, say) leaves the same content.
        assert len(index) == len(records)
        assert _unpack(out.read_bytes(), out_suffix) == b"".join(records[i] + b"\n" for i in order)
        assert texts == [json.loads(r)["text"] for r in records]


json_like = st.one_of(st.text(max_size=30), nested, st.builds(lambda pad, value, tail: pad + value + tail,
                                                              st.sampled_from(["", " ", "\t", "\ufeff", "\r\n"]), nested,
                                                              st.sampled_from(["", " ", "\r", "x", "}", " 1"])))


@settings(max_examples=300, deadline=None)
@given(json_like)
def test_fast_json_parse_is_json_loads(decoded):
    """The scan's direct call of json's C scanner gives json.loads's value, or its error and message."""
    from diversity_order.records import _parse_json

    try:
        expected = json.loads(decoded)
    except (ValueError, RecursionError) as exc:
        try:
            _parse_json(decoded)
        except type(exc) as got:
            assert str(got) == str(exc)
        else:
            raise AssertionError(f"{decoded!r} parsed, but json.loads raises {exc!r}")
    else:
        got = _parse_json(decoded)
        assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


_text_values = st.one_of(st.text(max_size=20), st.sampled_from(['"\\ud800"', '"a\\udc00b"', '"\\ud83d\\ude00"', "NaN",
                                                                "1e999", "123456789012345678901234567890", "[]"]))


@settings(max_examples=300, deadline=None)
@given(st.one_of(json_like, st.builds(lambda value, other, dup: '{"text": ' + value + ', "n": ' + other + dup + "}",
                                      _text_values.map(lambda v: v if not v or v[0] in '"[N1' else json.dumps(v)),
                                      st.sampled_from(["1", "-0", "123456789012345678901234567890", "NaN", '"x"',
                                                       '{"a": [1, 2.5e3]}', "null"]),
                                      st.sampled_from(["", ', "text": "later"', ', "text": 5']))),
       st.sampled_from(["text", "n"]))
def test_a_records_text_is_the_same_as_json_reads_it(decoded, field):
    """orjson reads the usual record; every record gives the text (or the error) json.loads gives."""
    from diversity_order.records import TextReader

    raw = decoded.encode("utf-8", "surrogatepass")

    def outcome(read):
        try:
            return "text", read()
        except UserError as exc:
            return "error", str(exc)

    def plain():  # the definition: json.loads, then the field must be a string
        try:
            record = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as exc:
            raise UserError(type(exc).__name__) from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            raise UserError("not a text")
        return record[field]

    reader = TextReader(Path("x.jsonl"), field)
    got, expected = outcome(lambda: reader(raw, 1)), outcome(plain)
    assert got[0] == expected[0], (decoded, got, expected)
    if got[0] == "text":
        assert got[1] == expected[1]


def test_orjson_is_not_tried_again_after_a_conversation():
    from diversity_order.records import TextReader

    reader = TextReader(Path("x.jsonl"), "messages")
    assert reader(b'{"messages": "plain"}', 1) == "plain" and reader.fast
    conversation = reader(b'{"messages": [{"role": "user", "content": "hi"}]}', 2)
    assert not isinstance(conversation, str) and not reader.fast
    assert reader(b'{"messages": "plain again"}', 3) == "plain again"
