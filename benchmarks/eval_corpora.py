"""Real evaluation corpora for the orderings, built from text every machine with this project has.

    .venv/bin/python benchmarks/eval_corpora.py build OUT      # write OUT/<corpus>.jsonl (a few minutes)
    .venv/bin/python benchmarks/eval_corpora.py label OUT      # run curate_dataset.py --stats-only on each
    .venv/bin/python benchmarks/eval_corpora.py all OUT        # both, then print each corpus's shape

Each corpus is a JSONL of {"text", "source"} records, grouped by source in file order: the
realistic "bad" input order an ordering has to fix. Sources are the project's virtual environment
(site-packages of the interpreter running this script) and the standard library; every choice is
deterministic (sorted walks, CRC-32 of relative paths), so a machine with the same packages builds
the same bytes.

- packages: every top-level function and class (decorators included) of a third of the installed
  packages' .py files, grouped by package; lengths from a one-line helper to a 10k-line class.
- stdlib-tests: every test function and method of the standard library's test suite, grouped by
  test module.
- mix-a, mix-b: heavy-tailed mixes of many tiny records and a few huge ones from many sources
  (sources: package/sub-package folders of site-packages, alternately given to a and b, so the two
  share no source). A quarter of the files split at blank lines into paragraphs (SmolLM2 tokens:
  median ~50, a third under 30), plus 16 whole files spread over the sizes from 64 KB to the
  largest (the longest ~200-400k tokens).
- mix-stdlib: the same recipe on all of the standard library's files (tests excluded), sources =
  top-level modules.
- docstring-lines: the first line of every docstring in another third of the packages' files:
  many very short records (median ~12 tokens).
- files: whole .py files of half the installed packages: few, long documents (median ~2k tokens).

Outside the suite (``EXTRA_CORPORA``, built only with ``--only``), checked once as held-out data:

- prose: text, not code: every docstring of the standard library (tests excluded) whole, grouped by
  top-level module; each help topic of ``pydoc_data.topics``; and the paragraphs of each installed
  package's long description (``*.dist-info/METADATA``), grouped by package.

Which of these the ordering was tuned on and which were held out is recorded in
``bench_ordering_quality.py`` (``TUNING_CORPORA``).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import sysconfig
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
SITE_PACKAGES = Path(sysconfig.get_paths()["purelib"])
STDLIB = Path(sysconfig.get_paths()["stdlib"])
STDLIB_TESTS = STDLIB / "test"

# The demo corpus (`make demo`) is labelled with the others; it is not rebuilt here.
DEMO_CORPUS = ROOT / "demo/stdlib.jsonl"
CORPORA = ("packages", "stdlib-tests", "mix-a", "mix-b", "mix-stdlib", "docstring-lines", "files")
# Whole-file records of a heavy-tailed mix: this many, spread over the file sizes from HUGE_MIN_BYTES up.
HUGE_RECORDS = 16
HUGE_MIN_BYTES = 64_000
PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")


def _py_files(base: Path, skip_dirs: tuple[str, ...] = ()) -> list[Path]:
    """Every .py file under ``base``, in sorted walk order (directories before their files' siblings)."""
    out = []
    for root, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.endswith(".dist-info")
                         and d not in skip_dirs)
        out += [Path(root) / f for f in sorted(files) if f.endswith(".py")]
    return out


def _bucket(path: Path, base: Path, n_buckets: int) -> int:
    """A stable pseudo-random bucket for a file, from its path relative to ``base``."""
    return zlib.crc32(str(path.relative_to(base)).encode()) % n_buckets


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


def _package(path: Path) -> str:
    """site-packages/torch/nn/x.py -> torch; site-packages/six.py -> six."""
    first = path.relative_to(SITE_PACKAGES).parts[0]
    return first[:-3] if first.endswith(".py") else first


def _sub_package(path: Path, base: Path) -> str:
    """base/torch/nn/x.py -> torch/nn; base/torch/x.py -> torch; base/six.py -> six."""
    parts = path.relative_to(base).parts
    if len(parts) == 1:
        return parts[0][:-3]
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        return None


