"""The pipeline executor: this rank's virtual stages and one mini-batch through a schedule of
:mod:`.schedules` (GPipe, 1F1B, interleaved 1F1B, zero bubble H1), the messages between the
stages in the order :mod:`.channels` gives; and a slice of val or test through every stage.

Both pipelines run on it: the pipeline strategies, whose chunks are runs of any model's layers
(:mod:`.chunk`, one layer of the executor each), and the mesh's ``pp`` dimension, whose chunks
are gpt-tiny's layers sliced over ``tp`` (:mod:`..mesh.stage`). A layer is anything with

- ``forward(dims, x, grad)`` → ``(out, saved)``: its output and what its backward needs;
- ``backward(dims, saved, grad, weights)`` → the gradient of its input (None on the first),
  with ``weights`` False zero bubble's B (the input's gradient only, the graphs kept);
- ``weights(dims, saved)``: zero bubble's W, the weight gradients of the graphs B kept;

each charging its own compute on the simulator. ``dims`` is what the layers need of the rest of
the mesh (the mesh's :class:`..mesh.layers.Dims`; nothing for a pipeline's chunks).

The virtual stages are p·V runs of the layers (``counts``, one per virtual stage); chunk c of
stage k is virtual stage c·p + k, its neighbours the ranks of virtual stages v ± 1 in the ``pp``
group. What crosses the cut between virtual stages v − 1 and v has shape ``boundaries[v − 1]``
for one micro-batch (the receive buffers; ``batch_dim`` says where the batch lies in it). Each
operation's start and end go to ``on_event``: busy from its input's arrival to before its send.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ...data import Dataset
from ...objective import correct_count, model_input, summed_loss
from ...runtime.base import Group, Pending
from . import channels, schedules

if TYPE_CHECKING:  # the mesh's package imports this module: no import back at run time
    from ..mesh.view import GroupComm


def loss_of(logits: torch.Tensor, y: torch.Tensor, batch_size: int) -> torch.Tensor:
    """A micro-batch's share of the mini-batch's mean loss (its sum over the whole batch)."""
    return summed_loss(logits, y) / batch_size


class Chunk:
    """One virtual stage on this rank: its layers, its neighbours' world ranks, the shapes of
    its input and output for one micro-batch (None where it has no neighbour)."""

    def __init__(
        self, virtual: int, layers: list, last: int, group: Group,
        in_shape: torch.Size | None, out_shape: torch.Size | None,
    ) -> None:  # fmt: skip
        self.virtual, self.layers = virtual, layers
        self.is_first, self.is_last = virtual == 0, virtual == last
        self.in_shape, self.out_shape = in_shape, out_shape
        stages = len(group)
        self.prev = group[(virtual - 1) % stages]
        self.next = group[(virtual + 1) % stages]


class Executor:
    """This rank's chunks of a pipeline and how it runs a schedule's operations."""

    def __init__(
        self, layers: Sequence[Any], counts: Sequence[int], boundaries: Sequence[torch.Size],
        pp: GroupComm, dims: Any, *, schedule: str, micro_batches: int, virtual: int,
        dtype: torch.dtype, batch_dim: int = 0,
    ) -> None:  # fmt: skip
        """``layers``: every layer of the model, in order (this rank's part of each; those of
        other stages are not run); ``counts``: layers per virtual stage (p·V of them);
        ``boundaries``: the p·V − 1 shapes between them."""
        self.pp, self.dims, self.dtype, self.batch_dim = pp, dims, dtype, batch_dim
        self.to_loss: Any = lambda logits: logits  # 16 bits: cast to float32, loss-scaled
        self.on_event: Callable[[int, str, float, float, int], None] | None = None
        p, k = pp.world_size, pp.rank
        last = p * virtual - 1
        self.chunks = []
        for v in range(k, p * virtual, p):
            lo, hi = sum(counts[:v]), sum(counts[: v + 1])
            in_shape = boundaries[v - 1] if v > 0 else None
            out_shape = boundaries[v] if v < last else None
            self.chunks.append(Chunk(v, list(layers[lo:hi]), last, pp.group, in_shape, out_shape))
        self.layers = [layer for chunk in self.chunks for layer in chunk.layers]
        self.by_virtual = {chunk.virtual: chunk for chunk in self.chunks}
        self.is_last = any(chunk.is_last for chunk in self.chunks)
        plan = schedules.schedule(schedule, p, micro_batches, virtual)
        self.micro_batches = micro_batches
        self.ops = plan[k]
        self.splits_backward = any(op[0] == "W" for op in self.ops)  # zero bubble: B, then W
        self.ahead = schedules.in_flight(self.ops)  # receives kept posted: as many as it stashes
        sent = channels.messages(plan)
        self.expected = {pp.group[s]: list(keys) for (s, d), keys in sent.items() if d == k}
        self.peak_count = self.peak_bytes = 0  # stashed micro-batches (and their bytes)
        self.peak_until_w = 0  # stashed or waiting for their weight gradient (zero bubble)
        self.messages_sent = 0

    # -- what a subclass adds around each layer (the mesh's ZeRO-3 gathers) -----------------

    async def _enter(self, layer: Any) -> None:
        """Before ``layer`` computes."""

    def _leave(self, layer: Any) -> None:
        """After ``layer`` computed."""

    def kept_bytes(self, chunk: Chunk, saved: list) -> int:
        """The bytes a stashed micro-batch of ``chunk`` keeps (0: not measured)."""
        return 0

    # -- one chunk, forward and backward ---------------------------------------------------

    async def forward(self, chunk: Chunk, x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, list]:
        saved = []
        for layer in chunk.layers:
            await self._enter(layer)
            x, s = await layer.forward(self.dims, x, grad)
            self._leave(layer)
            saved.append(s)
        return x, saved

    async def backward(
        self, chunk: Chunk, saved: list, grad: torch.Tensor | None, weights: bool = True
    ) -> torch.Tensor | None:
        """The chunk's backward (``weights`` False: zero bubble's B, the weights' W later)."""
        for layer, s in zip(reversed(chunk.layers), reversed(saved), strict=True):
            await self._enter(layer)
            grad = await layer.backward(self.dims, s, grad, weights)
            self._leave(layer)
        return grad

    async def weights(self, chunk: Chunk, saved: list) -> None:
        """Zero bubble's W: the weight gradients of the graphs B kept."""
        for layer, s in zip(reversed(chunk.layers), reversed(saved), strict=True):
            await self._enter(layer)
            await layer.weights(self.dims, s)
            self._leave(layer)

    def _loss(self, logits: torch.Tensor, y: torch.Tensor, batch_size: int) -> torch.Tensor:
        return loss_of(self.to_loss(logits), y, batch_size)

    def _send(self, tensor: torch.Tensor, rank: int) -> Pending:
        self.messages_sent += 1
        return self.pp.comm.isend(tensor.contiguous(), rank)

    # -- one mini-batch --------------------------------------------------------------------

    async def run(self, x: torch.Tensor, y: torch.Tensor, batch_size: int) -> tuple[float, int]:
        """Run the schedule on one mini-batch (``batch_size``: the replica's, which the loss
        is the mean over); the replica's loss sum and hits (on the rank of the last virtual
        stage; 0 elsewhere), the gradients accumulated in this rank's layers.

        The last chunk's ``saved[-1]`` gets ``"out"``, the loss its backward starts from, and
        ``"loss"``, the loss of logits, for a layer that computes them again."""
        comm = self.pp.comm
        micro = len(x) // self.micro_batches
        xs, ys = x.split(micro), y.split(micro)
        inbox = channels.Inbox(comm, self.expected, self._shape_of, self.dtype, self.ahead)
        stash: dict[tuple[int, int], list] = {}
        waiting_w: dict[tuple[int, int], list] = {}
        sends: list[Pending] = []
        loss_sum, correct = 0.0, 0
        for op in self.ops:
            phase, m, c = op[0], op[1], op[2] if len(op) > 2 else 0
            chunk = self.chunks[c]
            v = chunk.virtual
            key = (v, m)
            if phase == "F":
                inp = xs[m] if chunk.is_first else await inbox.take(("F", m, v), chunk.prev)
                start = comm.now()  # busy from here: waiting for the input is the bubble
                out, saved = await self.forward(chunk, inp, grad=True)
                if chunk.is_last:
                    correct += correct_count(out, ys[m])
                    loss_fn = functools.partial(self._loss, y=ys[m], batch_size=batch_size)
                    loss = loss_fn(out)
                    saved[-1].update(out=loss, loss=loss_fn)  # backward starts from the loss
                    loss_sum += loss.item()
                end = comm.now()  # before the send: a receiver may start before isend returns
                if not chunk.is_last:
                    sends.append(self._send(out.detach(), chunk.next))
                stash[key] = saved
            elif phase == "B":
                saved = stash.pop(key)
                grad = None
                if not chunk.is_last:
                    grad = await inbox.take(("B", m, v), chunk.next)
                start = comm.now()
                grad_in = await self.backward(chunk, saved, grad, not self.splits_backward)
                end = comm.now()
                if not chunk.is_first:
                    sends.append(self._send(grad_in, chunk.prev))
                if self.splits_backward:
                    waiting_w[key] = saved
            else:  # "W"
                start = comm.now()
                await self.weights(chunk, waiting_w.pop(key))
                end = comm.now()
            self._track(stash, waiting_w)
            if self.on_event is not None:
                self.on_event(m, phase, start, end, c)
        for pending in sends:
            await pending.wait()
        return loss_sum, correct

    def _shape_of(self, key: channels.Key) -> torch.Size:
        phase, _, v = key
        chunk = self.by_virtual[v]
        return chunk.in_shape if phase == "F" else chunk.out_shape  # type: ignore[return-value]

    def _track(self, stash: dict, waiting_w: dict) -> None:
        """The peaks of stashed micro-batches (forward run, backward not), of those also
        waiting for their weight gradient, and of their bytes."""
        self.peak_count = max(self.peak_count, len(stash))
        self.peak_until_w = max(self.peak_until_w, len(stash) + len(waiting_w))
        kept = [*stash.items(), *waiting_w.items()]
        total = sum(self.kept_bytes(self.by_virtual[v], saved) for (v, _), saved in kept)
        self.peak_bytes = max(self.peak_bytes, total)

    # -- evaluation ------------------------------------------------------------------------

    async def score(
        self, split: Dataset, micro: int, device: torch.device,
        take: Callable[[torch.Tensor], torch.Tensor] = lambda y: y,
    ) -> tuple[float, int, int]:  # fmt: skip
        """``split`` in slices of ``micro`` samples, each through every virtual stage in turn:
        the summed loss, hits and samples (``take``: this rank's part of the targets) on the
        rank of the last virtual stage; zeros elsewhere."""
        comm = self.pp.comm
        loss, hits, count = 0.0, 0, 0
        for start in range(0, len(split), micro):
            n = min(micro, len(split) - start)
            for chunk in self.chunks:
                if chunk.is_first:
                    inp = model_input(split.x[start : start + n], device, self.dtype)
                else:
                    shape = list(chunk.in_shape)  # type: ignore[arg-type]
                    shape[self.batch_dim] = n
                    inp = await comm.recv(torch.empty(shape, dtype=self.dtype), chunk.prev)
                out, _ = await self.forward(chunk, inp, grad=False)
                if chunk.is_last:
                    y = take(split.y[start : start + n].to(device))
                    loss += summed_loss(out, y).item()
                    hits += correct_count(out, y)
                    count += n
                else:
                    await comm.send(out.contiguous(), chunk.next)
        return loss, hits, count
