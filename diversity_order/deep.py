"""Deep embeddings: mean of a Hugging Face model's last hidden layer over each document's tokens.

Each document becomes the L2-normalised mean of the base model's ``last_hidden_state`` over
its real (non-pad) tokens, accumulated in float32, saved as a float32 N x D ``.npy`` in input
order (the format ``curate_dataset.py --load-embeddings`` reads).

* Tokens: ``tokenizer.encode(text, add_special_tokens=False)``, exactly as the shallow path
  (no BOS/EOS), truncated to ``min(--max-tokens, --max-seq-len)``. ``--max-seq-len`` defaults
  to the model's ``max_position_embeddings``: a longer document is truncated to it (and the
  number of truncated documents is logged), since positions past it are untrained.
* Order: documents are processed sorted by token count (ascending; ``--reverse`` longest
  first) in right-padded batches with an attention mask. With right padding and causal
  attention a real token never sees a pad, so a document's vector depends only on itself
  (the tests check padded batch == one at a time, cosine > 0.9999 in float32).
* Batch size: the most documents whose count x longest length fits a token budget (from 70%
  of free accelerator memory on GPU, a fixed default on CPU), capped by ``--batch-size``.
* Out of memory: several documents -> the budget shrinks to 60% of the failed batch and the
  batch is retried; one document -> it is skipped (NaN row, listed with its length in
  ``OUTPUT.skipped.json`` and the log). The budget grows back 10% per successful batch.
* Resume: ``OUTPUT.partial.npy`` (rows so far) and ``OUTPUT.partial.done.npy`` (done mask,
  written after the data) are checkpointed atomically every ``checkpoint_docs`` documents or
  ``checkpoint_seconds``; ``OUTPUT.partial.json`` keys them to the data, the model and the
  settings (a mismatch starts over, with a warning). A rerun computes only the missing rows;
  skipped rows are retried. An OUTPUT already holding every record, in order, means nothing
  to do.
* Incremental: the output is written with ``OUTPUT.fingerprints.npy`` (each row's text
  fingerprint) and ``OUTPUT.cache.json`` (model, tokenizer, dtype, truncation, text field;
  written last), as in ``caches``. A rerun reuses every row whose text is unchanged, wherever
  it moved, and computes only new or edited records (and earlier NaN rows); the file follows
  the new input order. Another model, dtype, truncation or text field recomputes all rows (the
  log says why); an OUTPUT without the sidecars is recomputed with a warning.
* Tokens: each document is tokenized once per run and only if it is to be embedded; the ids
  are cached beside the output (``OUTPUT.tokens.{ids,lengths,full_lengths,fingerprints}.npy``,
  marker ``OUTPUT.tokens.json`` written last) keyed by text fingerprint, tokenizer, text field
  and truncation, so a resumed or repeated run tokenizes only unseen texts.
* torchrun (data parallel): every rank takes a contiguous run of the length-sorted documents,
  balanced by tokens, checkpoints its own ``OUTPUT.rank{r}.partial.*``, and rank 0 gathers
  and writes the output.
* torchrun with ``--tp N`` (tensor parallel): the WORLD_SIZE processes form WORLD_SIZE / N
  data-parallel groups of N consecutive ranks (a ("dp", "tp") device mesh), so a group stays
  inside a node when ``--nproc_per_node`` is a multiple of N. Each group holds one copy of
  the model sharded over its N ranks, which run the same batches in lockstep (their
  out-of-memory decisions and checkpoint state agreed within the group); the groups split the
  documents as data-parallel ranks do, the group's first rank checkpoints its share
  (``OUTPUT.rank{g}.partial.*`` for group g; ``OUTPUT.partial.*`` when there is one group),
  and rank 0 gathers the groups' rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import caches, distributed
from .atomic import remove_stale_temps, save_json, save_npy
from .errors import UserError
from .records import RecordIndex, iter_text_batches, scan_jsonl

log = logging.getLogger(__name__)

DTYPES = ("auto", "float32", "bfloat16", "float16")
CPU_TOKEN_BUDGET = 16384  # tokens per forward pass on CPU (documents x longest length)
GPU_MEMORY_FRACTION = 0.7
OOM_SHRINK = 0.6
SUCCESS_GROWTH = 1.1
TOKENIZE_CHUNK_DOCS = 4096  # documents read and tokenized together, in processing order

# forward(model, input_ids, attention_mask) -> last hidden state (batch x length x hidden).
ForwardFn = Callable[..., "object"]


@dataclass
class DeepConfig:
    input: Path
    output: Path
    model_dir: Path
    batch_size: int = 64
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
    skipped: list = field(default_factory=list)  # (input row, token count)
    nothing_to_do: bool = False


def default_forward(model, input_ids, attention_mask):
    return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def partial_paths(output: Path, ctx: distributed.DistContext) -> tuple[Path, Path, Path]:
    stem = f"{output.name}.rank{ctx.rank}.partial" if ctx.active else f"{output.name}.partial"
    base = output.parent / stem
    return Path(f"{base}.npy"), Path(f"{base}.done.npy"), Path(f"{base}.json")


def skipped_path(output: Path) -> Path:
    return output.parent / f"{output.name}.skipped.json"


# ----------------------------------------------------------------------------- validation

def _check_output_writable(output: Path) -> None:
    if output.is_dir():
        raise UserError(f"--output {output}: is a folder; give a .npy file path")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=output.parent, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise UserError(f"--output {output}: folder not writable ({exc.strerror or exc})") from None


def _check_config(config: DeepConfig) -> None:
    if not Path(config.model_dir).is_dir():
        raise UserError(f"--model-dir {config.model_dir}: folder not found")
    if not (Path(config.model_dir) / "config.json").is_file():
        raise UserError(f"--model-dir {config.model_dir}: no config.json, not a Hugging Face model folder")
    if config.batch_size < 1:
        raise UserError(f"--batch-size {config.batch_size}: must be at least 1")
    for name in ("max_tokens", "max_seq_len", "limit", "token_budget"):
        value = getattr(config, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} {value}: must be at least 1")
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
    _check_output_writable(Path(config.output))


def _check_heads_divisible(model_dir: Path, tp: int) -> None:
    """Tensor parallel splits attention heads across ranks: --tp must divide every head count."""
    import json

    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config) if "num_attention_heads" not in config else config
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads", heads)
    counts = {n for n in (heads, kv_heads) if isinstance(n, int)}
    if counts and any(n % tp for n in counts):
        import math

        fits = [d for d in range(2, math.gcd(*counts) + 1) if math.gcd(*counts) % d == 0]
        hint = f"e.g. --tp {fits[0]}" if fits else "this model cannot be split by heads"
        raise UserError(f"--tp {tp}: the model has {heads} attention heads and {kv_heads} key/value heads; "
                        f"tensor parallel needs a --tp that divides both ({hint})")


def _torch_dtype(name: str, device):
    import torch

    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def load_model(model_dir: Path, dtype, device, tensor_parallel: bool = False, attn_implementation: str | None = None,
               mesh=None, progress: bool = True):
    """The base model (no LM head): its output carries ``last_hidden_state``.

    With ``tensor_parallel`` (under torchrun) transformers' ``tp_plan="auto"`` shards the
    weights over the ranks; every rank then gets the full hidden states. With ``mesh`` (a
    ("dp", "tp") DeviceMesh: data parallel x tensor parallel) they are sharded over this
    rank's "tp" group only, and each data-parallel group holds its own copy.
    """
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if not (progress and sys.stderr.isatty()):  # its "Loading weights" bar would fill log files
        hf_logging.disable_progress_bar()
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if tensor_parallel:
        try:  # newer transformers take the plan in a DistributedConfig; older ones as tp_plan=
            from transformers import DistributedConfig

            # Under dp x tp the size must be given: from the plan alone it would be WORLD_SIZE.
            sizes = {"tp_size": mesh["tp"].size()} if mesh is not None else {}
            extra["distributed_config"] = DistributedConfig(tp_plan="auto", **sizes)
        except ImportError:
            extra["tp_plan"] = "auto"
    if mesh is not None:
        extra["device_mesh"] = mesh  # from_pretrained's own argument (a mesh with a "tp" dimension)
    try:
        with _sharding_on(mesh, device) if mesh is not None else contextlib.nullcontext():
            model = AutoModel.from_pretrained(str(model_dir), dtype=dtype, local_files_only=True, **extra)
    except Exception as exc:  # transformers raises many types for a bad folder
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = "load a Hugging Face model with tp_plan='auto' (tensor parallel)" if tensor_parallel else \
            "load a Hugging Face model"
        raise UserError(f"--model-dir {model_dir}: cannot {what} ({first})") from None
    # Only models that read token ids have a per-token last hidden state to pool (decoders and
    # text encoders); a vision or audio model loads too, but cannot embed text.
    if getattr(model.config, "vocab_size", None) is None or model.get_input_embeddings() is None:
        raise UserError(f"--model-dir {model_dir}: {type(model).__name__} is not a text model "
                        f"(no token-embedding table); use a causal LM or a text encoder")
    if mesh is not None:
        _check_sharded_on(model, mesh["tp"])
    return (model if tensor_parallel else model.to(device)).eval()


@contextlib.contextmanager
def _sharding_on(mesh, device):
    """While open, transformers' from_pretrained shards over ``mesh["tp"]``, not the whole world.

    transformers 5.x ignores ``from_pretrained(device_mesh=)`` as soon as a distributed_config
    (or tp_plan) is given: it builds its own (pp, dp_replicate, fsdp, tp) mesh over every
    process in ``transformers.distributed.mixin.initialize_distributed_mesh``, which refuses a
    tp size smaller than WORLD_SIZE (and without a distributed_config nothing is sharded at
    all). Here that function hands back our mesh instead, seen under the names transformers
    expects: (pp=1, dp_replicate=dp, fsdp=1, tp), the same ranks and process groups. Nothing
    is patched where that function is missing (other transformers versions): they get
    ``device_mesh=`` only, and ``_check_sharded_on`` refuses a model sharded elsewhere.
    """
    try:
        from transformers.distributed import mixin
        from transformers.distributed.utils import TransformersDeviceMesh
    except ImportError:
        mixin = None
    original = getattr(mixin, "initialize_distributed_mesh", None)
    if original is None:
        yield
        return
    dp, tp = mesh["dp"].size(), mesh["tp"].size()
    if hasattr(mesh, "_unflatten"):  # a view of our mesh: its "tp" process groups are reused
        dense = mesh._unflatten("dp", (1, dp, 1), ("pp", "dp_replicate", "fsdp"))
    else:
        from torch.distributed.device_mesh import init_device_mesh

        dense = init_device_mesh(mesh.device_type, (1, dp, 1, tp), mesh_dim_names=("pp", "dp_replicate", "fsdp", "tp"))

    def initialize(config):
        if (config.tp_size, config.pp_size, config.dp_size, config.ep_size) != (tp, 1, 1, 1):
            return original(config)
        # Experts are only sharded when ep_size > 1, so the expert view is never read here.
        return device, TransformersDeviceMesh(dense, dense)

    mixin.initialize_distributed_mesh = initialize
    try:
        yield
    finally:
        mixin.initialize_distributed_mesh = original


def _check_sharded_on(model, tp_mesh) -> None:
    """Refuse a model whose weights are not sharded over exactly the ranks of ``tp_mesh``."""
    import transformers
    from torch.distributed.tensor import DTensor

    want = sorted(tp_mesh.mesh.flatten().tolist())
    sharded = next((p for p in model.parameters() if isinstance(p, DTensor)), None)
    got = sorted(sharded.device_mesh.mesh.flatten().tolist()) if sharded is not None else None
    if got != want:
        where = "not sharded at all" if got is None else f"sharded over ranks {got}"
        raise UserError(f"--tp {len(want)}: transformers {transformers.__version__} loaded the model {where}, not "
                        f"over this tensor-parallel group (ranks {want}); data parallel x tensor parallel was written "
                        f"for transformers 5.23; with this one run --nproc_per_node={len(want)}")


def _config_max_positions(model_dir: Path) -> int | None:
    """``max_position_embeddings`` from config.json (the text part of a multimodal config)."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--model-dir {model_dir}: config.json unreadable ({exc})") from None
    if not isinstance(config, dict):
        return None
    value = config.get("max_position_embeddings")
    if value is None and isinstance(config.get("text_config"), dict):
        value = config["text_config"].get("max_position_embeddings")
    return int(value) if isinstance(value, int) and value > 0 else None


