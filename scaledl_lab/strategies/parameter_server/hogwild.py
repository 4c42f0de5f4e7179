"""Hogwild! (Niu et al. 2011): lock-free SGD on parameters shared by the workers of one machine.

Every worker maps the same flat parameter vector and applies its updates in place, without
locks, while the others read and write it. Each model parameter is a view into that vector, so
the worker's own optimiser updates the shared memory directly (its momentum buffer stays
private, as in PyTorch's mnist_hogwild example). A second shared vector holds one update
counter per worker (each worker writes only its own slot): the staleness of a gradient is the
number of updates the others applied between reading the weights and applying it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ...objective import correct_count
from ...params import param_vector
from ...training.worker import StepStats, WorkerContext, check_finite, lr_of, steps_per_epoch_of
from ..registry import register
from .workers import global_target


def share_parameters(model: nn.Module, flat: torch.Tensor) -> None:
    """Make every parameter of ``model`` a view into ``flat`` (same order and sizes)."""
    params = list(model.parameters())
    total = sum(p.numel() for p in params)
    if total != flat.numel():
        raise ValueError(f"shared vector has {flat.numel()} elements, the model {total}")
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view_as(p)
        offset += n


@register(
    "hogwild",
    "Hogwild!: lock-free SGD on parameters shared in memory by the workers of one machine",
    tolerates_worker_loss=True,
)
async def train(ctx: WorkerContext) -> None:
    """The program one worker runs: read shared weights, compute a gradient, write in place."""
    cfg, comm = ctx.config, ctx.comm
    initial = comm.now()  # the initial state (the same on every worker) exists from here
    model = ctx.build_model()
    init = param_vector(model.parameters())
    flat = await comm.shared_tensor("params", init)
    counts = await comm.shared_tensor("updates", torch.zeros(ctx.world_size, dtype=torch.float64))
    share_parameters(model, flat)
    optimizer = ctx.build_optimizer(model)
    target = global_target(cfg)  # as many gradients as synchronous SGD computes
    per_epoch = steps_per_epoch_of(cfg) * ctx.world_size
    others = [r for r in range(ctx.world_size) if r != ctx.rank]

    def applied() -> int:
        return int(counts.sum().item())

    evaluated = 0
    if ctx.rank == 0:
        await ctx.evaluate_local(model, epoch=0.0, step=0, at=initial)
    step = 0
    epoch = 0
    while applied() < target:
        for x, y in ctx.batches(epoch):
            seen = counts[others].sum().item()  # the others' updates when we read the weights
            async with comm.compute(len(y)):
                optimizer.zero_grad()
                out = model(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
            local_loss = loss.item()
            check_finite(local_loss, rank=ctx.rank, epoch=epoch, step=step)
            if applied() >= target:  # the others finished the run while we computed
                break
            staleness = counts[others].sum().item() - seen
            ctx.set_lr(optimizer, step)  # the scheduled rate of this worker's step
            optimizer.step()  # in place on the shared vector, no lock
            counts[ctx.rank] += 1  # only this worker writes its slot
            step += 1
            done = applied()
            ctx.log_train(
                step,
                StepStats(local_loss, correct_count(out, y), len(y)),
                staleness=staleness,
                lr=lr_of(optimizer),
                epoch=min(done, target) / per_epoch,
            )
            ctx.die_if_killed(step)
            if done >= target:
                break
            if ctx.rank == 0 and done // per_epoch > evaluated:
                evaluated = done // per_epoch
                await ctx.evaluate_local(model, epoch=done / per_epoch, step=step)
        epoch += 1
    if ctx.rank == 0:
        done = applied()
        await ctx.evaluate_local(model, epoch=min(done, target) / per_epoch, step=step)
    ctx.keep_model(model)
    ctx.result["updates"] = counts.tolist()
