"""Calls to a hosted server as torch.distributed point-to-point messages, on a gloo group of the
server's own: the ranks 0..W-1 of the run and the server as rank W, rendezvoused through a
``TCPStore`` the server's process opens. Works on one machine or across machines.

A value (a call: the method name and its arguments; or a reply) travels as tagged messages to
one peer, in order: its description (a pickle of the value with each tensor replaced by its
index, and every tensor's dtype and shape), in a first message of ``FIRST`` bytes that starts
with its length (and a second one for what does not fit), then each non-empty tensor's bytes,
sent as they lie (no copy into a buffer). The receiver posts the first message's receive in
advance, then allocates each tensor from the description and receives into it.

The server's side has one receiver thread per rank (a dead rank ends its own thread only),
which queues each call as it arrives, and one thread that hands the queued calls, in arrival
order, to the shared :class:`~..servers.ServerLoop` and sends its answers. A rank has one call
in flight per server; it posts the reply's first receive as it sends the call, so a parked
call's reply finds it waiting.
"""

from __future__ import annotations

import io
import pickle
import queue
import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..base import clone_tensors
from ..servers import Answer, ServerLoop
from .rendezvous import gloo_options, master_store, worker_host

CALL, REPLY = 1, 2  # the tags of the two directions
FIRST = 1024  # bytes of a value's first message: its description's length, and what fits of it
GOODBYE = -1  # the length a rank's last message carries: its run is over
CLOSE_S = 5.0  # how long closing waits for the serving thread (it may wait for a lost rank)


