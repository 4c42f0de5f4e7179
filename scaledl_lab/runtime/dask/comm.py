"""torch.distributed under the :class:`Comm` interface: what a rank of a Dask run talks through.

Collectives and point-to-point messages go over an initialised process group (gloo on CPU,
NCCL on GPU), in wall-clock time; hosted servers are Dask actors, called through
torch.distributed messages on a gloo group of each server's own (:mod:`.p2p`) or as actor
calls; memory shared by the workers of one machine is a file in /dev/shm. On a GPU, NCCL
carries device tensors only: a CPU tensor handed to the comm (a step's loss, evaluation counts)
travels through the device and is written back, and server calls carry CPU tensors out and
device tensors back, so a strategy never needs to know where it runs.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ...errors import RunError, ServerLostError
from ..base import (
    Comm,
    Group,
    Incoming,
    Mailbox,
    Pending,
    check_gather,
    check_shardable,
    tensor_bytes,
)
from ..collectives import (
    all_to_all_bytes,
    allgather_bytes,
    check_all_to_all,
    ring_allreduce_bytes,
    ring_reduce_scatter_bytes,
)
from .p2p import P2PClient
from .survivors import LostRanks, star_allreduce, star_broadcast
from .work import (
    _ActorCall,
    _Done,
    _Failed,
    _LinkCall,
    _moved,
    _Posted,
    _Sent,
    _ThreadMailbox,
    _Work,
)


class TorchComm(Comm):
    """:class:`Comm` over an initialised torch.distributed process group, wall-clock time.

    Hosted servers are Dask actors; memory shared between workers is a file in /dev/shm.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        t0: float,
        *,
        run_id: str = "",
        servers: list[Any] | None = None,
        server_addresses: list[str] | None = None,
        server_links: list[dict[str, Any]] | None = None,
        timeout_s: float = 60.0,
        device: torch.device | None = None,
        before_exit: Callable[[], None] = lambda: None,
        lost_ranks: str | None = None,
        stragglers: Any = None,
    ) -> None:
        super().__init__(rank, world_size)
        # NCCL moves device tensors only; None: every tensor goes as it is (gloo, CPU).
        self.device = device if device is not None and device.type == "cuda" else None
        self.posts_ahead = self.device is None  # gloo; not NCCL (see Comm.posts_ahead)
        self.before_exit = before_exit  # ships the rows logged so far
        # Runs that go on when a worker dies: the driver's list of lost ranks, and ours.
        self.lost_view = LostRanks(lost_ranks) if lost_ranks else None
        self.lost: set[int] = set()
        self.stragglers = stragglers  # cost.Stragglers, or None
        self.steps = 0
        self.t0 = t0
        self.run_id = run_id
        self.servers = servers or []
        self.server_addresses = server_addresses or []
        # Calls go as torch.distributed messages through each server's link (.p2p), or as
        # actor calls without one.
        self.timeout_s = timeout_s
        self.links = [P2PClient(a, rank, timeout_s) for a in server_links or []]
        self.timeout = timedelta(seconds=timeout_s)
        self.groups: dict[Group, Any] = {}

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def restore_clock(self, state: dict[str, float]) -> None:
        """A resumed run: a wall clock goes on by itself (the driver shifts the rows)."""

    def _staged(self, tensor: torch.Tensor) -> torch.Tensor:
        """The tensor the process group moves: ``tensor``, or its copy on this rank's GPU."""
        if self.device is None or tensor.device == self.device:
            return tensor
        return tensor.to(self.device)

    def to_device(self, value: Any) -> Any:
        """A server's reply on this rank's device (servers hold CPU tensors)."""
        return value if self.device is None else _moved(value, self.device)

    def lost_peers(self) -> set[int]:
        return set(self.lost)

    def peer_lost(self, peer: int, exc: RuntimeError) -> None:
        """A message to or from ``peer`` failed: in a tolerant run it died (go on without it);
        otherwise the run fails with gloo's error."""
        if self.lost_view is None:
            raise exc
        self.lost.add(peer)

    def _world(self, gloo: Callable[[], Any], star: Callable[[list[int]], Any]) -> Any:
        """A collective over every worker: gloo's while all live; among the survivors (the
        driver's view) once one has died, or once gloo's fails because one has."""
        if self.lost_view is not None:
            self.lost |= self.lost_view.read()
        if not self.lost:
            try:
                return gloo()
            except RuntimeError:
                if self.lost_view is None:
                    raise
                self.lost |= self.lost_view.wait_for_any(self.timeout_s)
        return star(self.survivors())

    def die(self, step: int) -> None:
        """An injected fault: the rows so far go to the driver, then the worker process exits
        at once, as a crash would (its Dask worker is lost; a nanny may start a new one)."""
        self.before_exit()
        os._exit(1)

    @contextlib.asynccontextmanager
    async def compute(self, samples: int, share: float = 1.0) -> AsyncIterator[None]:
        """A straggler injected on a real worker: ``slow:RANK:FACTOR`` sleeps FACTOR − 1 times
        the block's measured duration after it, ``hiccup`` adds its seeded pauses."""
        start = time.perf_counter()
        yield
        if self.stragglers is not None:
            factor = self.stragglers.factor(self.rank, self.world_size)
            extra = (factor - 1) * (time.perf_counter() - start)
            time.sleep(max(0.0, extra) + self.stragglers.hiccup(self.rank, self.steps))
        self.steps += 1

    def new_group(self, ranks: Sequence[int]) -> Group:
        group = super().new_group(ranks)
        if group not in self.groups:  # a collective call: every rank creates every group
            self.groups[group] = dist.new_group(list(group), timeout=self.timeout)
        return group

    def allreduce_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        size = self.group_size(group)
        self.bytes_sent += ring_allreduce_bytes(tensor.numel() * tensor.element_size(), size)
        if size == 1:
            return _Done(tensor)
        if group is None and self.lost_view is not None:  # this run goes on without the dead
            self._world(
                lambda: dist.all_reduce(tensor),
                lambda alive: star_allreduce(tensor, self.rank, alive),
            )
            return _Done(tensor)
        pg = None if group is None else self.groups[group]
        staged = self._staged(tensor)
        return _Work(dist.all_reduce(staged, group=pg, async_op=True), tensor, staged)

    async def allreduce(self, tensor: torch.Tensor, group: Group | None = None) -> torch.Tensor:
        # The blocking form calls gloo and waits, with no Pending in between. Gloo still does
        # the work on its own thread in both forms, and the GIL is released while this thread
        # waits, so the worker's event loop (its heartbeats) runs meanwhile.
        size = self.group_size(group)
        if size == 1 or self.device is not None or (group is None and self.lost_view is not None):
            return await super().allreduce(tensor, group)  # staged, or among the survivors
        self.bytes_sent += ring_allreduce_bytes(tensor.numel() * tensor.element_size(), size)
        dist.all_reduce(tensor, group=None if group is None else self.groups[group])
        return tensor

    async def allgather(
        self, tensor: torch.Tensor, group: Group | None = None
    ) -> list[torch.Tensor]:
        size = self.group_size(group)
        self.bytes_sent += allgather_bytes(tensor.numel() * tensor.element_size(), size)
        if size == 1:
            return [tensor.detach().clone()]
        staged = self._staged(tensor.contiguous())
        out = [torch.empty_like(staged) for _ in range(size)]
        dist.all_gather(out, staged, group=None if group is None else self.groups[group])
        return [t.to(tensor.device) for t in out]

    def reduce_scatter_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        size = self.group_size(group)
        chunk = check_shardable("reduce_scatter", tensor, size)
        self.bytes_sent += ring_reduce_scatter_bytes(tensor.numel() * tensor.element_size(), size)
        if size == 1:
            return _Done(tensor.clone())
        out = torch.empty(chunk, dtype=tensor.dtype, device=tensor.device)
        staged, staged_out = self._staged(tensor), self._staged(out)
        pg = None if group is None else self.groups[group]
        work = dist.reduce_scatter_single(staged_out, staged, group=pg, async_op=True)
        return _Work(work, out, staged_out)

    def all_gather_into_start(
        self, out: torch.Tensor, shard: torch.Tensor, group: Group | None = None
    ) -> Pending:
        size = self.group_size(group)
        check_gather(out, shard, size)
        self.bytes_sent += allgather_bytes(shard.numel() * shard.element_size(), size)
        if size == 1:
            out.copy_(shard)
            return _Done(out)
        staged, staged_out = self._staged(shard), self._staged(out)
        pg = None if group is None else self.groups[group]
        work = dist.all_gather_single(staged_out, staged, group=pg, async_op=True)
        return _Work(work, out, staged_out)

    def all_to_all_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        size = self.group_size(group)
        check_all_to_all(tensor, size)
        self.bytes_sent += all_to_all_bytes(tensor.numel() * tensor.element_size(), size)
        if size == 1:
            return _Done(tensor.clone())
        out = torch.empty_like(tensor)
        staged, staged_out = self._staged(tensor.contiguous()), self._staged(out)
        pg = None if group is None else self.groups[group]
        work = dist.all_to_all_single(staged_out, staged, group=pg, async_op=True)
        return _Work(work, out, staged_out)

    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        if self.rank == src:
            self.bytes_sent += tensor.numel() * tensor.element_size() * (self.world_size - 1)
        if self.world_size > 1 and self.lost_view is not None:
            self._world(
                lambda: dist.broadcast(tensor, src),
                lambda alive: star_broadcast(tensor, src, self.rank, alive),
            )
        elif self.world_size > 1:
            staged = self._staged(tensor)
            dist.broadcast(staged, src)
            if staged is not tensor:
                tensor.copy_(staged)
        return tensor

    async def rank0_choice(self, choice: bool) -> bool:
        if self.world_size == 1 or self.lost_view is not None:  # survivors: each its own
            return choice
        flag = self._staged(torch.tensor([int(choice)], dtype=torch.int32))
        dist.broadcast(flag, 0)
        return bool(flag.item())

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        staged = self._staged(tensor)  # kept alive by the _Sent until the send completes
        try:
            return _Sent(self, dist.isend(staged, dst), dst, staged)
        except RuntimeError as exc:  # the peer's connection is already closed
            self.peer_lost(dst, exc)
            return _Done(tensor)

    def irecv(self, tensor: torch.Tensor, src: int) -> Incoming:
        staged = self._staged(tensor)
        try:
            return _Posted(dist.irecv(staged, src), tensor, self, src, staged)
        except RuntimeError as exc:  # the peer's connection is already closed
            self.peer_lost(src, exc)
            return _Posted(_Failed(exc), tensor, self, src)

    def mailbox(self, src: int, like: torch.Tensor, total: int) -> Mailbox:
        return _ThreadMailbox(self, src, like, total)

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        try:
            dist.send(self._staged(tensor), dst)
        except RuntimeError as exc:
            self.peer_lost(dst, exc)

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return await self.irecv(tensor, src).wait()

    @property
    def num_servers(self) -> int:
        return len(self.servers)

    def call_start(self, server: int, method: str, *args: Any) -> Pending:
        if not 0 <= server < len(self.servers):
            return super().call_start(server, method, *args)
        self.bytes_sent += tensor_bytes(args)
        if self.device is not None:  # servers live in other processes, on the CPU
            args = _moved(args, torch.device("cpu"))
        if self.links:
            self.links[server].start(method, args)
            return _LinkCall(self, server, self.links[server])
        try:
            future = self.servers[server].call(method, args)
        except Exception as exc:  # the actor's worker is already gone
            raise self.server_lost(server, "is gone", exc) from None
        return _ActorCall(self, server, future)

    def close_links(self) -> None:
        for link in self.links:
            link.close()
        self.links = []

    def server_lost(self, server: int, what: str, exc: Exception) -> ServerLostError:
        return ServerLostError(
            f"server {server} on worker {self.server_addresses[server]} {what} "
            f"({type(exc).__name__}: {exc}); the run cannot go on without it"
        )

    async def shared_tensor(self, name: str, init: torch.Tensor) -> torch.Tensor:
        hosts = [None] * self.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        if len(set(hosts)) > 1:
            raise RunError(
                f"shared memory needs every worker on one machine, but the workers run on "
                f"{sorted(set(hosts))}; run this strategy on a single-node cluster"
            )
        path = Path("/dev/shm") / f"scaledl-{self.run_id}-{name}"
        if self.is_root:
            init.detach().cpu().contiguous().numpy().tofile(path)
        dist.barrier()
        shared = torch.from_file(str(path), shared=True, size=init.numel(), dtype=init.dtype)
        dist.barrier()  # everyone has mapped it: the name can go, the memory stays
        if self.is_root:
            path.unlink(missing_ok=True)
        return shared.view_as(init)

    async def barrier(self) -> None:
        if self.world_size > 1 and self.lost_view is not None:
            one = torch.zeros(1)
            self._world(dist.barrier, lambda alive: star_allreduce(one, self.rank, alive))
        elif self.world_size > 1:
            dist.barrier()
