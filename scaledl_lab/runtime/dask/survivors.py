"""Collectives among the survivors of a Dask run that lost a worker.

A process group cannot shrink: once a rank has died, gloo collectives over the whole group fail.
Runs that tolerate the loss (decentralised and asynchronous ones) then carry out collectives over
point-to-point messages among the survivors, through the lowest of them (a star: fine for the
few collectives those runs make, at epoch boundaries). Which ranks died comes from the driver,
which watches the cluster and publishes the lost ranks in a Dask ``Variable``, so that every
survivor uses the same members.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from distributed import Variable

TAG = 9973  # keeps these messages apart from the strategies' own point-to-point traffic


def star_allreduce(tensor: torch.Tensor, rank: int, members: list[int]) -> torch.Tensor:
    """In-place sum over ``members`` (in rank order, as the simulator sums)."""
    leader = members[0]
    if rank == leader:
        buffer = torch.empty_like(tensor)
        for r in members[1:]:
            dist.recv(buffer, r, tag=TAG)
            tensor += buffer
        for r in members[1:]:
            dist.send(tensor, r, tag=TAG)
    else:
        dist.send(tensor, leader, tag=TAG)
        dist.recv(tensor, leader, tag=TAG)
    return tensor


def star_broadcast(tensor: torch.Tensor, src: int, rank: int, members: list[int]) -> None:
    if rank == src:
        for r in members:
            if r != src:
                dist.send(tensor, r, tag=TAG)
    else:
        dist.recv(tensor, src, tag=TAG)


class LostRanks:
    """The driver's list of lost ranks (a Dask Variable), read by the ranks."""

    def __init__(self, name: str) -> None:
        self.name = name

    def read(self) -> set[int]:
        return set(Variable(self.name).get(timeout=30))

    def wait_for_any(self, timeout_s: float) -> set[int]:
        """The lost ranks, once the driver has noticed at least one (a collective failed)."""
        deadline = time.monotonic() + timeout_s
        while not (lost := self.read()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return lost
