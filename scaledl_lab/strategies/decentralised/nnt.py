"""Nearest-neighbour training (NNT), the paper's method as implemented in FAST (Viviani et al.).

Every worker starts from the same weights and trains on its own shard. A step: compute the
local mini-batch gradient, apply it with the worker's own optimiser, send that gradient (all
parameter gradients, flattened) to each neighbour of the ring or torus. Each neighbour gradient
that has arrived is applied with the same optimiser, one message at a time, as if it were local
(not averaged). Three variants:

- ``nnt``: never wait: after its step a worker applies what has arrived and carries on;
- ``nnt-lockstep``: after its step a worker waits for one message per neighbour (that
  neighbour's gradient of the same step), so the run is deterministic on both runtimes;
- ``nnt-staged``: as ``nnt``, and every ``stage_epochs`` epochs all workers restart from the
  best worker on the validation split (its weights are broadcast; the optimiser state is reset
  on every worker, since the best worker's momentum belongs to its own trajectory). Before the
  restart each worker applies every gradient of the stage, so no stale gradient crosses it.

Receiving. By default (``cfg.nnt_max_lead=None``) a worker never waits for a neighbour, as in
FAST: each neighbour's messages are taken off the wire as they arrive and queued without bound
(:meth:`Comm.mailbox`: the simulator's mailboxes; on Dask a receiver thread per neighbour that
keeps a gloo receive posted, since gloo's sends complete only once the receiver has posted the
matching receive). Epoch boundaries are then no synchronisation point: each worker evaluates its
own model at its own boundary and keeps a copy of its weights; the consensus distance of those
copies is computed once all workers are done. Nor is the start: each worker scores its part of
the common initial weights and goes on, their sum waits for the end of the run (a straggler
scoring its part slowly would otherwise hold every other worker at step 0). With a bound
``cfg.nnt_max_lead = L`` (flow control, our departure from FAST; the lock-step variant is
L = 0), a worker may run at most L steps ahead of the messages it has received from a
neighbour, keeps ``L + 1`` receives posted and at most ``2·L + 1`` sends in flight per
neighbour: whenever a worker waits for a send the receiver has already posted the receive, and
waits for receives only point to workers that are behind, so no deadlock; epoch boundaries are
synchronisation points (an allreduce measures the consensus). Every worker runs the same
number of steps T (all shards have the same length), so it sends exactly T messages to each
neighbour and, at the end, receives all T from each before its final evaluation.

Rows: ``kind="train"`` per worker per step, with ``bytes_sent`` (degree × gradient bytes) and
``staleness`` (mean age in steps of the neighbour gradients applied after that step). At each
epoch boundary (all workers reach it at the same step count, which makes it a synchronisation
point) rank 0 records ``kind="consensus"`` with (1/N) Σ_i ||x_i − x̄||² in the ``value`` column,
and every worker records ``val`` and ``test`` rows for its own model. The final result is the
best worker on validation; ``ctx.result`` holds each rank's val/test accuracy, ``best_rank``,
``best_test_accuracy``, the mean and spread (see :func:`scaledl_lab.metrics.summarise_workers`).

When a worker dies its neighbours drop it: they apply what it sent before it died, then
neither send to it nor wait for it; epoch-boundary collectives run among the survivors.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch
from torch import nn

from ... import topology
from ...errors import PeerLostError
from ...params import flat_grad, load_state_vector, param_vector, state_vector, write_grads
from ...runtime.base import Comm, Incoming, Pending
from ...training.worker import WorkerContext, lr_of
from ..compression.messages import message_codec
from ..registry import register
from .replicas import epoch_end, finish, local_gradient, log_consensus


class Inbox:
    """``depth`` receives posted per neighbour (matched in order); neighbour gradients are
    applied one message at a time, in each neighbour's sending order."""

    def __init__(
        self, comm: Comm, neighbours: list[int], like: torch.Tensor, total: int, depth: int
    ) -> None:
        self.comm, self.neighbours, self.total = comm, neighbours, total
        self.count = dict.fromkeys(neighbours, 0)  # messages applied from each neighbour
        self.posted: dict[int, deque[tuple[torch.Tensor, Incoming]]] = {}
        for j in neighbours:
            buffers = [torch.empty_like(like) for _ in range(min(depth, total))]
            self.posted[j] = deque((b, comm.irecv(b, j)) for b in buffers)

    async def drain(self, apply: Any, *, need: int, greedy: bool) -> list[int]:
        """Apply messages until ``need`` from each neighbour (waiting if needed); with
        ``greedy``, also every further one that has already arrived. Returns the indices
        (the sender's step) of the messages applied."""
        applied = []
        for j in list(self.neighbours):
            posted = self.posted[j]
            while posted:
                buffer, incoming = posted[0]
                if self.count[j] < need:
                    try:
                        await incoming.wait()
                    except PeerLostError:  # j died: drop it, keep what it sent before
                        self.neighbours.remove(j)
                        break
                elif not (greedy and incoming.ready()):
                    break
                posted.popleft()
                await apply(buffer)  # used up before the buffer is posted again
                applied.append(self.count[j])
                self.count[j] += 1
                if self.count[j] + len(posted) < self.total:
                    posted.append((buffer, self.comm.irecv(buffer, j)))
        return applied


