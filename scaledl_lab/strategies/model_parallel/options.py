"""The model-parallel options: stages per replica, micro-batches, how layers are balanced over
the stages, sequence parallelism, recomputation (checked in :mod:`.partition`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...families import option


@dataclass(frozen=True)
class ModelParallelOptions:
    stages: int | None = field(
        default=None, metadata=option("pipelines: stages per replica (default: every worker)")
    )
    micro_batches: int = field(
        default=1, metadata=option("gpipe, 1f1b: micro-batches per mini-batch")
    )
    balance: str = field(
        default="params", metadata=option("pipelines: params | time | layers per stage 2,3,1")
    )
    sequence_parallel: bool = field(
        default=False,
        metadata=option("tensor-parallel: split gpt-tiny's LayerNorm regions along the sequence"),
    )
    recompute: bool = field(
        default=False, metadata=option("gpipe, 1f1b, zero2, zero3: recompute forwards in backward")
    )
