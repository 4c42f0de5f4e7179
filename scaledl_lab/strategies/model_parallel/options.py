"""The model-parallel options: stages per replica, micro-batches, how layers are balanced over
the stages, model chunks per worker (interleaving), sequence parallelism, checked in
:mod:`.partition`. Recomputation, which pipelines apply stage by stage, is every
strategy's option (:mod:`scaledl_lab.strategies.memory.options`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...families import option


@dataclass(frozen=True)
class ModelParallelOptions:
    stages: int | None = field(
        default=None, metadata=option("pipelines: stages per replica (default: every worker)")
    )
    micro_batches: int = field(
        default=1, metadata=option("pipelines: micro-batches per mini-batch")
    )
    balance: str = field(
        default="params", metadata=option("pipelines: params | time | layers per stage 2,3,1")
    )
    virtual_stages: int = field(
        default=1,
        metadata=option("interleaved-1f1b: model chunks per worker (p·V virtual stages)"),
    )
    sequence_parallel: bool = field(
        default=False,
        metadata=option("tensor-parallel: split gpt-tiny's LayerNorm regions along the sequence"),
    )
