"""Memory: sharding the model states over data-parallel workers, ZeRO's stages 1, 2 and 3
(Rajbhandari et al. 2020; stage 3 is PyTorch FSDP's full shard): the flat sharded layers
(:mod:`.flat`), the per-worker programs (:mod:`.zero`) and their checks (:mod:`.checks`);
mixed precision's underflow and accuracy study (:mod:`.precision_study`)."""

from ...families import Family, register_family
from ..registry import described
from . import checks, flat, zero

FAMILY = register_family(
    Family(
        name="memory",
        summary="sharded data parallelism: optimiser state, gradients, parameters over workers",
        strategies=described(*zero.DESCRIPTIONS),
        capabilities={"recomputes": ("zero2", "zero3"), "mixed_precision": True},
        check=checks.check_memory,
    )
)

__all__ = ["FAMILY", "checks", "flat", "zero"]