def _node_source(lines: list[str], node: ast.AST) -> str:
    """The node's source lines, decorators included (line slicing: get_source_segment is quadratic)."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "".join(lines[start - 1:node.end_lineno]).rstrip()


def _definitions(files: list[Path], source_of, methods: bool) -> Iterator[dict]:
    """Top-level functions and classes (``methods``: top-level functions and each method of top-level classes)."""
    definition = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    for path in files:
        text = _read(path)
        tree = _parse(text)
        if tree is None:
            continue
        lines = text.splitlines(keepends=True)
        source = source_of(path)
        for node in tree.body:
            if methods and isinstance(node, ast.ClassDef):
                for child in node.body:
                    if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield {"text": _node_source(lines, child), "source": source}
            elif isinstance(node, definition):
                yield {"text": _node_source(lines, node), "source": source}


def packages_corpus() -> Iterator[dict]:
    files = [p for p in _py_files(SITE_PACKAGES) if _bucket(p, SITE_PACKAGES, 3) == 0]
    yield from _definitions(files, _package, methods=False)


def stdlib_tests_corpus() -> Iterator[dict]:
    files = _py_files(STDLIB_TESTS)
    yield from _definitions(files, lambda p: str(p.relative_to(STDLIB_TESTS))[:-3], methods=True)


def docstring_lines_corpus() -> Iterator[dict]:
    for path in _py_files(SITE_PACKAGES):
        if _bucket(path, SITE_PACKAGES, 3) != 1:
            continue
        tree = _parse(_read(path))
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                first = doc.strip().split("\n", 1)[0].strip() if doc else ""
                if first:
                    yield {"text": first, "source": _package(path)}


def files_corpus() -> Iterator[dict]:
    for path in _py_files(SITE_PACKAGES):
        if _bucket(path, SITE_PACKAGES, 2) == 0:
            text = _read(path)
            if text.strip():
                yield {"text": text, "source": _package(path)}


def _huge_files(files: list[Path]) -> set[Path]:
    """HUGE_RECORDS files kept whole: the largest, and the rest spread evenly over the size ranks above
    HUGE_MIN_BYTES (so the tail runs from tens of thousands of tokens up, not only the very largest)."""
    big = sorted((p for p in files if p.stat().st_size >= HUGE_MIN_BYTES), key=lambda p: (-p.stat().st_size, str(p)))
    if len(big) <= HUGE_RECORDS:
        return set(big)
    ranks = np.linspace(0, len(big) - 1, HUGE_RECORDS).round().astype(int)
    return {big[r] for r in ranks}


def _heavy_tailed_mix(files: list[Path], base: Path, source_of, n_buckets: int) -> Iterator[dict]:
    """Paragraphs of one file in ``n_buckets`` (by path), and a few whole huge files, grouped by source."""
    huge = _huge_files(files)
    for path in files:
        if path in huge:
            yield {"text": _read(path), "source": source_of(path)}
        elif _bucket(path, base, n_buckets) == 0:
            for paragraph in PARAGRAPH_BREAK.split(_read(path)):
                if paragraph.strip():
                    yield {"text": paragraph.rstrip(), "source": source_of(path)}


def _mix_half(half: int) -> Iterator[dict]:
    files = _py_files(SITE_PACKAGES)
    sources = sorted({_sub_package(p, SITE_PACKAGES) for p in files})
    mine = set(sources[half::2])  # alternate sources, so mix-a and mix-b share none
    files = [p for p in files if _sub_package(p, SITE_PACKAGES) in mine]
    # Grouped by source: the walk interleaves a package's sub-packages with its root files.
    files.sort(key=lambda p: (_sub_package(p, SITE_PACKAGES), str(p)))
    yield from _heavy_tailed_mix(files, SITE_PACKAGES, lambda p: _sub_package(p, SITE_PACKAGES), n_buckets=4)


def mix_stdlib_corpus() -> Iterator[dict]:
    files = _py_files(STDLIB, skip_dirs=("test", "tests", "site-packages"))
    top = lambda p: p.relative_to(STDLIB).parts[0].removesuffix(".py")  # noqa: E731
    files.sort(key=lambda p: (top(p), str(p)))
    yield from _heavy_tailed_mix(files, STDLIB, top, n_buckets=1)


def prose_corpus() -> Iterator[dict]:
    files = _py_files(STDLIB, skip_dirs=("test", "tests", "site-packages"))
    top = lambda p: p.relative_to(STDLIB).parts[0].removesuffix(".py")  # noqa: E731
    files.sort(key=lambda p: (top(p), str(p)))
    for path in files:
        tree = _parse(_read(path))
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and doc.strip():
                    yield {"text": doc, "source": top(path)}
    topics = ast.literal_eval(_parse(_read(STDLIB / "pydoc_data" / "topics.py")).body[-1].value)
    for name in sorted(topics):
        yield {"text": topics[name].strip(), "source": "pydoc-topics"}
    for metadata in sorted(SITE_PACKAGES.glob("*.dist-info/METADATA")):
        body = _read(metadata).split("\n\n", 1)[1] if "\n\n" in _read(metadata) else ""
        package = metadata.parent.name.split("-")[0].lower()
        for paragraph in PARAGRAPH_BREAK.split(body):
            if paragraph.strip():
                yield {"text": paragraph.strip(), "source": package}


BUILDERS = {
    "packages": packages_corpus,
    "stdlib-tests": stdlib_tests_corpus,
    "mix-a": lambda: _mix_half(0),
    "mix-b": lambda: _mix_half(1),
    "mix-stdlib": mix_stdlib_corpus,
    "docstring-lines": docstring_lines_corpus,
    "files": files_corpus,
    "prose": prose_corpus,
}
EXTRA_CORPORA = ("prose",)


def build(out: Path, names: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = out / f"{name}.jsonl"
        n = 0
        with open(path.with_suffix(".tmp"), "w", encoding="utf-8") as f:
            for record in BUILDERS[name]():
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                n += 1
        path.with_suffix(".tmp").replace(path)
        print(f"{path}: {n:,} records", flush=True)


def _input(out: Path, name: str) -> Path:
    return DEMO_CORPUS if name == "demo" else out / f"{name}.jsonl"


def label(out: Path, names: list[str], model_dir: Path) -> None:
    """The real pipeline, once per corpus: token counts beside the input, labels in OUT/labels/."""
    for name in names:
        done = subprocess.run([sys.executable, str(ROOT / "curate_dataset.py"), "--input", str(_input(out, name)),
                               "--output", str(out / "labels" / f"{name}_curated.jsonl"), "--model-dir",
                               str(model_dir), "--stats-only", "--no-plot", "--no-progress"])
        if done.returncode:  # curate_dataset.py has said why, in one line
            sys.exit(f"labelling {name} failed (exit {done.returncode}); --model-dir {model_dir} is the model used")


def load(out: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(labels, token counts) of a built and labelled corpus, input order."""
    labels = np.load(out / "labels" / f"{name}_curated_labels.npy").astype(np.int64)
    source = _input(out, name)
    counts = np.load(source.with_name(source.stem + "_token_counts.npy")).astype(np.int64)
    return labels, counts


def shape(counts: np.ndarray) -> str:
    return (f"{counts.size:,} docs, {counts.sum():,} tokens, median {np.median(counts):.0f}, "
            f"<30 tokens {np.mean(counts < 30):.0%}, >16K: {int((counts > 16384).sum())}, longest {counts.max():,}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=("build", "label", "all", "shape"))
    p.add_argument("out", type=Path)
    p.add_argument("--only", nargs="+", choices=CORPORA + EXTRA_CORPORA + ("demo",),
                   help="default: every corpus of the suite (build: all but demo); prose only when named")
    p.add_argument("--model-dir", type=Path, default=ROOT / "demo/SmolLM2-135M")
    args = p.parse_args()
    names = args.only or list(CORPORA) + ["demo"]
    if args.command in ("build", "all"):
        build(args.out, [n for n in names if n != "demo"])
    if args.command in ("label", "all"):
        label(args.out, names, args.model_dir)
    if args.command in ("label", "all", "shape"):
        for name in names:
            print(f"{name}: {shape(load(args.out, name)[1])}")


if __name__ == "__main__":
    main()
