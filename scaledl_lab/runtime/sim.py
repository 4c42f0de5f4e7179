"""The simulated runtime: every worker in one process, under a virtual clock.

Each worker's program is the same ``async def`` that runs on Dask. Here its awaits yield
requests to a small discrete-event scheduler instead of touching a network: gradients are
computed for real, only time is virtual, charged by a :class:`~scaledl_lab.cost.CostModel`.
The scheduler always resumes the runnable worker with the smallest clock (ties by rank), so a
run is a pure function of its config and seed.
"""

from __future__ import annotations

import contextlib
import heapq
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from dataclasses import dataclass, field
from typing import Any

import torch

from ..cost import CostModel
from .base import Comm, Pending, RunError
from .memory import keep_freed_memory


@dataclass
class Event:
    """One bar of the per-worker timeline: what ``rank`` did from ``start`` to ``end``."""

    rank: int
    kind: str  # "compute" | "comm" | "idle"
    start: float
    end: float


@dataclass
class _Request:
    rank: int


@dataclass
class _Sleep(_Request):
    until: float


@dataclass
class _Collective(_Request):
    kind: str  # "allreduce" | "broadcast" | "barrier"
    tensor: torch.Tensor | None = None
    src: int = 0


@dataclass
class _Send(_Request):
    dst: int
    tensor: torch.Tensor


@dataclass
class _Recv(_Request):
    src: int
    tensor: torch.Tensor


class _Await:
    """Hands a request to the scheduler and resumes with its answer."""

    def __init__(self, request: _Request) -> None:
        self.request = request

    def __await__(self) -> Generator[_Request, Any, Any]:
        return (yield self.request)


class _SimPending(Pending):
    def __init__(self, comm: SimComm, tensor: torch.Tensor) -> None:
        self.comm, self.tensor = comm, tensor

    async def wait(self) -> torch.Tensor:
        await _Await(_Collective(self.comm.rank, "allreduce", self.tensor))
        return self.tensor


class SimComm(Comm):
    """:class:`Comm` of one virtual worker; time is ``clock``, advanced by the cost model."""

    def __init__(self, rank: int, world: SimWorld) -> None:
        super().__init__(rank, world.world_size)
        self.world = world
        self.clock = 0.0
        self.steps = 0

    def now(self) -> float:
        return self.clock

    @contextlib.asynccontextmanager
    async def compute(self, samples: int) -> AsyncIterator[None]:
        yield
        cost = self.world.cost.step_time(self.rank, self.world_size, self.steps, samples)
        self.steps += 1
        await _Await(_Sleep(self.rank, self.clock + cost))

    def allreduce_start(self, tensor: torch.Tensor) -> Pending:
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_sent += self.world.cost.allreduce_bytes(nbytes, self.world_size)
        return _SimPending(self, tensor)

    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        if self.rank == src:
            self.bytes_sent += tensor.numel() * tensor.element_size() * (self.world_size - 1)
        await _Await(_Collective(self.rank, "broadcast", tensor, src))
        return tensor

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        await _Await(_Send(self.rank, dst, tensor))

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        await _Await(_Recv(self.rank, src, tensor))
        return tensor

    async def barrier(self) -> None:
        await _Await(_Collective(self.rank, "barrier"))


