"""Config errors of the low-communication options (outer optimiser, fragments, overlap,
mixing), each one line naming the field, before any cluster starts."""

from __future__ import annotations

import dataclasses
from typing import Any

from ...contract import OUTER_OPTIMIZERS
from ...errors import ConfigError, choices
from .compressed import OUTER_COMPRESSORS
from .fragments import layer_total
from .options import LowCommunicationOptions

DILOCO = ("diloco", "streaming-diloco")
# The strategies each option applies to; its default is the options dataclass's.
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "outer_optimizer": DILOCO,
    "outer_lr": DILOCO,
    "outer_momentum": DILOCO,
    "fragments": ("streaming-diloco",),
    "overlap_steps": ("streaming-diloco",),
    "mixing_alpha": ("streaming-diloco",),
}
OPTIONS: dict[str, tuple[Any, tuple[str, ...]]] = {
    f.name: (f.default, APPLIES_TO[f.name]) for f in dataclasses.fields(LowCommunicationOptions)
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(cfg: Any) -> None:
    """Raise ConfigError for the first invalid low-communication field."""
    for name, (default, strategies) in OPTIONS.items():
        value = getattr(cfg, name)
        if cfg.strategy not in strategies and value != default:
            raise ConfigError(
                f"{name}={value!r} applies only to {choices(strategies)}, "
                f"not to strategy={cfg.strategy!r}"
            )
    if cfg.outer_optimizer not in OUTER_OPTIMIZERS:
        raise ConfigError(
            f"outer_optimizer={cfg.outer_optimizer!r} is unknown; allowed: "
            f"{choices(OUTER_OPTIMIZERS)}"
        )
    lr, momentum = cfg.outer_lr, cfg.outer_momentum
    if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not lr > 0:
        raise ConfigError(f"outer_lr={lr!r} must be a positive number (DiLoCo's is 0.7)")
    if not isinstance(momentum, (int, float)) or isinstance(momentum, bool):
        raise ConfigError(f"outer_momentum={momentum!r} must be a number in [0, 1)")
    if not 0 <= momentum < 1:
        raise ConfigError(f"outer_momentum={momentum!r} must lie in [0, 1) (DiLoCo's is 0.9)")
    if cfg.outer_optimizer == "nesterov" and momentum == 0:
        raise ConfigError(
            "outer_optimizer='nesterov' needs outer_momentum > 0: Nesterov momentum with "
            "momentum 0 is plain SGD, so write outer_optimizer='sgd'"
        )
    if cfg.strategy in DILOCO and cfg.compress != "none":
        name = str(cfg.compress).partition(":")[0]
        if name not in OUTER_COMPRESSORS:
            raise ConfigError(
                f"compress={cfg.compress!r} does not fit DiLoCo's outer gradients (sent once a "
                f"round, applied with the outer momentum); use {choices(OUTER_COMPRESSORS)}"
            )
    _check_streaming(cfg)


def _check_streaming(cfg: Any) -> None:
    count, tau, alpha, period = cfg.fragments, cfg.overlap_steps, cfg.mixing_alpha, cfg.sync_period
    if not _is_int(count) or count < 1:
        raise ConfigError(f"fragments={count!r} must be a positive integer")
    if not _is_int(tau) or tau < 0:
        raise ConfigError(f"overlap_steps={tau!r} must be a non-negative integer")
    if alpha is not None and (
        not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 0 <= alpha <= 1
    ):
        raise ConfigError(f"mixing_alpha={alpha!r} must lie in [0, 1], or be None (the default)")
    if cfg.strategy != "streaming-diloco" or not _is_int(period) or period < 1:
        return  # sync_period itself is checked with the decentralised options
    if count > period:
        raise ConfigError(
            f"fragments={count} exceeds sync_period={period}: each fragment needs its own "
            f"step among the {period} of a round; use at most {period} fragments"
        )
    layers = layer_total(cfg.model, cfg.dataset)
    if count > layers:
        raise ConfigError(
            f"fragments={count} exceeds the {layers} layers with weights of model="
            f"{cfg.model!r}: a fragment is a run of whole layers; use at most {layers}"
        )
    if tau >= period:
        raise ConfigError(
            f"overlap_steps={tau} must be below sync_period={period}: a fragment's outer step "
            "has to land before the fragment's next round starts"
        )
