"""The names of the user-facing contract (DESIGN.md): strategies, runtimes, datasets,
optimisers and the other choices a config offers. Imports nothing from the package."""

from __future__ import annotations

# Every strategy name of the user-facing contract; each one is implemented, in one family.
# Which strategies take a topology, host servers, compress, split the model, ... is asked of
# the families' records (scaledl_lab.families), not written here.
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
    "interleaved-1f1b",
    "zb-h1",
    "tensor-parallel",
    "zero1",
    "zero2",
    "zero3",
    "diloco",
    "streaming-diloco",
    "mesh",
)
# Gradient compressors (``compress``: none, onebit, qsgd:LEVELS, topk:RATIO, dgc:RATIO,
# powersgd:RANK).
COMPRESSORS: tuple[str, ...] = ("none", "onebit", "qsgd", "topk", "dgc", "powersgd")
RUNTIMES: tuple[str, ...] = ("dask", "sim")
IMPLEMENTED_RUNTIMES: tuple[str, ...] = ("dask", "sim")
DATASETS: tuple[str, ...] = ("fashion-mnist", "mnist1d", "cifar10", "licenses")
# Next-token corpora: a target per position, no class labels to skew shards by.
TEXT_DATASETS: tuple[str, ...] = ("licenses",)
OPTIMIZERS: tuple[str, ...] = ("sgd", "adam", "adagrad", "lars", "lamb", "adamw")
SHARDINGS: tuple[str, ...] = ("iid", "label-skew")
# How a real run's ranks call hosted servers: torch.distributed point-to-point messages (auto,
# p2p), Dask actor calls (actor); and the transports removed, with what replaced them.
SERVER_TRANSPORTS: tuple[str, ...] = ("auto", "actor", "p2p")
REMOVED_SERVER_TRANSPORTS: dict[str, str] = {
    "shm": "(calls through shared memory) was removed: 'p2p', torch.distributed point-to-point "
    "messages on a gloo group of each server's own, replaced it (as fast on the async-PS "
    "benchmark, and across machines too); 'auto', the default, takes it",
}
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
PRECISIONS: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")
# The precisions whose model trains in 16 bits against float32 master weights
# (scaledl_lab.training.precision, Micikevicius et al. 2018).
LOW_PRECISIONS: tuple[str, ...] = ("bfloat16", "float16")
# Large batches (scaledl_lab.training.schedule): the learning-rate scaling rules.
LR_SCALINGS: tuple[str, ...] = ("none", "linear", "sqrt")
# Low communication (DiLoCo): the outer optimisers applied to the averaged outer gradient.
OUTER_OPTIMIZERS: tuple[str, ...] = ("sgd", "nesterov")
