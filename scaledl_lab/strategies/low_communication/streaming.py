"""Streaming DiLoCo (Douillard et al. 2025, "Streaming DiLoCo with overlapping communication:
Towards a Distributed Free Lunch", Algorithm 2): DiLoCo whose model is cut into F fragments
synchronised in turn, each fragment's outer all-reduce overlapped with τ inner steps.

Fragment f (a contiguous run of layers, :mod:`.fragments`) ends a round at the steps t with
(t − offset_f) mod H = 0, the offsets spread by H/F, so one synchronisation moves about 1/F
of the model (the peak bandwidth falls F-fold; the bytes per H steps stay those of DiLoCo).
At such a step the worker starts the allreduce of the fragment's outer gradient θ_f − θ_{i,f}
and goes on with its inner steps; τ = ``cfg.overlap_steps`` steps later it waits for the
average Δ_f, applies the outer step θ_f ← Outer(θ_f, Δ_f) and merges it into the local
fragment, which kept training meanwhile: θ_{i,f} ← α·θ_{i,f} + (1 − α)·θ_f (the paper's
mixing, α = ``cfg.mixing_alpha``; by default 0.5 with τ > 0, the paper's choice, and 0 with
τ = 0, where the local fragment has not moved and is simply replaced, as in DiLoCo). With
F = 1 and τ = 0 this is DiLoCo, step for step (the tests check it).

The run ends by waiting for the fragments still in flight, then one blocking round of every
fragment with α = 0, so that it yields one model. A lost worker drops out of the averages that
follow; on the simulator also out of a round in flight when it dies (it never joins that
allreduce), while on Dask a run that tolerates worker loss reduces among the survivors when the
round starts (no overlap then), so there the round it started still counts it.

Outer gradients may be compressed (``compress``: onebit, qsgd:LEVELS, topk:RATIO, with error
feedback; :mod:`.compressed`), as the paper sends them in 4 bits (qsgd:7 codes each entry in
4 bits). Compressed payloads cannot be summed, so they are allgathered when the round starts:
a compressed round saves bytes but does not overlap.

Rows: as :mod:`.diloco`'s; a train row's ``bytes_sent`` is what the fragments started at that
step sent.
"""

from __future__ import annotations

from typing import Any

from ...training.worker import WorkerContext, lr_of
from ..decentralised.replicas import local_gradient
from ..registry import register
from .compressed import outer_codec
from .diloco import GlobalModel, evaluate_global, finish
from .fragments import fragments_of, offsets, syncs_at
from .outer import Averaged, GlobalFragment, OuterSum


def mixing_alpha(cfg: Any) -> float:
    """α: the local fragment's share when a delayed outer step is merged (see module doc)."""
    if cfg.mixing_alpha is not None:
        return float(cfg.mixing_alpha)
    return 0.5 if cfg.overlap_steps > 0 else 0.0


@register(
    "streaming-diloco",
    "Streaming DiLoCo: the model's fragments synchronised in turn, each outer all-reduce "
    "overlapped with overlap_steps inner steps",
    tolerates_worker_loss=True,
)
async def train(ctx: WorkerContext) -> None:
    """The program one Streaming DiLoCo worker runs."""
    cfg, comm = ctx.config, ctx.comm
    period, tau, alpha = cfg.sync_period, cfg.overlap_steps, mixing_alpha(cfg)
    model, inner = await ctx.start()
    parts = fragments_of(model, cfg.fragments)
    blocks = [GlobalFragment(cfg, f, outer_codec(ctx, f, i)) for i, f in enumerate(parts)]
    starts = offsets(period, cfg.fragments)
    view = GlobalModel(model, cfg.fragments)
    in_flight: dict[
        int, tuple[int, OuterSum | Averaged]
    ] = {}  # fragment -> (step it merges at, its sum)
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        stats = await local_gradient(ctx, model, inner, x, y, step=step, apply=True)
        step += 1
        last = step >= ctx.total_steps
        for f in sorted(in_flight):  # the same order on every worker
            due, pending = in_flight[f]
            if due == step or last:
                del in_flight[f]
                await blocks[f].finish(pending, alpha)
        for f, block in enumerate(blocks):
            if last:
                await block.sync(comm)  # the closing round: every fragment, α = 0
            elif syncs_at(step, starts[f], period):
                pending = await block.start(comm)
                if tau == 0:
                    await block.finish(pending, alpha)
                else:
                    in_flight[f] = (step + tau, pending)
        ctx.log_train(step, stats, sent=comm.bytes_sent - sent_before, lr=lr_of(inner))
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await evaluate_global(ctx, view, blocks, step)
    finish(ctx, model)
