"""Parameter servers, the workers' side: synchronous, asynchronous, Downpour, staleness-aware,
DC-ASGD, backup workers.

The parameters live on ``S`` servers (:mod:`.server`), each holding one contiguous slice of
the flat parameter vector with its own (elementwise) optimiser, so S shards compute exactly
what one server does. Every worker computes the gradient of its own mini-batch and then
exchanges it with the servers under one of three named policies:

- :class:`SyncExchange` (``ps-sync``, ``backup-workers``): push, then pull the next version;
- :class:`AsyncExchange` (``ps-async``, ``staleness-aware``, ``dc-asgd``): push and pull in one
  round trip, never waiting for the others;
- :class:`DownpourExchange` (Dean et al. 2012): fetch every ``n_fetch`` steps and push the
  gradient accumulated over ``n_push`` local steps, the replica stepping on its own in between.

Each variant is one exchange policy and one server update rule (:data:`VARIANTS`). Every applied
gradient's staleness is logged; asynchronous train rows carry global progress in ``epoch``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...config import ExperimentConfig
from ...models import build_model
from ...objective import correct_count
from ...params import flat_grad, load_param_vector, param_vector
from ...training.snapshots import Closing, restore, save_if_due
from ...training.worker import (
    StepStats,
    WorkerContext,
    check_finite,
    load_for,
    steps_per_epoch_of,
    total_steps,
)
from ..compression.messages import push_codec, push_decoder
from ..large_batch.recipe import prepare_model
from ..registry import ServerSpec, register
from .server import ParameterServer, scheduled_lr, staleness_aware_lr


@dataclass(frozen=True)
class Variant:
    """A parameter-server strategy: the server's update rule and the workers' exchange."""

    name: str
    rule: str  # a key of ps_server.RULES
    exchange: str  # "sync" | "async" | "downpour"
    description: str


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("ps-sync", "sync", "sync",
                "parameter server, synchronous: average one gradient per worker, then step"),
        Variant("backup-workers", "sync", "sync",
                "synchronous PS stepping on the first N−b gradients (Chen et al. 2016)"),
        Variant("ps-async", "async", "async",
                "parameter server, asynchronous: apply every gradient at once (stale)"),
        Variant("downpour", "async", "downpour",
                "Downpour SGD: async PS, fetch every n_fetch, push accumulated every n_push"),
        Variant("staleness-aware", "staleness-aware", "async",
                "async PS with the learning rate divided by the staleness (Zhang 2015)"),
        Variant("dc-asgd", "dc-asgd", "async",
                "async PS with delay compensation g + λ·g⊙g⊙(w_now − w_stale) (Zheng 2016)"),
    )
}  # fmt: skip


def global_target(cfg: ExperimentConfig) -> int:
    """Progress a run makes in all: versions (sync) or gradients applied (async; Hogwild!),
    as many gradients as synchronous SGD computes (per worker × N)."""
    synchronous = cfg.strategy in VARIANTS and VARIANTS[cfg.strategy].rule == "sync"
    return total_steps(cfg) * (1 if synchronous else cfg.workers)


def initial_vector(cfg: ExperimentConfig) -> torch.Tensor:
    """The seeded model's parameters as one flat vector (what every worker starts from)."""
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    return param_vector(prepare_model(cfg, model).to(cfg.dtype).parameters())


class ServerShards(ServerSpec):
    """``cfg.servers`` shards, shard ``index`` = the index-th ``tensor_split`` slice."""

    def count(self, cfg: ExperimentConfig) -> int:
        return cfg.servers

    def create(self, cfg: ExperimentConfig, index: int) -> ParameterServer:
        shard = torch.tensor_split(initial_vector(cfg), cfg.servers)[index]
        return ParameterServer(
            shard,
            cfg,
            mode=VARIANTS[cfg.strategy].rule,
            workers=cfg.workers,
            backup=cfg.backup_workers if cfg.strategy == "backup-workers" else 0,
            limit=global_target(cfg),
            decoder=push_decoder(cfg, index),
        )


