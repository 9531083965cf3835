"""Where each process sits under torchrun: data-parallel groups of tensor-parallel ranks.

With ``--tp N`` and WORLD_SIZE processes, groups of N consecutive ranks each hold one copy of
the model sharded over the group (a ("dp", "tp") device mesh), and the groups split the
documents as data-parallel ranks do. The ranks of a group run the same batches in lockstep, so
their out-of-memory and checkpoint decisions are agreed with ``TensorParallelGroup``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import distributed


@dataclass(frozen=True)
class Layout:
    """Where this process sits under torchrun: its data-parallel group and its rank in that
    group's tensor-parallel ranks. Group g is the consecutive ranks g*tp ... g*tp + tp - 1."""

    dp: int = 1
    tp: int = 1
    dp_rank: int = 0
    tp_rank: int = 0
    mesh: object = None  # DeviceMesh ("dp", "tp"): only when there are several groups of tp > 1 ranks

    @classmethod
    def of(cls, ctx: distributed.DistContext, tp: int, device) -> Layout:
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


class TensorParallelGroup:
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


