"""The low-communication options: DiLoCo's outer optimiser, Streaming DiLoCo's fragments,
overlap and mixing (checked in :mod:`.checks`). DiLoCo's H, the inner steps of a round, is the
decentralised family's ``sync_period``."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...contract import OUTER_OPTIMIZERS
from ...families import option


@dataclass(frozen=True)
class LowCommunicationOptions:
    outer_optimizer: str = field(
        default="nesterov",
        metadata=option(
            "diloco, streaming-diloco: the optimiser of the averaged outer gradient",
            choices=OUTER_OPTIMIZERS,
        ),
    )
    outer_lr: float = field(
        default=0.7, metadata=option("diloco, streaming-diloco: outer learning rate")
    )
    outer_momentum: float = field(
        default=0.9,
        metadata=option("diloco, streaming-diloco: outer momentum (0 with sgd: plain steps)"),
    )
    fragments: int = field(
        default=1,
        metadata=option("streaming-diloco: contiguous groups of layers, synchronised in turn"),
    )
    overlap_steps: int = field(
        default=0,
        metadata=option("streaming-diloco: τ, inner steps a fragment's all-reduce overlaps"),
    )
    # None: 0.5 with overlap (Streaming DiLoCo's choice); 0 without, i.e. DiLoCo's replace
    mixing_alpha: float | None = field(
        default=None,
        metadata=option(
            "streaming-diloco: α, the local share when a fragment is merged "
            "(default 0.5 with overlap, 0 without)"
        ),
    )
