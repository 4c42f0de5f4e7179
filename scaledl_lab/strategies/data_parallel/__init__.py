"""Synchronous data parallelism: every worker holds a replica and the gradients are averaged by
an allreduce every step (:mod:`.sync_sgd`: ``allreduce``, ``allreduce-naive``)."""

from ...families import Family, register_family
from ..registry import described
from . import sync_sgd

FAMILY = register_family(
    Family(
        name="data_parallel",
        summary="synchronous data parallelism: every step averages the replicas' gradients",
        strategies=described("allreduce", "allreduce-naive"),
        capabilities={
            "compressible": True,
            "sends_replica_update": True,
            "accumulates": True,
            "batch_schedule": True,
            "checkpointable": True,
            "mixed_precision": True,
        },
    )
)

__all__ = ["FAMILY", "sync_sgd"]
