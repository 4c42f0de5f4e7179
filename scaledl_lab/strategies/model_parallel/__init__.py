"""Model parallelism: a model's ordered layers and how many go to each stage
(:mod:`.partition`, with the checks of the family's options), pipeline schedules as pure
functions (:mod:`.schedules`), the one pipeline executor (:mod:`.executor`, its messages in
order, :mod:`.channels`; the mesh's ``pp`` runs on it too), the pipeline strategies on it
(:mod:`.pipeline`: ``model-parallel``, ``gpipe``, ``1f1b``, ``interleaved-1f1b``, ``zb-h1``,
each chunk a run of any model's layers, :mod:`.chunk`) and Megatron-style tensor parallelism
(:mod:`.tensor_parallel`; gpt-tiny's whole blocks and sequence parallelism in
:mod:`.parallel_transformer`, its f and g operators in :mod:`.conjugates`)."""

from ...families import Family, register_family
from ..registry import described
from . import channels, chunk, executor, partition, pipeline, schedules, tensor_parallel
from .options import ModelParallelOptions

PIPELINES = tuple(pipeline.DESCRIPTIONS)

FAMILY = register_family(
    Family(
        name="model_parallel",
        summary="the model split over workers: pipelines of stages, tensor-parallel layers",
        strategies=described(*PIPELINES, "tensor-parallel"),
        capabilities={
            "splits_model": True,
            "pipeline": PIPELINES,
            "interleaves": ("interleaved-1f1b",),
            "slices_layers": ("tensor-parallel",),
        },
        check=partition.check_model_parallel,
        options=ModelParallelOptions,
    )
)

__all__ = [
    "FAMILY",
    "ModelParallelOptions",
    "channels",
    "chunk",
    "executor",
    "partition",
    "pipeline",
    "schedules",
    "tensor_parallel",
]
