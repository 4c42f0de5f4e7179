"""torch.distributed under the :class:`Comm` interface: what a rank of a Dask run talks through.

Collectives and point-to-point messages go over an initialised process group (gloo on CPU,
NCCL on GPU), in wall-clock time; hosted servers are Dask actors; memory shared by the
workers of one machine is a file in /dev/shm.
"""

from __future__ import annotations

import collections
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..cost import allgather_bytes, ring_allreduce_bytes
from ..errors import RunError, ServerLostError
from .base import Comm, Group, Incoming, Mailbox, Pending, tensor_bytes


class _Done(Pending):
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    async def wait(self) -> torch.Tensor:
        return self.tensor


class _Work(Pending):
    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        self.work, self.tensor = work, tensor

    async def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.tensor


class _Posted(Incoming):
    """A posted gloo receive. Gloo's recv work reports ``is_completed()`` only after ``wait()``
    (and has no future), so the first ``ready()`` starts a helper thread that waits for it."""

    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        self.work, self.tensor = work, tensor
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _wait_in_thread(self) -> None:
        try:
            self.work.wait()
        except BaseException as exc:  # re-raised by wait() in the worker's own thread
            self._error = exc
        finally:
            self._done.set()

    def ready(self) -> bool:
        if self._thread is None:
            self._thread = threading.Thread(target=self._wait_in_thread, daemon=True)
            self._thread.start()
        return self._done.is_set()

    async def wait(self) -> torch.Tensor:
        if self._thread is None:
            self.work.wait()
        else:
            self._thread.join()
            if self._error is not None:
                raise self._error
        return self.tensor


class _ThreadMailbox(Mailbox):
    """A receiver thread keeps one gloo receive posted for ``src`` and queues what arrives, so
    a sender's message leaves it as soon as it is on the wire, whatever this worker is doing
    (gloo's sends otherwise complete only once the receiver has posted the receive)."""

    def __init__(self, comm: Comm, src: int, like: torch.Tensor, total: int) -> None:
        self.comm, self.src, self.like, self.total = comm, src, like, total
        self.taken = self.received = 0
        self._queue: collections.deque[torch.Tensor] = collections.deque()
        self._arrived = threading.Condition()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        try:
            for _ in range(self.total):
                buffer = torch.empty_like(self.like)
                dist.irecv(buffer, self.src).wait()
                with self._arrived:
                    self._queue.append(buffer)
                    self.received += 1
                    self._arrived.notify()
        except BaseException as exc:  # re-raised by get() in the worker's own thread
            with self._arrived:
                self._error = exc
                self._arrived.notify()

    def ready(self) -> bool:
        return bool(self._queue)

    async def get(self) -> torch.Tensor:
        if self.taken >= self.total:
            raise RunError(f"all {self.total} messages from rank {self.src} were taken already")
        with self._arrived:
            while not self._queue and self._error is None:
                self._arrived.wait()
            if not self._queue:
                raise RunError(f"receiving from rank {self.src} failed: {self._error}")
            self.taken += 1
            return self._queue.popleft()


class _ActorCall(Pending):
    def __init__(self, comm: TorchComm, server: int, future: Any) -> None:
        self.comm, self.server, self.future = comm, server, future

    async def wait(self) -> Any:
        try:
            return self.future.result(timeout=self.comm.timeout_s)
        except Exception as exc:  # a dead host: OSError, CommClosedError or the timeout
            raise self.comm.server_lost(
                self.server, f"did not answer within {self.comm.timeout_s:g} s", exc
            ) from None


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
        timeout_s: float = 60.0,
        stragglers: Any = None,
    ) -> None:
        super().__init__(rank, world_size)
        self.stragglers = stragglers  # cost.Stragglers, or None
        self.steps = 0
        self.t0 = t0
        self.run_id = run_id
        self.servers = servers or []
        self.server_addresses = server_addresses or []
        self.timeout_s = timeout_s
        self.timeout = timedelta(seconds=timeout_s)
        self.groups: dict[Group, Any] = {}

    def now(self) -> float:
        return time.perf_counter() - self.t0

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
        pg = None if group is None else self.groups[group]
        return _Work(dist.all_reduce(tensor, group=pg, async_op=True), tensor)

    async def allgather(
        self, tensor: torch.Tensor, group: Group | None = None
    ) -> list[torch.Tensor]:
        size = self.group_size(group)
        self.bytes_sent += allgather_bytes(tensor.numel() * tensor.element_size(), size)
        if size == 1:
            return [tensor.detach().clone()]
        out = [torch.empty_like(tensor) for _ in range(size)]
        dist.all_gather(
            out, tensor.contiguous(), group=None if group is None else self.groups[group]
        )
        return out

    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        if self.rank == src:
            self.bytes_sent += tensor.numel() * tensor.element_size() * (self.world_size - 1)
        if self.world_size > 1:
            dist.broadcast(tensor, src)
        return tensor

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        return _Work(dist.isend(tensor, dst), tensor)

    def irecv(self, tensor: torch.Tensor, src: int) -> Incoming:
        return _Posted(dist.irecv(tensor, src), tensor)

    def mailbox(self, src: int, like: torch.Tensor, total: int) -> Mailbox:
        return _ThreadMailbox(self, src, like, total)

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        dist.send(tensor, dst)

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(tensor, src)
        return tensor

    @property
    def num_servers(self) -> int:
        return len(self.servers)

    def call_start(self, server: int, method: str, *args: Any) -> Pending:
        if not 0 <= server < len(self.servers):
            return super().call_start(server, method, *args)
        self.bytes_sent += tensor_bytes(args)
        try:
            future = self.servers[server].call(method, args)
        except Exception as exc:  # the actor's worker is already gone
            raise self.server_lost(server, "is gone", exc) from None
        return _ActorCall(self, server, future)

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
        if self.world_size > 1:
            dist.barrier()
