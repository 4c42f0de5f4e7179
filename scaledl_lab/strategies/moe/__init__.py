"""Mixtures of experts, which register no strategy of their own: gpt-tiny-moe's options
(:mod:`.options`), their checks and the config's mixture in every worker's model
(:mod:`.checks`). The model is :mod:`scaledl_lab.moe`; its experts spread over the mesh's
``ep`` ranks in :mod:`scaledl_lab.strategies.mesh.experts`."""

from ...families import Family, register_family
from . import checks
from .options import MoEOptions

FAMILY = register_family(
    Family(
        name="moe",
        summary="gpt-tiny-moe's mixture of experts: experts, top-k, capacity, load balancing",
        strategies={},
        check=checks.check_config,
        options=MoEOptions,
        prepare_model=checks.prepare_model,
    )
)

__all__ = ["FAMILY", "MoEOptions", "checks"]
