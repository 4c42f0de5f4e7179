"""The communication interface every per-worker program is written against.

A strategy is an ``async def`` program that one worker runs. It talks to its peers only through
a :class:`Comm`; a runtime supplies the implementation: ``dask`` (real processes, tensors moved
by torch.distributed, wall-clock time) or ``sim`` (every worker in one process, virtual time).
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from ..errors import RunError, WorkerKilled
from .collectives import check_gather as check_gather
from .collectives import check_shardable as check_shardable
from .collectives import ring_allreduce_bytes
from .collectives import shard_numel as shard_numel


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


class Mailbox:
    """Every message ``src`` sends this worker, taken as it arrives and queued without bound, so
    the sender never waits for this worker to be ready (FAST's receiving side).

    This default keeps one receive posted, which suffices where sends never wait for their
    receiver (the simulator queues messages); the Dask runtime takes them in a thread.
    ``taken`` counts the messages handed out; ``total`` are expected.
    """

    def __init__(self, comm: Comm, src: int, like: torch.Tensor, total: int) -> None:
        self.comm, self.src, self.like, self.total = comm, src, like, total
        self.taken = 0
        self._posted: Incoming | None = None
        self._post()

    def _post(self) -> None:
        more = self.taken < self.total
        self._posted = self.comm.irecv(torch.empty_like(self.like), self.src) if more else None

    def ready(self) -> bool:
        """True if a message is waiting (never blocks)."""
        return self._posted is not None and self._posted.ready()

    async def get(self) -> torch.Tensor:
        """The next message, waiting for it if none has arrived."""
        if self._posted is None:
            raise RunError(f"all {self.total} messages from rank {self.src} were taken already")
        message = await self._posted.wait()
        self.taken += 1
        self._post()
        return message


class Comm(abc.ABC):
    """What a worker may do with its peers. Every method is awaited, so a runtime may suspend."""

    # Whether receives may be posted long before this rank's own sends to the same peer (gloo
    # and the simulator match each in order, apart; NCCL runs a pair's sends and receives on
    # one stream, where a posted receive holds the sends behind it).
    posts_ahead = True

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

    def clock_state(self) -> dict[str, float]:
        return {"time": self.now()}  # what a checkpoint keeps: each runtime has restore_clock

    def new_group(self, ranks: Sequence[int]) -> Group:
        """A group of ranks for collectives among them only. Every worker must create every
        group, in the same order (as torch.distributed requires), members or not."""
        group = tuple(sorted(set(ranks)))
        if not group or not all(0 <= r < self.world_size for r in group):
            raise RunError(f"a group needs ranks in [0, {self.world_size}), got {list(ranks)}")
        return group

    def group_size(self, group: Group | None) -> int:
        return self.world_size if group is None else len(group)

    @abc.abstractmethod
    def allreduce_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        """Start an in-place sum allreduce of ``tensor`` over ``group`` (default: every
        worker) and return at once (overlap with work)."""

    async def allreduce(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        """In-place sum of ``tensor`` over ``group`` (default: every worker)."""
        return await self.allreduce_start(tensor, group).wait()

    def allreduce_background(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        """Start an allreduce that runs behind the computation before its ``wait()`` (Streaming
        DiLoCo's outer gradients, DDP's buckets): :meth:`allreduce_start` on a real runtime;
        the simulator counts its transfer from now, so the steps computed meanwhile hide it.
        Started inside a :meth:`compute` block (a gradient hook, during backward), it counts
        from the point of backward that produced its bytes, after the transfers started before
        it (the timeline shows the hidden part as ``overlapped``)."""
        return self.allreduce_start(tensor, group)

    def allreduce_bytes(self, nbytes: int, group: Group | None = None) -> int:
        """Bytes this worker sends in an allreduce of ``nbytes`` (what ``bytes_sent`` counts)."""
        return ring_allreduce_bytes(nbytes, self.group_size(group))

    async def allgather(
        self, tensor: torch.Tensor, group: Group | None = None
    ) -> list[torch.Tensor]:
        """Every member's ``tensor`` (the same size on each), in rank order; do not modify them.
        Counts (members − 1) × its bytes as sent (a ring allgather)."""
        raise RunError("this runtime has no allgather")

    # -- sharded collectives (ZeRO, FSDP): a flat tensor padded to a multiple of the group ---

    def reduce_scatter_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        """Start summing the flat ``tensor`` over ``group``; ``wait()`` gives this member's
        chunk of the sum (the i-th of p equal chunks for the i-th member, a new tensor).
        ``tensor`` must not change until then. Its size must divide by p: callers pad with
        zeros at the end (:func:`shard_numel`). Counts (p − 1)/p of its bytes as sent."""
        raise RunError("this runtime has no reduce_scatter")

    async def reduce_scatter(
        self, tensor: torch.Tensor, group: Group | None = None
    ) -> torch.Tensor:
        """This member's chunk of the sum of the flat ``tensor`` (see reduce_scatter_start)."""
        return await self.reduce_scatter_start(tensor, group).wait()

    def all_gather_into_start(
        self, out: torch.Tensor, shard: torch.Tensor, group: Group | None = None
    ) -> Pending:
        """Start writing every member's flat ``shard`` (the same size on each) into ``out``,
        in rank order (``out`` holds p shards); ``wait()`` gives ``out``. Counts (p − 1) ×
        the shard's bytes as sent: (p − 1)/p of ``out``'s, as a ring all-gather."""
        raise RunError("this runtime has no all_gather_into")

    async def all_gather_into(
        self, out: torch.Tensor, shard: torch.Tensor, group: Group | None = None
    ) -> torch.Tensor:
        """Every member's ``shard`` concatenated into ``out`` (see all_gather_into_start)."""
        return await self.all_gather_into_start(out, shard, group).wait()

    def all_to_all_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        """Start an all-to-all over ``group``: ``tensor``'s first dimension splits into p equal
        chunks, the i-th for the i-th member; ``wait()`` gives a new tensor of its shape whose
        j-th chunk came from the j-th member. Counts (p − 1)/p of its bytes as sent."""
        raise RunError("this runtime has no all_to_all")

    async def all_to_all(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        """The chunks every member sent this one (see all_to_all_start)."""
        return await self.all_to_all_start(tensor, group).wait()

    @abc.abstractmethod
    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        """Overwrite ``tensor`` on every worker with the copy held by rank ``src``."""

    @abc.abstractmethod
    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        """Start sending ``tensor`` to ``dst``; do not modify it until the Pending is waited."""

    @abc.abstractmethod
    def irecv(self, tensor: torch.Tensor, src: int) -> Incoming:
        """Post a receive of the next message from ``src`` into ``tensor``."""

    def mailbox(self, src: int, like: torch.Tensor, total: int) -> Mailbox:
        """Start taking the ``total`` messages ``src`` will send (each shaped as ``like``) off the
        wire as they arrive; see :class:`Mailbox`."""
        return Mailbox(self, src, like, total)

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        await self.isend(tensor, dst).wait()

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return await self.irecv(tensor, src).wait()

    async def rank0_choice(self, choice: bool) -> bool:
        """Rank 0's ``choice`` on every rank: a tuning decision the ranks must share (whether
        the reducer overlaps), not part of the algorithm, so not counted as traffic. The
        simulator keeps each rank's own: its modes cost the same virtual time."""
        return choice

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

    def survivors(self) -> list[int]:
        """The ranks not known to have died, in order: collectives over every worker (group
        None) run among them, and the first of them reports what rank 0 would."""
        lost = self.lost_peers()
        return [r for r in range(self.world_size) if r not in lost]

    def die(self, step: int) -> None:
        """End this worker now, as a crash would (an injected fault after ``step``)."""
        raise WorkerKilled(self.rank, step)

    @abc.abstractmethod
    async def barrier(self) -> None: ...

    @contextlib.asynccontextmanager
    async def compute(self, samples: int, share: float = 1.0) -> AsyncIterator[None]:
        """Mark a block of local computation: ``share`` of a training step on ``samples``.

        Wall-clock runtimes need nothing here; the simulated runtime charges the block's
        duration to this worker's virtual clock from its cost model (a pipeline stage's
        forward is its layers' share of a step's FLOPs, times about 1/3).
        """
        yield

    @contextlib.asynccontextmanager
    async def applying(self, nbytes: int) -> AsyncIterator[None]:
        """Mark applying a received gradient of ``nbytes`` parameter bytes (its copy out of the
        receive buffer and an optimiser step); the simulated runtime charges it from its cost
        model, wall-clock runtimes need nothing."""
        yield


Emit = Callable[[dict[str, Any]], None]
Group = tuple[int, ...]  # the ranks of a group, sorted


class RankProgram(Protocol):
    """What a runtime runs on every rank: the layer above binds a strategy, a config and the
    run's metrics to it (``launch.BoundProgram``); the runtime only provides the Comm."""

    def prepare(self) -> None:
        """Load what every rank needs (data) before the run's clock starts."""

    async def __call__(self, comm: Comm, device: torch.device, emit: Emit) -> dict[str, Any]:
        """Run rank ``comm.rank``'s program; ``emit`` records a metrics row; returns its result."""


@dataclass(frozen=True)
class Launch:
    """Everything a runtime needs to run one program on ``world_size`` ranks.

    ``servers`` builds each hosted server object where it will live (zero-argument, picklable);
    ``tolerates_worker_loss`` says whether the run goes on when a worker dies.
    """

    program: RankProgram
    world_size: int
    label: str
    servers: tuple[Callable[[], Any], ...] = ()
    tolerates_worker_loss: bool = False
    device: str = "auto"
    timeout_s: float = 60.0
    stragglers: Any = None  # cost.Stragglers: the Dask runtime injects them as sleeps
    server_transport: str = "auto"  # how ranks call hosted servers (Dask runtime): see dask.p2p


@dataclass
class Outcome:
    """What a run returns: each rank's result (empty for a lost worker), each server's counters
    (``calls``, ``bytes_in``, ``bytes_out``), when the run ended, and (sim) the timeline."""

    results: list[dict[str, Any]]
    server_stats: list[dict[str, int]]
    end_time: float
    events: list[Any] | None = None
