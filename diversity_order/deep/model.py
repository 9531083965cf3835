"""The model of deep extraction: loading it (also sharded for tensor parallel), its forward pass,
and what identifies it (a fingerprint for caches, its longest context)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .. import matrix
from ..errors import UserError

log = logging.getLogger("diversity_order.deep")

# forward(model, input_ids, attention_mask) -> last hidden state (batch x length x hidden).
ForwardFn = Callable[..., "object"]


def default_forward(model, input_ids, attention_mask):
    return model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def torch_dtype(name: str, device):
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
    if mesh is not None and _mesh_builder()[1] is None:
        # Said before loading: such a transformers fails inside from_pretrained with a message about sizes.
        raise _dp_x_tp_unsupported(mesh["tp"].size(), "cannot shard a model over part of the processes")
    # Loading takes from seconds to many minutes with no output of its own in a log file: say when
    # it starts and how long it took (the first rank only: under torchrun every rank loads).
    speaks = _first_rank()
    if speaks:
        log.info("Loading the model from %s (%s on %s%s) ...", model_dir, str(dtype).replace("torch.", ""),
                 device, ", tensor parallel" if tensor_parallel else "")
    started = time.perf_counter()
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
    model = (model if tensor_parallel else model.to(device)).eval()
    if speaks:
        log.info("Model loaded in %.1f s: %s, %.0fM parameters, hidden size %s", time.perf_counter() - started,
                 type(model).__name__, sum(p.numel() for p in model.parameters()) / 1e6,
                 getattr(model.config, "hidden_size", "?"))
    return model


def _first_rank() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


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
    mixin, original = _mesh_builder()
    if original is None:
        yield
        return
    from transformers.distributed.utils import TransformersDeviceMesh

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


def _mesh_builder():
    """(transformers' module, its mesh builder that ``_sharding_on`` replaces); (None, None) where this
    transformers has none (5.17 has none: it refuses a tp size below WORLD_SIZE while loading)."""
    try:
        from transformers.distributed import mixin
    except ImportError:
        return None, None
    return mixin, getattr(mixin, "initialize_distributed_mesh", None)


def _dp_x_tp_unsupported(tp: int, what: str) -> UserError:
    import transformers

    return UserError(f"--tp {tp}: transformers {transformers.__version__} {what}; data parallel x tensor parallel was "
                     f"written for transformers 5.23; with this one run --nproc_per_node={tp}")


def _check_sharded_on(model, tp_mesh) -> None:
    """Refuse a model whose weights are not sharded over exactly the ranks of ``tp_mesh``."""
    from torch.distributed.tensor import DTensor

    want = sorted(tp_mesh.mesh.flatten().tolist())
    sharded = next((p for p in model.parameters() if isinstance(p, DTensor)), None)
    got = sorted(sharded.device_mesh.mesh.flatten().tolist()) if sharded is not None else None
    if got != want:
        where = "not sharded at all" if got is None else f"sharded over ranks {got}"
        raise _dp_x_tp_unsupported(len(want), f"loaded the model {where}, not over this tensor-parallel group "
                                              f"(ranks {want})")


def config_max_positions(model_dir: Path) -> int | None:
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


# Files of a model folder whose content decides the vectors: the weights the loader reads, and
# every small file beside them (config.json, tokenizer files, weight index). Bigger files that are
# not those weights (other frameworks' weights, ONNX, GGUF, unused .bin next to .safetensors) are
# never read by AutoModel.from_pretrained, so they are not hashed.
SMALL_FILE_BYTES = 64 << 20
NOT_MODEL_FILES = (".md", ".png", ".jpg", ".jpeg", ".gif", ".gitattributes")
TORCH_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt")
_LFS_BLOB = re.compile(r"[0-9a-f]{64}")


def fingerprint_files(model_dir: Path) -> list[Path]:
    """The files ``model_fingerprint`` hashes, sorted by name."""
    files = [p for p in model_dir.iterdir() if p.is_file() and not p.name.startswith(".")
             and not p.name.endswith(NOT_MODEL_FILES) and not p.name.upper().startswith("LICENSE")]
    # transformers prefers safetensors; only without them does it read the torch pickles.
    weights = (".safetensors",) if any(p.suffix == ".safetensors" for p in files) else TORCH_WEIGHTS
    return sorted((p for p in files if p.suffix in weights or p.stat().st_size <= SMALL_FILE_BYTES),
                  key=lambda p: p.name)


def _cached_blob_digest(path: Path) -> str | None:
    """The sha256 a Hugging Face cache snapshot already carries, where it can be trusted.

    In a hub cache, ``snapshots/<rev>/NAME`` is a symlink to ``blobs/<sha256 of the content>``
    for large (LFS) files. The name stays if the blob is later written through the link (a
    fine-tune saved into the snapshot), so it is only trusted when the blob is no newer than its
    link: the hub writes the blob first, then links it. Anything else is hashed.
    """
    if not path.is_symlink():
        return None
    blob = path.resolve()
    if blob.parent.name != "blobs" or not _LFS_BLOB.fullmatch(blob.name):
        return None
    return blob.name if blob.stat().st_mtime_ns <= os.lstat(path).st_mtime_ns else None


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _hash_files(model_dir: Path, speak: bool = True, workers: int | None = None) -> str:
    files = fingerprint_files(model_dir)
    sizes = {p: p.stat().st_size for p in files}
    digests = {p: _cached_blob_digest(p) for p in files}
    to_read = [p for p in files if digests[p] is None]
    read_bytes = sum(sizes[p] for p in to_read)
    if speak and read_bytes > 1 << 30:  # a line before it starts: a big model takes a while
        log.info("Hashing the model's files (%.1f GB) to key the caches ...", read_bytes / 1e9)
    started = time.perf_counter()
    # sha256 (not blake2b): CPUs with SHA extensions hash it 2-3x faster, and it is the name the hub
    # cache gives a blob, so a model used from the cache or copied out of it keys the same rows.
    # Shards are hashed in parallel (hashlib releases the GIL while hashing).
    workers = max(1, min(len(to_read), workers or os.cpu_count() or 1, 8))
    with ThreadPoolExecutor(workers) as pool:
        digests.update(zip(to_read, pool.map(_sha256, to_read)))
    seconds = time.perf_counter() - started
    if speak:
        log.info("Model fingerprint: %d files, %s read and hashed in %.1f s (%.0f MiB/s)%s", len(files),
                 matrix.size_text(read_bytes), seconds, read_bytes / 2**20 / max(seconds, 1e-9),
                 f"; {len(files) - len(to_read)} known from the hub cache's blob names"
                 if len(to_read) < len(files) else "")
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path.name}\0{sizes[path]}\0{digests[path]}\n".encode())
    return digest.hexdigest()[:32]


def model_fingerprint(model_dir: Path) -> str:
    """A hash of the content of the files that decide the vectors (``fingerprint_files``).

    Under torchrun every rank hashes its own view of the folder (reads after the first come from
    the page cache) rather than waiting for one rank's: a wait that long could outlast the
    process group's timeout. Ranks whose folders differ (nodes with other copies) are refused.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return _hash_files(model_dir)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    mine = _hash_files(model_dir, speak=dist.get_rank() == 0, workers=max(1, (os.cpu_count() or 1) // per_node))
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if len(set(everyone)) != 1:
        differ = sorted(rank for rank, value in enumerate(everyone) if value != everyone[0])
        raise UserError(f"--model-dir {model_dir}: the model files of ranks {differ} differ from rank 0's (other "
                        f"copies on other nodes?); give every rank the same model")
    return mine
