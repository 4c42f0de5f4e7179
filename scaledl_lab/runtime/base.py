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
from typing import Any

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


class ServerLostError(RunError):
    """A parameter server (or another hosted server object) stopped answering."""


class _NotReady:
    def __repr__(self) -> str:
        return "NOT_READY"


# A server method returns NOT_READY to have the runtime park the call and try it again after the
# server's next state change (a synchronous parameter server's pull waits for the step this way).
NOT_READY: Any = _NotReady()


def tensor_bytes(value: Any) -> int:
    """Bytes of the tensors in ``value`` (a tensor, or tuples/lists/dicts of them)."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(tensor_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(tensor_bytes(v) for v in value.values())
    return 8 if isinstance(value, (int, float)) else 0


def clone_tensors(value: Any) -> Any:
    """A copy of ``value`` whose tensors are private (messages must not alias their sender)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(clone_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: clone_tensors(v) for k, v in value.items()}
    return value


class Pending(abc.ABC):
    """An operation that was started and has not been waited for yet."""

    @abc.abstractmethod
    async def wait(self) -> Any: ...


class Incoming(abc.ABC):
    """A posted receive: poll it without blocking, or wait for it."""

    @abc.abstractmethod
    def ready(self) -> bool:
        """True once the message has arrived (never blocks)."""

    @abc.abstractmethod
    async def wait(self) -> torch.Tensor: ...


class ServerSpec(abc.ABC):
    """How a strategy's server objects are made; the runtime decides where they live.

    A server is a plain class whose methods take and return tensors and numbers. The simulator
    keeps the objects in its own process and delivers calls in virtual time; the Dask runtime
    hosts each one as an actor on a worker. Calls to one server run one at a time.
    """

    @abc.abstractmethod
    def count(self, cfg: Any) -> int:
        """How many servers a run of ``cfg`` needs."""

    @abc.abstractmethod
    def create(self, cfg: Any, index: int) -> Any:
        """Server ``index`` of ``count(cfg)``, built where it will run."""


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
    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        """Start sending ``tensor`` to ``dst``; do not modify it until the Pending is waited."""

    @abc.abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int) -> Incoming:
        """Post a receive of the next message from ``src`` into ``tensor``."""

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        await self.isend(tensor, dst).wait()

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return await self.irecv(tensor, src).wait()

    # -- hosted servers (parameter servers, the EASGD centre) ------------------------------

    @property
    def num_servers(self) -> int:
        return 0

    def call_start(self, server: int, method: str, *args: Any) -> Pending:
        """Call ``method(*args)`` on hosted server ``server``; ``wait()`` gives its return value."""
        raise RunError("this run hosts no servers: the strategy declared none")

    async def call(self, server: int, method: str, *args: Any) -> Any:
        return await self.call_start(server, method, *args).wait()

    # -- memory shared by the workers of one machine (Hogwild!) ----------------------------

    async def shared_tensor(self, name: str, init: torch.Tensor) -> torch.Tensor:
        """A tensor that every worker maps at once (rank 0's ``init`` is the starting value).

        Writes by any worker are seen by all without locks. Only for workers of one machine.
        """
        raise RunError("this runtime has no shared memory between workers")

    def lost_peers(self) -> set[int]:
        """Ranks known to have died (tolerant strategies keep going without them)."""
        return set()

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