def _model_fingerprint(model_dir: Path) -> str:
    """Hash of config.json and the weight files' names and sizes (cheap, no reading weights)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.iterdir()):
        if path.suffix in (".safetensors", ".bin", ".pt", ".json") and path.is_file():
            digest.update(f"{path.name}:{path.stat().st_size};".encode())
    return digest.hexdigest()


# ----------------------------------------------------------------------------- tokens

def tokenize_rows(index: RecordIndex, rows: np.ndarray, tokenizer, max_len: int | None,
                  progress: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids of ``rows`` (ascending; each tokenized once): flat ids truncated to ``max_len``
    (int32), each row's kept length and its untruncated length, in the order of ``rows``."""
    rows = np.sort(np.asarray(rows, dtype=np.int64))
    pieces: list[np.ndarray] = []
    lengths = np.zeros(rows.size, dtype=np.int64)
    full = np.zeros(rows.size, dtype=np.int64)
    bar = _bar(int(rows.size), "Tokenizing", "doc", progress)
    done = 0
    for batch_rows, texts in iter_text_batches(index, rows, max_batch_rows=TOKENIZE_CHUNK_DOCS):
        flat, counts = tokenizer.encode_batch(texts)
        kept = counts if max_len is None else np.minimum(counts, max_len)
        if max_len is not None and (kept < counts).any():
            starts = np.cumsum(counts) - counts
            flat = np.concatenate([flat[s : s + k] for s, k in zip(starts.tolist(), kept.tolist())] or [flat[:0]])
        pieces.append(flat.astype(_ID_DTYPE, copy=False))
        # iter_text_batches yields rows in the order asked for, so positions are consecutive.
        lengths[done : done + len(batch_rows)] = kept
        full[done : done + len(batch_rows)] = counts
        done += len(batch_rows)
        if bar is not None:
            bar.update(len(batch_rows))
    if bar is not None:
        bar.close()
    flat_all = np.concatenate(pieces) if pieces else np.zeros(0, dtype=_ID_DTYPE)
    return flat_all, lengths, full


