"""The simulated runtime: every worker in one process, under a virtual clock.

Each worker's program is the same ``async def`` that runs on Dask. Here its awaits yield
requests to a small discrete-event scheduler instead of touching a network: gradients are
computed for real, only time is virtual, charged by a :class:`~.cost.CostModel`. The scheduler
always resumes the runnable worker with the smallest clock (ties by rank), so a run is a pure
function of its config and seed.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import RunError, WorkerKilled, WorkerLostError
from ..base import Comm, Launch, Outcome
from ..memory import freed_memory_kept
from ..servers import ServerLoop
from .comm import LOST, SimCall, SimComm, SimIncoming
from .cost import (
    CostModel,
    all_to_all_time,
    allgather_time,
    allreduce_time,
    reduce_scatter_time,
)
from .mail import Copies, Mail
from .requests import Collective, Request, Sleep, Until, WaitCall, WaitRecv
from .servers import SimServers, _ServerState


@dataclass
class Event:
    """One bar of the per-worker timeline: what ``rank`` did from ``start`` to ``end``."""

    rank: int
    kind: str  # "compute" | "comm" | "idle"; "overlapped": a transfer behind a compute block
    start: float
    end: float


@dataclass
class SimWorld(SimServers):
    """The discrete-event scheduler that hosts ``world_size`` virtual workers (and servers).

    Everything that happens is an entry of one heap ordered by virtual time: a worker resuming,
    or a call reaching a server. Server calls go through the server's own link, one message at
    a time, so a server that many workers talk to becomes the bottleneck it is on a network.
    """

    world_size: int
    cost: CostModel
    server_objects: list[Any] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    tolerates_worker_loss: bool = False

    def __post_init__(self) -> None:
        self.comms = [SimComm(r, self) for r in range(self.world_size)]
        self.servers = [_ServerState(ServerLoop(obj)) for obj in self.server_objects]
        self.shared: dict[str, torch.Tensor] = {}
        # (time, order, seq, action, payload): order is the rank for resumes, -1 for deliveries.
        self._heap: list[tuple[float, int, int, str, Any]] = []
        self._seq = 0
        # Collectives under way, by group (None: every worker): who has arrived so far.
        self._collective: dict[tuple[int, ...] | None, dict[int, Collective]] = {}
        self._in_collective: set[int] = set()
        self._mail = Mail()  # sent, not yet received: spilled to disk past a memory budget
        self._copies = Copies()  # one copy of a message, whatever the number of its receivers
        self._posted: dict[tuple[int, int], deque[SimIncoming]] = defaultdict(deque)
        self._waiting_recv: dict[int, SimIncoming] = {}
        self._waiting_call: dict[int, SimCall] = {}
        self.dead: dict[int, float] = {}  # rank -> virtual time it died (injected faults)

    # -- scheduling ------------------------------------------------------------------------

    def _push(self, at: float, order: int, action: str, payload: Any) -> None:
        heapq.heappush(self._heap, (at, order, self._seq, action, payload))
        self._seq += 1

    def _resume(self, rank: int, at: float, value: Any = None) -> None:
        self._push(at, rank, "resume", (rank, value))

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
            while self._heap:
                at, _, _, action, payload = heapq.heappop(self._heap)
                if action == "deliver":
                    self._serve(payload, at)
                    continue
                rank, value = payload
                try:
                    request = coros[rank].send(value)
                except StopIteration:
                    done[rank] = True
                    continue
                except WorkerKilled as killed:
                    done[rank] = True
                    self._kill(rank, killed.step)
                    continue
                self._handle(request)
        finally:
            for coro in coros:
                coro.close()
            self._mail.close()  # what was spilled lives no longer than the run
        if not all(done):
            blocked = [r for r in range(self.world_size) if not done[r]]
            raise RunError(
                f"simulated deadlock: ranks {blocked} wait for messages, collectives or "
                "server replies that will never come"
            )

    def _handle(self, req: Request) -> None:
        if isinstance(req, Sleep):
            self._advance(req.rank, req.until, "compute")
            self._resume(req.rank, req.until)
        elif isinstance(req, Until):
            self._advance(req.rank, req.until, "comm")
            self._resume(req.rank, self.comms[req.rank].clock)
        elif isinstance(req, Collective):
            self._arrive(req)
        elif isinstance(req, WaitRecv):
            if req.incoming.lost:
                self._resume(req.rank, self.comms[req.rank].clock, LOST)
            elif req.incoming.message is None:
                self._waiting_recv[req.rank] = req.incoming
            else:
                self._wake_recv(req.incoming)
        elif isinstance(req, WaitCall):
            if req.pending.reply_at is None:
                self._waiting_call[req.rank] = req.pending
            else:
                self._wake_call(req.pending)
        else:  # pragma: no cover - a program awaited something that is not a Comm operation
            raise RunError(f"rank {req.rank} awaited {req!r}, which the simulator cannot run")

    # -- point to point --------------------------------------------------------------------

    def _deliver(self, src: int, dst: int, arrival: float, tensor: torch.Tensor) -> None:
        """A message from ``src`` reaches ``dst`` at ``arrival``: match the oldest posted recv."""
        if not 0 <= dst < self.world_size or dst == src:
            raise RunError(f"rank {src} sent to rank {dst}, which is not a peer")
        if dst in self.dead:
            return  # nobody receives it
        sent = self._copies.of(src, tensor)
        posted = self._posted[(src, dst)]
        if not posted:
            self._mail.put(src, dst, arrival, sent)
            return
        incoming = posted.popleft()
        incoming.arrive(arrival, sent)
        if self._waiting_recv.get(dst) is incoming:
            del self._waiting_recv[dst]
            self._wake_recv(incoming)

    def _post(self, rank: int, incoming: SimIncoming) -> None:
        if (incoming.src, rank) in self._mail and not self._posted[(incoming.src, rank)]:
            incoming.message = self._mail.take(incoming.src, rank)
        elif incoming.src in self.dead:
            incoming.lost = True  # everything it sent has been delivered
        else:
            self._posted[(incoming.src, rank)].append(incoming)

    def _wake_recv(self, incoming: SimIncoming) -> None:
        assert incoming.message is not None
        rank = incoming.comm.rank
        self._advance(rank, incoming.message[0], "idle")
        self._resume(rank, self.comms[rank].clock)

    # -- faults ----------------------------------------------------------------------------

    def _kill(self, rank: int, step: int) -> None:
        """``rank`` died (an injected fault): what it never sent is lost, its neighbours'
        receives from it fail, and collectives go on among the survivors."""
        at = self.comms[rank].clock
        if not self.tolerates_worker_loss:
            raise WorkerLostError(
                f"rank {rank} died after step {step} (virtual time {at:.3f} s; an injected "
                "fault); a synchronous run cannot continue without it, so the run was stopped"
            )
        self.dead[rank] = at
        for (src, _dst), posted in self._posted.items():
            while src == rank and posted:
                incoming = posted.popleft()
                incoming.lost = True
                waiter = incoming.comm.rank
                if self._waiting_recv.get(waiter) is incoming:
                    del self._waiting_recv[waiter]
                    self._advance(waiter, at, "idle")
                    self._resume(waiter, self.comms[waiter].clock, LOST)
        for group, arrived in list(self._collective.items()):
            if set(arrived) >= set(self._members(group)):
                self._complete(group)

    def _members(self, group: tuple[int, ...] | None) -> tuple[int, ...]:
        members = group if group is not None else tuple(range(self.world_size))
        return tuple(r for r in members if r not in self.dead)

    # -- collectives -----------------------------------------------------------------------

    def _arrive(self, req: Collective) -> None:
        if req.rank in self._in_collective:
            raise RunError(f"rank {req.rank} entered a second collective before the first ended")
        members = self._members(req.group)
        if req.rank not in members:
            raise RunError(f"rank {req.rank} called a collective of group {list(members)}")
        arrived = self._collective.setdefault(req.group, {})
        arrived[req.rank] = req
        self._in_collective.add(req.rank)
        if len(arrived) == len(members):
            self._complete(req.group)

    def _complete(self, group: tuple[int, ...] | None) -> None:
        """Every (surviving) member of ``group`` has arrived: carry the collective out."""
        members = self._members(group)
        arrived = self._collective.pop(group)
        req = arrived[members[0]]
        self._in_collective -= set(members)
        calls = [arrived[r] for r in members]
        kinds = {(c.kind, None if c.tensor is None else c.tensor.numel()) for c in calls}
        if len(kinds) != 1:
            raise RunError(f"collective mismatch: the ranks called {sorted(map(str, kinds))}")
        # A background allreduce's transfer began when its ranks started it (the latest of
        # them); the ranks computed meanwhile, and wait only for what is left of it.
        background = calls[0].started is not None
        start = max(self.comms[c.rank].clock if c.started is None else c.started for c in calls)
        gathered: list[torch.Tensor] = []
        results: dict[int, torch.Tensor] = {}  # what each member's wait returns, if not None
        nbytes = (
            0
            if calls[0].tensor is None
            else calls[0].tensor.numel() * calls[0].tensor.element_size()
        )
        # the link the group's ring crosses: inside one node, or between nodes (cost.link)
        net, algorithm = self.cost.link(members), self.cost.allreduce
        if req.kind == "allreduce":
            # Sum in rank order: deterministic, and for two ranks bit-equal to gloo's a + b.
            total = calls[0].tensor
            for c in calls[1:]:
                total += c.tensor
            for c in calls[1:]:
                c.tensor.copy_(total)
            duration = allreduce_time(nbytes, len(members), net, algorithm)
        elif req.kind == "reduce_scatter":
            # The same sums, in the same rank order, as the allreduce's: each member its chunk.
            total = calls[0].tensor.clone()
            for c in calls[1:]:
                total += c.tensor
            chunks = total.chunk(len(calls))
            results = {c.rank: chunks[i].clone() for i, c in enumerate(calls)}
            duration = reduce_scatter_time(nbytes, len(members), net, algorithm)
        elif req.kind == "all_gather_into":
            whole = torch.cat([c.tensor.detach() for c in calls])  # in rank order
            for c in calls:
                c.out.copy_(whole)
            results = {c.rank: c.out for c in calls}
            duration = reduce_scatter_time(nbytes * len(members), len(members), net, algorithm)
        elif req.kind == "all_to_all":  # member i's j-th chunk becomes member j's i-th
            chunks = [c.tensor.detach().chunk(len(calls)) for c in calls]
            results = {c.rank: torch.cat([mine[j] for mine in chunks]) for j, c in enumerate(calls)}
            duration = all_to_all_time(nbytes, len(members), net)
        elif req.kind == "allgather":
            gathered = [c.tensor.detach().clone() for c in calls]  # in rank order
            duration = allgather_time(nbytes, len(members), net, algorithm)
        elif req.kind == "broadcast":
            source = arrived[req.src].tensor
            for c in calls:
                if c.rank != req.src:
                    c.tensor.copy_(source)
            duration = net.message_time(nbytes) if self.world_size > 1 else 0.0
        else:
            duration = allreduce_time(0, self.world_size, net, algorithm)
        for c in calls:
            if c.overlapped:  # the transfer's part hidden behind the block it was started in
                hidden = min(start + duration, self.comms[c.rank].clock)
                if hidden > start:
                    self.events.append(Event(c.rank, "overlapped", start, hidden))
            self._advance(c.rank, start, "idle")
            self._advance(c.rank, start + duration, "comm")
            value = list(gathered) if gathered else results.get(c.rank)
            end = (
                max(start + duration, self.comms[c.rank].clock) if background else start + duration
            )
            self._resume(c.rank, end, value)


ROWS_PER_BATCH = 200


def run_sim(
    launch: Launch, cost: CostModel, on_rows: Callable[[list[dict[str, Any]]], None]
) -> Outcome:
    """Run ``launch`` with ``launch.world_size`` virtual workers; stream rows to ``on_rows``.

    One thread, as each real worker has, so that the gradients are bit-identical to a Dask run's.
    """
    launch.program.prepare()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    buffer: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = [{} for _ in range(launch.world_size)]

    def emit(row: dict[str, Any]) -> None:
        buffer.append(row)
        if len(buffer) >= ROWS_PER_BATCH:
            on_rows(buffer[:])
            buffer.clear()

    async def rank_program(comm: Comm) -> None:
        results[comm.rank] = await launch.program(comm, torch.device("cpu"), emit)

    # the tuning for one run: a notebook kernel keeps neither it nor the run's peak
    with freed_memory_kept():
        try:
            servers = [make() for make in launch.servers]
            world = SimWorld(launch.world_size, cost, servers, [], launch.tolerates_worker_loss)
            world.run([rank_program] * launch.world_size)
        finally:
            torch.set_num_threads(threads)
            if buffer:
                on_rows(buffer[:])
    end = max((c.clock for c in world.comms), default=0.0)
    return Outcome(results, world.server_stats(), end, world.events)
