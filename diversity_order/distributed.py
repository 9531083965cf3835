"""Many processes under ``torchrun``: each rank tokenizes and embeds a share of the documents.

Launched as ``torchrun --nproc_per_node=N [--nnodes=M ...] curate_dataset.py ...``, every rank
indexes the input and checks the caches (cheap, identical on all ranks), embeds its own
contiguous share of the rows still to compute (balanced by bytes of JSON), and sends the
results to rank 0, which writes the caches and runs the rest of the pipeline (clustering and
ordering need only a few bytes per document). GPU ranks use NCCL and their local GPU; CPU
ranks use gloo. Without torchrun nothing here does anything.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistContext:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


TIMEOUT_ENV = "DIVERSITY_ORDER_DIST_TIMEOUT_SECONDS"
# Ranks wait for each other at stage boundaries while one of them does a long single-process step
# (tokenizing uncached records, writing the output): the collectives' default 10 minutes is too short.
DEFAULT_TIMEOUT_SECONDS = 4 * 3600


def collective_timeout():
    """How long a rank waits at a collective before giving up (``DIVERSITY_ORDER_DIST_TIMEOUT_SECONDS``)."""
    import datetime

    try:
        seconds = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_SECONDS))
    except ValueError:
        seconds = DEFAULT_TIMEOUT_SECONDS
    return datetime.timedelta(seconds=max(seconds, 60.0))


def init_from_env(use_cuda: bool) -> DistContext:
    """Join the process group torchrun set up; a single process gets the trivial context."""
    if not launched_by_torchrun():
        return DistContext()
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", timeout=collective_timeout())
    ctx = DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if use_cuda:
        torch.cuda.set_device(ctx.local_rank)
    return ctx


def shutdown(ctx: DistContext) -> None:
    if ctx.active:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def split_by_bytes(sizes: np.ndarray, parts: int) -> np.ndarray:
    """Cut points (parts + 1) splitting consecutive items into ``parts`` contiguous runs of
    about equal total size; every run is non-empty when there are at least ``parts`` items."""
    n = sizes.size
    if n == 0:
        return np.zeros(parts + 1, dtype=np.int64)
    cumulative = np.cumsum(sizes, dtype=np.float64)
    targets = cumulative[-1] * np.arange(1, parts) / parts
    cuts = np.searchsorted(cumulative, targets, side="left") + 1
    bounds = np.concatenate([[0], cuts, [n]]).astype(np.int64)
    # Keep the cuts increasing so no rank is handed a negative range.
    return np.maximum.accumulate(np.minimum(bounds, n))


def my_share(ctx: DistContext, rows: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The contiguous slice of ``rows`` (sorted) this rank computes."""
    if not ctx.active:
        return rows
    bounds = split_by_bytes(sizes, ctx.world_size)
    return rows[bounds[ctx.rank] : bounds[ctx.rank + 1]]


def gather_to_main(ctx: DistContext, array: np.ndarray, device=None, group=None) -> list[np.ndarray] | None:
    """Rank 0 receives every rank's ``array`` (same dtype and trailing shape, any row count);
    the other ranks get None.

    With ``group`` (a process group) ``ctx`` describes this rank's place in it (rank within the
    group, group size), only its members call this, and its rank 0 receives."""
    if not ctx.active:
        return [array]
    import torch
    import torch.distributed as dist

    device = device or torch.device("cpu")
    tensor = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    count = torch.tensor([tensor.shape[0]], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(count) for _ in range(ctx.world_size)]
    dist.all_gather(counts, count, group=group)
    longest = int(max(c.item() for c in counts))
    padded = torch.zeros((longest,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=device)
    padded[: tensor.shape[0]] = tensor
    gathered = [torch.zeros_like(padded) for _ in range(ctx.world_size)] if ctx.is_main else None
    dst = 0 if group is None else dist.get_global_rank(group, 0)
    dist.gather(padded, gathered, dst=dst, group=group)
    if not ctx.is_main:
        return None
    return [g[: int(c.item())].cpu().numpy() for g, c in zip(gathered, counts)]


def barrier(ctx: DistContext) -> None:
    if ctx.active:
        import torch.distributed as dist

        dist.barrier()
