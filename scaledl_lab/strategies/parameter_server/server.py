"""The parameter server (Dean et al. 2012): one shard of the parameters, its optimiser, a version
counter, and the update rule of each variant as a small named class.

The server is a plain class; the runtime hosts it (a Dask actor, or an object inside the
simulator) and it does not know which. Staleness of a gradient = the number of updates the
server applied between the pull its weights came from and its push.

Update rules:

- :class:`Synchronous` (``ps-sync``, ``backup-workers``): collect ``workers − backup`` pushes for
  the current version, average them in rank order, step; pushes for an older version are dropped;
- :class:`Asynchronous` (``ps-async``, ``downpour``): apply every push at once;
- :class:`StalenessAware` (Zhang et al. 2015): lr / max(1, staleness);
- :class:`DelayCompensated` (Zheng et al. 2016): g + λ·g⊙g⊙(w_now − w_stale), w_stale being the
  weights last sent to that worker; with ``dc_adaptive`` λ = λ0/√(MeanSquare(g) + ε) elementwise
  (their DC-ASGD-a).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from ...config import ExperimentConfig
from ...runtime.base import NOT_READY
from ...training.schedule import is_constant_lr, lr_at_epoch
from ...training.worker import make_optimizer, steps_per_epoch_of

DC_MEAN_SQUARE_MOMENTUM = 0.95  # DC-ASGD-a's moving average of g⊙g (Zheng et al. 2016)
DC_EPSILON = 1e-7


def staleness_aware_lr(lr: float, staleness: float) -> float:
    """Zhang et al. 2015: divide the learning rate by the gradient's staleness (at least 1)."""
    return lr / max(1.0, staleness)


def scheduled_lr(cfg: ExperimentConfig, done: float, per_epoch: int, limit: float) -> float:
    """The schedule's rate (``scaledl_lab.training.schedule``) for the update after ``done`` of the
    run's ``limit`` server updates, ``per_epoch`` of them an epoch; ``cfg.lr`` by default."""
    if is_constant_lr(cfg):
        return cfg.lr
    start, end, run = done / per_epoch, (done + 1) / per_epoch, limit / per_epoch
    return lr_at_epoch(cfg, start, end, cfg.effective_batch_size, run)


def adaptive_lambda(lam0: float, mean_square: torch.Tensor) -> torch.Tensor:
    """DC-ASGD-a: λ_t = λ0 / √(MeanSquare(g) + ε), elementwise (Zheng et al. 2016)."""
    return lam0 / torch.sqrt(mean_square + DC_EPSILON)


def delay_compensated(
    grad: torch.Tensor, w_now: torch.Tensor, w_stale: torch.Tensor, lam: float | torch.Tensor
) -> torch.Tensor:
    """Zheng et al. 2016: g + λ·g⊙g⊙(w_now − w_stale), a first-order Taylor correction."""
    return grad + lam * grad * grad * (w_now - w_stale)


class Asynchronous:
    """Apply each push at once, with the configured learning rate."""

    is_synchronous = False

    def __init__(self, cfg: ExperimentConfig, param: torch.Tensor) -> None:
        self.lr = cfg.lr

    def on_pull(self, rank: int, param: torch.Tensor) -> None:
        """Called when ``rank`` is sent the weights."""

    def update(
        self, rank: int, grad: torch.Tensor, staleness: float, param: torch.Tensor
    ) -> tuple[torch.Tensor, float]:
        """The gradient to apply and the learning rate to apply it with."""
        return grad, self.lr


class Synchronous(Asynchronous):
    """Average one gradient per worker (or the first N − b), then step."""

    is_synchronous = True


class StalenessAware(Asynchronous):
    def update(self, rank, grad, staleness, param):  # type: ignore[no-untyped-def]
        return grad, staleness_aware_lr(self.lr, staleness)


class DelayCompensated(Asynchronous):
    def __init__(self, cfg: ExperimentConfig, param: torch.Tensor) -> None:
        super().__init__(cfg, param)
        self.dc_lambda = cfg.dc_lambda
        # DC-ASGD-a keeps a moving average of g⊙g; None for the constant-λ variant.
        self.mean_square = torch.zeros_like(param) if cfg.dc_adaptive else None
        self.backup: dict[int, torch.Tensor] = {}  # the weights last sent to each rank

    def on_pull(self, rank: int, param: torch.Tensor) -> None:
        self.backup[rank] = param.clone()

    def update(self, rank, grad, staleness, param):  # type: ignore[no-untyped-def]
        stale = self.backup.get(rank, param)
        lam: float | torch.Tensor = self.dc_lambda
        if self.mean_square is not None:
            m = DC_MEAN_SQUARE_MOMENTUM
            self.mean_square.mul_(m).addcmul_(grad, grad, value=1 - m)
            lam = adaptive_lambda(self.dc_lambda, self.mean_square)
        return delay_compensated(grad, param, stale, lam), self.lr


