"""Sequential twins of the parallel strategies: what each one must equal, in one process.

Synchronous data parallelism on N workers with per-worker batch B must equal single-process
training on the combined N·B batch, in the same data order. ``train_sequential`` builds those
combined batches from the very same shards and per-epoch orders the workers use;
``train_worker_mean`` does the same arithmetic the way the workers do (their gradients summed
in rank order), which float32 runs match bit for bit. The decentralised and asynchronous
families have twins of their own: D-PSGD as the matrix recursion X ← W·X − lr·∇F(X_old)
(``train_dpsgd_sequential``), and an asynchronous parameter server replayed push by push in
the order its metrics table records (in its family's folder:
:mod:`scaledl_lab.strategies.parameter_server.twins`, which uses :class:`Gradients` and
:func:`worker_batches` from here).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import families
from ..config import ExperimentConfig
from ..data import DataSplits, epoch_batches, shard_indices, steps_per_epoch
from ..models import build_model
from ..objective import model_input
from .schedule import StepPlan, set_lr
from .worker import make_optimizer


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread while a twin trains (the rank-order sums of one worker process, bit
    for bit), the caller's count restored when it ends; also a decorator (``@one_thread()``)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def combined_batches(cfg: ExperimentConfig, data: DataSplits, epoch: int) -> list[torch.Tensor]:
    """Step t's combined batch: replica 0's t-th batch, then replica 1's, ... (sample indices;
    a replica is a worker unless the strategy splits the model over several)."""
    per_rank = []
    size = _plan(cfg, data).batch_size(epoch) * cfg.accumulate  # one replica's update
    for rank in range(cfg.replicas):
        shard = shard_indices(data.train.y, cfg.replicas, rank, scheme=cfg.sharding, seed=cfg.seed)
        per_rank.append(epoch_batches(shard, size, seed=cfg.seed, epoch=epoch, rank=rank))
    return [torch.cat(parts) for parts in zip(*per_rank, strict=False)]


def _plan(cfg: ExperimentConfig, data: DataSplits) -> StepPlan:
    """The workers' plan: built, as each worker builds it, from a shard's length."""
    shard = shard_indices(data.train.y, cfg.replicas, 0, scheme=cfg.sharding, seed=cfg.seed)
    return StepPlan.build(cfg, len(shard))


@one_thread()
def train_sequential(cfg: ExperimentConfig, data: DataSplits) -> dict[str, Any]:
    """Plain single-process training on the combined batches; returns the final state_dict.

    With ``accumulate`` K each worker's part of a batch is its K micro-batches at once; a batch
    schedule grows it as the workers' does; every step runs at the workers' scheduled rate."""
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    model = families.prepare_model(cfg, model).to(cfg.dtype)  # the workers' initial weights
    optimizer = make_optimizer(cfg, model.parameters())
    plan = _plan(cfg, data)
    batches = [idx for epoch in range(cfg.epochs) for idx in combined_batches(cfg, data, epoch)]
    for step, idx in enumerate(batches[: plan.total_steps]):
        set_lr(optimizer, plan.lr(step))
        optimizer.zero_grad()
        loss = F.cross_entropy(
            model(model_input(data.train.x[idx], None, cfg.dtype)), data.train.y[idx]
        )
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@one_thread()
def train_worker_mean(cfg: ExperimentConfig, data: DataSplits) -> dict[str, Any]:
    """Synchronous SGD in one process, done the way the workers do it: at each step every
    worker's gradient of its own batch at the shared weights, summed in rank order, divided by
    the number of workers, then one optimiser step; returns the final state_dict.

    In exact arithmetic this is ``train_sequential``. In floating point it performs the very
    operations of a run whose allreduce sums in rank order (the simulator's; gloo's a + b for
    two workers), so with one thread per process the two agree bit for bit, in float32 too.
    """
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    model = families.prepare_model(cfg, model).to(cfg.dtype)  # the workers' initial weights
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = make_optimizer(cfg, params)
    shards = [
        shard_indices(data.train.y, cfg.workers, r, scheme=cfg.sharding, seed=cfg.seed)
        for r in range(cfg.workers)
    ]
    steps = []
    for epoch in range(cfg.epochs):
        per_rank = [
            epoch_batches(shard, cfg.batch_size, seed=cfg.seed, epoch=epoch, rank=r)
            for r, shard in enumerate(shards)
        ]
        steps += list(zip(*per_rank, strict=True))
    for batches in steps[: cfg.max_steps]:
        total: list[torch.Tensor] | None = None
        for idx in batches:
            loss = F.cross_entropy(
                model(model_input(data.train.x[idx], None, cfg.dtype)), data.train.y[idx]
            )
            grads = torch.autograd.grad(loss, params, allow_unused=True)
            grads = [
                torch.zeros_like(p) if g is None else g for p, g in zip(params, grads, strict=True)
            ]
            total = grads if total is None else [t + g for t, g in zip(total, grads, strict=True)]
        assert total is not None
        for p, t in zip(params, total, strict=True):
            p.grad = t / cfg.workers
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- per-worker data order ---------------------------------------------------------------------


def worker_batches(
    cfg: ExperimentConfig, data: DataSplits, rank: int, *, epochs: int | None = None
) -> Iterator[torch.Tensor]:
    """Worker ``rank``'s mini-batches (sample indices), epoch after epoch, in the order its
    ``WorkerContext.batches`` gives them; ``epochs=None`` draws for ever (asynchronous workers
    draw until the run ends)."""
    shard = shard_indices(data.train.y, cfg.workers, rank, scheme=cfg.sharding, seed=cfg.seed)
    epoch = 0
    while epochs is None or epoch < epochs:
        yield from epoch_batches(shard, cfg.batch_size, seed=cfg.seed, epoch=epoch, rank=rank)
        epoch += 1


def _local_steps(cfg: ExperimentConfig, data: DataSplits) -> int:
    """Steps every worker of a decentralised run takes (all shards have the same length)."""
    shard = shard_indices(data.train.y, cfg.workers, 0, scheme=cfg.sharding, seed=cfg.seed)
    steps = cfg.epochs * steps_per_epoch(len(shard), cfg.batch_size)
    return min(steps, cfg.max_steps) if cfg.max_steps is not None else steps


class Gradients:
    """∇F(w; batch) of the config's model at any flat weight vector ``w``, in one process (a
    twin using it runs under :func:`one_thread`)."""

    def __init__(self, cfg: ExperimentConfig, data: DataSplits) -> None:
        self.cfg, self.data = cfg, data
        self.model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        self.model = self.model.to(cfg.dtype)
        if any(b.is_floating_point() for b in self.model.buffers()):
            raise ValueError(
                f"model={cfg.model!r} has floating-point buffers (BatchNorm statistics), which "
                "the flat-vector twins do not carry; use mlp, cnn or cnn1d"
            )
        self.params = list(self.model.parameters())

    def initial(self) -> torch.Tensor:
        """The seeded initial weights as one flat vector (what every worker starts from)."""
        return nn.utils.parameters_to_vector(self.params).detach().clone()

    def __call__(self, w: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            nn.utils.vector_to_parameters(w, self.params)
        x, y = model_input(self.data.train.x[idx], None, self.cfg.dtype), self.data.train.y[idx]
        loss = F.cross_entropy(self.model(x), y)
        grads = torch.autograd.grad(loss, self.params, allow_unused=True)
        return torch.cat(
            [
                (torch.zeros_like(p) if g is None else g).reshape(-1)
                for p, g in zip(self.params, grads, strict=True)
            ]
        )

    def state_dict(self, w: torch.Tensor) -> dict[str, Any]:
        with torch.no_grad():
            nn.utils.vector_to_parameters(w, self.params)
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}


def check_plain_sgd(cfg: ExperimentConfig, what: str) -> None:
    if cfg.optimizer != "sgd":
        raise ValueError(f"the {what} twin is written for optimizer='sgd', not {cfg.optimizer!r}")


# -- D-PSGD ------------------------------------------------------------------------------------


@one_thread()
def train_dpsgd_sequential(cfg: ExperimentConfig, data: DataSplits) -> list[dict[str, Any]]:
    """D-PSGD (Lian et al. 2017) with all N workers as the rows of one matrix X (N × P):

        G ← [∇F_i(X_i; batch_i(t))]_i        (each worker's gradient at its weights before mixing)
        M ← μ·M + G + wd·W·X                 (SGD's momentum; weight decay acts on the mixed point,
                                              where the worker's optimiser step finds its weights)
        X ← W·X − lr·M

    with W the topology's mixing matrix. Plain SGD (μ = 0, wd = 0) is X ← W·X − lr·∇F(X_old).
    Worker i's batches are its own shard's, in its per-epoch order. Returns each worker's final
    state_dict, rank by rank.
    """
    from ..topology import mixing_matrix

    check_plain_sgd(cfg, "D-PSGD")
    grad = Gradients(cfg, data)
    n, steps = cfg.workers, _local_steps(cfg, data)
    w = mixing_matrix(cfg.resolved_topology, n).to(cfg.dtype)
    x = grad.initial().repeat(n, 1)
    m = torch.zeros_like(x)
    batches = [list(worker_batches(cfg, data, r, epochs=cfg.epochs))[:steps] for r in range(n)]
    for t in range(steps):
        g = torch.stack([grad(x[i], batches[i][t]) for i in range(n)])
        mixed = w @ x
        m = cfg.momentum * m + g + cfg.weight_decay * mixed
        x = mixed - cfg.lr * m
    return [grad.state_dict(x[i]) for i in range(n)]
