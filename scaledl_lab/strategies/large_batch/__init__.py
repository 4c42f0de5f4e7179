"""Large batches, which register no strategy of their own: the recipe beyond the schedules
(:mod:`.recipe`; the schedules every loop follows are :mod:`scaledl_lab.training.schedule`), its
config checks (:mod:`.checks`), sharp and flat minima (:mod:`.sharpness`), the claims and
figures (:mod:`.report`) and the reproductions of notebook 07 (:mod:`.study`).

Only the options, the checks and the recipe are imported here, for the family's record: the
study runs experiments, which sit above the strategies.
"""

from ...families import Family, register_family
from . import checks, recipe
from .options import LargeBatchOptions

FAMILY = register_family(
    Family(
        name="large_batch",
        summary="options on the others' strategies: lr scaling, warmup, schedules, "
        "accumulation, LARS/LAMB",
        strategies={},
        check=checks.check_config,
        options=LargeBatchOptions,
        prepare_model=recipe.prepare_model,
        optimiser_changes=recipe.optimiser_changes,
    )
)

__all__ = ["FAMILY", "LargeBatchOptions", "checks", "recipe"]
