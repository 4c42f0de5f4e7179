"""Mixed-precision training (Micikevicius et al. 2018, "Mixed Precision Training"): the model's
weights, gradients, data and forward in 16 bits (bfloat16 or float16), the optimiser stepping a
float32 master copy of every weight, and loss scaling for float16.

- :class:`Precision` is one worker's setting: its forward hook casts the model's logits to
  float32 before the loss, through :class:`ScaleGradient`, whose backward multiplies the
  gradient flowing into the network by the loss scale S (§3.2: small gradients then stay above
  float16's smallest subnormal, 2**-24). The loss itself, and what is logged, is unscaled.
- :class:`MasterWeights` wraps the optimiser the config names, built on float32 copies of the
  16-bit parameters (§3.1): at each step it casts the gradients up to float32 and divides them
  by S, skips the step when one is inf or NaN (dynamic scaling), steps the masters and copies
  them, rounded, into the model. Its state (the masters and the optimiser's own tensors, all
  float32) is what the memory ledger counts as ``optim``: K = 4 + the optimiser's bytes per
  parameter, ZeRO's (2 + 2 + K)Ψ (Rajbhandari et al. 2020, §3.1).
- :class:`LossScale` is static (``loss_scale=N``) or dynamic with ``torch.amp.GradScaler``'s
  defaults: start at 2**16, halve and skip the step on an overflow, double after 2000
  consecutive good steps.

The strategies that average gradients before the step (data parallelism) check the averaged
gradient, identical on every worker, so every worker takes the same decision; ZeRO's ranks
each hold a shard and agree through the loss's allreduce (:mod:`scaledl_lab.strategies.memory`).
Checkpoints hold the 16-bit model, the masters, the optimiser's state and the scale: a resumed
run continues exactly. Evaluation and the returned weights are the 16-bit model's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..contract import LOW_PRECISIONS

# torch.amp.GradScaler's defaults (init_scale, growth_factor, backoff_factor, growth_interval).
INIT_SCALE, GROWTH, BACKOFF, GROWTH_INTERVAL = 2.0**16, 2.0, 0.5, 2000


def is_low(precision: str) -> bool:
    """Whether ``precision`` trains a 16-bit model against float32 master weights."""
    return precision in LOW_PRECISIONS


def element_bytes(precision: str) -> tuple[int, int, int]:
    """Bytes per parameter of (its value and its gradient each, its float32 master copy, each
    optimiser state tensor): (2, 4, 4) in 16 bits; (4, 0, 4) float32; (8, 0, 8) float64."""
    if is_low(precision):
        return 2, 4, 4
    size = torch.empty((), dtype=getattr(torch, precision)).element_size()
    return size, 0, size


class LossScale:
    """The loss scale S of one worker: static, or dynamic (GradScaler's defaults).

    ``used`` is the scale of the last step's backward and ``skipped`` whether that step's
    update was skipped (an inf or NaN gradient): the metrics' ``loss_scale`` and ``skipped``.
    """

    def __init__(self, scale: float, dynamic: bool) -> None:
        self.scale, self.dynamic = float(scale), dynamic
        self.good_steps = 0
        self.used, self.skipped = float(scale), False

    @classmethod
    def of(cls, loss_scale: float | str | None) -> LossScale:
        if loss_scale is None or loss_scale == "dynamic":
            return cls(INIT_SCALE, dynamic=True)
        return cls(float(loss_scale), dynamic=False)

    def update(self, found_inf: bool) -> None:
        """After a step whose gradients were scaled by :attr:`scale`: halve it on an overflow,
        double it after ``GROWTH_INTERVAL`` good steps in a row (dynamic only)."""
        self.used, self.skipped = self.scale, found_inf
        if not self.dynamic:
            return
        if found_inf:
            self.scale *= BACKOFF
            self.good_steps = 0
            return
        self.good_steps += 1
        if self.good_steps == GROWTH_INTERVAL:
            self.scale *= GROWTH
            self.good_steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])


class ScaleGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the incoming gradient by the loss scale of the
    step (read at forward time): d(S·L)/dz without scaling the loss L itself."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


class _LogitsHook:
    """The model's forward hook: its output through :meth:`Precision.logits`."""

    def __init__(self, precision: Precision) -> None:
        self.precision = precision

    def __call__(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return self.precision.logits(output)


class Precision:
    """One worker's mixed precision: the 16-bit dtype and, for float16, its loss scale."""

    def __init__(self, precision: str, loss_scale: float | str | None = None) -> None:
        self.name, self.dtype = precision, getattr(torch, precision)
        self.scale = LossScale.of(loss_scale) if precision == "float16" else None

    @classmethod
    def of(cls, cfg: Any) -> Precision | None:
        """The setting of ``cfg``, or None (float32, float64: nothing changes)."""
        return cls(cfg.precision, cfg.loss_scale) if is_low(cfg.precision) else None

    @property
    def checks_overflow(self) -> bool:
        """Whether each step checks its gradients for inf/NaN (dynamic loss scaling)."""
        return self.scale is not None and self.scale.dynamic

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """The model's 16-bit output as float32 for the loss; with a loss scale, the gradient
        that flows back into the network is multiplied by it (in float32, before the cast)."""
        out = out.float()
        return out if self.scale is None else ScaleGradient.apply(out, self.scale.scale)

    def attach(self, model: nn.Module) -> nn.Module:
        """``model`` with its output cast by :meth:`logits` (a forward hook: same module, same
        state_dict keys, so checkpoints and the returned weights read as without it)."""
        model.register_forward_hook(_LogitsHook(self))
        return model

    def optimizer(
        self, params: Iterable[torch.Tensor], build: Callable[[list[torch.Tensor]], Any]
    ) -> MasterWeights:
        return MasterWeights(params, build, self.scale)

    def columns(self) -> dict[str, float]:
        """The train row's ``loss_scale`` and ``skipped`` (none without a loss scale)."""
        if self.scale is None:
            return {}
        return {"loss_scale": self.scale.used, "skipped": float(self.scale.skipped)}


class MasterWeights:
    """An optimiser of 16-bit parameters that steps float32 master copies of them (§3.1).

    ``build`` makes the inner optimiser (the config's, with its hooks: clipping sees the
    unscaled float32 gradients) on the masters. ``param_groups`` are the inner optimiser's, so
    a learning-rate schedule sets them; ``state`` maps each 16-bit parameter to its master and
    the inner optimiser's tensors of it (the memory ledger's ``optim``).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        build: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
        scale: LossScale | None,
    ) -> None:
        self.params = list(params)
        self.masters = [nn.Parameter(p.detach().to(torch.float32)) for p in self.params]
        self.inner = build(self.masters)
        self.scale = scale

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.inner.param_groups

    @property
    def state(self) -> dict[torch.Tensor, dict[str, Any]]:
        return {
            p: {"master": m, **self.inner.state.get(m, {})}
            for p, m in zip(self.params, self.masters, strict=True)
        }

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.zero_()

    def found_inf(self) -> bool:
        """Whether some 16-bit gradient holds an inf or a NaN (this rank's: its shards')."""
        return any(not torch.isfinite(p.grad).all() for p in self.params if p.grad is not None)

    @torch.no_grad()
    def step(self, found_inf: bool | None = None) -> None:
        """Unscale the gradients into the masters (float32), step them, and copy them into the
        model; with a dynamic scale, skip all of it on an overflow (``found_inf``: the
        workers' common verdict where each holds a part of the gradient, else checked here)."""
        scale = self.scale
        if scale is not None and scale.dynamic:
            found = self.found_inf() if found_inf is None else bool(found_inf)
            if found:
                scale.update(True)
                return
        for p, m in zip(self.params, self.masters, strict=True):
            if p.grad is None:
                m.grad = None
                continue
            m.grad = p.grad.to(torch.float32)
            if scale is not None and scale.scale != 1.0:
                m.grad.div_(scale.scale)
        self.inner.step()
        for p, m in zip(self.params, self.masters, strict=True):
            p.copy_(m)
            m.grad = None  # a step's temporary: the ledger's gradients are the model's
        if scale is not None:
            scale.update(False)

    def state_dict(self) -> dict[str, Any]:
        return {
            "inner": self.inner.state_dict(),
            "masters": [m.detach().clone() for m in self.masters],
            "scale": None if self.scale is None else self.scale.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for m, saved in zip(self.masters, state["masters"], strict=True):
                m.copy_(saved)
        self.inner.load_state_dict(state["inner"])
        if self.scale is not None and state["scale"] is not None:
            self.scale.load_state_dict(state["scale"])
