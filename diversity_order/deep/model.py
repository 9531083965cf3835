"""The model of deep extraction: loading it (also sharded for tensor parallel), its forward pass,
and what identifies it (a fingerprint for caches, its longest context)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
from collections.abc import Callable
from pathlib import Path

from ..errors import UserError

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


def model_fingerprint(model_dir: Path) -> str:
    """Hash of config.json and the weight files' names and sizes (cheap, no reading weights)."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.iterdir()):
        if path.suffix in (".safetensors", ".bin", ".pt", ".json") and path.is_file():
            digest.update(f"{path.name}:{path.stat().st_size};".encode())
    return digest.hexdigest()


