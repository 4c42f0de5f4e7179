"""The messages between pipeline workers, in the order each one sends them.

Every worker knows every worker's schedule (a pure function), so it knows, for each neighbour,
the order in which that neighbour will send it activations and gradients (:func:`messages`)
and the order in which it needs them (:func:`receives`). With interleaved chunks one link may
carry both kinds (two workers of two chunks: activations and gradients both flow 0 → 1). The
schedules of :mod:`.schedules` need every link's messages in the order they were sent (a test
checks it for many p, M, V); a hand-written schedule that keeps every dependency may not.
Point-to-point messages between two ranks arrive in the order they were sent (gloo's and the
simulator's alike), so :class:`Inbox` takes them in that order and keeps an early one until its
operation runs: no tags, and no receive waits for a message sent after the one it needs.

Where the runtime allows it (:attr:`Comm.posts_ahead`: gloo, the simulator) the inbox keeps
the next ``ahead`` receives from each sender posted: gloo moves a message only once its receive
is posted, so a receive posted when its operation is due would put the whole transfer of every
hand-over on the pipeline's critical path; posted ahead, it lands while the receiver computes.
Each posted receive holds a buffer, so the pipeline posts as many as its schedule stashes
micro-batches (:func:`.schedules.in_flight`: M for GPipe, p − stage for 1F1B), no more.

A message is keyed ``(phase, micro-batch, virtual stage)``: ``("F", m, v)`` is the input of
virtual stage v, ``("B", m, v)`` the gradient of its output.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable

import torch

from ...runtime.base import Comm, Incoming
from .schedules import Op, chunks

Key = tuple[str, int, int]  # (phase, micro-batch, virtual stage of the receiver)


def virtual_stage(worker: int, op: Op, stages: int) -> int:
    """The virtual stage ``op`` of ``worker`` runs: chunk c of worker s is c·p + s."""
    return (op[2] if len(op) > 2 else 0) * stages + worker


def messages(schedule: list[list[Op]]) -> dict[tuple[int, int], list[Key]]:
    """For each (sender, receiver): the messages the sender's schedule sends it, in order. A
    forward sends its output to the next virtual stage, a backward (B) the gradient of its input
    to the previous one; W sends nothing."""
    stages = len(schedule)
    last = stages * chunks(schedule) - 1
    out: dict[tuple[int, int], list[Key]] = defaultdict(list)
    for s, ops in enumerate(schedule):
        for op in ops:
            phase, m, v = op[0], op[1], virtual_stage(s, op, stages)
            if phase == "F" and v < last:
                out[(s, (v + 1) % stages)].append(("F", m, v + 1))
            elif phase == "B" and v > 0:
                out[(s, (v - 1) % stages)].append(("B", m, v - 1))
    return dict(out)


def receives(schedule: list[list[Op]]) -> dict[tuple[int, int], list[Key]]:
    """For each (sender, receiver): the messages the receiver's schedule needs, in order."""
    stages = len(schedule)
    last = stages * chunks(schedule) - 1
    out: dict[tuple[int, int], list[Key]] = defaultdict(list)
    for s, ops in enumerate(schedule):
        for op in ops:
            phase, m, v = op[0], op[1], virtual_stage(s, op, stages)
            if phase == "F" and v > 0:
                out[((v - 1) % stages, s)].append(("F", m, v))
            elif phase == "B" and v < last:
                out[((v + 1) % stages, s)].append(("B", m, v))
    return dict(out)


class Inbox:
    """This worker's receives of one step, taken in the senders' order (see the module)."""

    def __init__(
        self,
        comm: Comm,
        expected: dict[int, list[Key]],
        shape_of: Callable[[Key], torch.Size],
        dtype: torch.dtype,
        ahead: int = 0,
    ) -> None:
        """``expected``: per sender, its messages to this worker in order; ``shape_of``: a
        message's shape (the receiver's input or output shape); ``ahead``: receives to keep
        posted per sender (where :attr:`Comm.posts_ahead`)."""
        self.comm, self.shape_of, self.dtype = comm, shape_of, dtype
        self.queues = {src: deque(keys) for src, keys in expected.items()}  # not yet posted
        self.posted: dict[int, deque[tuple[Key, Incoming]]] = {src: deque() for src in expected}
        self.early: dict[Key, torch.Tensor] = {}
        self.ahead = ahead if comm.posts_ahead else 0
        for src in self.queues:
            self._refill(src)

    def _post(self, key: Key, src: int) -> Incoming:
        return self.comm.irecv(torch.empty(self.shape_of(key), dtype=self.dtype), src)

    def _refill(self, src: int) -> None:
        queue, posted = self.queues[src], self.posted[src]
        while queue and len(posted) < self.ahead:
            key = queue.popleft()
            posted.append((key, self._post(key, src)))

    async def take(self, key: Key, src: int) -> torch.Tensor:
        """The message ``key`` from ``src``; those ``src`` sent before it are kept for later."""
        if key in self.early:
            return self.early.pop(key)
        while True:
            if self.posted[src]:
                first, incoming = self.posted[src].popleft()
            else:
                first = self.queues[src].popleft()
                incoming = self._post(first, src)
            self._refill(src)  # the next ones posted before this one is waited for
            buffer = await incoming.wait()
            if first == key:
                return buffer
            self.early[first] = buffer