_ID_DTYPE = np.int32  # token ids; every tokenizer in use has far fewer than 2**31 entries


@dataclass
class Tokens:
    """Token ids of the current records (those loaded), indexed by input row."""

    flat: np.ndarray  # ids of the loaded rows, concatenated (may be a memory map)
    starts: np.ndarray  # int64 per input row: offset in ``flat`` (-1: not loaded)
    lengths: np.ndarray  # int64 per input row: kept (truncated) token count
    full_lengths: np.ndarray  # int64 per input row: count before truncation
    tokenized: int = 0  # rows tokenized in this run (the rest came from the cache)

    def ids(self, row: int) -> np.ndarray:
        start = int(self.starts[row])
        return np.asarray(self.flat[start : start + int(self.lengths[row])])


def token_cache_paths(output: Path) -> dict[str, Path]:
    """``OUTPUT.tokens.*``: flat ids, kept and full lengths, text fingerprints, and the marker."""
    base = f"{output.name}.tokens"
    return {name: output.parent / f"{base}.{name}.npy" for name in ("ids", "lengths", "full_lengths", "fingerprints")} \
        | {"meta": output.parent / f"{base}.json"}


def _load_token_cache(output: Path, key: dict) -> tuple[dict | None, str]:
    paths = token_cache_paths(output)
    if not paths["meta"].exists():
        return None, "no token cache yet"
    try:
        meta = json.loads(paths["meta"].read_text())
        cache = {"fingerprints": np.load(paths["fingerprints"]), "lengths": np.load(paths["lengths"]),
                 "full_lengths": np.load(paths["full_lengths"]), "ids": np.load(paths["ids"], mmap_mode="r")}
    except (OSError, ValueError) as exc:
        return None, f"{paths['meta'].name}: token cache unreadable ({exc}); tokenizing again"
    if meta.get("key") != key:
        changed = sorted(k for k in set(key) | set(meta.get("key", {})) if key.get(k) != meta.get("key", {}).get(k))
        return None, f"{paths['meta'].name}: tokens were made with a different {', '.join(changed)}; tokenizing again"
    rows = meta.get("rows")
    if not (cache["fingerprints"].size == cache["lengths"].size == cache["full_lengths"].size == rows) \
            or cache["ids"].ndim != 1 or cache["ids"].size != int(cache["lengths"].sum()):
        return None, f"{paths['meta'].name}: token cache files disagree; tokenizing again"
    return cache, ""


