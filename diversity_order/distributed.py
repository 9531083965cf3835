"""Many processes under ``torchrun``: who this rank is, its share of the work, and the few collectives.

Launched as ``torchrun --nproc_per_node=N [--nnodes=M ...] SCRIPT ...``, every rank joins the
process group (NCCL on GPUs, each rank on its local GPU; gloo on CPUs). The helpers here cut work
into shares (contiguous, balanced by bytes or by count), and move small things: rank 0's objects
and arrays to every rank, every rank's arrays to rank 0. Curate moves only token counts, labels and
a bounded sample of rows this way (``scale_out``); deep extraction gathers its rows to rank 0.
Without torchrun nothing here does anything.
"""

from __future__ import annotations

import contextlib
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
        _import_modules_that_capture_the_world_group()
        backend = "nccl" if use_cuda else "gloo"
        if os.environ.get("RANK", "0") == "0":
            # It waits for every process: said first, so a run stuck there does not look stuck anywhere else.
            log.info("Joining the process group (%s processes, %s, rendezvous %s:%s) ...",
                     os.environ.get("WORLD_SIZE", "?"), backend, os.environ.get("MASTER_ADDR", "?"),
                     os.environ.get("MASTER_PORT", "?"))
        try:
            dist.init_process_group(backend=backend, timeout=collective_timeout())
        except RuntimeError as exc:  # (the store's wait timeout: a DistStoreError)
            if "timeout" not in str(exc).lower() and "timed out" not in str(exc).lower():
                raise
            from .errors import UserError

            raise UserError(f"the {os.environ.get('WORLD_SIZE', '?')} processes did not all join the process group "
                            f"within {collective_timeout()} ({type(exc).__name__}): a process that stopped before "
                            f"joining says why in its own node's output; {TIMEOUT_ENV} sets how long they wait") from None
    ctx = DistContext(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    if use_cuda:
        torch.cuda.set_device(ctx.local_rank)
    return ctx


def _import_modules_that_capture_the_world_group() -> None:
    """Import, before the process group exists, the modules whose functions take ``group.WORLD`` as
    a default argument value (transformers imports ``torch.distributed.nn`` while loading a model).

    Imported after, their defaults keep the world group alive past ``destroy_process_group``: its
    worker threads then outlive the interpreter, and one that drops the last reference to a
    collective's tensor during interpreter shutdown aborts the process ("terminate called without
    an active exception") although every rank has finished its work."""
    import importlib

    with contextlib.suppress(ImportError):
        importlib.import_module("torch.distributed.nn.functional")


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
    dtype = array.dtype
    if dtype.kind == "u":
        array = np.ascontiguousarray(array).view(_carrier(dtype))
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
    return [g[: int(c.item())].cpu().numpy().view(dtype) for g, c in zip(gathered, counts)]


def even_range(ctx: DistContext, n: int) -> tuple[int, int]:
    """This rank's contiguous run of ``n`` items cut into ``world_size`` runs of equal count
    (rank order = item order, so concatenating the ranks' results in rank order restores it)."""
    bounds = np.linspace(0, n, ctx.world_size + 1).astype(np.int64)
    return int(bounds[ctx.rank]), int(bounds[ctx.rank + 1])


def slice_of_order(ctx: DistContext, parts: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The consecutive ``parts`` (lo, hi) of an order that this rank writes, as (part, lo, hi): the parts dealt to
    the ranks in contiguous blocks (output shards written in parallel, cut where one process cuts them; one
    process gets every part)."""
    first, last = even_range(ctx, len(parts))
    return [(part, *parts[part]) for part in range(first, last)]


def comm_device():
    """Where collectives' tensors live: the rank's GPU under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_object(ctx: DistContext, obj=None):
    """Rank 0's ``obj`` (anything picklable and small: a file name, centres, a fitted PCA) on every rank."""
    if not ctx.active:
        return obj
    import torch.distributed as dist

    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def from_main(ctx: DistContext, compute, what: str):
    """Rank 0's ``compute()`` on every rank. Where it fails there, rank 0 raises its error (one line, as in one
    process) and the others a UserError saying so, instead of waiting on a broadcast that never comes and
    ending in a collective's traceback when rank 0 exits."""
    if not ctx.active:
        return compute()
    value, error = None, None
    if ctx.is_main:
        try:
            value = compute()
        except Exception as exc:  # (Ctrl-C and SIGTERM are the interrupt handling's: they stop every rank)
            error = exc
    failed, value = broadcast_object(ctx, (error is not None, value))
    if error is not None:
        raise error
    if failed:
        from .errors import UserError

        raise UserError(f"{what}: rank 0 could not (its error line says why)")
    return value


def exchange_objects(ctx: DistContext, outgoing: dict[int, object], incoming: list[int]) -> dict[int, object]:
    """Point to point: this rank sends ``outgoing[rank]`` to each of those ranks and receives one
    object from each rank in ``incoming``. Every rank must call it, and a send from rank r to d
    must be listed on both (r's ``outgoing``, d's ``incoming``). The pairs are served in one global
    order (by sender, then receiver), so the blocking calls cannot wait on each other in a cycle."""
    if not ctx.active:
        return {}
    import torch.distributed as dist

    device = comm_device()
    pairs = sorted([(ctx.rank, d) for d in outgoing] + [(r, ctx.rank) for r in incoming])
    received = {}
    for sender, receiver in pairs:
        if sender == ctx.rank:
            dist.send_object_list([outgoing[receiver]], dst=receiver, device=device)
        else:
            box = [None]
            dist.recv_object_list(box, src=sender, device=device)
            received[sender] = box[0]
    return received


def broadcast_array(ctx: DistContext, array: np.ndarray | None = None) -> np.ndarray:
    """Rank 0's 1-D ``array`` on every rank (e.g. the curated order, 8 bytes per record, for ranks
    that write their slices of it)."""
    if not ctx.active:
        return array
    import torch
    import torch.distributed as dist

    size, dtype = broadcast_object(ctx, (array.size, array.dtype.str) if ctx.is_main else None)
    tensor = (torch.from_numpy(np.ascontiguousarray(array)) if ctx.is_main
              else torch.empty(size, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype)).to(comm_device())
    dist.broadcast(tensor, src=0)
    return tensor.cpu().numpy()


def _carrier(dtype: np.dtype) -> np.dtype:
    """The integer type an array of ``dtype`` travels as, byte for byte: every backend carries these
    (gloo refuses unsigned types wider than a byte)."""
    return np.dtype({8: np.int64, 4: np.int32, 2: np.int16, 1: np.uint8}[np.dtype(dtype).itemsize])


def all_gather_object(ctx: DistContext, obj) -> list:
    """Every rank's ``obj`` (picklable and small: a message, a few counts), in rank order, on every rank."""
    if not ctx.active:
        return [obj]
    import torch.distributed as dist

    out = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def all_gather_arrays(ctx: DistContext, array: np.ndarray) -> list[np.ndarray]:
    """Every rank's 1-D ``array`` (one dtype on all ranks, any length), in rank order, on every rank.
    Sent as integers of the same size (``_carrier``)."""
    if not ctx.active:
        return [array]
    import torch
    import torch.distributed as dist

    array = np.ascontiguousarray(array)
    carrier = _carrier(array.dtype)
    lengths = [int(n) for n in all_gather_object(ctx, int(array.size))]
    device = comm_device()
    padded = torch.zeros(max(lengths), dtype=torch.from_numpy(np.zeros(0, carrier)).dtype, device=device)
    padded[: array.size] = torch.from_numpy(array.view(carrier)).to(device)
    gathered = [torch.empty_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, padded)
    del padded
    return [g[:n].cpu().numpy().view(array.dtype) for g, n in zip(gathered, lengths)]


def scatter_ranges(ctx: DistContext, array: np.ndarray | None, bounds: np.ndarray) -> np.ndarray:
    """Each rank's part ``array[bounds[rank]:bounds[rank + 1]]`` of rank 0's 1-D ``array`` (the
    others pass None): a rank receives its own part only."""
    if not ctx.active:
        return array[bounds[0]:bounds[1]]
    import torch
    import torch.distributed as dist

    dtype = np.dtype(broadcast_object(ctx, array.dtype.str if ctx.is_main else None))
    carrier = _carrier(dtype)
    sizes = np.diff(bounds)
    device = comm_device()
    torch_dtype = torch.from_numpy(np.zeros(0, carrier)).dtype
    received = torch.empty(int(sizes.max()), dtype=torch_dtype, device=device)
    parts = None
    if ctx.is_main:
        parts = [torch.zeros_like(received) for _ in range(ctx.world_size)]
        for rank, part in enumerate(parts):
            part[: sizes[rank]] = torch.from_numpy(np.ascontiguousarray(array[bounds[rank]:bounds[rank + 1]])
                                                   .view(carrier)).to(device)
    dist.scatter(received, parts, src=0)
    return received[: sizes[ctx.rank]].cpu().numpy().view(dtype)


def all_agree(ctx: DistContext, ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank (a check each rank makes on its own)."""
    if not ctx.active:
        return ok
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1 if ok else 0], dtype=torch.int64, device=comm_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def barrier(ctx: DistContext) -> None:
    if ctx.active:
        import torch.distributed as dist

        dist.barrier()
