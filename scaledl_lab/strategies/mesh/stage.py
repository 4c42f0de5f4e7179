"""The ``pp`` dimension: this rank's virtual stages of gpt-tiny on the pipeline executor
(:mod:`..model_parallel.executor`, which runs the pipeline strategies too), each stage's
neighbours found in the rank's ``pp`` group. What runs inside a stage is :mod:`.layers` (sliced
over ``tp``), and what comes after the schedule (sequence parallelism's sum of the split
regions' gradients, data parallelism's average) is the program's (:mod:`.program`).

gpt-tiny's layers (embedding, blocks, head) are cut into ``pp·V`` equal runs; chunk c of stage
k is virtual stage c·pp + k, as the pipeline strategies place them. What crosses a cut is the
residual stream, sequence-first ``(S, micro, h)`` (``S/tp`` positions with sequence
parallelism). Zero bubble splits each layer's backward into B (the input gradients, the graphs
kept) and W (the weights', later): :class:`.layers.Deferred`; the simulator charges F, B and W a
third of a layer's step each, as the pipeline strategy ``zb-h1`` charges its chunks. At ZeRO
stage 3 each layer's parameters are gathered over ``dp`` just before it computes and freed
after.
"""

from __future__ import annotations

from typing import Any

import torch

from ...training.ledger import Peak
from ..model_parallel.executor import Executor
from .layers import Dims
from .view import GroupComm


class Stage(Executor):
    """This rank's chunks of gpt-tiny's pipeline, its layers' ZeRO-3 shards gathered around
    each computation."""

    def __init__(
        self, layers: list, pp: GroupComm, dims: Dims, *, schedule: str, micro_batches: int,
        virtual: int, boundary: torch.Size, dtype: torch.dtype, dp: GroupComm | None = None,
        buffers: Peak | None = None,
    ) -> None:  # fmt: skip
        """``layers``: every layer of the model (this rank's part of each); ``boundary``: what
        crosses a cut for one micro-batch; ``dp`` and ``buffers``: where ZeRO-3 gathers a
        layer's parameters."""
        self.dp, self.buffers = dp, buffers or Peak()
        stages = pp.world_size * virtual
        super().__init__(
            layers, [len(layers) // stages] * stages, [boundary] * (stages - 1), pp, dims,
            schedule=schedule, micro_batches=micro_batches, virtual=virtual, dtype=dtype,
            batch_dim=1,
        )  # fmt: skip

    async def _enter(self, layer: Any) -> None:
        if layer.unit is not None:
            await layer.unit.gather(self.dp, self.buffers)

    def _leave(self, layer: Any) -> None:
        if layer.unit is not None:
            layer.unit.free(self.buffers)
