"""The large-batch options: learning-rate scaling and warmup, schedules, accumulation, LARS
and LAMB's trust coefficient, Goyal's details (checked in :mod:`.checks`; None: on in the
recipe, :mod:`.recipe`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...contract import LR_SCALINGS
from ...families import option


@dataclass(frozen=True)
class LargeBatchOptions:
    lr_scaling: str = field(
        default="none",
        metadata=option("--lr x (effective batch / reference batch)^1 or ^½", choices=LR_SCALINGS),
    )
    reference_batch_size: int = field(
        default=256, metadata=option("the effective batch at which --lr is the rate")
    )
    warmup_epochs: float = field(
        default=0.0, metadata=option("gradual warmup (Goyal et al.), fractional allowed")
    )
    lr_schedule: str = field(
        default="constant",
        metadata=option("constant | step:E1,E2[:GAMMA] (default GAMMA 0.1) | cosine"),
    )
    batch_schedule: str | None = field(
        default=None,
        metadata=option(
            "E1,E2[:FACTOR]: the batch x FACTOR (default 10) from each epoch "
            "(allreduce, allreduce-naive)"
        ),
    )
    accumulate: int = field(
        default=1, metadata=option("micro-batches per update (allreduce, allreduce-naive)")
    )
    trust_coefficient: float | None = field(
        default=None, metadata=option("lars (default 0.001) and lamb (default 1)")
    )
    zero_init_residual: bool | None = field(
        default=None,
        metadata=option(
            "resnet18: gamma = 0 closing each residual branch (default: in the recipe)",
            off_flag="--no-zero-init-residual",
        ),
    )
    no_bias_decay: bool | None = field(
        default=None,
        metadata=option(
            "no weight decay or trust ratio on biases/BN, or decay them like the weights "
            "(default: in the recipe)",
            off_flag="--bias-decay",
        ),
    )
