"""Local SGD / periodic model averaging (Zinkevich et al. 2010; Stich 2019; Lin et al. 2020).

Each worker trains its own replica on its own shard with its own optimiser and, every
``cfg.sync_period`` local steps (and after the last step), the replicas are replaced by their
average with one allreduce of the weights. Communication drops by the factor ``sync_period``
against synchronous SGD; with ``sync_period=1`` and plain SGD (no momentum) it *is* synchronous
SGD, which the tests check. Optimiser state (momentum, Adam moments) stays local.

Rows: ``kind="train"`` per worker per step (``bytes_sent`` is the averaging's share on the
steps that average, 0 otherwise); at each epoch boundary ``kind="consensus"`` on rank 0 (the
distance of the replicas from their average, ``value`` column) and ``val``/``test`` rows of every
worker's own model, as for the other decentralised methods.
"""

from __future__ import annotations

from torch import nn

from ...params import load_state_vector, state_vector
from ...training.worker import WorkerContext, lr_of
from ..registry import register
from .replicas import finish, finish_step, local_gradient


async def average_models(ctx: WorkerContext, model: nn.Module) -> None:
    """Replace this worker's weights by the average over all workers (collective)."""
    flat = state_vector(model)
    await ctx.comm.allreduce(flat)
    load_state_vector(model, flat / ctx.world_size)


@register(
    "local-sgd",
    "local SGD: average the replicas with an allreduce every sync_period steps",
)
async def train(ctx: WorkerContext) -> None:
    """The program one local-SGD worker runs."""
    cfg, comm = ctx.config, ctx.comm
    model, optimizer = await ctx.start()
    scores: dict[str, float] = {}
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        stats = await local_gradient(ctx, model, optimizer, x, y, step=step, apply=True)
        step += 1
        if step % cfg.sync_period == 0 or step >= ctx.total_steps:
            await average_models(ctx, model)
        scores = await finish_step(ctx, model, step, stats, scores, sent_before, lr_of(optimizer))
    await finish(ctx, model, scores)
