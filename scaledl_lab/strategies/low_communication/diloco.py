"""DiLoCo (Douillard et al. 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models", Algorithm 1): H inner steps with the worker's own optimiser, then one outer step.

Every worker starts a round from the global weights θ. It takes H = ``cfg.sync_period`` inner
steps on its own shard with its own inner optimiser (AdamW in the paper; its state stays on the
worker across rounds), reaching θ_i. One allreduce averages the outer gradients,
Δ = (1/k) Σ_i (θ − θ_i), and every worker applies the same outer step θ ← Outer(θ, Δ)
(:mod:`.outer`: Nesterov 0.7 / 0.9 by default) and continues from θ. The run ends with a round
after its last step, so it yields one model. Outer SGD of rate 1 without momentum lands on the
average of the θ_i: local SGD (FedAvg); with H = 1 and plain inner SGD too, synchronous SGD.
The tests check both, and a sequential twin (:mod:`.twins`) for the general case.

A lost worker drops out of the next outer average. Every step ends with no message in flight,
so a checkpoint holds the local model, the inner optimiser, θ and the outer momentum. Outer
gradients may be compressed (``compress``; :mod:`.compressed`).

Rows: ``kind="train"`` per worker per step (``bytes_sent`` is the outer gradient's allreduce on
the steps that end a round, 0 otherwise); ``val``/``test`` of the global weights θ at the start
and at each epoch boundary (evaluated by the workers together, reported by rank 0).
"""

from __future__ import annotations

import copy

from torch import nn

from ...training.snapshots import Closing, is_due, save_if_due, start_or_resume
from ...training.worker import WorkerContext, lr_of
from ..decentralised.replicas import local_gradient
from ..registry import register
from .compressed import outer_codec
from .fragments import fragments_of
from .outer import GlobalFragment


class GlobalModel:
    """A model holding the global weights θ of every fragment, for evaluation."""

    def __init__(self, model: nn.Module, count: int) -> None:
        self.model = copy.deepcopy(model)
        self.fragments = fragments_of(self.model, count)

    def load(self, blocks: list[GlobalFragment]) -> nn.Module:
        for fragment, block in zip(self.fragments, blocks, strict=True):
            fragment.load(block.theta)
        return self.model


async def evaluate_global(
    ctx: WorkerContext, view: GlobalModel, blocks: list[GlobalFragment], step: int
) -> None:
    """Every worker together scores θ on val and test (rank 0, or the first survivor, logs)."""
    await ctx.evaluate_shared(view.load(blocks), epoch=ctx.progress(step), step=step)


def finish(ctx: WorkerContext, model: nn.Module) -> None:
    """The run's result: every worker holds θ after the last round."""
    ctx.keep_model(model)


@register(
    "diloco",
    "DiLoCo: sync_period inner steps with the worker's optimiser, then an outer "
    "optimiser (Nesterov) steps on the averaged outer gradient",
    tolerates_worker_loss=True,
)
async def train(ctx: WorkerContext) -> None:
    """The program one DiLoCo worker runs."""
    cfg, comm = ctx.config, ctx.comm
    model, inner, step = await start_or_resume(ctx)  # step > 0: a resumed run
    (whole,) = fragments_of(model, 1)
    block = GlobalFragment(cfg, whole, outer_codec(ctx, whole, 0))
    view = GlobalModel(model, 1)
    if ctx.resume is not None:
        block.load_state_dict(ctx.resume["extra"]["global"])
        if "closing" in ctx.resume and ctx.is_boundary(step):
            # The checkpoint came before a closing round, whose evaluation a longer run does
            # not make: score θ as the longer run does at this boundary.
            await evaluate_global(ctx, view, [block], step)
    for x, y in ctx.local_batches(step):
        sent_before = comm.bytes_sent
        stats = await local_gradient(ctx, model, inner, x, y, step=step, apply=True)
        step += 1
        # The closing round (a last step that ends no round of H) only yields the run's one
        # model; a checkpoint there keeps the state, clock and bytes before it, which a longer
        # run goes on from.
        closing = step >= ctx.total_steps and step % cfg.sync_period != 0
        due = is_due(ctx, step)  # the state is copied only for a checkpoint (θ is the model's size)
        kept = None
        if closing and due:
            before = Closing(comm.clock_state(), comm.bytes_sent - sent_before)
            kept = (copy.deepcopy(model), block.state_dict(), before)
        if step % cfg.sync_period == 0 or closing:
            await block.sync(comm)  # Δ averaged, θ ← Outer(θ, Δ), θ_i ← θ
        ctx.log_train(step, stats, sent=comm.bytes_sent - sent_before, lr=lr_of(inner))
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await evaluate_global(ctx, view, [block], step)
        if due:
            saved, state, before = kept or (model, block.state_dict(), None)
            await save_if_due(ctx, step, saved, inner, extra={"global": state}, closing=before)
    finish(ctx, model)
