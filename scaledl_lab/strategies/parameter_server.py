"""Parameter servers: synchronous, asynchronous, Downpour, staleness-aware, DC-ASGD, backup workers.

The parameters live on ``S`` servers, each holding one contiguous slice of the flat parameter
vector with its own (elementwise) optimiser, so S shards compute exactly what one server does.
Workers pull weights and push gradients (Dean et al. 2012). The server is a plain class; the
runtime hosts it (a Dask actor, or an object inside the simulator) and the algorithm does not
know which. Variants:

- ``ps-sync``: the server averages one gradient per worker, steps, and releases the next version;
- ``backup-workers``: the step uses the first N−b gradients to arrive (Chen et al. 2016);
- ``ps-async``: every push is applied at once, whatever version it was computed on;
- ``downpour``: async, workers fetch every ``n_fetch`` steps and push the gradient accumulated
  over ``n_push`` local steps, updating their replica locally in between (Dean et al. 2012);
- ``staleness-aware``: async with lr / max(1, staleness) (Zhang et al. 2015);
- ``dc-asgd``: async with g + λ·g⊙g⊙(w_now − w_stale) (Zheng et al. 2016); with
  ``dc_adaptive`` λ is λ0/√(MeanSquare(g) + ε) per element (their DC-ASGD-a).

Staleness of a gradient = the number of updates the server applied between the pull its
weights came from and its push; every applied gradient's staleness is logged.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..config import ExperimentConfig
from ..models import build_model
from ..runtime.base import NOT_READY, Row, ServerSpec
from ..worker import WorkerContext, check_finite, flat_grad, load_for, make_optimizer
from . import Strategy, register

# strategy -> server mode
MODES: dict[str, str] = {
    "ps-sync": "sync",
    "backup-workers": "sync",
    "ps-async": "async",
    "downpour": "async",
    "staleness-aware": "staleness-aware",
    "dc-asgd": "dc-asgd",
}


def staleness_aware_lr(lr: float, staleness: float) -> float:
    """Zhang et al. 2015: divide the learning rate by the gradient's staleness (at least 1)."""
    return lr / max(1.0, staleness)


DC_MEAN_SQUARE_MOMENTUM = 0.95  # DC-ASGD-a's moving average of g⊙g (Zheng et al. 2016)
DC_EPSILON = 1e-7


def adaptive_lambda(lam0: float, mean_square: torch.Tensor) -> torch.Tensor:
    """DC-ASGD-a: λ_t = λ0 / √(MeanSquare(g) + ε), elementwise (Zheng et al. 2016)."""
    return lam0 / torch.sqrt(mean_square + DC_EPSILON)


def delay_compensated(
    grad: torch.Tensor, w_now: torch.Tensor, w_stale: torch.Tensor, lam: float | torch.Tensor
) -> torch.Tensor:
    """Zheng et al. 2016: g + λ·g⊙g⊙(w_now − w_stale), a first-order Taylor correction."""
    return grad + lam * grad * grad * (w_now - w_stale)


def global_target(cfg: ExperimentConfig, steps_per_epoch: int) -> int:
    """Gradients a run applies in all: as many as synchronous SGD computes (per worker × N)."""
    per_worker = cfg.epochs * steps_per_epoch
    if cfg.max_steps is not None:
        per_worker = min(per_worker, cfg.max_steps)
    return per_worker * (cfg.workers if MODES.get(cfg.strategy) != "sync" else 1)


