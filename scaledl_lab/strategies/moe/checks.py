"""Config errors of gpt-tiny-moe's options, each naming the field, and the runs it does not
take yet; and the family's change to every worker's model (:func:`prepare_model`): the
config's mixture."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ... import families
from ...errors import ConfigError
from ...moe import MoEGPT, Settings
from .options import MoEOptions

DEFAULTS = MoEOptions()
FIELDS = ("experts", "top_k", "capacity_factor", "aux_loss_weight")


def settings_of(cfg: Any) -> Settings:
    return Settings(*(getattr(cfg, name) for name in FIELDS))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_config(cfg: Any) -> None:
    if cfg.model != "gpt-tiny-moe":
        for name in FIELDS:
            if getattr(cfg, name) != getattr(DEFAULTS, name):
                raise ConfigError(
                    f"{name}={getattr(cfg, name)!r} applies only to model='gpt-tiny-moe', not "
                    f"to model={cfg.model!r}"
                )
        return
    experts, k = cfg.experts, cfg.top_k
    if not _is_int(experts) or experts < 1:
        raise ConfigError(f"experts={experts!r} must be a positive integer")
    if not _is_int(k) or k not in (1, 2):
        raise ConfigError(f"top_k={k!r} must be 1 or 2 (experts each token goes to)")
    if k > experts:
        raise ConfigError(f"top_k={k} is above experts={experts}: a token cannot go to more "
                          "experts than there are")  # fmt: skip
    factor, weight = cfg.capacity_factor, cfg.aux_loss_weight
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not factor > 0:
        raise ConfigError(
            f"capacity_factor={factor!r} must be a positive number (places per expert = "
            "ceil(capacity_factor x tokens x top_k / experts))"
        )
    if not isinstance(weight, (int, float)) or isinstance(weight, bool) or weight < 0:
        raise ConfigError(f"aux_loss_weight={weight!r} must be a non-negative number")
    _check_runs(cfg)


def _check_runs(cfg: Any) -> None:
    """What gpt-tiny-moe does not take yet: its aux loss enters the backward with weight α
    once per forward, unscaled, so neither several micro-batches per update nor float16's
    loss scale; recomputation would route twice; a split model has no MoE layers."""
    for what, bad, why in (
        (f"accumulate={cfg.accumulate}", cfg.accumulate > 1,
         "the aux loss would count once per micro-batch"),
        ("precision='float16'", cfg.precision == "float16",
         "the aux loss's gradient is not multiplied by the loss scale"),
        ("recompute=True", bool(cfg.recompute), "the forward again would route twice"),
    ):  # fmt: skip
        if bad:
            raise ConfigError(f"model='gpt-tiny-moe' does not take {what} yet: {why}")
    if families.has(cfg.strategy, "splits_model") and not families.has(cfg.strategy, "mesh"):
        raise ConfigError(
            f"model='gpt-tiny-moe' trains with strategies that keep the whole model on a "
            f"worker (allreduce, ...) or on strategy='mesh' (experts over ep); "
            f"strategy={cfg.strategy!r} splits the model"
        )


def prepare_model(cfg: Any, model: nn.Module) -> nn.Module:
    """The config's mixture: its top-k, capacity and aux weight set, or, for another number
    of experts, the model built again from the run's seed with them."""
    if not isinstance(model, MoEGPT):
        return model
    settings = settings_of(cfg)
    if settings.experts == model.settings.experts:
        model.configure(settings)
        return model
    with torch.random.fork_rng(devices=[]):  # as build_model seeds it
        torch.manual_seed(cfg.seed)
        return MoEGPT(model.vocabulary, model.sequence, settings).to(model.head.out.weight.dtype)