RULES: dict[str, type[Asynchronous]] = {
    "sync": Synchronous,
    "async": Asynchronous,
    "staleness-aware": StalenessAware,
    "dc-asgd": DelayCompensated,
}


class ParameterServer:
    """One shard of the parameters, its optimiser and a version counter.

    ``mode`` names the update rule (a key of :data:`RULES`). ``limit`` is the number of versions
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
        decoder: Any = None,
    ) -> None:
        if mode not in RULES:
            raise ValueError(f"unknown parameter-server mode {mode!r}; allowed: {sorted(RULES)}")
        self.cfg = cfg
        self.param = nn.Parameter(weights.detach().clone(), requires_grad=False)
        self.optimizer = make_optimizer(cfg, [self.param])
        self.rule = RULES[mode](cfg, self.param.detach())
        self.mode = mode
        self.workers = workers
        self.needed = workers - backup
        self.limit = limit if limit is not None else math.inf
        self.version = 0  # updates applied
        self.gradients = 0  # mini-batch gradients applied (a Downpour push may carry several)
        self.dropped = 0  # pushes not applied (late in sync mode, or after the limit)
        self.staleness: list[float] = []  # of every applied push
        self._pending: dict[int, torch.Tensor] = {}  # sync: this version's gradients by rank
        self.decoder = decoder  # compressed pushes: a compressor for this shard's layout

    @property
    def progress(self) -> int:
        """Versions (sync) or gradients (async) applied: what ``limit`` counts."""
        return self.version if self.rule.is_synchronous else self.gradients

    # -- the protocol ---------------------------------------------------------------------

    def pull(self, rank: int, min_version: int = 0) -> Any:
        """``(weights, version, progress)`` once ``version >= min_version`` (else NOT_READY)."""
        if self.version < min_version and self.progress < self.limit:
            return NOT_READY
        self.rule.on_pull(rank, self.param.detach())
        return self.param.detach(), self.version, self.progress

    def push(self, rank: int, grad: torch.Tensor, version: int, steps: int = 1) -> Any:
        """Apply (or collect) a gradient computed on ``version``; ``(staleness, progress)``.

        Staleness is ``nan`` for a push that was dropped.
        """
        if self.decoder is not None:  # a compressed payload
            grad = self.decoder.decode(grad)
        staleness = float(self.version - version)
        late = self.rule.is_synchronous and version < self.version
        if self.progress >= self.limit or late:
            self.dropped += 1
            return math.nan, self.progress
        if self.rule.is_synchronous:
            self._pending[rank] = grad
            if len(self._pending) == self.needed:
                ranks = sorted(self._pending)
                total = self._pending[ranks[0]].clone()
                for r in ranks[1:]:  # rank order: the same sum as the simulator's allreduce
                    total += self._pending[r]
                self._step(torch.div(total, self.needed), self.rule.lr)
                self._pending.clear()
                self.gradients += self.needed
        else:
            grad, lr = self.rule.update(rank, grad, staleness, self.param.detach())
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
        if not is_constant_lr(self.cfg):  # the rule's rate, scaled as the schedule scales lr
            cfg, sync = self.cfg, self.rule.is_synchronous
            per_epoch = steps_per_epoch_of(cfg) * (1 if sync else self.workers)
            lr *= scheduled_lr(cfg, self.progress, per_epoch, self.limit) / cfg.lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.param.grad = None
        self.version += 1

    def checkpoint(self) -> dict[str, Any]:
        """Everything :meth:`restore` needs to go on from here (between two versions)."""
        return {
            "param": self.param.detach().clone(),
            "optimizer": copy.deepcopy(self.optimizer.state_dict()),
            "counters": (self.version, self.gradients, self.dropped, list(self.staleness)),
        }

    def restore(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            self.param.copy_(state["param"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.gradients, self.dropped, staleness = state["counters"]
        self.staleness = list(staleness)

    def stats(self) -> dict[str, Any]:
        s = torch.tensor(self.staleness or [math.nan], dtype=torch.float64)
        return {
            "version": self.version,
            "gradients": self.gradients,
            "dropped": self.dropped,
            "mean_staleness": s.mean().item(),
        }
