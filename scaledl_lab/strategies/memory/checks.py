"""Config errors of the ZeRO stages and of ``recompute``, each naming the field, before any
cluster starts."""

from __future__ import annotations

from typing import Any

from ... import families
from ...errors import ConfigError

# Optimisers whose step of an element needs only that element's gradient and state: what a
# flat shard can step on its own, exactly as the whole model would be stepped.
ELEMENTWISE_OPTIMIZERS = ("sgd", "adam", "adagrad")


def check_memory(cfg: Any) -> None:
    from ..large_batch.recipe import no_bias_decay_of  # the recipe's default rule

    if not isinstance(cfg.recompute, bool):
        raise ConfigError(f"recompute={cfg.recompute!r} must be True or False")
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
