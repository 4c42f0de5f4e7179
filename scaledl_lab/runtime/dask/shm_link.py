"""Calls to a hosted server through shared memory, for servers on the machine of every rank.

A Dask actor call moves its tensors through pickling and a TCP connection to the worker that
hosts the actor, and the server's work then runs on that worker's event loop. On one machine
that is most of a parameter server's step for a small model (``bench_ps_sync``,
``bench_async``), so this transport keeps the actor for placement, counters and shutdown and
moves each call the way MXNet's local kvstore moves tensors, through memory:

- every (server, rank) pair has two named pipes in /dev/shm, ``req-RANK`` (the rank writes,
  the server reads) and ``rep-RANK``; a message on a pipe is a length and a small pickle: the
  method name and arguments with each tensor replaced by a reference into a slot;
- a slot is a file in /dev/shm that its writer maps and grows (a bigger file under a new name
  when a message does not fit) and its reader maps once per name. A tensor is copied in by its
  sender. The server reads a call's tensors where they lie: they stay valid until that rank's
  next call with tensors (the contract of ``ServerSpec``). A rank copies a reply's tensors
  out, since it may keep them (a checkpoint) past its next call;
- the server answers in a thread of its own, one call at a time, through the shared
  :class:`~..servers.ServerLoop` (a call answered ``NOT_READY`` is parked and tried again after
  each call that was answered).

One call per (rank, server) pair is in flight at a time: a rank waits for a reply before it
calls that server again, which is what keeps one request slot and one reply slot enough.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing.util
import os
import pickle
import select
import shutil
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..servers import Answer, ServerLoop

LENGTH = struct.Struct("<Q")
ALIGN = 64  # bytes: every tensor in a slot starts on a cache line
MIN_SLOT = 1 << 20
POLL_MS = 200  # how often a waiting side looks up from its pipe (server: to stop; rank: liveness)


class _Slot:
    """The memory this side writes tensors into: a /dev/shm file, replaced by a larger one when
    a message does not fit (the reader maps each name once)."""

    def __init__(self, directory: Path, prefix: str) -> None:
        self.directory, self.prefix = directory, prefix
        self.generation = 0
        self.name = ""
        self.buffer = torch.empty(0, dtype=torch.uint8)

    def reserve(self, nbytes: int) -> torch.Tensor:
        if nbytes > self.buffer.numel():
            old = self.directory / self.name if self.name else None
            self.generation += 1
            self.name = f"{self.prefix}-{self.generation}"
            size = max(MIN_SLOT, nbytes + nbytes // 4)
            path = self.directory / self.name
            with open(path, "wb") as f:
                f.truncate(size)
            self.buffer = torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
            if old is not None:  # the reader has taken every message that referred to it
                old.unlink(missing_ok=True)
        return self.buffer

    def close(self) -> None:
        if self.name:
            (self.directory / self.name).unlink(missing_ok=True)


class _Mapped:
    """The other side's slots, each mapped once by name."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.name, self.buffer = "", torch.empty(0, dtype=torch.uint8)

    def get(self, name: str, size: int) -> torch.Tensor:
        if name != self.name:
            path = str(self.directory / name)
            self.buffer = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
            self.name = name
        return self.buffer


