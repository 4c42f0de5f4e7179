"""The views of a worker's ``Comm`` that the assignments hand a student's code: the calls the
exercise allows, counted as the checks need them; any other call raises, saying what the
exercise allows instead."""

from __future__ import annotations

from typing import Any

import torch

from ..runtime.base import Comm, Incoming, Pending


class _View:
    """A worker's rank and size, read through to its ``Comm``; what else a view allows is its
    subclass's; any other attribute raises (``__getattr__``), saying what is allowed."""

    allowed = ""

    def __init__(self, comm: Comm) -> None:
        self._comm = comm

    @property
    def rank(self) -> int:
        return self._comm.rank

    @property
    def world_size(self) -> int:
        return self._comm.world_size

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"comm.{name} is not part of this exercise: {self.allowed}")


class PointToPoint(_View):
    """The part of :class:`Comm` that question 1 may use: its rank and size, the bytes it has
    sent, and send/recv (blocking or not). Every other method raises, saying so."""

    allowed = "build the ring from comm.send and comm.recv (or isend/irecv) only"

    def __init__(self, comm: Comm) -> None:
        super().__init__(comm)
        self.messages = 0  # sends so far: a ring sends 2(N − 1)

    @property
    def bytes_sent(self) -> int:
        return self._comm.bytes_sent

    def now(self) -> float:
        return self._comm.now()

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        self.messages += 1
        return self._comm.isend(tensor, dst)

    def irecv(self, tensor: torch.Tensor, src: int) -> Incoming:
        return self._comm.irecv(tensor, src)

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.messages += 1
        await self._comm.send(tensor, dst)

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return await self._comm.recv(tensor, src)


class Collectives(_View):
    """The part of :class:`Comm` this assignment may use: rank, size and ``allreduce``, each call
    recorded as (phase, elements, bytes) under the phase the grader is in. Every other method
    raises, saying so."""

    allowed = (
        "Megatron's f and g need only await comm.allreduce(tensor) (in place, the sum over "
        "the ranks)"
    )

    def __init__(self, comm: Comm) -> None:
        super().__init__(comm)
        self.phase = ""
        self.calls: list[tuple[str, int, int]] = []

    async def allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append((self.phase, tensor.numel(), tensor.numel() * tensor.element_size()))
        return await self._comm.allreduce(tensor)