class Mailboxes:
    """The unbounded receiving side: one :class:`Mailbox` per neighbour; same ``drain`` as
    :class:`Inbox`, and no sender ever waits for this worker."""

    def __init__(self, comm: Comm, neighbours: list[int], like: torch.Tensor, total: int) -> None:
        self.neighbours, self.total = neighbours, total
        self.boxes = {j: comm.mailbox(j, like, total) for j in neighbours}
        self.dead: set[int] = set()  # neighbours that died: what they sent before is kept

    @property
    def count(self) -> dict[int, int]:
        """Messages applied from each neighbour."""
        return {j: box.taken for j, box in self.boxes.items()}

    async def drain(self, apply: Any, *, need: int, greedy: bool) -> list[int]:
        applied = []
        for j, box in self.boxes.items():
            while (
                j not in self.dead
                and box.taken < self.total
                and (box.taken < need or (greedy and box.ready()))
            ):
                try:
                    message = await box.get()
                except PeerLostError:  # j died: drop it (the outbox shares the list)
                    self.dead.add(j)
                    self.neighbours.remove(j)
                    break
                applied.append(box.taken - 1)
                await apply(message)
        return applied


# Unbounded NNT: sends a worker may have in flight before it waits for the oldest. Receivers
# take every message as it arrives, so this caps the sender's memory, never couples it to a
# neighbour's progress.
SEND_WINDOW = 8


class Outbox:
    """Sends each gradient to every neighbour, ``window`` in flight at most. The message is the
    outbox's from then on: a new tensor each step (``flat_grad``'s or the codec's), never
    changed, so no copy of it is needed."""

    def __init__(self, comm: Comm, neighbours: list[int], window: int) -> None:
        self.comm, self.neighbours, self.window = comm, neighbours, window
        self.in_flight: list[list[Pending]] = []

    async def send(self, flat: torch.Tensor) -> None:
        if not self.neighbours:
            return
        while len(self.in_flight) >= self.window:
            for pending in self.in_flight.pop(0):
                await pending.wait()
        lost = self.comm.lost_peers()  # neighbours that died get nothing more
        alive = [j for j in self.neighbours if j not in lost]
        self.in_flight.append([self.comm.isend(flat, j) for j in alive])

    async def flush(self) -> None:
        while self.in_flight:
            for pending in self.in_flight.pop(0):
                await pending.wait()