class ParameterServer:
    """One shard of the parameters, its optimiser and a version counter.

    ``mode`` is ``sync`` (collect ``workers − backup`` pushes for the current version, average
    them in rank order, step; pushes for an older version are dropped), ``async`` (apply each
    push at once), ``staleness-aware`` or ``dc-asgd``. ``limit`` is the number of versions
    (sync) or gradients (async) after which pushes are dropped: the run's end.
    """

    def __init__(
        self,
        weights: torch.Tensor,
        cfg: ExperimentConfig,
        *,
        mode: str,
        workers: int,
        backup: int = 0,
        limit: int | None = None,
    ) -> None:
        if mode not in ("sync", "async", "staleness-aware", "dc-asgd"):
            raise ValueError(f"unknown parameter-server mode {mode!r}")
        self.param = nn.Parameter(weights.detach().clone(), requires_grad=False)
        self.optimizer = make_optimizer(cfg, [self.param])
        self.lr = cfg.lr
        self.dc_lambda = cfg.dc_lambda
        # DC-ASGD-a keeps a moving average of g⊙g; None for the constant-λ variant.
        self.mean_square = torch.zeros_like(self.param) if cfg.dc_adaptive else None
        self.mode = mode
        self.workers = workers
        self.needed = workers - backup
        self.limit = limit if limit is not None else math.inf
        self.version = 0  # updates applied
        self.gradients = 0  # mini-batch gradients applied (a Downpour push may carry several)
        self.dropped = 0  # pushes not applied (late in sync mode, or after the limit)
        self.staleness: list[float] = []  # of every applied push
        self._pending: dict[int, torch.Tensor] = {}  # sync: this version's gradients by rank
        self._backup: dict[int, torch.Tensor] = {}  # dc-asgd: the weights last sent to a rank

    @property
    def progress(self) -> int:
        """Versions (sync) or gradients (async) applied: what ``limit`` counts."""
        return self.version if self.mode == "sync" else self.gradients

    # -- the protocol ---------------------------------------------------------------------

    def pull(self, rank: int, min_version: int = 0) -> Any:
        """``(weights, version, progress)`` once ``version >= min_version`` (else NOT_READY)."""
        if self.version < min_version and self.progress < self.limit:
            return NOT_READY
        if self.mode == "dc-asgd":
            self._backup[rank] = self.param.detach().clone()
        return self.param.detach(), self.version, self.progress

    def push(self, rank: int, grad: torch.Tensor, version: int, steps: int = 1) -> Any:
        """Apply (or collect) a gradient computed on ``version``; ``(staleness, progress)``.

        Staleness is ``nan`` for a push that was dropped.
        """
        staleness = float(self.version - version)
        if self.progress >= self.limit or (self.mode == "sync" and version < self.version):
            self.dropped += 1
            return math.nan, self.progress
        if self.mode == "sync":
            self._pending[rank] = grad
            if len(self._pending) == self.needed:
                ranks = sorted(self._pending)
                total = self._pending[ranks[0]].clone()
                for r in ranks[1:]:  # rank order: the same sum as the simulator's allreduce
                    total += self._pending[r]
                self._step(torch.div(total, self.needed), self.lr)
                self._pending.clear()
                self.gradients += self.needed
        else:
            lr = self.lr
            if self.mode == "staleness-aware":
                lr = staleness_aware_lr(self.lr, staleness)
            elif self.mode == "dc-asgd":
                stale = self._backup.get(rank, self.param.detach())
                lam: float | torch.Tensor = self.dc_lambda
                if self.mean_square is not None:
                    m = DC_MEAN_SQUARE_MOMENTUM
                    self.mean_square.mul_(m).addcmul_(grad, grad, value=1 - m)
                    lam = adaptive_lambda(self.dc_lambda, self.mean_square)
                grad = delay_compensated(grad, self.param.detach(), stale, lam)
            self._step(grad, lr)
            self.gradients += steps
        self.staleness.append(staleness)
        return staleness, self.progress

    def push_pull(self, rank: int, grad: torch.Tensor, version: int, steps: int = 1) -> Any:
        """Asynchronous modes: push, then pull in the same call (one round trip)."""
        staleness, _ = self.push(rank, grad, version, steps)
        weights, version, progress = self.pull(rank)
        return staleness, weights, version, progress

    def _step(self, grad: torch.Tensor, lr: float) -> None:
        self.param.grad = grad.to(self.param.dtype)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.param.grad = None
        self.version += 1

    def stats(self) -> dict[str, Any]:
        s = torch.tensor(self.staleness or [math.nan], dtype=torch.float64)
        return {
            "version": self.version,
            "gradients": self.gradients,
            "dropped": self.dropped,
            "mean_staleness": s.mean().item(),
        }


