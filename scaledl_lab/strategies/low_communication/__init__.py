"""Low-communication training after the paper: DiLoCo (:mod:`.diloco`) and Streaming DiLoCo
(:mod:`.streaming`). Workers take many inner steps with their own optimiser, then an outer
optimiser (:mod:`.outer`) steps on the averaged outer gradient; Streaming DiLoCo synchronises
the model's fragments (:mod:`.fragments`) in turn, overlapping each with inner steps. The
sequential twin is :mod:`.twins`, the options' checks :mod:`.checks`."""

from ...families import Family, register_family
from ..registry import described
from . import checks, diloco, fragments, outer, streaming, twins

FAMILY = register_family(
    Family(
        name="low_communication",
        summary="many inner steps, then an outer optimiser on the averaged outer gradient: "
        "DiLoCo, Streaming DiLoCo",
        strategies=described("diloco", "streaming-diloco"),
        capabilities={"checkpointable": ("diloco",)},
        check=checks.check_config,
    )
)

__all__ = ["FAMILY", "checks", "diloco", "fragments", "outer", "streaming", "twins"]
