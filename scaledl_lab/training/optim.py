"""Layer-wise adaptive optimisers for large batches: LARS (You, Gitman, Ginsburg 2017) and LAMB
(You et al. 2019), as ``torch.optim.Optimizer`` subclasses; and AdamW (Loshchilov & Hutter
2019), DiLoCo's inner optimiser, written out so that its decoupled weight decay is on screen.

Both scale each layer's update by a *trust ratio*, the layer's weight norm over its update norm
(times a trust coefficient), so that no layer moves by more than a set fraction of its size
whatever the global rate. Parameter groups with ``adapt=False`` skip the ratio (the biases and
BatchNorm parameters: :func:`param_groups` puts them there, without weight decay, as Goyal et
al. 2017 and the LARS/LAMB reference implementations do).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer


def param_groups(params: Iterable[nn.Parameter], weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: weights (matrices, kernels) with ``weight_decay`` and trust-ratio adaptation;
    biases and BatchNorm γ/β (every 1-D parameter) with neither."""
    params = [p for p in params if p.requires_grad]
    return [
        {"params": [p for p in params if p.ndim > 1], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0, "adapt": False},
    ]


def trust_ratio(weight_norm: torch.Tensor, update_norm: torch.Tensor, coefficient: float) -> Any:
    """coefficient · ||w|| / ||u||, or 1 where either norm is zero (a fresh or frozen layer)."""
    ok = (weight_norm > 0) & (update_norm > 0)
    return torch.where(ok, coefficient * weight_norm / update_norm, torch.ones_like(weight_norm))


def adam_moments(state: dict[str, Any], p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Adam's first and second moments of ``p`` (zeros at its first step) and the step count,
    advanced by one: the state LAMB and AdamW share, under ``torch.optim.Adam``'s names."""
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p)
        state["exp_avg_sq"] = torch.zeros_like(p)
    state["step"] += 1
    return state["exp_avg"], state["exp_avg_sq"], state["step"]


class LARS(Optimizer):
    """SGD with momentum whose per-layer step is scaled by η·||w|| / (||g|| + β·||w||).

    You, Gitman, Ginsburg 2017, Algorithm 1: the local rate λ = η·||w||/(||∇L(w)|| + β||w||)
    multiplies the weight-decayed gradient g + βw before it enters the momentum buffer. With a
    trust ratio of 1 (``adapt=False``) this is exactly ``torch.optim.SGD``.
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 0.0,
    ) -> None:
        if trust_coefficient < 0:
            raise ValueError(f"trust_coefficient={trust_coefficient} must be non-negative")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, eps=eps, adapt=True)  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None if closure is None else closure()
        for group in self.param_groups:
            decay, momentum = group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                d = p.grad if decay == 0 else p.grad.add(p, alpha=decay)
                if group["adapt"]:
                    w_norm = torch.linalg.vector_norm(p)
                    denom = torch.linalg.vector_norm(p.grad) + decay * w_norm + group["eps"]
                    d = d * trust_ratio(w_norm, denom, group["trust_coefficient"])
                if momentum != 0:
                    state = self.state[p]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.clone(d).detach()
                    else:
                        state["momentum_buffer"].mul_(momentum).add_(d)
                    d = state["momentum_buffer"]
                p.add_(d, alpha=-group["lr"])
        return loss


class LAMB(Optimizer):
    """Adam's bias-corrected direction plus weight decay, scaled per layer by η·||w|| / ||u||.

    You et al. 2019, Algorithm 2 (LAMB) with φ(z) = z: m, v as Adam; r = m̂ / (√v̂ + ε);
    u = r + λw; w ← w − lr · η·||w||/||u|| · u.
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.0,
        trust_coefficient: float = 1.0,
    ) -> None:
        if trust_coefficient < 0:
            raise ValueError(f"trust_coefficient={trust_coefficient} must be non-negative")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        trust_coefficient=trust_coefficient, adapt=True)  # fmt: skip
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None if closure is None else closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m, v, t = adam_moments(self.state[p], p)
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                m_hat = m / (1 - beta1**t)
                v_hat = v / (1 - beta2**t)
                update = m_hat / (v_hat.sqrt() + group["eps"])
                if group["weight_decay"] != 0:
                    update.add_(p, alpha=group["weight_decay"])
                if group["adapt"]:
                    w_norm = torch.linalg.vector_norm(p)
                    u_norm = torch.linalg.vector_norm(update)
                    update.mul_(trust_ratio(w_norm, u_norm, group["trust_coefficient"]))
                p.add_(update, alpha=-group["lr"])
        return loss


class AdamW(Optimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2), with
    ``torch.optim.AdamW``'s arithmetic (the tests compare the two).

    The decay shrinks the weights directly, w ← w − lr·λ·w, before the Adam step; it never
    enters the moments m, v, as an L2 term added to the gradient would (``torch.optim.Adam``'s
    ``weight_decay``), so a coordinate with large v is decayed as much as any other.
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None if closure is None else closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr = group["lr"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                m, v, t = adam_moments(self.state[p], p)
                p.mul_(1 - lr * group["weight_decay"])  # decoupled: not through m and v
                m.lerp_(p.grad, 1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                step_size = lr / (1 - beta1**t)
                denom = v.sqrt().div_(math.sqrt(1 - beta2**t)).add_(group["eps"])
                p.addcdiv_(m, denom, value=-step_size)
        return loss
