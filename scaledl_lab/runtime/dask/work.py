"""What a :class:`~.comm.TorchComm` hands back: started collectives and messages (on the
rank's device or staged through it), posted receives, receiver-thread mailboxes and calls to
server actors."""

from __future__ import annotations

import collections
import threading
from typing import Any

import torch
import torch.distributed as dist

from ...errors import PeerLostError, RunError
from ..base import Comm, Incoming, Mailbox, Pending


class _Done(Pending):
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    async def wait(self) -> torch.Tensor:
        return self.tensor


class _Work(Pending):
    """A started operation on ``staged`` (``tensor`` itself, or its device copy)."""

    def __init__(self, work: Any, tensor: torch.Tensor, staged: torch.Tensor | None = None) -> None:
        self.work, self.tensor = work, tensor
        self.staged = tensor if staged is None else staged

    async def wait(self) -> torch.Tensor:
        self.work.wait()
        if self.staged is not self.tensor:
            self.tensor.copy_(self.staged)
        return self.tensor


class _Failed:
    """The work of a receive that could not even be posted: waiting raises its error."""

    def __init__(self, exc: RuntimeError) -> None:
        self.exc = exc

    def wait(self) -> None:
        raise self.exc


class _Sent(Pending):
    """A posted send; in a run that tolerates worker loss, one to a dead peer is dropped."""

    def __init__(self, comm: Any, work: Any, peer: int, staged: torch.Tensor) -> None:
        self.comm, self.work, self.peer = comm, work, peer
        self.staged = staged  # kept alive until the send completes

    async def wait(self) -> None:
        try:
            self.work.wait()
        except RuntimeError as exc:
            self.comm.peer_lost(self.peer, exc)


class _Posted(Incoming):
    """A posted gloo receive. Gloo's recv work reports ``is_completed()`` only after ``wait()``
    (and has no future), so the first ``ready()`` starts a helper thread that waits for it."""

    def __init__(
        self, work: Any, tensor: torch.Tensor, comm: Any, peer: int,
        staged: torch.Tensor | None = None,
    ) -> None:  # fmt: skip
        self.work, self.tensor, self.comm, self.peer = work, tensor, comm, peer
        self.staged = tensor if staged is None else staged
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
        if self.staged.is_cuda:  # NCCL: the work's CUDA event says when the data is there
            return self.work.is_completed()
        if self._thread is None:
            self._thread = threading.Thread(target=self._wait_in_thread, daemon=True)
            self._thread.start()
        return self._done.is_set() and self._error is None  # a failed one: see wait()

    async def wait(self) -> torch.Tensor:
        try:
            if self._thread is None:
                self.work.wait()
            else:
                self._thread.join()
                if self._error is not None:
                    raise self._error
        except RuntimeError as exc:
            self.comm.peer_lost(self.peer, exc)
            raise PeerLostError(f"rank {self.peer} died before sending", self.peer) from None
        if self.staged is not self.tensor:
            self.tensor.copy_(self.staged)
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
                if isinstance(self._error, RuntimeError):  # raised again if not tolerated
                    self.comm.peer_lost(self.src, self._error)
                    raise PeerLostError(f"rank {self.src} died before sending", self.src)
                raise RunError(f"receiving from rank {self.src} failed: {self._error}")
            self.taken += 1
            return self._queue.popleft()


class _ActorCall(Pending):
    def __init__(self, comm: Any, server: int, future: Any) -> None:
        self.comm, self.server, self.future = comm, server, future

    async def wait(self) -> Any:
        try:
            value = self.future.result(timeout=self.comm.timeout_s)
        except Exception as exc:  # a dead host: OSError, CommClosedError or the timeout
            raise self.comm.server_lost(
                self.server, f"did not answer within {self.comm.timeout_s:g} s", exc
            ) from None
        return self.comm.to_device(value)


class _LinkCall(Pending):
    """A call through a server link (:mod:`.p2p`): the reply, or the server's error."""

    def __init__(self, comm: Any, server: int, link: Any) -> None:
        self.comm, self.server, self.link = comm, server, link

    async def wait(self) -> Any:
        try:
            value = self.link.wait(self.comm.timeout_s)
        except ConnectionError as exc:  # the server is gone, or silent past the timeout
            raise self.comm.server_lost(self.server, "did not answer", exc) from None
        except RuntimeError as exc:
            raise RunError(f"server {self.server} failed in a call: {exc}") from None
        return self.comm.to_device(value)


def _moved(value: Any, device: torch.device) -> Any:
    """``value`` with its tensors on ``device`` (tuples, lists and dicts walked)."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _moved(v, device) for k, v in value.items()}
    return value
