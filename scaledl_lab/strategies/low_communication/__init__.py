"""Low-communication training after the paper: DiLoCo (:mod:`.diloco`) and Streaming DiLoCo
(:mod:`.streaming`). Workers take many inner steps with their own optimiser, then an outer
optimiser (:mod:`.outer`) steps on the averaged outer gradient; Streaming DiLoCo synchronises
the model's fragments (:mod:`.fragments`) in turn, overlapping each with inner steps. The
sequential twin is :mod:`.twins`, the options' checks :mod:`.checks`. The study that sets DiLoCo
against synchronous SGD runs experiments, above the strategies: it is
:mod:`scaledl_lab.studies.low_communication`."""

from typing import Any

from ...families import Family, OptimiserDefault, register_family
from ..registry import described
from . import checks, compressed, diloco, fragments, outer, streaming, twins
from .options import LowCommunicationOptions


def _why_adamw(cfg: Any, setting: str, flags: str) -> str:
    return (
        f"DiLoCo's inner loop runs sync_period={cfg.sync_period} steps alone with its own "
        f"optimiser ({setting}); it was built for AdamW, which trains it best here: {flags}"
    )


# DiLoCo's inner optimiser is AdamW (Douillard et al. 2023). Measured in quick mode (sim, 4
# workers, MLP, Fashion-MNIST 10k, 2 epochs, batch 64, H = 10, seeds 0-2): final test accuracy
# 80.4% ± 0.4 with the config's SGD 0.05 / momentum 0.9, 81.2% ± 0.5 with AdamW 1e-3 / decay 0.01.
ADAMW = OptimiserDefault(
    strategies=("diloco", "streaming-diloco"),
    settings=dict(optimizer="adamw", lr=1e-3, momentum=0.0, weight_decay=0.01),
    why=_why_adamw,
)

FAMILY = register_family(
    Family(
        name="low_communication",
        summary="many inner steps, then an outer optimiser on the averaged outer gradient: "
        "DiLoCo, Streaming DiLoCo",
        strategies=described("diloco", "streaming-diloco"),
        capabilities={"checkpointable": ("diloco",), "compressible": True},
        optimisers=(ADAMW,),
        check=checks.check_config,
        options=LowCommunicationOptions,
    )
)

__all__ = ["FAMILY", "checks", "compressed", "diloco", "fragments", "outer", "streaming", "twins"]
