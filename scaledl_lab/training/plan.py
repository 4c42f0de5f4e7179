"""What a config implies before any worker starts: its data, its optimiser, its step counts.

The workers, the simulator, the sequential twins and the driver all ask here, so that they
agree (one definition of the steps a run takes, one dataset cache per process).
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .. import families
from ..config import ExperimentConfig
from ..data import DataSplits, load_dataset
from .optim import LAMB, LARS, AdamW, param_groups
from .schedule import StepPlan


# One dataset per process: a full Fashion-MNIST is ~220 MB as float32, and loading another one
# takes ~0.13 s from the decoded files (cached below it), so a sweep over seeds or subsets
# reloads instead of holding four copies (0.9 GB in each of reproduce's processes).
@functools.lru_cache(maxsize=1)
def _cached_dataset(
    name: str,
    data_dir: str | None,
    val_size: int,
    train_subset: int | None,
    test_subset: int | None,
    seed: int,
) -> DataSplits:
    return load_dataset(
        name,
        data_dir=data_dir,
        val_size=val_size,
        train_subset=train_subset,
        test_subset=test_subset,
        seed=seed,
    )


def forget_data() -> None:
    """Drop this process's cached dataset (the next :func:`load_for` loads it again)."""
    _cached_dataset.cache_clear()


def load_for(cfg: ExperimentConfig) -> DataSplits:
    """The data a config names (cached: every worker, the driver and the simulator use it)."""
    return _cached_dataset(
        cfg.dataset, cfg.data_dir, cfg.val_size, cfg.train_subset, cfg.test_subset, cfg.seed
    )


def make_optimizer(cfg: ExperimentConfig, params: Any, precision: Any = None) -> Any:
    """The optimiser named by the config (every worker and the sequential twin use this).
    With a 16-bit ``precision`` (:class:`.precision.Precision`), it steps float32 master
    copies of ``params`` (:class:`.precision.MasterWeights`; clipping acts on them).

    SGD, Adam and AdaGrad step all tensors at once (``foreach``: the same arithmetic per element,
    the same numbers, fewer calls). ``clip_gradient``: every gradient element is clipped into
    [-c, c] before each step, as MXNet's optimisers do with ``clip_gradient``."""
    if precision is not None:
        return precision.optimizer(params, lambda masters: make_optimizer(cfg, masters))
    optimizer = _optimizer(cfg, params)
    if cfg.clip_gradient is not None:
        optimizer.register_step_pre_hook(_clipper(float(cfg.clip_gradient)))
    return optimizer


def _clipper(bound: float) -> Any:
    def clip(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.clamp_(-bound, bound)

    return clip


def _optimizer(cfg: ExperimentConfig, params: Any) -> torch.optim.Optimizer:
    # The families' changes (their records say): the large-batch recipe's bias decay and trust
    # coefficients, DGC's momentum correction (the momentum moves into each compressor).
    changes = families.optimiser_changes(cfg)
    if changes.no_bias_decay:  # biases and BatchNorm: no weight decay, no trust ratio
        params = param_groups(params, cfg.weight_decay)
    coefficient = changes.trust_coefficient
    trust = {} if coefficient is None else {"trust_coefficient": coefficient}
    if cfg.optimizer == "lars":
        return LARS(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                    **trust)  # fmt: skip
    if cfg.optimizer == "lamb":
        return LAMB(params, lr=cfg.lr, weight_decay=cfg.weight_decay, **trust)
    if cfg.optimizer == "sgd":
        momentum = cfg.momentum if changes.momentum is None else changes.momentum
        return torch.optim.SGD(params, lr=cfg.lr, momentum=momentum,
                               weight_decay=cfg.weight_decay, foreach=True)  # fmt: skip
    if cfg.optimizer == "adamw":
        return AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    return torch.optim.Adagrad(params, lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)


def step_plan(cfg: ExperimentConfig) -> StepPlan:
    """Where every worker's steps fall: all shards have ``n // replicas`` samples."""
    return StepPlan.build(cfg, len(load_for(cfg).train) // cfg.replicas)


def steps_per_epoch_of(cfg: ExperimentConfig) -> int:
    """Steps every worker takes per epoch (the first epoch's, with a batch schedule)."""
    return step_plan(cfg).steps_per_epoch


def total_steps(cfg: ExperimentConfig) -> int:
    """Steps every worker of a synchronous or decentralised run takes in all."""
    return step_plan(cfg).total_steps
