"""The ``pp`` dimension: this rank's virtual stages of gpt-tiny and one mini-batch through a
pipeline schedule (:mod:`..model_parallel.schedules`, the messages in the order
:mod:`..model_parallel.channels` gives), each stage's neighbours found in the rank's ``pp``
group. What runs inside a stage is :mod:`.layers` (sliced over ``tp``), and what comes after the
schedule (sequence parallelism's sum of the split regions' gradients, data parallelism's
average) is the program's (:mod:`.program`).

gpt-tiny's layers (embedding, blocks, head) are cut into ``pp·V`` equal runs; chunk c of stage
k is virtual stage c·pp + k, as the pipeline strategies place them. Zero bubble splits each
layer's backward into B (the input gradients, the graphs kept) and W (the weights', later):
:class:`.layers.Deferred`; the simulator charges F, B and W a third of a layer's step each, as
the pipeline strategy ``zb-h1`` charges its chunks. Each operation's start and end go to
``on_event`` (set on the ranks that write the events table), as the pipeline strategies log
them: busy from its input's arrival to before its send.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ...objective import correct_count
from ...runtime.base import Pending
from ...training.ledger import Peak
from ..model_parallel import channels, schedules
from ..model_parallel.pipeline import loss_of
from .layers import Dims
from .view import GroupComm


class Chunk:
    """One virtual stage on this rank: its layers and its neighbours' world ranks."""

    def __init__(self, virtual: int, layers: list, last: int, pp: GroupComm) -> None:
        self.virtual, self.layers = virtual, layers
        self.is_first, self.is_last = virtual == 0, virtual == last
        stages = pp.world_size
        self.prev = pp.group[(virtual - 1) % stages]
        self.next = pp.group[(virtual + 1) % stages]


