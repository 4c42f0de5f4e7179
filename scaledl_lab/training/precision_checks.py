"""The config's check of ``precision`` and ``loss_scale`` (registered with the families'
records): where 16 bits apply (the families' ``mixed_precision`` capability), what loss scaling
applies to, and whether this CPU build runs the lab's models in 16 bits (:func:`probe`)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .. import families
from ..errors import ConfigError, choices
from .precision import is_low


def probe(dtype: torch.dtype) -> str | None:
    """What of the lab's models fails in ``dtype`` on this CPU build (None: all runs): a
    matmul, 1-D and 2-D convolutions, max pooling, batch norm, ReLU, and their backward."""
    return _probe(str(dtype).removeprefix("torch."))


@functools.lru_cache(maxsize=4)
def _probe(name: str) -> str | None:
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(0)
    tests: dict[str, Callable[[], torch.Tensor]] = {}
    w = torch.randn(4, 4, generator=g).to(dtype).requires_grad_()
    k1 = torch.randn(2, 1, 3, generator=g).to(dtype).requires_grad_()
    k2 = torch.randn(2, 1, 3, 3, generator=g).to(dtype).requires_grad_()
    tests["matmul"] = lambda: torch.randn(3, 4, generator=g).to(dtype) @ w
    tests["conv1d"] = lambda: F.conv1d(torch.randn(2, 1, 8, generator=g).to(dtype), k1)
    tests["conv2d + max_pool2d"] = lambda: F.max_pool2d(
        F.conv2d(torch.randn(2, 1, 6, 6, generator=g).to(dtype), k2), 2
    )
    tests["batch_norm + relu"] = lambda: F.relu(
        F.batch_norm(
            (torch.randn(4, 2, 3, 3, generator=g).to(dtype) @ w[:3, :3]) * 1,
            torch.zeros(2, dtype=dtype),
            torch.ones(2, dtype=dtype),
            training=True,
        )
    )
    for what, compute in tests.items():
        try:
            out = compute()
            out.float().sum().backward()
        except (RuntimeError, NotImplementedError) as exc:
            return f"{what} ({str(exc).splitlines()[0][:120]})"
    return None


@families.register_check
def check_precision(cfg: Any) -> None:
    """``precision`` and ``loss_scale``: where they apply, and whether this CPU can run them."""
    scale = cfg.loss_scale
    if scale is not None:
        if cfg.precision != "float16":
            raise ConfigError(
                f"loss_scale={scale!r} applies to precision='float16' only; "
                f"precision={cfg.precision!r} "
                + (
                    "has float32's exponent range and needs no loss scaling"
                    if cfg.precision == "bfloat16"
                    else "keeps its gradients in range without it"
                )
                + ": drop loss_scale (--loss-scale) or set precision='float16'"
            )
        number = isinstance(scale, (int, float)) and not isinstance(scale, bool)
        if not (scale == "dynamic" or (number and math.isfinite(scale) and scale > 0)):
            raise ConfigError(
                f"loss_scale={scale!r} must be 'dynamic' or a positive number (a static scale)"
            )
        if scale != "dynamic" and scale < 1:
            # A scale exists to lift small gradients above float16's smallest subnormal; one
            # below 1 pushes them under it: more round to zero than with no scaling at all.
            raise ConfigError(
                f"loss_scale={scale!r} is below 1: a static scale multiplies the gradients so "
                "that small ones stay above float16's smallest subnormal (2**-24, about 6e-8); "
                "below 1 it shrinks them and more underflow to zero than unscaled (at 1e-30 "
                "every one does): give a scale of at least 1, or 'dynamic'"
            )
    if not is_low(cfg.precision):
        return
    if not families.has(cfg.strategy, "mixed_precision"):
        able = families.with_capability("mixed_precision")
        raise ConfigError(
            f"precision {cfg.precision} applies to {choices(able)} (their workers step "
            f"float32 master weights of a 16-bit model); strategy={cfg.strategy!r} trains in "
            "float32 or float64 only"
        )
    if cfg.compress != "none":
        raise ConfigError(
            f"precision {cfg.precision} sends 16-bit gradients already; compress={cfg.compress!r}"
            " is not combined with it: set compress='none' or precision='float32'"
        )
    if cfg.device == "cpu" or not torch.cuda.is_available():
        failed = probe(cfg.dtype)
        if failed is not None:
            raise ConfigError(
                f"precision {cfg.precision}: this CPU build of torch {torch.__version__} cannot "
                f"run {failed}; use precision='float32' (or a GPU: device='cuda')"
            )
