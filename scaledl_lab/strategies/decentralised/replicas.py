"""What the decentralised family shares (NNT, D-PSGD, AD-PSGD, local SGD, EASGD): every worker
trains its own replica, so each one is evaluated on its own, the replicas' disagreement is
measured (the consensus distance), and the run's result is the worker best on validation.

Rows: at each epoch boundary ``kind="consensus"`` on rank 0 with the consensus distance
(1/N) Σ_i ||x_i − x̄||² in the ``value`` column, and ``kind="val"``/``"test"`` from every worker
for its own model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...metrics import Row, summarise_workers
from ...objective import correct_count
from ...params import state_vector
from ...runtime.base import Comm
from ...training.worker import StepStats, WorkerContext, check_finite


async def local_gradient(
    ctx: WorkerContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    step: int,
    apply: bool,
) -> StepStats:
    """Forward and backward on this worker's batch (and the local update when ``apply``);
    the optimiser gets step ``step``'s scheduled rate for every update until the next call."""
    ctx.set_lr(optimizer, step)
    async with ctx.comm.compute(len(y)):
        optimizer.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        if apply:
            optimizer.step()
    value = loss.item()
    check_finite(value, rank=ctx.rank, epoch=step // ctx.steps_per_epoch, step=step)
    return StepStats(value, correct_count(out, y), len(y))


async def consensus_distance(comm: Comm, flat: torch.Tensor) -> float:
    """(1/N) Σ_i ||x_i − x̄||²: how far the workers' weights are from their average (collective)."""
    mean = flat.detach().to(torch.float64).clone()
    await comm.allreduce(mean)  # over the survivors when a worker has died
    size = len(comm.survivors())
    mean /= size
    distance = ((flat.detach().to(torch.float64) - mean) ** 2).sum().reshape(1)
    await comm.allreduce(distance)
    return distance.item() / size


async def log_consensus(
    ctx: WorkerContext, model: nn.Module | torch.Tensor, step: int, time: float | None = None
) -> float:
    """Collective: the consensus distance, recorded by rank 0 as a ``kind="consensus"`` row.

    ``model`` may be a copy of the weights each worker kept at its step ``step`` (at ``time``
    on rank 0), for runs whose epoch boundaries are no synchronisation point."""
    sent_before = ctx.comm.bytes_sent
    flat = model if isinstance(model, torch.Tensor) else state_vector(model)
    distance = await consensus_distance(ctx.comm, flat)
    if ctx.rank == ctx.comm.survivors()[0]:  # rank 0 unless it died
        ctx.log(
            Row(
                kind="consensus",
                epoch=ctx.progress(step),
                step=step,
                time=ctx.comm.now() if time is None else time,
                bytes_sent=ctx.comm.bytes_sent - sent_before,
                value=distance,
            )
        )
    return distance


async def epoch_end(ctx: WorkerContext, model: nn.Module, step: int) -> dict[str, float]:
    """At an epoch boundary (all workers at the same step count): consensus, then each
    worker scores its own model on val and test (rows with its rank)."""
    await log_consensus(ctx, model, step)
    return await ctx.evaluate_local(model, epoch=ctx.progress(step), step=step)


async def finish_step(
    ctx: WorkerContext,
    model: nn.Module,
    step: int,
    stats: StepStats,
    scores: dict[str, float],
    sent_before: int,
    lr: float,
) -> dict[str, float]:
    """The loop tail: log step ``step``'s train row (bytes sent since ``sent_before``), where an
    injected fault ends this worker (``die_if_killed``); at an epoch boundary, the consensus
    and every worker's evaluation. Returns the latest scores (``scores`` between boundaries)."""
    ctx.log_train(step, stats, sent=ctx.comm.bytes_sent - sent_before, lr=lr)
    ctx.die_if_killed(step)
    if ctx.is_boundary(step):
        return await epoch_end(ctx, model, step)
    return scores


async def gather_scores(comm: Comm, value: float) -> list[float]:
    """Every worker's ``value`` (collective: a one-hot vector summed by an allreduce); NaN for
    workers that died."""
    vec = torch.zeros(comm.world_size, dtype=torch.float64)
    vec[comm.rank] = value
    await comm.allreduce(vec)
    for rank in comm.lost_peers():
        vec[rank] = math.nan
    return vec.tolist()


async def finish(ctx: WorkerContext, model: nn.Module, scores: dict[str, float]) -> None:
    """Final bookkeeping: every worker's val/test accuracy, the best-on-val worker, the spread.

    ``scores`` is this worker's final ``evaluate_local`` result. The best worker is chosen on
    the validation split (FAST chose on the test split; we keep test for reporting).
    """
    val = await gather_scores(ctx.comm, scores.get("val", math.nan))
    test = await gather_scores(ctx.comm, scores.get("test", math.nan))
    ctx.result.update(summarise_workers(val, test))
    ctx.result["val_accuracy"] = scores.get("val", math.nan)
    ctx.result["test_accuracy"] = scores.get("test", math.nan)
    ctx.keep_model(model)
