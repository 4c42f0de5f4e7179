"""Large batches, which register no strategy of their own: the recipe beyond the schedules
(:mod:`.recipe`; the schedules every loop follows are :mod:`scaledl_lab.training.schedule`), its
config checks (:mod:`.checks`) and sharp and flat minima (:mod:`.sharpness`). The claims,
figures and reproductions of notebook 07 run experiments, which sit above the strategies: they
are :mod:`scaledl_lab.studies.large_batch`.

Only the options, the checks and the recipe are imported here, for the family's record.
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
