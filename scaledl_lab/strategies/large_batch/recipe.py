"""The large-batch recipe beyond its schedules (those are :mod:`scaledl_lab.training.schedule`):
Goyal et al. 2017's zero-initialised residual branches, no weight decay on biases and
BatchNorm, and the trust coefficients of LARS and LAMB (You et al. 2017, 2019), each on when the
config asks for the recipe (scaling, warmup, LARS or LAMB).

The family's record hands :func:`prepare_model` and :func:`optimiser_changes` to the loop.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ... import families
from ...models import PreActBasicBlock

TRUST_COEFFICIENTS = {"lars": 0.001, "lamb": 1.0}  # You et al. 2017 (η), 2019 (φ(z) = z)


# -- what the large-batch recipe switches on -----------------------------------------------


def is_recipe(cfg: Any) -> bool:
    """Whether the config asks for the large-batch recipe (scaling, warmup, LARS or LAMB)."""
    return cfg.lr_scaling != "none" or cfg.warmup_epochs > 0 or cfg.optimizer in ("lars", "lamb")


def zero_init_residual_of(cfg: Any) -> bool:
    """Goyal et al.'s γ = 0 ending each residual branch: on for ResNet-18 in the recipe."""
    if cfg.zero_init_residual is not None:
        return bool(cfg.zero_init_residual)
    return cfg.model == "resnet18" and is_recipe(cfg)


def no_bias_decay_of(cfg: Any) -> bool:
    """No weight decay (nor LARS/LAMB trust ratio) on biases and BatchNorm: on in the recipe,
    except on parameter servers (their shards are flat vectors with no layers to tell apart)."""
    if cfg.no_bias_decay is not None:
        return bool(cfg.no_bias_decay)
    return is_recipe(cfg) and not families.has(cfg.strategy, "hosts_servers")


def trust_coefficient_of(cfg: Any) -> float:
    """The trust coefficient of LARS (η, default 0.001) or LAMB (default 1)."""
    if cfg.trust_coefficient is not None:
        return float(cfg.trust_coefficient)
    return TRUST_COEFFICIENTS.get(cfg.optimizer, 1.0)


def optimiser_changes(cfg: Any) -> families.OptimiserChanges:
    """The recipe's changes to every worker's optimiser (the family's record hands them on)."""
    return families.OptimiserChanges(
        no_bias_decay=no_bias_decay_of(cfg), trust_coefficient=trust_coefficient_of(cfg)
    )


def prepare_model(cfg: Any, model: nn.Module) -> nn.Module:
    """Goyal et al. §5.1: zero-initialise the last BatchNorm γ of every residual branch, so each
    block starts as the identity. In the pre-activation blocks that BatchNorm is ``bn2`` (its
    output, through ReLU, is all the second convolution sees)."""
    if zero_init_residual_of(cfg):
        for block in model.modules():
            if isinstance(block, PreActBasicBlock):
                nn.init.zeros_(block.bn2.weight)
    return model