def initial_vector(cfg: ExperimentConfig) -> torch.Tensor:
    """The seeded model's parameters as one flat vector (what every worker starts from)."""
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    return nn.utils.parameters_to_vector(model.to(cfg.dtype).parameters()).detach()


@functools.lru_cache(maxsize=16)
def steps_per_epoch_of(cfg: ExperimentConfig) -> int:
    """Every worker's steps per epoch (shards differ by at most one sample; take the least)."""
    from ..data import shard_indices, steps_per_epoch

    data = load_for(cfg)
    return min(
        steps_per_epoch(
            len(shard_indices(data.train.y, cfg.workers, r, scheme=cfg.sharding, seed=cfg.seed)),
            cfg.batch_size,
        )
        for r in range(cfg.workers)
    )


class ServerShards(ServerSpec):
    """``cfg.servers`` shards, shard ``index`` = the index-th ``tensor_split`` slice."""

    def count(self, cfg: ExperimentConfig) -> int:
        return cfg.servers

    def create(self, cfg: ExperimentConfig, index: int) -> ParameterServer:
        shard = torch.tensor_split(initial_vector(cfg), cfg.servers)[index]
        return ParameterServer(
            shard,
            cfg,
            mode=MODES[cfg.strategy],
            workers=cfg.workers,
            backup=cfg.backup_workers if cfg.strategy == "backup-workers" else 0,
            limit=global_target(cfg, steps_per_epoch_of(cfg)),
        )


def time_per_epoch(frame: Any) -> float:
    """Seconds per epoch of a run, from its metrics table: when global progress reached its
    final epoch, divided by that epoch (late pushes that were dropped do not count)."""
    train = frame[frame["kind"] == "train"]
    end = train["epoch"].max()
    return float(train.loc[train["epoch"] >= end - 1e-9, "time"].min() / end)


# -- the worker ------------------------------------------------------------------------------


