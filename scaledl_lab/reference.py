"""Sequential twins of the parallel strategies: what each one must equal, in one process.

Synchronous data parallelism on N workers with per-worker batch B must equal single-process
training on the combined N·B batch, in the same data order. ``train_sequential`` builds those
combined batches from the very same shards and per-epoch orders the workers use.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from . import large_batch
from .config import ExperimentConfig
from .data import DataSplits, epoch_batches, shard_indices
from .models import build_model
from .worker import make_optimizer


def combined_batches(cfg: ExperimentConfig, data: DataSplits, epoch: int) -> list[torch.Tensor]:
    """Step t's combined batch: replica 0's t-th batch, then replica 1's, ... (sample indices;
    a replica is a worker unless the strategy splits the model over several)."""
    per_rank = []
    size = _plan(cfg, data).batch_size(epoch) * cfg.accumulate  # one replica's update
    for rank in range(cfg.replicas):
        shard = shard_indices(data.train.y, cfg.replicas, rank, scheme=cfg.sharding, seed=cfg.seed)
        per_rank.append(epoch_batches(shard, size, seed=cfg.seed, epoch=epoch, rank=rank))
    return [torch.cat(parts) for parts in zip(*per_rank, strict=False)]


def _plan(cfg: ExperimentConfig, data: DataSplits) -> large_batch.StepPlan:
    """The workers' plan: built, as each worker builds it, from a shard's length."""
    shard = shard_indices(data.train.y, cfg.replicas, 0, scheme=cfg.sharding, seed=cfg.seed)
    return large_batch.StepPlan.build(cfg, len(shard))


def train_sequential(cfg: ExperimentConfig, data: DataSplits) -> dict[str, Any]:
    """Plain single-process training on the combined batches; returns the final state_dict.

    With ``accumulate`` K each worker's part of a batch is its K micro-batches at once; a batch
    schedule grows it as the workers' does; every step runs at the workers' scheduled rate."""
    torch.set_num_threads(1)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    model = large_batch.prepare_model(cfg, model).to(cfg.dtype)  # the workers' initial weights
    optimizer = make_optimizer(cfg, model.parameters())
    plan = _plan(cfg, data)
    batches = [idx for epoch in range(cfg.epochs) for idx in combined_batches(cfg, data, epoch)]
    for step, idx in enumerate(batches[: plan.total_steps]):
        large_batch.set_lr(optimizer, plan.lr(step))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.train.x[idx].to(cfg.dtype)), data.train.y[idx])
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}