def _store_token_cache(output: Path, key: dict, fingerprints: np.ndarray, flat: np.ndarray, lengths: np.ndarray,
                       full_lengths: np.ndarray) -> None:
    """Written atomically, the marker last: a crash mid-way leaves no trusted cache."""
    paths = token_cache_paths(output)
    paths["meta"].unlink(missing_ok=True)
    save_npy(paths["ids"], flat)
    save_npy(paths["lengths"], lengths.astype(np.int64))
    save_npy(paths["full_lengths"], full_lengths.astype(np.int64))
    save_npy(paths["fingerprints"], fingerprints.astype(np.uint64))
    save_json(paths["meta"], {"key": key, "rows": int(lengths.size), "ids": int(flat.size), "id_dtype": str(flat.dtype)})


def prepare_tokens(output: Path, key: dict, index: RecordIndex, fingerprints: np.ndarray, needed: np.ndarray,
                   tokenizer, max_len: int | None, progress: bool, writer: bool) -> Tokens:
    """Token ids of the ``needed`` rows: reused from ``OUTPUT.tokens.*`` where the text
    fingerprint (and tokenizer, text field, truncation) match, the rest tokenized once.

    The cache is rewritten (``writer`` only) when anything new was tokenized; it then keeps
    every current record it knows (old rows whose text is still in the input, plus the new).
    """
    n = fingerprints.size
    starts = np.full(n, -1, dtype=np.int64)
    lengths = np.zeros(n, dtype=np.int64)
    full = np.zeros(n, dtype=np.int64)
    cache, reason = _load_token_cache(output, key)
    if reason and cache is None and token_cache_paths(output)["meta"].exists():
        log.info("%s", reason)
    hit = np.zeros(n, dtype=bool)
    if cache is not None and cache["fingerprints"].size:
        c_fp = cache["fingerprints"]
        c_starts = np.cumsum(cache["lengths"]) - cache["lengths"]
        order = np.argsort(c_fp, kind="stable")
        pos = np.searchsorted(c_fp[order], fingerprints)
        clipped = np.minimum(pos, c_fp.size - 1)
        hit = (pos < c_fp.size) & (c_fp[order[clipped]] == fingerprints)
        src = order[clipped[hit]]
        starts[hit], lengths[hit], full[hit] = c_starts[src], cache["lengths"][src], cache["full_lengths"][src]
    missing = needed[~hit[needed]]
    if missing.size == 0:
        flat = cache["ids"] if cache is not None else np.zeros(0, dtype=_ID_DTYPE)
        if needed.size:
            log.info("Tokens of all %d document(s) to embed reused from %s", needed.size,
                     token_cache_paths(output)["meta"].name)
        return Tokens(flat, starts, lengths, full, tokenized=0)

    if needed.size > missing.size:
        log.info("Tokens: %d of %d document(s) reused from the cache, %d to tokenize",
                 needed.size - missing.size, needed.size, missing.size)
    new_flat, new_lengths, new_full = tokenize_rows(index, missing, tokenizer, max_len, progress)
    # The new cache: every current row known (cached or just tokenized), in input order.
    keep = hit.copy()
    keep[missing] = True
    keep_rows = np.flatnonzero(keep)
    new_starts = np.full(n, -1, dtype=np.int64)
    new_starts[missing] = np.cumsum(new_lengths) - new_lengths
    kept_lengths = lengths.copy()
    kept_lengths[missing], full[missing] = new_lengths, new_full
    out_lengths = kept_lengths[keep_rows]
    flat = np.zeros(int(out_lengths.sum()), dtype=_ID_DTYPE)
    out_starts = np.cumsum(out_lengths) - out_lengths
    from_new = np.zeros(n, dtype=bool)
    from_new[missing] = True
    for row, at, length in zip(keep_rows.tolist(), out_starts.tolist(), out_lengths.tolist()):
        if from_new[row]:
            s = int(new_starts[row])
            flat[at : at + length] = new_flat[s : s + length]
        else:
            s = int(starts[row])
            flat[at : at + length] = cache["ids"][s : s + length]
    starts = np.full(n, -1, dtype=np.int64)
    starts[keep_rows] = out_starts
    if writer:
        _store_token_cache(output, key, fingerprints[keep_rows], flat, out_lengths, full[keep_rows])
    return Tokens(flat, starts, kept_lengths, full, tokenized=int(missing.size))


