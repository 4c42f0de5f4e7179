"""The names of the user-facing contract (DESIGN.md): strategies and their families, runtimes,
datasets, optimisers and the other choices a config offers. Imports nothing from the package."""

from __future__ import annotations

# Every strategy name of the user-facing contract; each one is implemented.
CONTRACT_STRATEGIES: tuple[str, ...] = (
    "allreduce",
    "allreduce-naive",
    "ps-sync",
    "ps-async",
    "downpour",
    "hogwild",
    "staleness-aware",
    "dc-asgd",
    "backup-workers",
    "nnt",
    "nnt-lockstep",
    "nnt-staged",
    "dpsgd",
    "adpsgd",
    "local-sgd",
    "easgd",
    "model-parallel",
    "gpipe",
    "1f1b",
    "tensor-parallel",
)
# Pipelines: the model split into stages, one per worker of a replica (``stages``).
PIPELINE_STRATEGIES: tuple[str, ...] = ("model-parallel", "gpipe", "1f1b")
# Strategies that split the model itself across workers.
MODEL_PARALLEL_STRATEGIES: tuple[str, ...] = (*PIPELINE_STRATEGIES, "tensor-parallel")
IMPLEMENTED_STRATEGIES: tuple[str, ...] = CONTRACT_STRATEGIES
# Strategies whose workers talk along a topology (``topology``, default "ring").
TOPOLOGY_STRATEGIES: tuple[str, ...] = ("nnt", "nnt-lockstep", "nnt-staged", "dpsgd", "adpsgd")
# Strategies with hosted parameter servers (``servers`` shards).
SERVER_STRATEGIES: tuple[str, ...] = (
    "ps-sync",
    "ps-async",
    "downpour",
    "staleness-aware",
    "dc-asgd",
    "backup-workers",
)
# Gradient compressors (``compress``: none, onebit, qsgd:LEVELS, topk:RATIO, dgc:RATIO,
# powersgd:RANK) and the strategies whose messages carry gradients (D-PSGD: weight updates).
COMPRESSORS: tuple[str, ...] = ("none", "onebit", "qsgd", "topk", "dgc", "powersgd")
COMPRESSIBLE_STRATEGIES: tuple[str, ...] = (
    "allreduce",
    "allreduce-naive",
    *SERVER_STRATEGIES,
    "nnt",
    "nnt-lockstep",
    "nnt-staged",
    "dpsgd",
)
RUNTIMES: tuple[str, ...] = ("dask", "sim")
IMPLEMENTED_RUNTIMES: tuple[str, ...] = ("dask", "sim")
DATASETS: tuple[str, ...] = ("fashion-mnist", "mnist1d", "cifar10")
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adagrad", "lars", "lamb")
SHARDINGS: tuple[str, ...] = ("iid", "label-skew")
# How a real run's ranks call hosted servers: shared memory on one machine, Dask actor calls.
SERVER_TRANSPORTS: tuple[str, ...] = ("auto", "shm", "actor")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
PRECISIONS: tuple[str, ...] = ("float32", "float64")
# Large batches (scaledl_lab.training.schedule): the learning-rate scaling rules, and the strategies
# that take micro-batch accumulation and batch-size schedules (synchronous allreduce).
LR_SCALINGS: tuple[str, ...] = ("none", "linear", "sqrt")
ACCUMULATE_STRATEGIES: tuple[str, ...] = ("allreduce", "allreduce-naive")
BATCH_SCHEDULE_STRATEGIES: tuple[str, ...] = ("allreduce", "allreduce-naive")