@register(
    "nnt",
    "nearest-neighbour training (FAST): send gradients to ring/torus neighbours, never wait",
    tolerates_worker_loss=True,
)
async def train(ctx: WorkerContext, *, lockstep: bool = False, staged: bool = False) -> None:
    """The program one NNT worker runs."""
    cfg, comm = ctx.config, ctx.comm
    lead = 0 if lockstep else cfg.nnt_max_lead
    neighbours = topology.neighbours(cfg.resolved_topology, comm.world_size, comm.rank)
    model = ctx.build_model()  # same seed => the same initial weights on every worker
    holder = {"optimizer": ctx.build_optimizer(model)}
    params = [p for p in model.parameters() if p.requires_grad]
    last = ctx.total_steps
    like = param_vector(params)
    nbytes = like.numel() * like.element_size()
    codec = message_codec(ctx, params, copies=len(neighbours))  # None: uncompressed
    wire = codec.wire_like() if codec else like
    inbox: Inbox | Mailboxes
    if lead is None:
        inbox = Mailboxes(comm, neighbours, wire, last)
        outbox = Outbox(comm, neighbours, window=SEND_WINDOW)
    else:
        inbox = Inbox(comm, neighbours, wire, last, depth=lead + 1)
        outbox = Outbox(comm, neighbours, window=2 * lead + 1)
    del like, wire  # templates of a message: a gradient's worth per worker, not kept for the run
    snapshots: list[tuple[int, float, torch.Tensor]] = []  # unbounded: (step, time, weights)

    shared = lead is None and codec is None  # fresh messages: apply() need not copy them

    async def apply(flat: torch.Tensor) -> None:
        """A neighbour's gradient, applied with the local optimiser as if it were local (the
        simulator charges the copy and the optimiser step from its cost model)."""
        async with comm.applying(nbytes):
            # A mailbox's message is a new tensor that nothing else reads: the gradients
            # can be views of it (a bounded inbox reuses its buffers, so it copies).
            write_grads(params, codec.decode(flat) if codec else flat, share=shared)
            holder["optimizer"].step()

    unbounded = lead is None and not staged  # nobody waits: not even to score the start
    await ctx.evaluate_shared(model, epoch=0.0, step=0, defer=unbounded)
    scores: dict[str, float] = {}
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        optimizer = holder["optimizer"]
        stats = await local_gradient(ctx, model, optimizer, x, y, step=step, apply=False)
        gradient = flat_grad(params)
        optimizer.step()
        await outbox.send(codec.encode(gradient) if codec else gradient)
        step += 1
        final = step >= last
        # Receiving: at the end every remaining message; otherwise what has arrived,
        # waiting only to stay within ``lead`` steps of each neighbour.
        need = last if final else (0 if lead is None else step - lead)
        applied = await inbox.drain(apply, need=need, greedy=not lockstep and not final)
        if final:
            await outbox.flush()  # no message is left in flight
            optimizer.zero_grad()  # the last message, which the gradients view, is not needed
        staleness = sum(step - 1 - m for m in applied) / len(applied) if applied else math.nan
        ctx.log_train(
            step,
            stats,
            sent=comm.bytes_sent - sent_before,
            lr=lr_of(optimizer),
            staleness=staleness,
        )
        ctx.die_if_killed(step)
        if ctx.is_boundary(step) and unbounded:
            # No synchronisation: this worker's own evaluation, its weights kept for later.
            scores = await ctx.evaluate_local(model, epoch=ctx.progress(step), step=step)
            snapshots.append((step, comm.now(), state_vector(model).clone()))
        elif ctx.is_boundary(step):
            restart = staged and not final and (step // ctx.steps_per_epoch) % cfg.stage_epochs == 0
            if restart:
                await inbox.drain(apply, need=step, greedy=False)  # the whole stage
            scores = await epoch_end(ctx, model, step)
            if restart:
                await _restart_from_best(ctx, model, holder, scores)
    ctx.result["messages_applied"] = dict(inbox.count)  # T from every neighbour
    await ctx.report_deferred()  # the start's score, summed now that no one is held
    for at_step, at_time, weights in snapshots:
        await log_consensus(ctx, weights, at_step, at_time)
    await finish(ctx, model, scores)


async def _restart_from_best(
    ctx: WorkerContext, model: nn.Module, holder: dict[str, Any], scores: dict[str, float]
) -> None:
    """nnt-staged: everyone takes the weights of the best worker on val; optimisers reset."""
    val = torch.zeros(ctx.world_size, dtype=torch.float64)
    val[ctx.rank] = scores.get("val", 0.0)
    await ctx.comm.allreduce(val)
    for rank in ctx.comm.lost_peers():
        val[rank] = -1.0  # a dead worker cannot be the best
    best = int(torch.argmax(val))  # the first maximum: ties go to the lowest rank
    flat = state_vector(model)
    await ctx.comm.broadcast(flat, best)
    load_state_vector(model, flat)
    holder["optimizer"] = ctx.build_optimizer(model)
    ctx.result.setdefault("stage_best_ranks", []).append(best)


@register(
    "nnt-lockstep",
    "nearest-neighbour training, waiting for one gradient per neighbour each step",
    tolerates_worker_loss=True,
)
async def train_lockstep(ctx: WorkerContext) -> None:
    await train(ctx, lockstep=True)


@register(
    "nnt-staged",
    "nearest-neighbour training restarting everyone from the best worker every k epochs",
    tolerates_worker_loss=True,
)
async def train_staged(ctx: WorkerContext) -> None:
    await train(ctx, staged=True)
