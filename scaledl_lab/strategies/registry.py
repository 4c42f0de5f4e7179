"""The strategy registry: each name of the user-facing contract maps to one per-worker program.

A :class:`Strategy` is the program every worker runs, plus what its runtime must provide
around it: hosted server objects (parameter servers, the EASGD centre) and whether the run may
go on when a worker dies (asynchronous and decentralised methods) or must stop (synchronous);
where that depends on the options, a function of the config says.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import ExperimentConfig
from ..training.worker import Program


class ServerSpec(abc.ABC):
    """How a strategy's server objects are made; the runtime decides where they live.

    A server is a plain class whose methods take and return tensors and numbers. The simulator
    keeps the objects in its own process and delivers calls in virtual time; the Dask runtime
    hosts each one as an actor on a worker, called through torch.distributed messages
    (:mod:`..runtime.dask.p2p`) or actor calls; both runtimes take the calls through the
    same loop (:class:`..runtime.servers.ServerLoop`), one at a time, and a method that returns
    ``NOT_READY`` has its call parked until the server's state changes. A call's tensor arguments
    are the server's own (every transport delivers a copy), and its reply is copied as it is
    answered, so a server may keep the one and go on changing what it returned.
    """

    @abc.abstractmethod
    def count(self, cfg: ExperimentConfig) -> int:
        """How many servers a run of ``cfg`` needs."""

    @abc.abstractmethod
    def create(self, cfg: ExperimentConfig, index: int) -> Any:
        """Server ``index`` of ``count(cfg)``, built where it will run."""


@dataclass(frozen=True)
class Strategy:
    name: str
    program: Program
    description: str
    servers: ServerSpec | None = None
    tolerates_worker_loss: bool | Callable[[ExperimentConfig], bool] = False

    def survives_worker_loss(self, cfg: ExperimentConfig) -> bool:
        """Whether a run of ``cfg`` goes on when one of its workers dies."""
        tolerates = self.tolerates_worker_loss
        return tolerates(cfg) if callable(tolerates) else tolerates


STRATEGIES: dict[str, Strategy] = {}


def register(
    name: str,
    description: str,
    *,
    servers: ServerSpec | None = None,
    tolerates_worker_loss: bool | Callable[[ExperimentConfig], bool] = False,
) -> Callable[[Program], Program]:
    """Decorator: the program below is strategy ``name`` (a name of the user-facing contract)."""

    def add(program: Program) -> Program:
        STRATEGIES[name] = Strategy(name, program, description, servers, tolerates_worker_loss)
        return program

    return add


def described(*names: str) -> dict[str, str]:
    """``names`` (registered programs) with their descriptions: a family record's strategies."""
    return {name: get_strategy(name).description for name in names}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"strategy {name!r} is not implemented; available: {', '.join(sorted(STRATEGIES))}"
        ) from None
