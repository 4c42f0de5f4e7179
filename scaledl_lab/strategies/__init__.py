"""Strategy registry: each name of the user-facing contract maps to one per-worker program."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ..worker import WorkerContext
from . import sync_sgd

Program = Callable[[WorkerContext], Awaitable[None]]

STRATEGIES: dict[str, Program] = {
    "allreduce": sync_sgd.train,
    "allreduce-naive": sync_sgd.train_naive,
}

DESCRIPTIONS: dict[str, str] = {
    "allreduce": "synchronous data parallelism, bucketed gradient allreduce overlapping backward",
    "allreduce-naive": "synchronous data parallelism, one flat allreduce after backward",
}


def get_program(name: str) -> Program:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"strategy {name!r} is not implemented; available: {', '.join(sorted(STRATEGIES))}"
        ) from None
