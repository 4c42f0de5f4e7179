"""Decentralised training: every worker keeps its own replica (:mod:`.replicas`: what the
family shares). Nearest-neighbour training (:mod:`.nnt`: ``nnt``, ``nnt-lockstep``,
``nnt-staged``), gossip (:mod:`.gossip`: ``dpsgd``, ``adpsgd``), local SGD (:mod:`.local_sgd`)
and elastic averaging (:mod:`.easgd`); the checks of their options (:mod:`.checks`)."""

from typing import Any

from ...families import Family, OptimiserDefault, register_family
from ...topology import neighbours
from ..registry import described
from . import checks, easgd, gossip, local_sgd, nnt, replicas
from .options import DecentralisedOptions

NNT = ("nnt", "nnt-lockstep", "nnt-staged")


def _why_nnt(cfg: Any, setting: str, flags: str) -> str:
    degree = len(neighbours(cfg.resolved_topology, cfg.workers, 0))
    return (
        f"NNT applies 1 + {degree} gradients per step with the local optimiser "
        f"({setting}), which multiplies the step size; the paper's setting trains: {flags}"
    )


# NNT applies 1 + degree gradients per step with its local optimiser: the paper's setting
# (PAPER.md: AdaGrad, lr 0.01, weight decay 1e-4).
NNT_ADAGRAD = OptimiserDefault(
    strategies=NNT,
    settings=dict(optimizer="adagrad", lr=0.01, momentum=0.0, weight_decay=1e-4),
    why=_why_nnt,
)

FAMILY = register_family(
    Family(
        name="decentralised",
        summary="every worker its own replica: nearest neighbours, gossip, local SGD, EASGD",
        strategies=described(*NNT, "dpsgd", "adpsgd", "local-sgd", "easgd"),
        capabilities={
            "takes_topology": (*NNT, "dpsgd", "adpsgd"),
            "compressible": (*NNT, "dpsgd"),
            "checkpointable": ("dpsgd",),
        },
        optimisers=(NNT_ADAGRAD,),
        check=checks.check_config,
        options=DecentralisedOptions,
    )
)

__all__ = [
    "FAMILY",
    "DecentralisedOptions",
    "checks",
    "easgd",
    "gossip",
    "local_sgd",
    "nnt",
    "replicas",
]