class Shards:
    """A worker's view of the servers: pull into the model, push a flat gradient, in parallel."""

    def __init__(self, ctx: WorkerContext, model: nn.Module) -> None:
        self.ctx, self.comm = ctx, ctx.comm
        self.params = list(model.parameters())
        self.servers = ctx.config.servers
        self.versions = [0] * self.servers
        self.progress = 0
        self.codec = push_codec(ctx, self.params)  # None without compression

    def _load(self, replies: list) -> None:
        weights = replies[0][0] if len(replies) == 1 else torch.cat([w for w, _, _ in replies])
        load_param_vector(self.params, weights.to(self.params[0].dtype))
        self.versions = [v for _, v, _ in replies]
        self.progress = replies[0][2]

    def _split(self, grad: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.tensor_split(grad, self.servers))

    async def _call_all(self, method: str, *args, grad: torch.Tensor | None = None) -> list:
        parts = None
        if grad is not None:
            split = self.codec.encode if self.codec else self._split
            parts = split(grad)
        calls = [
            self.comm.call_start(
                i, method, self.ctx.rank, *((parts[i], self.versions[i]) if parts else ()), *args
            )
            for i in range(self.servers)
        ]
        return [await c.wait() for c in calls]

    async def pull(self, min_version: int = 0) -> None:
        self._load(await self._call_all("pull", min_version))

    async def push(self, grad: torch.Tensor, steps: int = 1) -> float:
        """Push ``grad`` (flat); the mean staleness over the shards (nan if dropped)."""
        replies = await self._call_all("push", steps, grad=grad)
        self.progress = replies[0][1]
        return sum(s for s, _ in replies) / len(replies)

    async def push_pull(self, grad: torch.Tensor, steps: int = 1) -> float:
        replies = await self._call_all("push_pull", steps, grad=grad)
        self._load([r[1:] for r in replies])
        return sum(r[0] for r in replies) / len(replies)


# -- exchange policies: what a worker does with each local gradient ---------------------------


class SyncExchange:
    """Push, then wait for the version that includes every worker's gradient."""

    steps_locally = False

    async def __call__(self, shards: Shards, grad: torch.Tensor, step: int) -> float:
        basis = shards.versions[0]
        staleness = await shards.push(grad)
        await shards.pull(min_version=basis + 1)
        return staleness


class AsyncExchange:
    """Push and pull in one round trip; never wait for another worker."""

    steps_locally = False

    async def __call__(self, shards: Shards, grad: torch.Tensor, step: int) -> float:
        return await shards.push_pull(grad)


class DownpourExchange:
    """Fetch every ``n_fetch`` steps, push the sum of the last ``n_push`` gradients."""

    def __init__(self, n_fetch: int, n_push: int) -> None:
        self.n_fetch, self.n_push = n_fetch, n_push
        self.steps_locally = n_fetch > 1 or n_push > 1  # else it is plain async
        self.accumulated: torch.Tensor | None = None

    async def __call__(self, shards: Shards, grad: torch.Tensor, step: int) -> float:
        self.accumulated = grad if self.accumulated is None else self.accumulated + grad
        fetch = step % self.n_fetch == 0
        staleness = math.nan
        if step % self.n_push == 0:
            if fetch:
                staleness = await shards.push_pull(self.accumulated, steps=self.n_push)
            else:
                staleness = await shards.push(self.accumulated, steps=self.n_push)
            self.accumulated = None
        elif fetch:
            await shards.pull()
        return staleness


def exchange_for(cfg: ExperimentConfig) -> SyncExchange | AsyncExchange | DownpourExchange:
    kind = VARIANTS[cfg.strategy].exchange
    if kind == "sync":
        return SyncExchange()
    if kind == "downpour":
        return DownpourExchange(cfg.n_fetch, cfg.n_push)
    return AsyncExchange()


