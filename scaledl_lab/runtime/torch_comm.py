"""torch.distributed under the :class:`Comm` interface: what a rank of a Dask run talks through.

Collectives and point-to-point messages go over an initialised process group (gloo on CPU,
NCCL on GPU), in wall-clock time; hosted servers are Dask actors; memory shared by the
workers of one machine is a file in /dev/shm.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ..cost import allgather_bytes, ring_allreduce_bytes
from ..errors import RunError, ServerLostError
from .base import Comm, Group, Incoming, Pending, tensor_bytes


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
    ) -> None:
        super().__init__(rank, world_size)
        self.t0 = t0
        self.run_id = run_id
        self.servers = servers or []
        self.server_addresses = server_addresses or []
        self.timeout_s = timeout_s
        self.timeout = timedelta(seconds=timeout_s)
        self.groups: dict[Group, Any] = {}

    def now(self) -> float:
        return time.perf_counter() - self.t0

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
