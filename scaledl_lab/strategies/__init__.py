"""The strategies: one folder per technique family. Importing this package imports every
family, so that each ``@register`` call (a per-worker program) has run before a strategy is
looked up (:func:`get_strategy`), and each family's record (:mod:`scaledl_lab.families`) is
there before a config is validated.

- :mod:`.data_parallel`: synchronous data parallelism (``allreduce``, ``allreduce-naive``);
- :mod:`.parameter_server`: parameter servers, their workers' side and Hogwild!;
- :mod:`.decentralised`: NNT, D-PSGD and AD-PSGD, local SGD, EASGD;
- :mod:`.model_parallel`: splitting a model, pipelines (naive, GPipe, 1F1B, interleaved 1F1B,
  zero bubble H1), tensor parallelism;
- :mod:`.large_batch`: the large-batch recipe, its checks, sharpness, its study and report;
- :mod:`.memory`: ZeRO's stages 1-3 (sharded optimiser state, gradients, parameters);
- :mod:`.compression`: compressors, error feedback and the wire, how compressed messages
  travel in each family, its study and report;
- :mod:`.low_communication`: DiLoCo and Streaming DiLoCo (inner steps, outer optimiser);
- :mod:`.mesh`: the device mesh, data (ZeRO), tensor/sequence and pipeline parallelism composed;
- :mod:`.moe`: gpt-tiny-moe's mixture of experts (its options; experts over ``ep``: the mesh).

Large batches, compression and mixtures of experts register no strategy of their own: they
change how the others train. Beside the
registry (:mod:`.registry`), :mod:`.launch` binds a config's strategy to a runtime. The checks
of the config fields no family owns (the cost model's, faults, checkpoints) register when
their modules are imported, which this package does.
"""

# Imported for their config checks, which register with the records.
from ..runtime.sim import cost_checks as cost_checks
from ..training import checkpoint as checkpoint
from ..training import faults as faults
from . import (
    compression,
    data_parallel,
    decentralised,
    large_batch,
    low_communication,
    memory,
    mesh,
    model_parallel,
    moe,
    parameter_server,
)
from .registry import STRATEGIES, ServerSpec, Strategy, get_strategy, register

__all__ = [
    "STRATEGIES",
    "ServerSpec",
    "Strategy",
    "compression",
    "data_parallel",
    "decentralised",
    "get_strategy",
    "large_batch",
    "low_communication",
    "memory",
    "mesh",
    "model_parallel",
    "moe",
    "parameter_server",
    "register",
]
