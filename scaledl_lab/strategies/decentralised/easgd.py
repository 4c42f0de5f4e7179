"""Elastic averaging SGD (EASGD; Zhang, Choromanska, LeCun 2015).

Each worker trains its own replica x_i; a centre variable x̃ ties them together by an elastic
force. Every τ = ``cfg.sync_period`` local steps, with moving rate α = ``cfg.elastic_alpha``
(default 0.9 / N, i.e. β = Nα = 0.9 as in the paper):

- synchronous (``elastic_async=False``, the paper's Eq. 5–6): the centre is replicated on every
  worker and updated from one allreduce of the differences,
  x_i ← x_i − α(x_i − x̃),  x̃ ← x̃ + α Σ_i (x_i − x̃)
  (which keeps Σ_i x_i + x̃ unchanged; the tests check it);
- asynchronous (``elastic_async=True``, the paper's Algorithm 1): the centre lives on one hosted
  server; a worker sends x_i, the server computes d = α(x_i − x̃), adds it to x̃ and returns it,
  and the worker subtracts it. Workers never wait for each other.

The final model is the centre. Rows: ``kind="train"`` per worker per step (``bytes_sent`` is the
elastic exchange on the steps that have one); ``val``/``test`` of the centre at each epoch
boundary (synchronous: evaluated by all workers together; asynchronous: rank 0 fetches the
centre and evaluates it alone, so no worker waits for another until the end), and at the end a
``kind="consensus"`` row (rank 0) with the replicas' distance from their average.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ...config import ExperimentConfig
from ...params import load_state_vector, state_vector
from ...runtime.base import NOT_READY, Comm
from ...training.worker import WorkerContext, lr_of
from ..registry import ServerSpec, register
from .replicas import local_gradient, log_consensus


def moving_rate(cfg: ExperimentConfig) -> float:
    return cfg.elastic_alpha if cfg.elastic_alpha is not None else 0.9 / cfg.workers


async def elastic_sync(comm: Comm, x: torch.Tensor, centre: torch.Tensor, alpha: float) -> None:
    """One synchronous elastic averaging, in place on ``x`` (this worker) and ``centre``."""
    diff = x - centre
    total = diff.clone()
    await comm.allreduce(total)  # Σ_i (x_i − x̃)
    x.sub_(alpha * diff)  # the same arithmetic as the asynchronous server's
    centre.add_(alpha * total)


class ElasticCentre:
    """The asynchronous EASGD server: holds x̃, moves it towards each worker that calls."""

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.centre: torch.Tensor | None = None

    def init(self, weights: torch.Tensor) -> int:
        if self.centre is None:  # rank 0 sends the common initial weights
            self.centre = weights.clone()
        return 0

    def elastic(self, weights: torch.Tensor) -> Any:
        if self.centre is None:
            return NOT_READY  # parked until rank 0's init arrives
        diff = self.alpha * (weights - self.centre)
        self.centre += diff
        return diff

    def weights(self) -> Any:
        return NOT_READY if self.centre is None else self.centre


class CentreSpec(ServerSpec):
    """One centre server when ``elastic_async``; none for the synchronous variant."""

    def count(self, cfg: Any) -> int:
        return 1 if cfg.elastic_async else 0

    def create(self, cfg: Any, index: int) -> ElasticCentre:
        return ElasticCentre(moving_rate(cfg))


@register(
    "easgd",
    "elastic averaging SGD: replicas pulled towards a centre variable every sync_period "
    "steps (synchronous allreduce, or an asynchronous centre server)",
    servers=CentreSpec(),
    tolerates_worker_loss=lambda cfg: cfg.elastic_async,  # the synchronous one allreduces
)
async def train(ctx: WorkerContext) -> None:
    """The program one EASGD worker runs (synchronous or asynchronous per the config)."""
    cfg, comm = ctx.config, ctx.comm
    is_async = cfg.elastic_async
    alpha = moving_rate(cfg)
    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    centre_model = copy.deepcopy(model)  # what gets evaluated: the centre x̃
    centre = state_vector(model)  # synchronous: every worker's replica of x̃
    if is_async and comm.is_root:
        await comm.call(0, "init", state_vector(model))
    await ctx.evaluate_shared(centre_model, epoch=0.0, step=0)
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        stats = await local_gradient(ctx, model, optimizer, x, y, step=step, apply=True)
        step += 1
        if step % cfg.sync_period == 0:
            mine = state_vector(model)
            if is_async:
                mine -= await comm.call(0, "elastic", mine)
            else:
                await elastic_sync(comm, mine, centre, alpha)
            load_state_vector(model, mine)
        ctx.log_train(
            step,
            stats,
            sent=comm.bytes_sent - sent_before,
            lr=lr_of(optimizer),
        )
        ctx.die_if_killed(step)
        if step < ctx.total_steps and ctx.is_boundary(step):
            await _evaluate_centre(ctx, centre_model, centre, step, is_async)
    if is_async:
        await comm.barrier()  # every worker's last elastic update has reached the centre
        centre = await comm.call(0, "weights")
    await log_consensus(ctx, model, step)
    load_state_vector(centre_model, centre)
    await ctx.evaluate_shared(centre_model, epoch=ctx.progress(step), step=step)
    ctx.keep_model(centre_model)
    ctx.keep_model(model, "local_state_dict")


async def _evaluate_centre(
    ctx: WorkerContext, centre_model: Any, centre: torch.Tensor, step: int, is_async: bool
) -> None:
    if not is_async:
        load_state_vector(centre_model, centre)
        await ctx.evaluate_shared(centre_model, epoch=ctx.progress(step), step=step)
    elif ctx.rank == ctx.comm.survivors()[0]:  # rank 0 unless it died
        load_state_vector(centre_model, await ctx.comm.call(0, "weights"))
        await ctx.evaluate_local(centre_model, epoch=ctx.progress(step), step=step)