# ----------------------------------------------------------------------------- partial files

class Partial:
    """This rank's rows, their vectors so far and the done mask, checkpointed atomically."""

    def __init__(self, output: Path, ctx: distributed.DistContext, rows: np.ndarray, dim: int, key: dict,
                 writer: bool = True):
        self.data_path, self.done_path, self.key_path = partial_paths(output, ctx)
        self.rows = rows  # input rows, ascending
        self.key = key
        self.writer = writer  # False: a tensor-parallel helper rank, which touches no files
        self.data = np.zeros((rows.size, dim), dtype=np.float32)
        self.done = np.zeros(rows.size, dtype=bool)
        if writer:
            self._load()

    def _load(self) -> None:
        if not self.key_path.exists():
            return
        try:
            stored = json.loads(self.key_path.read_text())
        except (OSError, ValueError):
            stored = None
        if stored != self.key:
            log.warning("%s: checkpoint is for other data, model or settings; starting over", self.key_path.name)
            self.remove()
            return
        try:
            data = np.load(self.data_path)
            done = np.load(self.done_path)
        except (OSError, ValueError):
            log.warning("%s: checkpoint unreadable or incomplete; starting over", self.data_path.name)
            return
        if data.shape != self.data.shape or done.shape != self.done.shape or data.dtype != np.float32:
            log.warning("%s: checkpoint has the wrong shape; starting over", self.data_path.name)
            return
        self.data, self.done = data.copy(), done.astype(bool)
        log.info("Resuming from %s: %d of %d rows already done", self.data_path.name, int(self.done.sum()), self.done.size)

    def start(self) -> None:
        if self.writer:
            save_json(self.key_path, self.key)

    def checkpoint(self) -> None:
        if not self.writer:
            return
        # Data before the mask: a crash in between leaves data newer than the mask, which is safe.
        save_npy(self.data_path, self.data)
        save_npy(self.done_path, self.done)

    def remove(self) -> None:
        if not self.writer:
            return
        for path in (self.data_path, self.done_path, self.key_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            remove_stale_temps(path)  # debris of a checkpoint write a killed run never finished


# ----------------------------------------------------------------------------- main loop

def _bar(total: int, desc: str, unit: str, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit=unit, leave=False, disable=None)


PROGRESS_LOG_SECONDS = 30


def _memory_text(device) -> str:
    import torch

    if device.type == "cuda":
        return f"GPU {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB"
    from .cli import peak_rss_mb

    return f"RSS {peak_rss_mb() / 1024:.1f} GiB"


def _log_progress(docs: int, total_docs: int, tokens: int, total_tokens: int, seconds: float, device) -> None:
    """One line with docs/s, tokens/s, ETA (from the token rate) and memory, for logs without a bar."""
    seconds = max(seconds, 1e-9)
    rate = tokens / seconds
    eta = (total_tokens - tokens) / rate if rate > 0 else float("nan")
    log.info("Deep embeddings: %d of %d documents (%.0f%%), %.1f docs/s, %s tokens/s, ETA %s, peak %s", docs,
             total_docs, 100 * docs / max(total_docs, 1), docs / seconds, f"{rate:,.0f}",
             f"{int(eta) // 3600}:{int(eta) % 3600 // 60:02d}:{int(eta) % 60:02d}" if eta == eta else "?",
             _memory_text(device))


def _initial_budget(config: DeepConfig, model, device, dtype) -> int:
    import torch

    if config.token_budget is not None:
        return int(config.token_budget)
    if device.type != "cuda":
        return CPU_TOKEN_BUDGET
    free, _ = torch.cuda.mem_get_info(device)
    cfg = model.config
    hidden = int(getattr(cfg, "hidden_size", 4096))
    inter = int(getattr(cfg, "intermediate_size", 4 * hidden) or 4 * hidden)
    elem = torch.tensor([], dtype=dtype).element_size()
    # Rough live activations per token in one layer (residual, attention, MLP) + float32 pooling.
    per_token = (6 * hidden + 3 * inter) * elem + 2 * hidden * 4
    return max(256, int(GPU_MEMORY_FRACTION * free / per_token))


class Embedder:
    """Runs length-sorted batches through the model, backing off on out-of-memory."""

    def __init__(self, model, device, batch_size: int, budget: int, forward: ForwardFn | None = None):
        self.model, self.device, self.batch_size = model, device, batch_size
        self.budget = budget
        # After an out-of-memory the budget grows back towards, never past, where it started:
        # without OOM the batches are then a fixed function of the order, hence reproducible.
        self.max_budget = budget
        self.forward = forward or default_forward

    def embed(self, docs: list[np.ndarray]):
        """Pooled, normalised float32 vectors of ``docs`` (all non-empty), one padded batch."""
        import torch

        longest = max(len(d) for d in docs)
        ids = torch.zeros((len(docs), longest), dtype=torch.long)
        mask = torch.zeros((len(docs), longest), dtype=torch.long)
        for i, doc in enumerate(docs):
            ids[i, : len(doc)] = torch.from_numpy(np.asarray(doc, dtype=np.int64))
            mask[i, : len(doc)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        with torch.inference_mode():
            hidden = self.forward(self.model, ids, mask)
            weights = mask.to(torch.float32).unsqueeze(-1)
            summed = (hidden.to(torch.float32) * weights).sum(dim=1)
            mean = summed / weights.sum(dim=1)
            vectors = torch.nn.functional.normalize(mean, dim=-1)
        return vectors.cpu().numpy().astype(np.float32, copy=False)

    def batch_count(self, lengths: np.ndarray) -> int:
        """Documents from the start of ``lengths`` that fit the budget (at least one)."""
        head = lengths[: self.batch_size]
        longest = np.maximum.accumulate(head)
        fits = np.arange(1, head.size + 1) * longest <= self.budget
        return max(1, int(np.argmin(fits)) if not fits.all() else head.size)


def _free_cache(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


def extract(config: DeepConfig, forward: ForwardFn | None = None) -> DeepResult:
    """Compute the deep embeddings of ``config.input`` into ``config.output``."""
    from . import cli

    config.output = Path(config.output)
    config.model_dir = Path(config.model_dir)
    _check_config(config)
    device = cli.resolve_device(config.device, config.gpu)
    ctx = distributed.init_from_env(device.type == "cuda")
    if ctx.active and device.type == "cuda":
        import torch

        device = torch.device(f"cuda:{ctx.local_rank}")
    try:
        layout = _Layout.of(ctx, config.tp, device)
        if ctx.active and config.tp > 1 and not layout.leader:
            # Tensor-parallel ranks do the same work as their group's first rank: only its log lines are worth reading.
            logging.getLogger("diversity_order").setLevel(logging.WARNING)
        return _extract(config, ctx, device, forward, layout)
    finally:
        distributed.shutdown(ctx)


def _existing_rows(output: Path) -> int | None:
    if not output.is_file():
        return None
    try:
        matrix = np.load(output, mmap_mode="r")
    except (OSError, ValueError):
        return None
    return int(matrix.shape[0]) if matrix.ndim == 2 else None


@dataclass(frozen=True)
class _Layout:
    """Where this process sits under torchrun: its data-parallel group and its rank in that
    group's tensor-parallel ranks. Group g is the consecutive ranks g*tp ... g*tp + tp - 1."""

    dp: int = 1
    tp: int = 1
    dp_rank: int = 0
    tp_rank: int = 0
    mesh: object = None  # DeviceMesh ("dp", "tp"): only when there are several groups of tp > 1 ranks

    @classmethod
    def of(cls, ctx: distributed.DistContext, tp: int, device) -> _Layout:
        if not ctx.active or tp == 1:
            return cls(dp=ctx.world_size, dp_rank=ctx.rank)
        dp = ctx.world_size // tp
        mesh = None
        if dp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
        return cls(dp, tp, ctx.rank // tp, ctx.rank % tp, mesh)

    @property
    def leader(self) -> bool:
        """The group's first rank: it alone reads and writes the group's checkpoint and sends its rows."""
        return self.tp_rank == 0

    def data_ctx(self, ctx: distributed.DistContext) -> distributed.DistContext:
        """The data-parallel context (shares, per-group files, gathering), with groups as ranks."""
        if self.tp == 1:
            return ctx
        return distributed.DistContext(self.dp_rank, self.dp, ctx.local_rank) if self.dp > 1 else distributed.DistContext()

    def group(self, dim: str):
        """The process group of this rank's ``dim`` ("dp" or "tp") row of the mesh; None: the world."""
        return self.mesh[dim].get_group() if self.mesh is not None else None


class _TensorParallelGroup:
    """Under --tp every rank of a group runs the same batches; these keep their decisions identical.

    ``group``: the tensor-parallel process group (None: the whole world, when it is the only group)."""

    def __init__(self, ctx: distributed.DistContext, device, group=None):
        self.active = ctx.active
        self.device = device
        self.group = group

    def _reduce(self, value: int, op) -> int:
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(tensor, op=op, group=self.group)
        return int(tensor.item())

    def min(self, value: int) -> int:
        import torch.distributed as dist

        return self._reduce(value, dist.ReduceOp.MIN) if self.active else value

    def any(self, flag: bool) -> bool:
        import torch.distributed as dist

        return bool(self._reduce(int(flag), dist.ReduceOp.MAX)) if self.active else flag

    def broadcast(self, array: np.ndarray) -> np.ndarray:
        if not self.active:
            return array
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.ascontiguousarray(array).astype(np.uint8)).to(self.device)
        src = 0 if self.group is None else dist.get_global_rank(self.group, 0)
        dist.broadcast(tensor, src=src, group=self.group)
        return tensor.cpu().numpy().astype(array.dtype)


def _extract(config: DeepConfig, ctx: distributed.DistContext, device, forward,
             layout: _Layout | None = None) -> DeepResult:
    from .tokenizer import DocumentTokenizer

    layout = layout or _Layout.of(ctx, config.tp, device)
    tensor_parallel = config.tp > 1
    tp_group = _TensorParallelGroup(ctx if tensor_parallel else distributed.DistContext(), device, layout.group("tp"))
    # Under --tp the ranks of a group share one model and process their documents together; the
    # data-parallel context (shares, per-rank files, gathering) counts groups, not ranks (the
    # trivial one for a single group), and the group's first rank reads and writes its files.
    data_ctx = layout.data_ctx(ctx)
    if ctx.is_main and tensor_parallel and layout.dp > 1:
        log.info("%d processes: %d data-parallel groups x tensor parallel %d", ctx.world_size, layout.dp, layout.tp)
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", ctx.world_size))
        if per_node % layout.tp:
            log.warning("--nproc_per_node=%d is not a multiple of --tp %d: some tensor-parallel groups span two nodes",
                        per_node, layout.tp)

    started = time.perf_counter()
    result = DeepResult(output=config.output)
    progress = config.progress and ctx.is_main
    index = scan_jsonl(config.input, config.text_field, progress=progress)
    n = len(index) if config.limit is None else min(config.limit, len(index))
    fingerprints = index.fingerprints[:n]

    tokenizer = DocumentTokenizer(config.model_dir)
    dtype = _torch_dtype(config.dtype, device)
    max_seq_len = config.max_seq_len or _config_max_positions(config.model_dir)
    limits = [v for v in (config.max_tokens, max_seq_len) if v]
    max_len = min(limits) if limits else None
    output_key = {
        "version": 1,
        "model": _model_fingerprint(config.model_dir),
        "tokenizer": tokenizer.fingerprint,
        "dtype": str(dtype),
        "max_len": max_len,
        "text_field": config.text_field,
    }

    # Incremental: rows of an existing OUTPUT whose text fingerprint matches are reused wherever
    # they moved; only new or edited records (and earlier NaN rows) are computed.
    found = caches.lookup(config.output, output_key, fingerprints)
    reused = found.hit.copy()
    if found.data is not None:
        reused &= np.isfinite(found.data.reshape(n, -1)).all(axis=1)
    needed = np.flatnonzero(~reused)
    if ctx.is_main and config.output.exists():
        if reused.any():
            log.info("%s: %d of %d rows reused, %d to compute", config.output.name, int(reused.sum()), n, needed.size)
        else:
            log.warning("%s", found.reason)
    if needed.size == 0 and found.data is not None:
        fp_path, _ = caches.sidecar_paths(config.output)
        same_order = _existing_rows(config.output) == n and np.array_equal(np.load(fp_path), fingerprints)
        if same_order:
            log.info("%s already holds all %d rows: nothing to do (delete it to recompute)", config.output, n)
            result.nothing_to_do = True
        elif ctx.is_main:
            caches.store(config.output, output_key, fingerprints, found.data)
            log.info("%s: all %d rows reused, rewritten in the new input order", config.output, n)
        distributed.barrier(ctx)
        result.seconds = time.perf_counter() - started
        return result

    # Tokens: read from (or added to) the cache beside the output; rank 0 writes it first.
    token_key = {"version": 1, "tokenizer": tokenizer.fingerprint, "text_field": config.text_field,
                 "max_len": max_len}
    if ctx.active and not ctx.is_main:
        distributed.barrier(ctx)
    doc_tokens = prepare_tokens(config.output, token_key, index, fingerprints, needed, tokenizer, max_len, progress,
                            writer=ctx.is_main)
    if ctx.active and ctx.is_main:
        distributed.barrier(ctx)
    lengths = doc_tokens.lengths
    truncated = int((doc_tokens.full_lengths[needed] > lengths[needed]).sum())
    if truncated and ctx.is_main:
        log.info("%d document(s) truncated to %d tokens", truncated, max_len)

    model = load_model(config.model_dir, dtype, device, tensor_parallel, config.attn_implementation, layout.mesh,
                       progress)
    dim = int(model.config.hidden_size)

    # Processing order: by length (stable, so ties keep input order); shares are contiguous.
    order = needed[np.argsort(lengths[needed], kind="stable")]
    if config.reverse:
        order = order[::-1].copy()
    share = distributed.my_share(data_ctx, order, lengths[order])
    rows = np.sort(share)

    key = output_key | {
        "records": n,
        "data": hashlib.blake2b(fingerprints.tobytes(), digest_size=16).hexdigest(),
        "rows": hashlib.blake2b(rows.tobytes(), digest_size=16).hexdigest(),
        "dim": dim,
    }
    partial = Partial(config.output, data_ctx, rows, dim, key, writer=layout.leader)
    partial.done = tp_group.broadcast(partial.done)  # --tp: the group leader's checkpoint decides for all
    partial.start()
    position = {int(r): i for i, r in enumerate(rows.tolist())}

    todo = np.asarray([r for r in share.tolist() if not partial.done[position[r]]], dtype=np.int64)
    empty = todo[lengths[todo] == 0]
    for row in empty.tolist():
        log.warning("record %d (line %d) has no tokens: its vector is all zeros", row, int(index.line_numbers[row]))
        partial.data[position[row]] = 0.0
        partial.done[position[row]] = True
    todo = todo[lengths[todo] > 0]

    budget = tp_group.min(_initial_budget(config, model, device, dtype))
    embedder = Embedder(model, device, config.batch_size, budget, forward)
    who = f"Rank {ctx.rank}" if layout.mesh is None else \
        f"Data-parallel group {layout.dp_rank} (ranks {ctx.rank}-{ctx.rank + layout.tp - 1})"
    log.info("%s: %d document(s) to embed (%d tokens) on %s in %s; token budget %d per batch",
             who, todo.size, int(lengths[todo].sum()), device, dtype, budget)

    bar = _bar(int(todo.size), "Deep embeddings", "doc", progress)
    since_checkpoint, last_checkpoint = 0, time.monotonic()
    last_progress_log = time.monotonic()
    try:
        # Batches are cut greedily over the whole to-do list (never at tokenization chunks), so
        # a resumed run, starting where a finished batch ended, cuts the same batches again.
        todo_lengths = lengths[todo]
        pos = 0
        while pos < todo.size:
            count = embedder.batch_count(todo_lengths[pos:])
            batch = todo[pos : pos + count]
            try:
                vectors = embedder.embed([doc_tokens.ids(int(r)) for r in batch.tolist()])
                failed = False
            except Exception as exc:  # noqa: BLE001 - only out-of-memory is handled
                if not is_oom(exc):
                    raise
                failed = True
            if tp_group.any(failed):  # --tp: one rank out of memory -> every rank backs off alike
                _free_cache(device)
                if count > 1:
                    used = count * int(todo_lengths[pos : pos + count].max())
                    embedder.budget = max(1, int(min(embedder.budget, used) * OOM_SHRINK))
                    log.debug("out of memory on %d docs; token budget now %d", count, embedder.budget)
                    continue
                row = int(batch[0])
                log.warning("record %d (%d tokens) does not fit in memory even alone: skipped (NaN row)",
                            row, int(lengths[row]))
                partial.data[position[row]] = np.nan
                result.skipped.append((row, int(lengths[row])))
                pos += 1
                if bar is not None:
                    bar.update(1)
                continue
            for row, vector in zip(batch.tolist(), vectors):
                partial.data[position[row]] = vector
                partial.done[position[row]] = True
            embedder.budget = min(embedder.max_budget, max(embedder.budget + 1, int(embedder.budget * SUCCESS_GROWTH)))
            pos += count
            tokens = int(todo_lengths[pos - count : pos].sum())
            result.docs += count
            result.tokens += tokens
            since_checkpoint += count
            if bar is not None:
                bar.update(count)
                elapsed = max(time.perf_counter() - started, 1e-9)
                bar.set_postfix_str(f"{result.tokens / elapsed:,.0f} tok/s, {_memory_text(device)}", refresh=False)
            if ctx.is_main and (bar is None or bar.disable) and time.monotonic() - last_progress_log >= PROGRESS_LOG_SECONDS:
                last_progress_log = time.monotonic()  # no bar drawn (log file, --no-progress): a line instead
                _log_progress(result.docs, int(todo.size), result.tokens, int(todo_lengths.sum()),
                              time.perf_counter() - started, device)
            if since_checkpoint >= config.checkpoint_docs or time.monotonic() - last_checkpoint >= config.checkpoint_seconds:
                partial.checkpoint()
                since_checkpoint, last_checkpoint = 0, time.monotonic()
    except BaseException:
        if result.docs:
            with contextlib.suppress(Exception):
                partial.checkpoint()
        raise
    finally:
        if bar is not None:
            bar.close()

    # Rows skipped for memory are NaN here and not marked done, so a rerun retries them.
    comm_device = device if device.type == "cuda" else None

    def gather(array: np.ndarray):
        # Each group's first rank sends (the others hold the same rows, without the resumed ones),
        # over the process group of the groups' first ranks, where rank 0 receives.
        return distributed.gather_to_main(data_ctx, array, comm_device, layout.group("dp")) if layout.leader else None

    parts = gather(partial.rows)
    datas = gather(partial.data)
    skipped_local = np.asarray(result.skipped, dtype=np.int64).reshape(-1, 2)
    skipped_all = gather(skipped_local)
    if ctx.is_main:
        embeddings = np.full((n, dim), np.nan, dtype=np.float32)
        if found.data is not None and found.data.shape[1:] == (dim,):
            embeddings[reused] = found.data[reused]
        for part_rows, part_data in zip(parts, datas):
            embeddings[part_rows] = part_data
        skipped = sorted(tuple(int(v) for v in pair) for block in skipped_all for pair in block)
        # The output with its fingerprint sidecars (OUTPUT.fingerprints.npy, OUTPUT.cache.json).
        caches.store(config.output, output_key, fingerprints, embeddings)
        sidecar = skipped_path(config.output)
        if skipped:
            save_json(sidecar, {"skipped": [{"index": r, "tokens": t} for r, t in skipped],
                                "reason": "out of memory even as a single document; the row is NaN"})
            log.warning("%d document(s) skipped for memory (NaN rows), listed in %s: %s", len(skipped),
                        sidecar.name, ", ".join(f"{r} ({t} tokens)" for r, t in skipped[:20]))
        else:
            with contextlib.suppress(FileNotFoundError):
                sidecar.unlink()
        result.skipped = skipped
    distributed.barrier(ctx)
    partial.remove()
    if data_ctx.active:
        totals = gather(np.asarray([[result.docs, result.tokens]], dtype=np.int64))
        if ctx.is_main:
            result.docs, result.tokens = (int(v) for v in np.concatenate(totals).sum(axis=0))
    result.seconds = time.perf_counter() - started
    if ctx.is_main:
        log.info("Deep embeddings: %d docs, %d tokens in %.1f s (%.0f tokens/s), %d skipped -> %s (%d x %d)",
                 result.docs, result.tokens, result.seconds, result.tokens / max(result.seconds, 1e-9),
                 len(result.skipped), config.output, n, dim)
    return result
