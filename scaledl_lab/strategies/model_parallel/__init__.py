"""Model parallelism: a model's ordered layers and how many go to each stage
(:mod:`.partition`), pipeline schedules as pure functions (:mod:`.schedules`), the pipeline
executor (:mod:`.pipeline`: ``model-parallel``, ``gpipe``, ``1f1b``) and Megatron-style tensor
parallelism (:mod:`.tensor_parallel`)."""

from . import partition, pipeline, schedules, tensor_parallel

__all__ = ["partition", "pipeline", "schedules", "tensor_parallel"]