@dataclass
class SimWorld:
    """The discrete-event scheduler that hosts ``world_size`` virtual workers."""

    world_size: int
    cost: CostModel
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.comms = [SimComm(r, self) for r in range(self.world_size)]
        self._ready: list[tuple[float, int, int, Any]] = []  # (time, rank, seq, value to send)
        self._seq = 0
        self._collective: list[_Collective | None] = [None] * self.world_size
        self._mail: dict[tuple[int, int], deque[tuple[float, torch.Tensor]]] = defaultdict(deque)
        self._waiting_recv: dict[int, _Recv] = {}

    # -- scheduling ------------------------------------------------------------------------

    def _resume(self, rank: int, at: float, value: Any = None) -> None:
        heapq.heappush(self._ready, (at, rank, self._seq, value))
        self._seq += 1

    def _advance(self, rank: int, until: float, kind: str) -> None:
        comm = self.comms[rank]
        if until > comm.clock:
            self.events.append(Event(rank, kind, comm.clock, until))
            comm.clock = until

    def run(self, programs: list[Callable[[Comm], Coroutine[Any, Any, Any]]]) -> None:
        """Run one coroutine per rank to completion, in virtual time."""
        coros = [program(comm) for program, comm in zip(programs, self.comms, strict=False)]
        done = [False] * self.world_size
        for rank in range(self.world_size):
            self._resume(rank, 0.0)
        try:
            while self._ready:
                at, rank, _, value = heapq.heappop(self._ready)
                try:
                    request = coros[rank].send(value)
                except StopIteration:
                    done[rank] = True
                    continue
                self._handle(request)
        finally:
            for coro in coros:
                coro.close()
        if not all(done):
            blocked = [r for r in range(self.world_size) if not done[r]]
            raise RunError(
                f"simulated deadlock: ranks {blocked} wait for messages or "
                "collectives that no other rank will ever send"
            )

    def _handle(self, req: _Request) -> None:
        if isinstance(req, _Sleep):
            self._advance(req.rank, req.until, "compute")
            self._resume(req.rank, req.until)
        elif isinstance(req, _Collective):
            self._arrive(req)
        elif isinstance(req, _Send):
            self._send(req)
        elif isinstance(req, _Recv):
            self._recv(req)
        else:  # pragma: no cover - a program awaited something that is not a Comm operation
            raise RunError(f"rank {req.rank} awaited {req!r}, which the simulator cannot run")

    # -- collectives -----------------------------------------------------------------------

    def _arrive(self, req: _Collective) -> None:
        if self._collective[req.rank] is not None:
            raise RunError(f"rank {req.rank} entered a second collective before the first ended")
        self._collective[req.rank] = req
        if any(c is None for c in self._collective):
            return
        calls: list[_Collective] = self._collective  # type: ignore[assignment]
        self._collective = [None] * self.world_size
        kinds = {(c.kind, None if c.tensor is None else c.tensor.numel()) for c in calls}
        if len(kinds) != 1:
            raise RunError(f"collective mismatch: the ranks called {sorted(map(str, kinds))}")
        start = max(self.comms[c.rank].clock for c in calls)
        nbytes = (
            0
            if calls[0].tensor is None
            else calls[0].tensor.numel() * calls[0].tensor.element_size()
        )
        if req.kind == "allreduce":
            # Sum in rank order: deterministic, and for two ranks bit-equal to gloo's a + b.
            total = calls[0].tensor
            for c in calls[1:]:
                total += c.tensor
            for c in calls[1:]:
                c.tensor.copy_(total)
            duration = self.cost.allreduce_time(nbytes, self.world_size)
        elif req.kind == "broadcast":
            source = calls[req.src].tensor
            for c in calls:
                if c.rank != req.src:
                    c.tensor.copy_(source)
            duration = self.cost.network.message_time(nbytes) if self.world_size > 1 else 0.0
        else:
            duration = self.cost.allreduce_time(0, self.world_size)
        for c in calls:
            self._advance(c.rank, start, "idle")
            self._advance(c.rank, start + duration, "comm")
            self._resume(c.rank, start + duration)

    # -- point to point --------------------------------------------------------------------

    def _send(self, req: _Send) -> None:
        comm = self.comms[req.rank]
        nbytes = req.tensor.numel() * req.tensor.element_size()
        # The sender is busy while the bytes leave; they arrive one latency later.
        injected = comm.clock + nbytes / self.cost.network.bandwidth_Bps
        self._advance(req.rank, injected, "comm")
        self._mail[(req.rank, req.dst)].append(
            (injected + self.cost.network.latency_s, req.tensor.detach().clone())
        )
        self._resume(req.rank, injected)
        waiting = self._waiting_recv.get(req.dst)
        if waiting is not None and waiting.src == req.rank:
            del self._waiting_recv[req.dst]
            self._recv(waiting)

    def _recv(self, req: _Recv) -> None:
        box = self._mail[(req.src, req.rank)]
        if not box:
            self._waiting_recv[req.rank] = req
            return
        arrival, tensor = box.popleft()
        req.tensor.copy_(tensor)
        self._advance(req.rank, arrival, "idle")
        self._resume(req.rank, self.comms[req.rank].clock)


ROWS_PER_BATCH = 200


def build_cost_model(cfg: Any, flops_per_sample: int) -> CostModel:
    """The cost model a config names (compute profile, network, allreduce, stragglers)."""
    from ..cost import Stragglers, compute_profile, network_profile

    return CostModel(
        compute=compute_profile(cfg.compute_profile, cfg.model, flops_per_sample),
        network=network_profile(cfg.network),
        allreduce=cfg.allreduce_algorithm,
        stragglers=Stragglers.parse(cfg.stragglers, seed=cfg.seed),
    )


def run_sim(
    cfg: Any,
    run_label: str,
    on_rows: Callable[[list[dict[str, Any]]], None],
    program: Callable[[Any], Any] | None = None,
) -> tuple[list[dict[str, Any]], list[Event]]:
    """Run ``cfg`` with ``cfg.workers`` virtual workers; stream rows to ``on_rows``.

    Returns each rank's result dict and the timeline events. One thread, as each real worker
    has, so that the gradients are bit-identical to a Dask run's.
    """
    from ..models import model_flops
    from ..strategies import get_program
    from ..worker import WorkerContext, load_for

    data = load_for(cfg)
    world = SimWorld(
        cfg.workers,
        build_cost_model(cfg, model_flops(cfg.model, data.input_shape, data.num_classes)),
    )
    buffer: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        buffer.append(row)
        if len(buffer) >= ROWS_PER_BATCH:
            on_rows(buffer[:])
            buffer.clear()

    contexts = [
        WorkerContext(cfg, comm, data, torch.device("cpu"), emit, run_label) for comm in world.comms
    ]
    chosen = program or get_program(cfg.strategy)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    keep_freed_memory()
    try:
        world.run([lambda comm, ctx=ctx: chosen(ctx) for ctx in contexts])
    finally:
        torch.set_num_threads(threads)
        if buffer:
            on_rows(buffer[:])
    return [ctx.result for ctx in contexts], world.events
