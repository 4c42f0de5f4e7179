"""The strategies: one module per technique family, each registering its contract names."""

from . import (
    easgd,
    gossip,
    hogwild,
    local_sgd,
    nnt,
    parameter_server,
    pipeline,
    sync_sgd,
    tensor_parallel,
)
from .registry import STRATEGIES, ServerSpec, Strategy, get_strategy, register

DESCRIPTIONS: dict[str, str] = {name: s.description for name, s in STRATEGIES.items()}

__all__ = [
    "DESCRIPTIONS",
    "STRATEGIES",
    "ServerSpec",
    "Strategy",
    "easgd",
    "get_strategy",
    "gossip",
    "hogwild",
    "local_sgd",
    "nnt",
    "parameter_server",
    "pipeline",
    "register",
    "sync_sgd",
    "tensor_parallel",
]
