"""Config errors of the ZeRO stages and of ``recompute`` (``'selective'``: a model with
attention), each naming the field, before any cluster starts."""

from __future__ import annotations

from typing import Any

from ... import families
from ...errors import ConfigError

# Optimisers whose step of an element needs only that element's gradient and state: what a
# flat shard can step on its own, exactly as the whole model would be stepped.
ELEMENTWISE_OPTIMIZERS = ("sgd", "adam", "adagrad")


def check_memory(cfg: Any) -> None:
    from ..large_batch.recipe import no_bias_decay_of  # the recipe's default rule

    if not isinstance(cfg.recompute, bool) and cfg.recompute != "selective":
        raise ConfigError(f"recompute={cfg.recompute!r} must be True, False or 'selective'")
    if cfg.recompute == "selective":
        _check_selective(cfg)
    family = families.family_of(cfg.strategy)
    if family.name != "memory":
        return
    if cfg.optimizer not in ELEMENTWISE_OPTIMIZERS:
        raise ConfigError(
            f"optimizer={cfg.optimizer!r} scales each layer's step by the layer's norms, but "
            f"strategy={cfg.strategy!r} steps flat shards that cut across layers; use one of "
            f"{', '.join(ELEMENTWISE_OPTIMIZERS)}"
        )
    if no_bias_decay_of(cfg):
        raise ConfigError(
            f"no_bias_decay (on in the large-batch recipe) needs biases apart from weights, but "
            f"strategy={cfg.strategy!r} steps flat shards holding both; set no_bias_decay=False"
        )


def _check_selective(cfg: Any) -> None:
    """Selective recomputation runs attention's core again: a model without attention has
    none, and context parallelism's blocks compute attention in exchanges of their own."""
    from ...data import num_classes, sample_shape
    from .recompute import core_shares

    if not core_shares(cfg.model, sample_shape(cfg.dataset), num_classes(cfg.dataset)):
        raise ConfigError(
            f"recompute='selective' runs attention's core again (softmax(QKᵀ)·V), but "
            f"model={cfg.model!r} has no attention; use recompute=True (whole layers) or "
            "model='gpt-tiny'"
        )
    from ..mesh.grid import Mesh

    if cfg.strategy == "mesh" and Mesh.parse(cfg.mesh).size("cp") > 1:
        raise ConfigError(
            f"recompute='selective' with mesh={cfg.mesh!r}: context parallelism's attention "
            "(ring or Ulysses) is not recomputed selectively so far; use recompute=True"
        )