def describe(value: Any) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """``value`` as a description (a uint8 tensor) and the bytes of its tensors, in order."""
    tensors: list[torch.Tensor] = []

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            if not isinstance(obj, torch.Tensor):
                return None
            tensors.append(obj.detach().contiguous())
            return len(tensors) - 1

    body = io.BytesIO()
    _Pickler(body, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    specs = [(t.dtype, tuple(t.shape)) for t in tensors]
    text = pickle.dumps((specs, body.getvalue()), protocol=pickle.HIGHEST_PROTOCOL)
    flat = [t.reshape(-1).view(torch.uint8) for t in tensors if t.numel()]
    return torch.frombuffer(bytearray(text), dtype=torch.uint8), flat


def send_value(pg: Any, value: Any, peer: int, tag: int) -> list[Any]:
    """Start sending ``value`` to ``peer``; the sends' works (their tensors stay alive in them)."""
    text, flat = describe(value)
    first = torch.zeros(FIRST, dtype=torch.uint8)
    first[:8].view(torch.int64)[0] = text.numel()
    fits = min(text.numel(), FIRST - 8)
    first[8 : 8 + fits] = text[:fits]
    rest = [text[fits:]] if text.numel() > fits else []
    return [pg.send([t], peer, tag) for t in (first, *rest, *flat)]


def send_goodbye(pg: Any, peer: int) -> None:
    first = torch.zeros(FIRST, dtype=torch.uint8)
    first[:8].view(torch.int64)[0] = GOODBYE
    pg.send([first], peer, CALL).wait()


def post_first(pg: Any, peer: int, tag: int) -> tuple[torch.Tensor, Any]:
    """Post the receive of the next value's first message from ``peer``."""
    first = torch.empty(FIRST, dtype=torch.uint8)
    return first, pg.recv([first], peer, tag)


def is_goodbye(first: torch.Tensor) -> bool:
    return int(first[:8].view(torch.int64)[0]) == GOODBYE


def receive_rest(pg: Any, first: torch.Tensor, peer: int, tag: int) -> Any:
    """The value whose first message has arrived: the rest of its description, then its
    tensors."""
    length = int(first[:8].view(torch.int64)[0])
    text = first[8 : 8 + length]
    if length > FIRST - 8:
        rest = torch.empty(length - (FIRST - 8), dtype=torch.uint8)
        pg.recv([rest], peer, tag).wait()
        text = torch.cat([text, rest])
    specs, body = pickle.loads(text.numpy().tobytes())
    tensors = [torch.empty(shape, dtype=dtype) for dtype, shape in specs]
    works = [pg.recv([t.reshape(-1).view(torch.uint8)], peer, tag) for t in tensors if t.numel()]
    for work in works:
        work.wait()

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return tensors[pid]

    return _Unpickler(io.BytesIO(body)).load()


class _Raised:
    """An exception the server raised in a call, sent back to the caller."""

    def __init__(self, text: str) -> None:
        self.text = text


class P2PServer:
    """The server's side: its group's rendezvous, the receiver threads and the serving thread."""

    def __init__(
        self, loop: ServerLoop, ranks: int, timeout_s: float, host: str | None = None
    ) -> None:
        self.loop, self.ranks = loop, ranks
        self.timeout = timedelta(seconds=timeout_s)
        # Its store and its group listen on this worker's interface only (:mod:`.rendezvous`).
        self.host = host or worker_host()
        self.store = master_store(self.host, 0, self.timeout)
        self.calls: queue.Queue[tuple[int, str, tuple[Any, ...]] | None] = queue.Queue()
        self.pg: Any = None
        self.sends: dict[int, list[Any]] = {}  # each rank's last reply, until it is taken
        self.thread = threading.Thread(target=self._serve, name="p2p-server", daemon=True)
        self.thread.start()

    def address(self) -> dict[str, Any]:
        """What a rank needs to reach this server (the driver adds the ``ip`` it is reached by)."""
        return {"port": self.store.port, "size": self.ranks + 1}

    def _receive(self, rank: int) -> None:
        pg = self.pg  # the thread of a rank that never says goodbye outlives close()
        try:
            while True:
                first, work = post_first(pg, rank, CALL)
                work.wait()
                if is_goodbye(first):
                    return
                method, args = receive_rest(pg, first, rank, CALL)
                self.calls.put((rank, method, args))
        except RuntimeError:  # the rank's process is gone; the others go on
            return

    def _reply(self, answer: Answer) -> None:
        rank = answer.caller
        if answer.error is not None:  # the caller raises it
            value: Any = _Raised(f"{type(answer.error).__name__}: {answer.error}")
        else:  # a copy: the sends read it later, after other calls may change the server
            value = clone_tensors(answer.value)
        try:
            for work in self.sends.pop(rank, []):  # taken by now: the rank has called again
                work.wait()
            self.sends[rank] = send_value(self.pg, value, rank, REPLY)
        except RuntimeError:  # the rank died waiting; the others go on
            pass

    def _serve(self) -> None:
        try:
            options = gloo_options(self.host, self.timeout)
            self.pg = dist.ProcessGroupGloo(self.store, self.ranks, self.ranks + 1, options)
        except RuntimeError:  # a rank never came: each rank hears of it by its own timeout
            return
        for rank in range(self.ranks):
            name = f"p2p-receive-{rank}"
            threading.Thread(target=self._receive, args=(rank,), name=name, daemon=True).start()
        while (call := self.calls.get()) is not None:
            for answer in self.loop.take(*call):
                self._reply(answer)

    def close(self) -> None:
        """Stop serving and leave the group: its connections and the store's listening thread
        end now, not whenever the worker process exits (which they would hold up)."""
        self.calls.put(None)
        self.thread.join(timeout=CLOSE_S)
        self.sends.clear()
        self.pg = self.store = None


class P2PClient:
    """A rank's side of its link to one server: start a call, wait for its reply."""

    def __init__(self, address: dict[str, Any], rank: int, timeout_s: float) -> None:
        timeout = timedelta(seconds=timeout_s)
        store = dist.TCPStore(address["ip"], address["port"], is_master=False, timeout=timeout)
        self.server = address["size"] - 1
        options = gloo_options(worker_host(), timeout)  # listening on this worker's interface
        self.pg = dist.ProcessGroupGloo(store, rank, address["size"], options)
        self.sends: list[Any] = []
        self.reply: tuple[torch.Tensor, Any] | None = None  # the posted first message

    def start(self, method: str, args: tuple[Any, ...]) -> None:
        if self.reply is not None:
            raise RuntimeError("a call to this server is still waiting for its reply")
        self.sends = send_value(self.pg, (method, args), self.server, CALL)
        self.reply = post_first(self.pg, self.server, REPLY)

    def wait(self, timeout_s: float) -> Any:
        """The reply; raises ConnectionError when the server is gone or has not answered within
        ``timeout_s``, RuntimeError with the server's error."""
        if self.reply is None:
            raise RuntimeError("no call to this server is waiting for its reply")
        first, work = self.reply
        try:
            for sent in self.sends:
                sent.wait()
            work.wait(timedelta(seconds=timeout_s))
            value = receive_rest(self.pg, first, self.server, REPLY)
        except RuntimeError as exc:  # gloo's: the connection closed, or the wait timed out
            raise ConnectionError(str(exc).splitlines()[0]) from None
        finally:
            self.reply, self.sends = None, []
        if isinstance(value, _Raised):
            raise RuntimeError(value.text)
        return value

    def close(self) -> None:
        """Tell the server this rank is done (its receiver thread ends), then leave the group."""
        try:
            send_goodbye(self.pg, self.server)
        except RuntimeError:  # the server is gone already
            pass
        self.pg = None
