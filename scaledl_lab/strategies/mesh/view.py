"""One dimension of the mesh as a ``Comm`` of its own: its group's collectives, its member's
rank and size (picotron's per-dimension process groups, here carried by the program).

The code written for a whole world (Megatron's f and g in :mod:`..model_parallel.conjugates`,
ZeRO's flat shards in :mod:`..memory.flat`) runs unchanged over one dimension when given a
:class:`GroupComm`: ``rank`` is the member's coordinate along the dimension, ``world_size`` the
dimension's size, and every collective goes to the group. Bytes, the clock and compute charges
are the whole rank's.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import torch
from torch import nn

from ...params import flat_grad, write_grads
from ...runtime.base import Comm, Group, Incoming, Pending
from .grid import DIMENSIONS, Mesh


class GroupComm:
    """``comm`` seen from inside ``group`` (the sorted world ranks of one dimension's slice)."""

    def __init__(self, comm: Comm, group: Group) -> None:
        self.comm, self.group = comm, group
        self.rank, self.world_size = group.index(comm.rank), len(group)

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @property
    def bytes_sent(self) -> int:
        return self.comm.bytes_sent

    def now(self) -> float:
        return self.comm.now()

    @contextlib.asynccontextmanager
    async def compute(self, samples: int, share: float = 1.0) -> AsyncIterator[None]:
        async with self.comm.compute(samples, share):
            yield

    def allreduce_start(self, tensor: torch.Tensor) -> Pending:
        return self.comm.allreduce_start(tensor, self.group)

    async def allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return await self.comm.allreduce(tensor, self.group)

    def reduce_scatter_start(self, tensor: torch.Tensor) -> Pending:
        return self.comm.reduce_scatter_start(tensor, self.group)

    async def reduce_scatter(self, tensor: torch.Tensor) -> torch.Tensor:
        return await self.comm.reduce_scatter(tensor, self.group)

    async def all_gather_into(self, out: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
        return await self.comm.all_gather_into(out, shard, self.group)

    def all_to_all_start(self, tensor: torch.Tensor) -> Pending:
        return self.comm.all_to_all_start(tensor, self.group)

    async def all_to_all(self, tensor: torch.Tensor) -> torch.Tensor:
        return await self.comm.all_to_all(tensor, self.group)

    async def average_grads(self, params: list[nn.Parameter]) -> None:
        """Data parallelism's step: every gradient replaced by its mean over the group (one
        allreduce of them all, flattened)."""
        flat = flat_grad(params)
        await self.allreduce(flat)
        write_grads(params, flat / self.world_size)

    def isend(self, tensor: torch.Tensor, member: int) -> Pending:
        """Send to the ``member``-th rank of the group (a ring's neighbour)."""
        return self.comm.isend(tensor, self.group[member])

    def irecv(self, tensor: torch.Tensor, member: int) -> Incoming:
        return self.comm.irecv(tensor, self.group[member])


def mesh_views(comm: Comm, mesh: Mesh) -> dict[str, GroupComm]:
    """Every dimension's group created on ``comm`` (every rank creates every group, in the same
    order, as collectives on groups require) and this rank's view of each."""
    for name in DIMENSIONS:
        for group in mesh.groups(name):
            comm.new_group(group)
    return {n: GroupComm(comm, mesh.group_of(comm.rank, n)) for n in DIMENSIONS}
