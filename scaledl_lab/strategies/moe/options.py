"""gpt-tiny-moe's options: its experts, the router's top-k, the capacity factor and the
load-balancing loss's weight (:mod:`scaledl_lab.moe`; checked in :mod:`.checks`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...families import option
from ...moe import AUX_LOSS_WEIGHT, CAPACITY_FACTOR, EXPERTS, TOP_K


@dataclass(frozen=True)
class MoEOptions:
    experts: int = field(
        default=EXPERTS, metadata=option("gpt-tiny-moe: experts in every block's mixture")
    )
    top_k: int = field(
        default=TOP_K,
        metadata=option(
            "gpt-tiny-moe: experts per token (2: the gates renormalised)", metavar="1|2"
        ),
    )
    capacity_factor: float = field(
        default=CAPACITY_FACTOR,
        metadata=option("gpt-tiny-moe: places per expert = ceil(X x tokens x k / experts)"),
    )
    aux_loss_weight: float = field(
        default=AUX_LOSS_WEIGHT,
        metadata=option("gpt-tiny-moe: weight of Switch's load-balancing loss (0: none)"),
    )
