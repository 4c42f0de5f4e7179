"""The communication interface every per-worker program is written against.

A strategy is an ``async def`` program that one worker runs. It talks to its peers only through
a :class:`Comm`; a runtime supplies the implementation: ``dask`` (real processes, tensors moved
by torch.distributed, wall-clock time) or ``sim`` (every worker in one process, virtual time).
"""

from __future__ import annotations

import abc
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import torch


class RunError(RuntimeError):
    """A run stopped before finishing; the message says why and where the partial metrics are."""


class DivergenceError(RunError):
    """The training loss became NaN or infinite."""


class WorkerLostError(RunError):
    """A worker process died during a run."""


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one worker sends in a ring allreduce: reduce-scatter then all-gather, 2(p-1)/p · n."""
    if world_size <= 1:
        return 0
    return int(math.ceil(2 * (world_size - 1) * nbytes / world_size))


class Pending(abc.ABC):
    """A collective that was started and has not been waited for yet."""

    @abc.abstractmethod
    async def wait(self) -> torch.Tensor: ...


class Comm(abc.ABC):
    """What a worker may do with its peers. Every method is awaited, so a runtime may suspend."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank = rank
        self.world_size = world_size
        self.bytes_sent = 0  # cumulative; strategies log the per-step difference

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    @abc.abstractmethod
    def now(self) -> float:
        """Seconds since the run started (wall-clock on dask, virtual on sim)."""

    @abc.abstractmethod
    def allreduce_start(self, tensor: torch.Tensor) -> Pending:
        """Start an in-place sum allreduce of ``tensor`` and return at once (overlap with work)."""

    async def allreduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place sum of ``tensor`` over all workers."""
        return await self.allreduce_start(tensor).wait()

    @abc.abstractmethod
    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Overwrite ``tensor`` on every worker with the copy held by rank ``src``."""

    @abc.abstractmethod
    async def send(self, tensor: torch.Tensor, dst: int) -> None: ...

    @abc.abstractmethod
    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor: ...

    @abc.abstractmethod
    async def barrier(self) -> None: ...

    @contextlib.asynccontextmanager
    async def compute(self, samples: int) -> AsyncIterator[None]:
        """Mark a block of local computation on ``samples`` samples.

        Wall-clock runtimes need nothing here; the simulated runtime charges the block's
        duration to this worker's virtual clock from its cost model.
        """
        yield


@dataclass
class Row:
    """One line of the tidy metrics table (see experiment.METRIC_COLUMNS)."""

    kind: str
    epoch: float
    step: int
    time: float
    loss: float
    accuracy: float
    samples: int
    bytes_sent: int = 0
    staleness: float = float("nan")
    lr: float = float("nan")