class Stage:
    """This rank's chunks of the pipeline and how it runs the schedule's operations."""

    def __init__(
        self, layers: list, pp: GroupComm, dims: Dims, *, schedule: str, micro_batches: int,
        virtual: int, hidden: int, dp: GroupComm | None = None, buffers: Peak | None = None,
    ) -> None:  # fmt: skip
        """``layers``: every layer of the model (this rank's part of each); ``hidden``: the
        model's width; ``dp`` and ``buffers``: where ZeRO-3 gathers a layer's parameters."""
        self.pp, self.dims, self.dp, self.buffers = pp, dims, dp, buffers or Peak()
        self.hidden = hidden
        self.to_loss: Any = lambda logits: logits  # 16 bits: cast to float32, loss-scaled
        self.on_event: Callable[[int, str, float, float, int], None] | None = None
        p, k = pp.world_size, pp.rank
        per = len(layers) // (p * virtual)
        last = p * virtual - 1
        self.chunks = [
            Chunk(c * p + k, layers[(c * p + k) * per : (c * p + k + 1) * per], last, pp)
            for c in range(virtual)
        ]
        self.layers = [layer for chunk in self.chunks for layer in chunk.layers]
        self.by_virtual = {chunk.virtual: chunk for chunk in self.chunks}
        self.is_last = any(chunk.is_last for chunk in self.chunks)
        plan = schedules.schedule(schedule, p, micro_batches, virtual)
        self.ops = plan[k]
        self.splits_backward = any(op[0] == "W" for op in self.ops)  # zero bubble: B, then W
        self.ahead = schedules.in_flight(self.ops)
        sent = channels.messages(plan)
        self.expected = {pp.group[s]: list(keys) for (s, d), keys in sent.items() if d == k}

    # -- one chunk, forward and backward ---------------------------------------------------

    async def _gathered(self, layer: Any) -> None:
        if layer.unit is not None:
            await layer.unit.gather(self.dp, self.buffers)

    def _free(self, layer: Any) -> None:
        if layer.unit is not None:
            layer.unit.free(self.buffers)

    async def forward(self, chunk: Chunk, x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, list]:
        saved = []
        for layer in chunk.layers:
            await self._gathered(layer)
            x, s = await layer.forward(self.dims, x, grad)
            self._free(layer)
            saved.append(s)
        return x, saved

    async def backward(
        self, chunk: Chunk, saved: list, grad: torch.Tensor | None, weights: bool = True
    ) -> torch.Tensor | None:
        """The chunk's backward (``weights`` False: zero bubble's B, the weights' W later)."""
        for layer, s in zip(reversed(chunk.layers), reversed(saved), strict=True):
            await self._gathered(layer)
            grad = await layer.backward(self.dims, s, grad, weights)
            self._free(layer)
        return grad

    async def weights(self, chunk: Chunk, saved: list) -> None:
        """Zero bubble's W: the weight gradients of the graphs B kept."""
        for layer, s in zip(reversed(chunk.layers), reversed(saved), strict=True):
            await self._gathered(layer)
            await layer.weights(self.dims, s)
            self._free(layer)

    # -- one mini-batch --------------------------------------------------------------------

    async def train_step(
        self, x: torch.Tensor, y: torch.Tensor, micro_batches: int, batch_size: int,
        dtype: torch.dtype,
    ) -> tuple[float, int]:  # fmt: skip
        """Run the schedule on one mini-batch; the replica's loss sum and hits (on the last
        stage; 0 elsewhere), the gradients accumulated in this rank's layers."""
        comm = self.pp.comm
        micro = len(x) // micro_batches
        xs, ys = x.split(micro), y.split(micro)
        shape = self._activation_shape(x.shape[1], micro)
        inbox = channels.Inbox(comm, self.expected, lambda key: shape, dtype, self.ahead)
        stash: dict[tuple[int, int], list] = {}
        waiting_w: dict[tuple[int, int], list] = {}
        sends: list[Pending] = []
        loss_sum, correct = 0.0, 0
        for op in self.ops:
            phase, m, c = op[0], op[1], op[2] if len(op) > 2 else 0
            chunk = self.chunks[c]
            if phase == "F":
                inp = (
                    xs[m]
                    if chunk.is_first
                    else await inbox.take(("F", m, chunk.virtual), chunk.prev)
                )
                start = comm.now()  # busy from here: waiting for the input is the bubble
                out, saved = await self.forward(chunk, inp, grad=True)
                if chunk.is_last:
                    correct += correct_count(out, ys[m])
                    loss = loss_of(self.to_loss(out), ys[m], batch_size)
                    saved[-1]["out"] = loss  # the head's backward starts from the loss
                    loss_sum += loss.item()
                end = comm.now()  # before the send: a receiver may start before isend returns
                if not chunk.is_last:
                    sends.append(comm.isend(out.detach().contiguous(), chunk.next))
                stash[(chunk.virtual, m)] = saved
            elif phase == "B":
                saved = stash.pop((chunk.virtual, m))
                grad = None
                if not chunk.is_last:
                    grad = await inbox.take(("B", m, chunk.virtual), chunk.next)
                start = comm.now()
                grad_in = await self.backward(chunk, saved, grad, not self.splits_backward)
                end = comm.now()
                if not chunk.is_first:
                    sends.append(comm.isend(grad_in.contiguous(), chunk.prev))
                if self.splits_backward:
                    waiting_w[(chunk.virtual, m)] = saved
            else:  # "W"
                start = comm.now()
                await self.weights(chunk, waiting_w.pop((chunk.virtual, m)))
                end = comm.now()
            if self.on_event is not None:
                self.on_event(m, phase, start, end, c)
        for pending in sends:
            await pending.wait()
        return loss_sum, correct

    def _activation_shape(self, sequence: int, micro: int) -> torch.Size:
        """What crosses a stage boundary: ``(S, micro, h)``, ``S/tp`` positions with sequence
        parallelism."""
        dims = self.dims
        s = sequence // dims.tp.world_size if dims.sequence_parallel else sequence
        return torch.Size((s, micro, self.hidden))
