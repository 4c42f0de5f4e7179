"""The simulated runtime, a worker's side: :class:`SimComm` turns every Comm operation into a
request to the scheduler (:mod:`.scheduler`) and resumes with its answer, in virtual time."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import torch

from ...errors import PeerLostError
from .. import extra_work
from ..base import (
    Comm,
    Incoming,
    Mailbox,
    Pending,
    check_gather,
    check_shardable,
    clone_tensors,
    tensor_bytes,
)
from ..collectives import (
    all_to_all_bytes,
    allgather_bytes,
    check_all_to_all,
    ring_reduce_scatter_bytes,
)
from .mail import Sent, lend
from .network import NetworkProfile
from .requests import Await, Collective, Sleep, Until, WaitCall, WaitRecv


class _SimPending(Pending):
    def __init__(self, comm: SimComm, tensor: torch.Tensor, group: tuple[int, ...] | None) -> None:
        self.comm, self.tensor, self.group = comm, tensor, group
        self.started: float | None = None
        self.overlapped = False

    async def wait(self) -> torch.Tensor:
        request = Collective(self.comm.rank, "allreduce", self.tensor, group=self.group)
        request.started, request.overlapped = self.started, self.overlapped
        await Await(request)
        return self.tensor


class _SimSharded(Pending):
    """A reduce-scatter or flat all-gather, carried out when every member waits for it."""

    def __init__(self, comm: SimComm, request: Collective) -> None:
        self.comm, self.request = comm, request

    async def wait(self) -> torch.Tensor:
        return await Await(self.request)


class _SimSent(Pending):
    def __init__(self, comm: SimComm, until: float) -> None:
        self.comm, self.until = comm, until

    async def wait(self) -> None:
        await Await(Until(self.comm.rank, self.until))


# The part of a compute block that is forward, before backward produces any gradient.
FORWARD_SHARE = 1 / 3
# What a receive from a peer that died without sending resumes with (then raises PeerLostError).
LOST: Any = object()


class SimIncoming(Incoming):
    """A posted receive; the world assigns it a message (FIFO per sender) when one is sent,
    or marks it ``lost`` when the sender died without sending it.

    ``tensor`` None (a mailbox's receive): the message itself is handed out, a private copy
    (:class:`~.mail.Sent`) taken when it was read, instead of being copied into a buffer of
    the receiver's."""

    def __init__(self, comm: SimComm, tensor: torch.Tensor | None, src: int) -> None:
        self.comm, self.tensor, self.src = comm, tensor, src
        self.message: tuple[float, Sent] | None = None
        self.copied = False
        self.lost = False
        self.lent = tensor is not None and lend(tensor)

    def arrive(self, at: float, sent: Sent) -> None:
        """The message is sent while this receive is posted: a buffer gets it straight away
        (the receiver reads it only once it has arrived, at ``at``); a mailbox's receive takes
        it when it reads it."""
        self.message = (at, sent)
        if self.tensor is not None:
            self._fill(sent)

    def _fill(self, sent: Sent) -> None:
        """The message into the receiver's buffer: a lent buffer takes the message's private
        copy as its storage (no copy, no second gradient), any other is copied into."""
        assert self.tensor is not None
        if self.lent and sent.shape == self.tensor.shape and sent.dtype == self.tensor.dtype:
            self.tensor.set_(sent.take().contiguous())
        else:
            if self.lent:
                self.tensor.set_(torch.empty_like(self.tensor))
            sent.read_into(self.tensor)
        self.copied = True

    def _take(self) -> torch.Tensor:
        if not self.copied:
            assert self.message is not None
            if self.tensor is None:
                self.tensor = self.message[1].take()
                self.copied = True
            else:
                self._fill(self.message[1])
        assert self.tensor is not None
        return self.tensor

    def ready(self) -> bool:
        if self.message is None or self.message[0] > self.comm.clock:
            return False
        self._take()
        return True

    async def wait(self) -> torch.Tensor:
        if await Await(WaitRecv(self.comm.rank, self)) is LOST:
            if self.lent:  # the buffer is the receiver's own again (its contents undefined)
                self.tensor.set_(torch.empty_like(self.tensor))  # type: ignore[union-attr]
            raise PeerLostError(f"rank {self.src} died before sending", self.src)
        return self._take()


class SimCall(Pending):
    """A call to a hosted server; ``reply_at``/``value`` are set when the server answers."""

    def __init__(self, comm: SimComm, server: int, method: str, args: tuple[Any, ...]) -> None:
        self.comm, self.server, self.method, self.args = comm, server, method, args
        self.reply_at: float | None = None
        self.reply_bytes = 0
        self.value: Any = None

    async def wait(self) -> Any:
        return await Await(WaitCall(self.comm.rank, self))


class SimMailbox(Mailbox):
    """Every message sent here is handed out as the simulator's private copy of it (see
    :class:`~.mail.Sent`): no buffer to allocate and copy it into."""

    def _post(self) -> None:
        more = self.taken < self.total
        self._posted = self.comm.irecv(None, self.src) if more else None  # type: ignore[arg-type]


class SimComm(Comm):
    """:class:`Comm` of one virtual worker; time is ``clock``, advanced by the cost model."""

    def __init__(self, rank: int, world: Any) -> None:  # world: the sim.SimWorld scheduling it
        super().__init__(rank, world.world_size)
        self.world = world
        self.clock = 0.0
        self.steps = 0
        self.nic_free = 0.0  # when this worker's outgoing link finishes what it was given
        # Background allreduces started inside the open compute block (None: no block open),
        # and when the last of those started from a block finishes its transfer.
        self._in_block: list[_SimPending] | None = None
        self.background_free = 0.0

    def _inject(self, nbytes: int, link: NetworkProfile) -> tuple[float, float]:
        """Queue ``nbytes`` on this worker's outgoing queue, sent at ``link``'s bandwidth (one
        queue whatever the link): (departure of the first byte, of the last)."""
        departure = max(self.clock, self.nic_free)
        self.nic_free = departure + nbytes / link.bandwidth_Bps
        return departure, self.nic_free

    def now(self) -> float:
        return self.clock

    def clock_state(self) -> dict[str, float]:
        """The virtual clock, the compute blocks taken (stragglers draw per block) and when
        the outgoing link is free: a resumed rank goes on from them bit for bit."""
        return {"time": self.clock, "steps": self.steps, "nic_free": self.nic_free}

    def restore_clock(self, state: dict[str, float]) -> None:
        self.clock, self.nic_free = state["time"], state["nic_free"]
        self.steps = int(state["steps"])

    def lost_peers(self) -> set[int]:
        return set(self.world.dead)

    @contextlib.asynccontextmanager
    async def compute(self, samples: int, share: float = 1.0) -> AsyncIterator[None]:
        extra_work.take()  # what ran outside any block is charged to none
        self._in_block = []
        try:
            yield
        finally:
            started, self._in_block = self._in_block, None
        share += extra_work.take() / 3  # forwards run again in backward: a third of a step each
        cost = self.world.cost.step_time(self.rank, self.world_size, self.steps, samples) * share
        self.steps += 1
        self._time_in_block(started, cost)
        await Await(Sleep(self.rank, self.clock + cost))

    def _time_in_block(self, started: list[_SimPending], cost: float) -> None:
        """When each background allreduce started inside the block that ends now (charged
        ``cost`` from ``clock``) began its transfer. The block is taken as a forward (its first
        third) then a backward that produces the gradients at an even rate, so an allreduce
        started from a gradient hook is ready once backward has produced the bytes of it and
        of those started before it (DDP's buckets, last layer first); the transfers go one
        after the other on this worker's link, as NCCL runs a process group's collectives."""
        total = sum(p.tensor.numel() * p.tensor.element_size() for p in started)
        done = 0
        for pending in started:
            nbytes = pending.tensor.numel() * pending.tensor.element_size()
            done += nbytes
            ready = self.clock + cost * (FORWARD_SHARE + (1 - FORWARD_SHARE) * done / total)
            pending.started = max(ready, self.background_free)
            pending.overlapped = True
            members = self.world._members(pending.group)
            duration = self.world.cost.allreduce_time(nbytes, len(members), members)
            self.background_free = pending.started + duration

    @contextlib.asynccontextmanager
    async def applying(self, nbytes: int) -> AsyncIterator[None]:
        yield
        cost = self.world.cost.apply_time(self.rank, self.world_size, nbytes)
        await Await(Sleep(self.rank, self.clock + cost))

    def allreduce_start(
        self, tensor: torch.Tensor, group: tuple[int, ...] | None = None
    ) -> Pending:
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_sent += self.world.cost.allreduce_bytes(nbytes, self.group_size(group))
        return _SimPending(self, tensor, group)

    def allreduce_background(
        self, tensor: torch.Tensor, group: tuple[int, ...] | None = None
    ) -> Pending:
        pending = self.allreduce_start(tensor, group)
        assert isinstance(pending, _SimPending)
        if self._in_block is not None:  # from backward (a gradient hook): timed at the block's end
            self._in_block.append(pending)
        else:
            pending.started = self.clock  # the sum is taken at wait(); its time runs from now
        return pending

    def allreduce_bytes(self, nbytes: int, group: tuple[int, ...] | None = None) -> int:
        return self.world.cost.allreduce_bytes(nbytes, self.group_size(group))

    async def allgather(
        self, tensor: torch.Tensor, group: tuple[int, ...] | None = None
    ) -> list[torch.Tensor]:
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_sent += allgather_bytes(nbytes, self.group_size(group))
        return await Await(Collective(self.rank, "allgather", tensor, group=group))

    def reduce_scatter_start(
        self, tensor: torch.Tensor, group: tuple[int, ...] | None = None
    ) -> Pending:
        size = self.group_size(group)
        check_shardable("reduce_scatter", tensor, size)
        self.bytes_sent += ring_reduce_scatter_bytes(tensor.numel() * tensor.element_size(), size)
        return _SimSharded(self, Collective(self.rank, "reduce_scatter", tensor, group=group))

    def all_gather_into_start(
        self, out: torch.Tensor, shard: torch.Tensor, group: tuple[int, ...] | None = None
    ) -> Pending:
        size = self.group_size(group)
        check_gather(out, shard, size)
        self.bytes_sent += allgather_bytes(shard.numel() * shard.element_size(), size)
        request = Collective(self.rank, "all_gather_into", shard, group=group, out=out)
        return _SimSharded(self, request)

    def all_to_all_start(
        self, tensor: torch.Tensor, group: tuple[int, ...] | None = None
    ) -> Pending:
        size = self.group_size(group)
        check_all_to_all(tensor, size)
        self.bytes_sent += all_to_all_bytes(tensor.numel() * tensor.element_size(), size)
        return _SimSharded(self, Collective(self.rank, "all_to_all", tensor, group=group))

    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        if self.rank == src:
            self.bytes_sent += tensor.numel() * tensor.element_size() * (self.world_size - 1)
        await Await(Collective(self.rank, "broadcast", tensor, src))
        return tensor

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        nbytes = tensor.numel() * tensor.element_size()
        self.bytes_sent += nbytes
        link = self.world.cost.link((self.rank, dst))  # the link between the two ranks' nodes
        _, done = self._inject(nbytes, link)
        self.world._deliver(self.rank, dst, done + link.latency_s, tensor)
        return _SimSent(self, done)

    def irecv(self, tensor: torch.Tensor | None, src: int) -> Incoming:
        incoming = SimIncoming(self, tensor, src)
        self.world._post(self.rank, incoming)
        return incoming

    def mailbox(self, src: int, like: torch.Tensor, total: int) -> Mailbox:
        # The simulator's messages need no buffer: keep no real template per neighbour.
        return SimMailbox(self, src, like.to("meta"), total)

    @property
    def num_servers(self) -> int:
        return len(self.world.servers)

    def call_start(self, server: int, method: str, *args: Any) -> Pending:
        if not 0 <= server < len(self.world.servers):
            return super().call_start(server, method, *args)
        nbytes = tensor_bytes(args)
        self.bytes_sent += nbytes
        departure, _ = self._inject(nbytes, self.world.cost.network.inter)  # a host of its own
        call = SimCall(self, server, method, clone_tensors(args))
        self.world._call(call, departure, nbytes)
        return call

    async def shared_tensor(self, name: str, init: torch.Tensor) -> torch.Tensor:
        # Every virtual worker lives in this process: the first caller's copy is everyone's.
        if name not in self.world.shared:
            self.world.shared[name] = init.detach().clone()
        return self.world.shared[name]

    async def barrier(self) -> None:
        await Await(Collective(self.rank, "barrier"))