def encode(value: Any, slot: _Slot) -> bytes:
    """``value`` as a pipe message, its tensors copied into ``slot``."""
    tensors: list[torch.Tensor] = []

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if not isinstance(obj, torch.Tensor):
                return None
            t = obj.detach()
            tensors.append(t)
            return (len(tensors) - 1, t.dtype, tuple(t.shape))

    meta = io.BytesIO()
    _Pickler(meta, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    spans, end = [], 0
    for t in tensors:
        n = t.numel() * t.element_size()
        spans.append((end, n))
        end += -(-n // ALIGN) * ALIGN
    buffer = slot.reserve(end) if tensors else slot.buffer
    for t, (start, n) in zip(tensors, spans, strict=True):
        if n:
            buffer[start : start + n].view(t.dtype).view(t.shape).copy_(t)
    where = (slot.name, buffer.numel()) if tensors else ("", 0)
    return pickle.dumps((where, spans, meta.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)


def decode(message: bytes, mapped: _Mapped, *, copy: bool = True) -> Any:
    """The value a message carries, its tensors copied out of the sender's slot (or views of
    it: ``copy=False``)."""
    (name, size), spans, meta = pickle.loads(message)
    buffer = mapped.get(name, size) if spans else None

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            index, dtype, shape = pid
            start, n = spans[index]
            view = buffer[start : start + n].view(dtype).view(shape)
            return view.clone() if copy else view

    return _Unpickler(io.BytesIO(meta)).load()


def _write(fd: int, message: bytes) -> None:
    data = memoryview(LENGTH.pack(len(message)) + message)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError("the pipe was closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read(fd: int) -> bytes:
    (n,) = LENGTH.unpack(_read_exactly(fd, LENGTH.size))
    return _read_exactly(fd, n)


def _pipe(path: Path) -> int:
    # Read-write on both ends: opening never blocks on the other side being there yet.
    return os.open(path, os.O_RDWR)


class ShmServer:
    """The server's side: a thread that hands ``ranks`` ranks' calls to ``loop`` (which
    answers or parks each) and writes back its answers; an exception a call raised is sent back
    and raised again in the caller."""

    def __init__(self, directory: Path, ranks: int, loop: ServerLoop) -> None:
        self.directory, self.loop = directory, loop
        directory.mkdir(parents=True, exist_ok=True)
        # Removed by close(); else when this process exits (a Dask worker is a multiprocessing
        # child, which runs Finalize callbacks but not atexit ones).
        for register in (atexit.register, _at_process_exit):
            register(shutil.rmtree, str(directory), True)
        for rank in range(ranks):
            for kind in ("req", "rep"):
                os.mkfifo(directory / f"{kind}-{rank}")
        self.requests = [_pipe(directory / f"req-{r}") for r in range(ranks)]
        self.replies = [_pipe(directory / f"rep-{r}") for r in range(ranks)]
        self.slots = [_Slot(directory, f"out-{r}") for r in range(ranks)]
        self.mapped = [_Mapped(directory) for _ in range(ranks)]
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="shm-server", daemon=True)
        self.thread.start()

    def address(self) -> dict[str, Any]:
        """What a rank needs to reach this server: the directory and the process."""
        return {"directory": str(self.directory), "pid": os.getpid()}

    def _reply(self, answer: Answer) -> None:
        rank = answer.caller
        value = answer.value
        if answer.error is not None:  # the caller raises it
            value = _Raised(f"{type(answer.error).__name__}: {answer.error}")
        _write(self.replies[rank], encode(value, self.slots[rank]))

    def _serve(self) -> None:
        poll = select.poll()
        rank_of = {}
        for rank, fd in enumerate(self.requests):
            poll.register(fd, select.POLLIN)
            rank_of[fd] = rank
        while not self.stopped.is_set():
            for fd, _ in poll.poll(POLL_MS):
                rank = rank_of[fd]
                try:
                    method, args = decode(_read(fd), self.mapped[rank], copy=False)
                except Exception as exc:  # a message it cannot read: the caller hears why
                    message = _Raised(f"unreadable call ({type(exc).__name__}: {exc})")
                    _write(self.replies[rank], encode(message, self.slots[rank]))
                    continue
                for answer in self.loop.take(rank, method, args):
                    self._reply(answer)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5 * POLL_MS / 1000)
        for fd in self.requests + self.replies:
            os.close(fd)
        shutil.rmtree(self.directory, ignore_errors=True)


def _at_process_exit(func: Callable[..., Any], *args: Any) -> None:
    multiprocessing.util.Finalize(None, func, args=args, exitpriority=0)


class _Raised:
    """An exception the server raised in a call, sent back to the caller."""

    def __init__(self, text: str) -> None:
        self.text = text


class ShmClient:
    """A rank's side of its link to one server: start a call, wait for its reply."""

    def __init__(self, address: dict[str, Any], rank: int) -> None:
        self.directory = Path(address["directory"])
        self.pid = int(address["pid"])
        self.request = _pipe(self.directory / f"req-{rank}")
        self.reply = _pipe(self.directory / f"rep-{rank}")
        self.slot = _Slot(self.directory, f"in-{rank}")
        self.mapped = _Mapped(self.directory)
        self.waiting = False

    def start(self, method: str, args: tuple[Any, ...]) -> None:
        if self.waiting:
            raise RuntimeError("a call to this server is still waiting for its reply")
        _write(self.request, encode((method, args), self.slot))
        self.waiting = True

    def server_alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's process: it exists
            pass
        return True

    def wait(self, timeout_s: float) -> Any:
        """The reply; raises TimeoutError when none came within ``timeout_s`` of silence, and
        ProcessLookupError when the server's process is gone."""
        poll = select.poll()
        poll.register(self.reply, select.POLLIN)
        waited = 0.0
        while not poll.poll(POLL_MS):
            waited += POLL_MS / 1000
            if not self.server_alive():
                raise ProcessLookupError(f"the server's process {self.pid} is gone")
            if waited >= timeout_s:
                raise TimeoutError(f"no reply within {timeout_s:g} s")
        value = decode(_read(self.reply), self.mapped)
        self.waiting = False
        if isinstance(value, _Raised):
            raise RuntimeError(value.text)
        return value

    def close(self) -> None:
        os.close(self.request)
        os.close(self.reply)
        self.slot.close()
