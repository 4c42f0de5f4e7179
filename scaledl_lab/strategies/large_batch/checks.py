"""Config errors of the large-batch options, each one line naming the field, before any cluster
starts: :func:`check_config` from the config alone, :func:`check_data` once the training set's
size is known (the driver calls it before it starts workers)."""

from __future__ import annotations

from typing import Any

from ... import families
from ...contract import LR_SCALINGS
from ...errors import ConfigError, choices
from ...training.schedule import StepPlan, epoch_batch_size, parse_batch_schedule, parse_lr_schedule


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_epochs(field: str, spec: Any, milestones: tuple[float, ...], epochs: float) -> None:
    if list(milestones) != sorted(set(milestones)):
        raise ConfigError(f"{field}={spec!r}: the epochs must increase strictly")
    outside = [m for m in milestones if not 0 < m < epochs]
    if outside:
        raise ConfigError(
            f"{field}={spec!r}: epoch {outside[0]:g} lies outside the run of {epochs:g} epochs "
            "(each must be above 0 and below the run's end)"
        )


def _check_batches(cfg: Any, train_samples: int | None) -> None:
    milestones, factor = parse_batch_schedule(cfg.batch_schedule)
    for epoch in milestones:
        batch = epoch_batch_size(cfg, epoch)
        if abs(batch - round(batch)) > 1e-9:
            raise ConfigError(
                f"batch_schedule={cfg.batch_schedule!r}: from epoch {epoch} the effective batch "
                f"{cfg.effective_batch_size * batch / cfg.batch_size:g} no longer divides over the "
                f"{cfg.replicas} replicas (workers={cfg.workers}); choose a factor that keeps "
                "the per-worker batch whole"
            )
        if train_samples is not None:
            shard = train_samples // cfg.replicas
            if round(batch) * cfg.accumulate > shard:
                raise ConfigError(
                    f"batch_schedule={cfg.batch_schedule!r}: from epoch {epoch} each worker's "
                    f"batch of {round(batch) * cfg.accumulate} exceeds its shard of {shard} "
                    f"samples ({train_samples} training samples over {cfg.replicas} replicas)"
                )


def _estimated_train_samples(cfg: Any) -> int | None:
    """The training split's size as published, less validation, cut to ``train_subset``."""
    from ...data import standard_sizes

    n = standard_sizes(cfg.dataset)[0] - cfg.val_size
    return min(n, cfg.train_subset) if cfg.train_subset is not None else n


def check_config(cfg: Any) -> None:
    """Raise ConfigError for the first invalid large-batch field."""
    if cfg.lr_scaling not in LR_SCALINGS:
        raise ConfigError(
            f"lr_scaling={cfg.lr_scaling!r} is unknown; allowed: {choices(LR_SCALINGS)}"
        )
    if not _is_int(cfg.reference_batch_size) or cfg.reference_batch_size <= 0:
        raise ConfigError(
            f"reference_batch_size={cfg.reference_batch_size!r} must be a positive integer"
        )
    warm = cfg.warmup_epochs
    if not isinstance(warm, (int, float)) or isinstance(warm, bool) or not warm >= 0:
        raise ConfigError(f"warmup_epochs={warm!r} must be a non-negative number of epochs")
    if warm > cfg.epochs:
        raise ConfigError(
            f"warmup_epochs={warm:g} is longer than the run (epochs={cfg.epochs}); "
            "warm up for part of the run"
        )
    milestones = parse_lr_schedule(cfg.lr_schedule)[1]
    _check_epochs("lr_schedule", cfg.lr_schedule, milestones, cfg.epochs)
    if not _is_int(cfg.accumulate) or cfg.accumulate < 1:
        raise ConfigError(
            f"accumulate={cfg.accumulate!r} must be a positive integer (micro-batches per update)"
        )
    if cfg.accumulate > 1 and not families.has(cfg.strategy, "accumulates"):
        raise ConfigError(
            f"accumulate={cfg.accumulate} is supported by "
            f"{choices(families.with_capability('accumulates'))} only, "
            f"not by strategy={cfg.strategy!r}"
        )
    if cfg.batch_schedule is not None:
        if not families.has(cfg.strategy, "batch_schedule"):
            raise ConfigError(
                f"batch_schedule={cfg.batch_schedule!r} is supported by the synchronous "
                f"{choices(families.with_capability('batch_schedule'))} only, "
                f"not by strategy={cfg.strategy!r}"
            )
        milestones_b, _ = parse_batch_schedule(cfg.batch_schedule)
        _check_epochs("batch_schedule", cfg.batch_schedule, milestones_b, cfg.epochs)
        _check_batches(cfg, _estimated_train_samples(cfg))
    _check_optimizer_options(cfg)


def _check_optimizer_options(cfg: Any) -> None:
    adaptive = cfg.optimizer in ("lars", "lamb")
    coefficient = cfg.trust_coefficient
    if coefficient is not None:
        if not adaptive:
            raise ConfigError(
                f"trust_coefficient={coefficient!r} applies to optimizer 'lars' or 'lamb', not "
                f"to optimizer={cfg.optimizer!r}"
            )
        if not isinstance(coefficient, (int, float)) or not coefficient >= 0:
            raise ConfigError(
                f"trust_coefficient={coefficient!r} must be a non-negative number "
                f"(optimizer={cfg.optimizer!r})"
            )
    if adaptive and families.has(cfg.strategy, "hosts_servers"):
        raise ConfigError(
            f"optimizer={cfg.optimizer!r} scales each layer by its own trust ratio, but the "
            f"parameter servers of strategy={cfg.strategy!r} hold flat shards with no layers; "
            "use sgd, adam or adagrad"
        )
    if adaptive and families.has(cfg.strategy, "slices_layers"):
        raise ConfigError(
            f"optimizer={cfg.optimizer!r} takes each layer's norms, but {cfg.strategy} ranks "
            "hold slices of the layers (their trust ratios would differ from the whole model's); "
            "use sgd, adam or adagrad"
        )
    for name in ("zero_init_residual", "no_bias_decay"):
        value = getattr(cfg, name)
        if value is not None and not isinstance(value, bool):
            raise ConfigError(f"{name}={value!r} must be True, False or None (the recipe's)")
    if cfg.zero_init_residual and cfg.model != "resnet18":
        raise ConfigError(
            f"zero_init_residual=True applies to model='resnet18' (residual blocks), not to "
            f"model={cfg.model!r}"
        )
    if cfg.no_bias_decay and families.has(cfg.strategy, "hosts_servers"):
        raise ConfigError(
            f"no_bias_decay=True cannot apply to strategy={cfg.strategy!r}: its parameter "
            "servers hold flat shards in which biases and BatchNorm are not told apart"
        )


def check_data(cfg: Any, train_samples: int) -> None:
    """The checks that need the training set's size: every batch fits in a shard, and warmup
    and milestones lie inside the run when ``max_steps`` ends it early."""
    if cfg.batch_schedule is not None:
        _check_batches(cfg, train_samples)
    plan = StepPlan.build(cfg, train_samples // cfg.replicas)
    run = plan.progress(plan.total_steps)
    if cfg.warmup_epochs > run:
        raise ConfigError(
            f"warmup_epochs={cfg.warmup_epochs:g} is longer than the run "
            f"({plan.total_steps} steps of max_steps={cfg.max_steps} are {run:.3g} epochs)"
        )
    _check_epochs("lr_schedule", cfg.lr_schedule, parse_lr_schedule(cfg.lr_schedule)[1], run)
    milestones = parse_batch_schedule(cfg.batch_schedule)[0]
    _check_epochs("batch_schedule", cfg.batch_schedule, milestones, run)
