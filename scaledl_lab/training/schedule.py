"""Where a run's steps fall and the learning rate of each: learning-rate scaling and gradual
warmup (Goyal et al. 2017), step and cosine decay, batch-size schedules (Smith et al. 2017) and
micro-batch accumulation.

Every schedule is a pure function of the config and the step. :class:`StepPlan` says where a
run's steps fall (steps in each epoch, the batch of each epoch, progress in epochs) and the
learning rate of each step; the workers, the parameter servers and the sequential twins all ask
it. With the defaults the rate is ``cfg.lr`` itself, so runs without these options are unchanged.
Configs are read by attribute (the config's checks import this module). The rest of the
large-batch recipe (Goyal's zero-initialised residual branches, no decay on biases, LARS and
LAMB's trust coefficients) is :mod:`scaledl_lab.strategies.large_batch.recipe`.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError

STEP_GAMMA = 0.1  # step schedule: the rate × GAMMA at each milestone (Goyal et al.: ÷10)
BATCH_FACTOR = 10.0  # batch schedule: the batch × FACTOR where the rate would have been ÷10


def _numbers(text: str, what: str, spec: str) -> tuple[float, ...]:
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise ConfigError(f"{what}={spec!r}: {text!r} is not a list of epochs") from None


def parse_lr_schedule(spec: str) -> tuple[str, tuple[float, ...], float]:
    """``"constant"``, ``"cosine"`` or ``"step:E1,E2[:GAMMA]"`` as (kind, milestones, gamma)."""
    if spec in ("constant", "cosine"):
        return spec, (), 1.0
    kind, _, rest = str(spec).partition(":")
    if kind != "step" or not rest:
        raise ConfigError(
            f"lr_schedule={spec!r} is unknown; allowed: 'constant', 'cosine', 'step:E1,E2[:GAMMA]'"
        )
    epochs, _, gamma = rest.partition(":")
    try:
        factor = float(gamma) if gamma else STEP_GAMMA
    except ValueError:
        raise ConfigError(f"lr_schedule={spec!r}: GAMMA={gamma!r} is not a number") from None
    if not factor > 0:
        raise ConfigError(f"lr_schedule={spec!r}: GAMMA={factor} must be positive")
    return "step", _numbers(epochs, "lr_schedule", spec), factor


def parse_batch_schedule(spec: str | None) -> tuple[tuple[int, ...], float]:
    """``"E1,E2[:FACTOR]"`` as (milestone epochs, factor); ``None`` as no milestones."""
    if spec is None:
        return (), 1.0
    epochs, _, factor = str(spec).partition(":")
    try:
        grow = float(factor) if factor else BATCH_FACTOR
    except ValueError:
        raise ConfigError(f"batch_schedule={spec!r}: FACTOR={factor!r} is not a number") from None
    milestones = _numbers(epochs, "batch_schedule", spec)
    if any(m != int(m) for m in milestones):
        raise ConfigError(
            f"batch_schedule={spec!r}: the batch changes at epoch starts; use whole epochs"
        )
    if not grow > 0:
        raise ConfigError(f"batch_schedule={spec!r}: FACTOR={grow} must be positive")
    return tuple(int(m) for m in milestones), grow


# -- learning rate --------------------------------------------------------------------------


def is_constant_lr(cfg: Any) -> bool:
    """True when every step runs at ``cfg.lr`` (no scaling, warmup or decay)."""
    return cfg.lr_scaling == "none" and cfg.warmup_epochs == 0 and cfg.lr_schedule == "constant"


def scaled_lr(cfg: Any, effective_batch: int) -> float:
    """``lr`` is the rate at ``reference_batch_size``; linear: × k, sqrt: × √k (k = ratio)."""
    ratio = effective_batch / cfg.reference_batch_size
    if cfg.lr_scaling == "linear":
        return cfg.lr * ratio
    if cfg.lr_scaling == "sqrt":
        return cfg.lr * math.sqrt(ratio)
    return cfg.lr


def lr_at_epoch(
    cfg: Any, start: float, end: float, effective_batch: int, run_epochs: float
) -> float:
    """The rate of a step from epoch ``start`` to ``end`` (progress in epochs) of a run of
    ``run_epochs`` epochs, at ``effective_batch`` samples per update."""
    if is_constant_lr(cfg):
        return cfg.lr
    target = scaled_lr(cfg, effective_batch)
    rate, warm = target, cfg.warmup_epochs
    if warm > 0 and start < warm:
        # Goyal et al. 2017 §2.2: linear, step by step, from the reference-batch rate η to kη
        # (from zero when the scaling rule did not raise the rate).
        base = cfg.lr if target > cfg.lr else 0.0
        rate = base + (target - base) * min(1.0, end / warm)
    kind, milestones, gamma = parse_lr_schedule(cfg.lr_schedule)
    if kind == "step":
        rate *= gamma ** sum(start >= m for m in milestones)
    elif kind == "cosine":  # from the end of warmup to the end of the run
        span = run_epochs - warm
        done = min(max((start - warm) / span, 0.0), 1.0) if span > 0 else 0.0
        rate *= 0.5 * (1.0 + math.cos(math.pi * done))
    return rate


def lr_at(cfg: Any, step: int, steps_per_epoch: int) -> float:
    """The rate of (0-based) update ``step`` when an epoch has ``steps_per_epoch`` updates (with a
    batch schedule: of the first epoch, a worker's shard taken as steps × batch)."""
    shard = steps_per_epoch * cfg.batch_size * cfg.accumulate
    return StepPlan.build(cfg, shard).lr(step)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Give every parameter group of ``optimizer`` the rate ``lr``; return it."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


# -- where the steps fall -------------------------------------------------------------------


def epoch_batch_size(cfg: Any, epoch: int) -> float:
    """The per-worker batch of ``epoch`` under the batch schedule (a float until checked)."""
    milestones, factor = parse_batch_schedule(cfg.batch_schedule)
    return cfg.batch_size * factor ** sum(epoch >= m for m in milestones)


@dataclass(frozen=True)
class StepPlan:
    """A worker's steps: how many in each epoch, at which per-worker batch, and the rate of each.

    ``batch_sizes[e]`` is the per-worker batch of epoch ``e`` (its micro-batch); an update takes
    ``accumulate`` of them. Epochs all have ``shard_len // (batch × accumulate)`` steps.
    """

    cfg: Any
    epoch_steps: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    total_steps: int

    @classmethod
    def build(cls, cfg: Any, shard_len: int) -> StepPlan:
        sizes = tuple(round(epoch_batch_size(cfg, e)) for e in range(cfg.epochs))
        steps = tuple(shard_len // (b * cfg.accumulate) for b in sizes)
        if steps[0] == 0:
            raise ValueError(
                f"each worker's shard has {shard_len} samples, fewer than "
                f"batch_size={cfg.batch_size}; use a smaller batch or more data"
            )
        if 0 in steps:
            epoch = steps.index(0)
            raise ConfigError(
                f"batch_schedule={cfg.batch_schedule!r}: from epoch {epoch} each worker's batch "
                f"of {sizes[epoch] * cfg.accumulate} exceeds its shard of {shard_len} samples"
            )
        total = sum(steps) if cfg.max_steps is None else min(sum(steps), cfg.max_steps)
        return cls(cfg, steps, sizes, total)

    @property
    def steps_per_epoch(self) -> int:
        """Steps of the first epoch (of every epoch without a batch schedule)."""
        return self.epoch_steps[0]

    @property
    def is_uniform(self) -> bool:
        return len(set(self.epoch_steps)) == 1

    def _starts(self) -> list[int]:
        starts = [0]
        for n in self.epoch_steps:
            starts.append(starts[-1] + n)
        return starts

    def epoch_of(self, step: int) -> int:
        """The epoch that (0-based) step ``step`` belongs to (the last one past the end)."""
        if self.is_uniform:
            return step // self.steps_per_epoch
        return min(bisect.bisect_right(self._starts(), step) - 1, len(self.epoch_steps) - 1)

    def progress(self, step: int) -> float:
        """Training progress in epochs after ``step`` steps."""
        if self.is_uniform:
            return step / self.steps_per_epoch
        epoch = self.epoch_of(step)
        return epoch + (step - self._starts()[epoch]) / self.epoch_steps[epoch]

    def is_boundary(self, step: int) -> bool:
        """After ``step`` steps: the end of an epoch, or of the run."""
        if self.is_uniform:
            return step % self.steps_per_epoch == 0 or step == self.total_steps
        return step in self._starts()[1:] or step == self.total_steps

    def batch_size(self, epoch: int) -> int:
        """The per-worker (micro-)batch of ``epoch`` (epochs past the config's: the last one)."""
        return self.batch_sizes[min(epoch, len(self.batch_sizes) - 1)]

    def effective_batch(self, step: int) -> int:
        """Samples per update at (0-based) step ``step``: replicas × batch × accumulate."""
        return self.cfg.replicas * self.batch_size(self.epoch_of(step)) * self.cfg.accumulate

    def lr(self, step: int) -> float:
        """The learning rate of (0-based) step ``step``."""
        if is_constant_lr(self.cfg):
            return self.cfg.lr
        start, end = self.progress(step), self.progress(step + 1)
        run = self.progress(self.total_steps)
        return lr_at_epoch(self.cfg, start, end, self.effective_batch(step), run)
