"""Parameter servers and Hogwild!: the workers' side of every variant (:mod:`.workers`:
``ps-sync``, ``ps-async``, ``downpour``, ``staleness-aware``, ``dc-asgd``, ``backup-workers``),
the server and its update rules (:mod:`.server`), lock-free SGD on parameters shared in
memory (:mod:`.hogwild`) and the checks of their options (:mod:`.checks`)."""

from typing import Any

from ...families import Family, OptimiserDefault, register_family
from ..registry import described
from . import checks, hogwild, server, workers
from .options import ParameterServerOptions


def _why_stale(cfg: Any, setting: str, flags: str) -> str:
    return (
        f"with {cfg.workers} asynchronous workers gradients arrive up to {cfg.workers - 1} "
        f"steps stale, and {setting} compounds them; try {flags}"
    )


# Plain SGD without momentum at a fifth of the synchronous rate for asynchronous servers (16
# simulated workers, MLP, quick-mode data, 2 epochs: 65.8% test accuracy; with SGD 0.05 / 0.9
# the loss is inf at step 9).
ASYNC_SGD = OptimiserDefault(
    strategies=("ps-async", "downpour", "staleness-aware", "dc-asgd"),
    settings=dict(optimizer="sgd", lr=0.01, momentum=0.0, weight_decay=0.0),
    why=_why_stale,
)
SERVERS = tuple(workers.VARIANTS)  # the variants with hosted servers (not Hogwild!)

FAMILY = register_family(
    Family(
        name="parameter_server",
        summary="parameter servers (synchronous, asynchronous and their variants) and Hogwild!",
        strategies=described(*SERVERS, "hogwild"),
        capabilities={
            "hosts_servers": SERVERS,
            "compressible": SERVERS,
            "sends_replica_update": SERVERS,
            "checkpointable": ("ps-sync",),
        },
        optimisers=(ASYNC_SGD,),
        check=checks.check_config,
        options=ParameterServerOptions,
    )
)

__all__ = ["FAMILY", "ParameterServerOptions", "checks", "hogwild", "server", "workers"]
