"""Strategy registry: each name of the user-facing contract maps to one per-worker program.

A :class:`Strategy` is the program every worker runs, plus what its runtime must provide
around it: hosted server objects (parameter servers, the EASGD centre) and whether the run may
go on when a worker dies (asynchronous and decentralised methods) or must stop (synchronous).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..runtime.base import ServerSpec
from ..worker import WorkerContext
from . import sync_sgd

Program = Callable[[WorkerContext], Awaitable[None]]


@dataclass(frozen=True)
class Strategy:
    name: str
    program: Program
    description: str
    servers: ServerSpec | None = None
    tolerates_worker_loss: bool = False


STRATEGIES: dict[str, Strategy] = {}


def register(strategy: Strategy) -> None:
    STRATEGIES[strategy.name] = strategy


register(
    Strategy(
        "allreduce",
        sync_sgd.train,
        "synchronous data parallelism, bucketed gradient allreduce overlapping backward",
    )
)
register(
    Strategy(
        "allreduce-naive",
        sync_sgd.train_naive,
        "synchronous data parallelism, one flat allreduce after backward",
    )
)


# Each family module registers its strategies on import (they need register() above).
from . import easgd, gossip, hogwild, local_sgd, nnt, parameter_server  # noqa: E402, F401

DESCRIPTIONS: dict[str, str] = {name: s.description for name, s in STRATEGIES.items()}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"strategy {name!r} is not implemented; available: {', '.join(sorted(STRATEGIES))}"
        ) from None


def get_program(name: str) -> Program:
    return get_strategy(name).program
