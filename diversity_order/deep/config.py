"""Deep extraction's settings (``DeepConfig``), its result, and the checks made before any work."""

from __future__ import annotations

import glob
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import distributed
from ..errors import EveryRankError, UserError
from ..model_folder import check_model_dir
from ..outputs import check_outside_model_dir, check_plain_output, same_file

DTYPES = ("auto", "float32", "bfloat16", "float16")
CPU_TOKEN_BUDGET = 16384  # tokens per forward pass on CPU (documents x longest length)
# Most documents per forward pass when --batch-size is not given. On an H200 (a 135M model, documents cut
# to 512 tokens) 1024 ran the batches 2.4x faster than 64 and 4096 slower again; with documents whole the
# long ones set the batches and the cap changed nothing. On a CPU 1024 was ~10% slower than 64.
GPU_BATCH_SIZE = 1024
CPU_BATCH_SIZE = 64
GPU_MEMORY_FRACTION = 0.7
OOM_SHRINK = 0.6
SUCCESS_GROWTH = 1.1
TOKENIZE_CHUNK_DOCS = 4096  # documents read and tokenized together, in processing order

@dataclass
class DeepConfig:
    input: Path
    output: Path
    model_dir: Path
    batch_size: int | None = None  # None: GPU_BATCH_SIZE on CUDA, else CPU_BATCH_SIZE
    device: str = "auto"
    gpu: int = 0
    dtype: str = "auto"
    tp: int = 1
    max_tokens: int | None = None
    max_seq_len: int | None = None
    reverse: bool = False
    text_field: str = "text"
    limit: int | None = None
    token_budget: int | None = None  # None: from free GPU memory, or CPU_TOKEN_BUDGET on CPU
    checkpoint_docs: int = 5000
    checkpoint_seconds: float = 600.0
    attn_implementation: str | None = None  # e.g. "sdpa", "eager", "flash_attention_2"; None: the model's default
    progress: bool = True


@dataclass
class DeepResult:
    output: Path
    docs: int = 0  # documents computed in this run
    tokens: int = 0
    seconds: float = 0.0
    # Rank 0's batches alone (its forward passes and their bookkeeping): on a GPU, start-up (imports, CUDA,
    # tokenizing, loading the model) can take longer than the batches themselves.
    batch_seconds: float = 0.0
    batch_tokens: int = 0
    skipped: list = field(default_factory=list)  # (input row, token count)
    nothing_to_do: bool = False