class Shards:
    """A worker's view of the servers: pull into the model, push a flat gradient, in parallel."""

    def __init__(self, ctx: WorkerContext, model: nn.Module) -> None:
        self.ctx, self.comm = ctx, ctx.comm
        self.params = [p for p in model.parameters()]
        self.servers = ctx.config.servers
        self.versions = [0] * self.servers
        self.progress = 0

    def _load(self, replies: list[Any]) -> None:
        weights = torch.cat([w for w, _, _ in replies])
        nn.utils.vector_to_parameters(weights.to(self.params[0].dtype), self.params)
        self.versions = [v for _, v, _ in replies]
        self.progress = replies[0][2]

    async def pull(self, min_version: int = 0) -> None:
        calls = [
            self.comm.call_start(i, "pull", self.ctx.rank, min_version) for i in range(self.servers)
        ]
        self._load([await c.wait() for c in calls])

    def _split(self, grad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.tensor_split(grad, self.servers)

    async def push(self, grad: torch.Tensor, steps: int = 1) -> float:
        """Push ``grad`` (flat); the mean staleness over the shards (nan if dropped)."""
        calls = [
            self.comm.call_start(i, "push", self.ctx.rank, g, self.versions[i], steps)
            for i, g in enumerate(self._split(grad))
        ]
        replies = [await c.wait() for c in calls]
        self.progress = replies[0][1]
        return sum(s for s, _ in replies) / len(replies)

    async def push_pull(self, grad: torch.Tensor, steps: int = 1) -> float:
        calls = [
            self.comm.call_start(i, "push_pull", self.ctx.rank, g, self.versions[i], steps)
            for i, g in enumerate(self._split(grad))
        ]
        replies = [await c.wait() for c in calls]
        self._load([r[1:] for r in replies])
        return sum(r[0] for r in replies) / len(replies)


def _batches_forever(ctx: WorkerContext):
    """This worker's batches, epoch after epoch (an async worker draws until the run ends)."""
    epoch = 0
    while True:
        yield from ctx.batches(epoch)
        epoch += 1


async def train(ctx: WorkerContext) -> None:
    """The program one worker runs against the parameter servers (every variant)."""
    cfg, comm = ctx.config, ctx.comm
    mode = MODES[cfg.strategy]
    sync = mode == "sync"
    model = ctx.build_model()
    shards = Shards(ctx, model)
    spe = steps_per_epoch_of(cfg)
    target = global_target(cfg, spe)
    per_epoch = spe if sync else spe * ctx.world_size  # progress units in one epoch
    n_fetch, n_push = (cfg.n_fetch, cfg.n_push) if cfg.strategy == "downpour" else (1, 1)
    local_lr = cfg.lr  # Downpour's local steps; the servers' own optimisers use cfg.lr too

    await shards.pull()
    evaluated = 0  # epochs evaluated so far (rank 0)
    if ctx.rank == 0:
        await ctx.evaluate_local(model, epoch=0.0, step=0)
    step = 0
    accumulated: torch.Tensor | None = None
    batches = _batches_forever(ctx)
    while shards.progress < target:
        x, y = next(batches)
        sent_before = comm.bytes_sent
        async with comm.compute(len(y)):
            model.zero_grad()
            out = model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()
            grad = flat_grad(shards.params)
            accumulated = grad if accumulated is None else accumulated + grad
            if n_fetch > 1 or n_push > 1:  # Downpour: the replica steps on its own in between
                with torch.no_grad():
                    for p in shards.params:
                        if p.grad is not None:
                            p.sub_(p.grad, alpha=local_lr)
        local_loss = loss.item()
        check_finite(local_loss, rank=ctx.rank, epoch=int(shards.progress // per_epoch), step=step)
        step += 1
        staleness = math.nan
        if sync:
            basis = shards.versions[0]
            staleness = await shards.push(accumulated)
            accumulated = None
            await shards.pull(min_version=basis + 1)
        else:
            fetch = step % n_fetch == 0
            if step % n_push == 0:
                pushed = n_push
                if fetch:
                    staleness = await shards.push_pull(accumulated, steps=pushed)
                else:
                    staleness = await shards.push(accumulated, steps=pushed)
                accumulated = None
            elif fetch:
                await shards.pull()
        lr = cfg.lr
        if mode == "staleness-aware" and not math.isnan(staleness):
            lr = staleness_aware_lr(cfg.lr, staleness)  # what the servers applied (mean τ)
        ctx.log(
            Row(
                kind="train",
                epoch=min(shards.progress, target) / per_epoch,
                step=step,
                time=comm.now(),
                loss=local_loss,
                accuracy=(out.argmax(1) == y).sum().item() / len(y),
                samples=len(y),
                bytes_sent=comm.bytes_sent - sent_before,
                staleness=staleness,
                lr=lr,
            )
        )
        if ctx.rank == 0 and shards.progress // per_epoch > evaluated and shards.progress < target:
            evaluated = int(shards.progress // per_epoch)
            await ctx.evaluate_local(model, epoch=shards.progress / per_epoch, step=step)
    # The run is over (pushes beyond the target are dropped): the servers' weights are final.
    await shards.pull()
    if ctx.rank == 0:
        await ctx.evaluate_local(model, epoch=min(shards.progress, target) / per_epoch, step=step)
    ctx.result["state_dict"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


_SERVERS = ServerShards()
_DESCRIPTIONS = {
    "ps-sync": "parameter server, synchronous: average one gradient per worker, then step",
    "ps-async": "parameter server, asynchronous: apply every gradient at once (stale)",
    "downpour": "Downpour SGD: async PS, fetch every n_fetch, push accumulated every n_push",
    "staleness-aware": "async PS with the learning rate divided by the staleness (Zhang 2015)",
    "dc-asgd": "async PS with delay compensation g + λ·g⊙g⊙(w_now − w_stale) (Zheng 2016)",
    "backup-workers": "synchronous PS stepping on the first N−b gradients (Chen et al. 2016)",
}
for _name, _mode in MODES.items():
    register(
        Strategy(
            _name,
            train,
            _DESCRIPTIONS[_name],
            servers=_SERVERS,
            tolerates_worker_loss=_mode != "sync",
        )
    )