async def train(ctx: WorkerContext) -> None:
    """The program one worker runs against the parameter servers (every variant)."""
    cfg, comm = ctx.config, ctx.comm
    variant = VARIANTS[cfg.strategy]
    exchange = exchange_for(cfg)
    model = ctx.build_model()
    shards = Shards(ctx, model)
    target = global_target(cfg)
    per_epoch = steps_per_epoch_of(cfg) * (1 if variant.rule == "sync" else ctx.world_size)

    # The initial state exists from the start: every worker built it from the seed, and the pull
    # fetches the same weights. Its evaluation (rank 0 alone, on whole splits) is stamped then.
    initial = comm.now()
    evaluated = 0  # epochs evaluated so far (rank 0)
    step = 0

    async def evaluate_if_due() -> None:
        nonlocal evaluated
        if ctx.rank == 0 and shards.progress // per_epoch > evaluated and shards.progress < target:
            evaluated = int(shards.progress // per_epoch)
            await ctx.evaluate_local(model, epoch=shards.progress / per_epoch, step=step)

    if ctx.resume is None:
        await shards.pull()
        if ctx.rank == 0:
            await ctx.evaluate_local(model, epoch=0.0, step=0, at=initial)
    else:  # a resumed run: the servers hold the weights and optimiser, the model their pull
        restore(ctx, model, None)
        shards.versions, shards.progress = ctx.resume["extra"]["shards"]
        step, evaluated = int(ctx.resume["step"]), int(shards.progress // per_epoch)
        if "closing" in ctx.resume:  # the first run scored its end after its closing pull:
            evaluated -= 1  # score this step as a longer run does
            await evaluate_if_due()
    batches = itertools.islice(ctx.batches_forever(), step, None)
    while shards.progress < target:
        x, y = next(batches)
        sent_before = comm.bytes_sent
        base_lr = scheduled_lr(cfg, shards.progress, per_epoch, target)  # cfg.lr by default
        async with comm.compute(len(y)):
            model.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            grad = flat_grad(shards.params)
            if exchange.steps_locally:  # Downpour: the replica steps on its own in between
                with torch.no_grad():
                    for p in shards.params:
                        if p.grad is not None:
                            p.sub_(p.grad, alpha=base_lr)
        local_loss = loss.item()
        check_finite(local_loss, rank=ctx.rank, epoch=int(shards.progress // per_epoch), step=step)
        step += 1
        staleness = await exchange(shards, grad, step)
        lr = base_lr
        if variant.rule == "staleness-aware" and not math.isnan(staleness):
            lr = staleness_aware_lr(base_lr, staleness)  # what the servers applied (mean τ)
        ctx.log_train(
            step,
            StepStats(local_loss, correct_count(out, y), len(y)),
            sent=comm.bytes_sent - sent_before,
            lr=lr,
            staleness=staleness,
            epoch=min(shards.progress, target) / per_epoch,
        )
        ctx.die_if_killed(step)
        if variant.exchange == "sync":  # every worker is at the same step
            # Saved before the step's evaluation, which a resumed run then makes at the same
            # time; the run's end (a closing pull, then its evaluation) is no part of a longer
            # run, whose evaluation of this step a run resumed from here makes again.
            closing = Closing() if shards.progress >= target else None
            kept = [list(shards.versions), shards.progress]
            await save_if_due(ctx, step, model, None, extra={"shards": kept}, closing=closing)
        await evaluate_if_due()
    # The run is over (pushes beyond the target are dropped): the servers' weights are final.
    await shards.pull()
    if ctx.rank == 0:
        await ctx.evaluate_local(model, epoch=min(shards.progress, target) / per_epoch, step=step)
    ctx.keep_model(model)


for _variant in VARIANTS.values():
    register(
        _variant.name,
        _variant.description,
        servers=ServerShards(),
        tolerates_worker_loss=_variant.rule != "sync",
    )(train)