def _check_output(output: Path, inputs, model_dir: Path) -> None:
    """A writable ``.npy`` path that is none of the inputs (a .jsonl named as the output would be replaced by the
    array) and outside the model folder."""
    if output.is_dir():
        raise UserError(f"--output {output}: is a folder; give a .npy file path")
    check_plain_output(output, "--output")
    check_outside_model_dir(output, model_dir)
    if output.suffix.lower() != ".npy":
        raise UserError(f"--output {output}: the deep embeddings are a NumPy array; give a name ending in .npy")
    written = files_written(output)
    for given in inputs:
        for source in glob.glob(str(given)) or [given]:  # an input may be a pattern
            if same_file(Path(source), output):
                raise UserError(f"--output {output} is the input file {source}; choose another output path")
            taken = [path for path in written if same_file(Path(source), path)]
            if taken or (Path(source).absolute().parent == output.absolute().parent
                         and re.fullmatch(rf"{re.escape(output.name)}\.rank\d+\.partial\..+", Path(source).name)):
                raise UserError(f"--input {source} is also a file this run writes beside --output {output} (its "
                                "cache, checkpoint or token cache); choose another --output")
    _check_replaceable(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--output {output}: folder not writable ({exc.strerror or exc})") from None
    if not output.is_file():  # (one there may hold every row already: a read-only folder is then no error)
        check_output_writable(output)


def check_output_writable(output: Path) -> None:
    """Before any work that writes beside ``output``: one line, not a failure hours later."""
    try:
        with tempfile.NamedTemporaryFile(dir=output.parent, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise EveryRankError(f"--output {output}: folder not writable ({exc.strerror or exc})") from None


def files_written(output: Path) -> list[Path]:
    """The files a run writing ``output`` writes beside it (a rank's checkpoints besides: ``OUTPUT.rankN.partial.*``):
    an input of one of these names would be overwritten (a reviewer's deep.cache.json was, and the run exited 0)."""
    from ..caches import files_for
    from .checkpoint import partial_paths, resumed_path, rows_path, skipped_path
    from .tokens import token_cache_files

    checkpoint = partial_paths(output, distributed.DistContext())
    return [path for files in (files_for(output), token_cache_files(output))
            for path in (files.data, files.fingerprints, files.marker, *files.extras.values())] + \
        [*checkpoint, rows_path(checkpoint[2]), resumed_path(output), skipped_path(output)]


def _check_replaceable(output: Path) -> None:
    """An existing ``.npy`` is replaced only where it can be this script's output: a curate run's files (a cache, its
    fingerprints, the labels or order) would be lost or taken for deep embeddings. A plain N x D float array with
    no manifest, as the original toolkit wrote, is computed again and replaced, as there."""
    import json

    import numpy as np

    from ..caches import files_for

    if not output.exists():
        return
    if output.name.endswith(".fingerprints.npy"):
        raise UserError(f"--output {output} is a cache's fingerprints file; choose another path")
    try:
        key = json.loads(files_for(output).marker.read_text(encoding="utf-8")).get("key")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        key = None  # none, or a damaged one: the reuse step says so and computes the rows again
    if isinstance(key, dict) and "model" not in key:
        raise UserError(f"--output {output} is a cache of curate_dataset.py's ({key.get('kind', 'not deep embeddings')}); "
                        "choose another path")
    try:
        held = np.load(output, mmap_mode="r")
        shape, dtype = held.shape, held.dtype
    except (OSError, ValueError, EOFError, AttributeError):  # (empty: EOFError; an .npz so named: AttributeError)
        return  # unreadable: nothing to keep
    if len(shape) != 2 or dtype.kind != "f":
        raise UserError(f"--output {output} holds {'x'.join(map(str, shape)) or 'one'} {dtype} value(s), not "
                        "embeddings (a curate run's labels or order?); choose another path")


def check_config(config: DeepConfig) -> None:
    check_model_dir(Path(config.model_dir))  # what curate says of a missing path, a GGUF file or a GGUF folder
    if not (Path(config.model_dir) / "config.json").is_file():
        raise UserError(f"--model-dir {config.model_dir}: no config.json, not a Hugging Face model folder")
    if config.batch_size is not None and config.batch_size < 1:
        raise UserError(f"--batch-size {config.batch_size}: must be at least 1")
    for name in ("max_tokens", "max_seq_len", "limit", "token_budget"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} {value}: must be at least 1")
    if config.checkpoint_docs < 1:
        raise UserError(f"--checkpoint-docs {config.checkpoint_docs}: must be at least 1")
    if not config.checkpoint_seconds > 0:  # also NaN; inf means by documents only
        raise UserError(f"--checkpoint-seconds {config.checkpoint_seconds}: must be more than 0")
    if config.dtype not in DTYPES:
        raise UserError(f"--dtype {config.dtype}: expected one of {', '.join(DTYPES)}")
    if config.tp < 1:
        raise UserError(f"--tp {config.tp}: must be at least 1")
    if config.tp > 1:
        _check_heads_divisible(Path(config.model_dir), config.tp)
        if not distributed.launched_by_torchrun():
            raise UserError(f"--tp {config.tp} needs torchrun --nproc_per_node={config.tp} (or a multiple of "
                            f"{config.tp} for data parallel x tensor parallel; WORLD_SIZE is not set)")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world % config.tp:
            per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
            lower = per_node // config.tp * config.tp
            fits = " or ".join(f"--nproc_per_node={k}" for k in (lower, lower + config.tp) if k >= config.tp)
            raise UserError(f"--tp {config.tp} under torchrun with {world} processes: the process count must be a "
                            f"multiple of --tp (data-parallel groups of {config.tp} tensor-parallel ranks); "
                            f"use {fits}")
        if config.device == "cpu" and _gpu_visible():
            raise UserError(f"--tp {config.tp} with --device cpu on a machine with a GPU: transformers puts the "
                            "tensor-parallel shards on the GPU whatever --device says; use --device cuda, or hide "
                            "the GPUs (CUDA_VISIBLE_DEVICES= before torchrun)")
    inputs = config.input if isinstance(config.input, (list, tuple)) else [config.input]
    _check_output(Path(config.output), inputs, Path(config.model_dir))


def _gpu_visible() -> bool:
    from ..runtime import resolve_device

    return resolve_device("auto", 0) != "cpu"


def _check_heads_divisible(model_dir: Path, tp: int) -> None:
    """Tensor parallel splits attention heads across ranks: --tp must divide every head count."""
    import json

    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config) if "num_attention_heads" not in config else config
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads", heads)
    counts = {n for n in (heads, kv_heads) if isinstance(n, int)}
    if counts and any(n % tp for n in counts):
        fits = [d for d in range(2, math.gcd(*counts) + 1) if math.gcd(*counts) % d == 0]
        hint = f"e.g. --tp {fits[0]}" if fits else "this model cannot be split by heads"
        raise UserError(f"--tp {tp}: the model has {heads} attention heads and {kv_heads} key/value heads; "
                        f"tensor parallel needs a --tp that divides both ({hint})")


