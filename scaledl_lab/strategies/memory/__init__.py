"""Memory: sharding the model states over data-parallel workers, ZeRO's stages 1, 2 and 3
(Rajbhandari et al. 2020; stage 3 is PyTorch FSDP's full shard): the flat sharded layers
(:mod:`.flat`), the per-worker programs (:mod:`.zero`) and their checks (:mod:`.checks`);
activation recomputation on every strategy (``recompute``, :mod:`.recompute`), the family's
change to every worker's model. The studies of mixed precision and of recomputation run
experiments, above the strategies: they are :mod:`scaledl_lab.studies.memory`."""

from ...families import Family, register_family
from ..registry import described
from . import checks, flat, recompute, zero
from .options import MemoryOptions

FAMILY = register_family(
    Family(
        name="memory",
        summary="sharded data parallelism: optimiser state, gradients, parameters over workers",
        strategies=described(*zero.DESCRIPTIONS),
        capabilities={"mixed_precision": True},
        check=checks.check_memory,
        options=MemoryOptions,
        prepare_model=recompute.prepare_model,
    )
)

__all__ = ["FAMILY", "MemoryOptions", "checks", "flat", "recompute", "zero"]
