"""Local SGD / periodic model averaging (Zinkevich et al. 2010; Stich 2019; Lin et al. 2020).

Each worker trains its own replica on its own shard with its own optimiser and, every
``cfg.sync_period`` local steps (and after the last step), the replicas are replaced by their
average with one allreduce of the weights. Communication drops by the factor ``sync_period``
against synchronous SGD; with ``sync_period=1`` and plain SGD (no momentum) it *is* synchronous
SGD, which the tests check. Optimiser state (momentum, Adam moments) stays local.

Rows: ``kind="train"`` per worker per step (``bytes_sent`` is the averaging's share on the
steps that average, 0 otherwise); at each epoch boundary ``kind="consensus"`` on rank 0 (the
distance of the replicas from their average, ``loss`` column) and ``val``/``test`` rows of every
worker's own model, as for the other decentralised methods.
"""

from __future__ import annotations

from ..worker import WorkerContext
from . import Strategy, register
from .gossip import (
    epoch_end,
    finish_decentralised,
    is_boundary,
    load_state_vector,
    local_batches,
    local_gradient,
    log_train,
    state_vector,
    total_steps,
)


async def average_models(ctx: WorkerContext, model) -> None:
    """Replace this worker's weights by the average over all workers (collective)."""
    flat = state_vector(model)
    await ctx.comm.allreduce(flat)
    load_state_vector(model, flat / ctx.world_size)


async def train(ctx: WorkerContext) -> None:
    """The program one local-SGD worker runs."""
    cfg, comm = ctx.config, ctx.comm
    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    last = total_steps(ctx)
    await ctx.evaluate_shared(model, epoch=0.0, step=0)
    scores: dict[str, float] = {}
    step = 0
    for epoch, x, y in local_batches(ctx, last):
        sent_before = comm.bytes_sent
        loss, correct = await local_gradient(
            ctx, model, optimizer, x, y, epoch=epoch, step=step, apply=True
        )
        step += 1
        if step % cfg.sync_period == 0 or step >= last:
            await average_models(ctx, model)
        log_train(
            ctx,
            step=step,
            loss=loss,
            correct=correct,
            samples=len(y),
            sent=comm.bytes_sent - sent_before,
            lr=optimizer.param_groups[0]["lr"],
        )
        if is_boundary(ctx, step, last):
            scores = await epoch_end(ctx, model, step)
    await finish_decentralised(ctx, model, scores)


register(
    Strategy(
        "local-sgd",
        train,
        "local SGD: average the replicas with an allreduce every sync_period steps",
    )
)
