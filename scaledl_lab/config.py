"""Experiment configuration: frozen dataclasses, validated before any cluster starts."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch

from . import families
from .contract import (
    CONTRACT_STRATEGIES,
    DATASETS,
    DEVICES,
    IMPLEMENTED_RUNTIMES,
    OPTIMIZERS,
    PRECISIONS,
    REMOVED_SERVER_TRANSPORTS,
    RUNTIMES,
    SERVER_TRANSPORTS,
    SHARDINGS,
)
from .errors import ConfigError, choices
from .models import MODELS

__all__ = [
    "CONTRACT_STRATEGIES",
    "DATASETS",
    "ConfigError",
    "ExperimentConfig",
    "check_resources",
    "is_quick",
    "quick",
    "validate",
]

# Which models accept which datasets' sample shapes (images vs 1-D signals).
_MODEL_DATASETS: dict[str, tuple[str, ...]] = {
    "mlp": DATASETS,
    "cnn": ("fashion-mnist", "cifar10"),
    "cnn1d": ("mnist1d",),
    "resnet18": ("fashion-mnist", "cifar10"),
}


def is_quick() -> bool:
    """True when quick mode (``SCALEDL_QUICK=1``) is on: small data, few epochs, same code."""
    return os.environ.get("SCALEDL_QUICK", "").strip().lower() not in ("", "0", "false", "no")


@dataclass(frozen=True)
class ExperimentConfig:
    """One training run. ``batch_size`` is per worker, as in the paper (effective: × workers)."""

    strategy: str = "allreduce"
    runtime: str = "dask"
    workers: int = 2
    dataset: str = "fashion-mnist"
    model: str = "cnn"
    epochs: int = 1
    batch_size: int = 64
    global_batch_size: int | None = None
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    clip_gradient: float | None = None  # each gradient element into [-c, c] before a step (MXNet)
    seed: int = 0
    topology: str | None = None
    sharding: str = "iid"
    val_size: int = 5000
    train_subset: int | None = None
    test_subset: int | None = None
    max_steps: int | None = None
    bucket_mb: float = 4.0
    device: str = "auto"
    precision: str = "float32"
    data_dir: str | None = None
    timeout_s: float = 60.0
    oversubscribe: bool = False
    name: str | None = None
    # Simulated runtime only: the cost model (see scaledl_lab.runtime.sim.cost).
    compute_profile: str = "cpu-core"
    network: str = "loopback"
    allreduce_algorithm: str = "ring"
    stragglers: str | None = None
    # Strategy options (each is used only by the strategies named in its comment).
    servers: int = 1  # parameter-server shards (ps-*, downpour, staleness-aware, dc-asgd, backup)
    server_transport: str = "auto"  # Dask runtime, servers' calls: auto | p2p | actor (dask.p2p)
    backup_workers: int = 1  # backup-workers: the step uses the first workers - b gradients
    n_fetch: int = 1  # downpour: pull the parameters every n_fetch steps
    n_push: int = 1  # downpour: push the accumulated gradient every n_push steps
    dc_lambda: float = 0.04  # dc-asgd: weight of the delay-compensation term (λ0 if adaptive)
    dc_adaptive: bool = False  # dc-asgd: λ0 / sqrt(moving mean of g⊙g), DC-ASGD-a
    sync_period: int = 4  # local-sgd and easgd: local steps between two averagings
    elastic_alpha: float | None = None  # easgd: moving rate (default 0.9 / workers)
    elastic_async: bool = False  # easgd: centre on a hosted server, updated asynchronously
    stage_epochs: int = 1  # nnt-staged: restart everyone from the best worker every k epochs
    nnt_max_lead: int | None = None  # nnt, nnt-staged: steps ahead of a neighbour's news (None:
    # unbounded, as FAST: a worker never waits for a neighbour)
    stages: int | None = None  # pipelines: stages per replica (default: every worker, one replica)
    micro_batches: int = 1  # gpipe, 1f1b: micro-batches per mini-batch
    balance: str = "params"  # pipelines: "params", "time" or layers per stage "2,3,1"
    recompute: bool = False  # gpipe, 1f1b: keep stage inputs only, recompute during backward
    # Large batches (training/schedule.py, the recipe's details strategies/large_batch/recipe.py);
    # None: on in the recipe (scaling, warmup, LARS/LAMB).
    lr_scaling: str = "none"  # "linear" | "sqrt": lr × (effective / reference batch) or its root
    reference_batch_size: int = 256  # the effective batch at which ``lr`` is the rate
    warmup_epochs: float = 0.0  # gradual warmup (Goyal et al. 2017); fractional allowed
    lr_schedule: str = "constant"  # "step:E1,E2[:GAMMA]" | "cosine"
    batch_schedule: str | None = None  # "E1,E2[:FACTOR]": batch × FACTOR at each (allreduce)
    accumulate: int = 1  # micro-batches per update (allreduce, allreduce-naive)
    trust_coefficient: float | None = None  # lars (default 0.001), lamb (default 1)
    zero_init_residual: bool | None = None  # resnet18: γ = 0 closing every residual branch
    no_bias_decay: bool | None = None  # no weight decay (nor trust ratio) on biases and BN
    compress: str = "none"  # gradient messages: onebit, qsgd:L, topk:R, dgc:R, powersgd:RANK
    error_feedback: bool = True  # compressed messages: carry what was not sent to the next step
    # Faults and checkpoints (scaledl_lab.training.faults, scaledl_lab.training.checkpoint).
    faults: str | None = None  # "kill:RANK:STEP,...": worker RANK dies after its step STEP
    checkpoint_every: int | str | None = None  # N steps, or "Nepochs"; beside the metrics
    # low communication (scaledl_lab.strategies.low_communication): diloco, streaming-diloco;
    # sync_period above is DiLoCo's H (inner steps per outer step).
    outer_optimizer: str = "nesterov"  # sgd | nesterov: applied to the averaged outer gradient
    outer_lr: float = 0.7  # DiLoCo's outer learning rate
    outer_momentum: float = 0.9  # DiLoCo's outer momentum (0 with sgd: plain averaging steps)
    fragments: int = 1  # streaming-diloco: contiguous groups of layers, synchronised in turn
    overlap_steps: int = 0  # streaming-diloco: τ, inner steps a fragment's all-reduce overlaps
    mixing_alpha: float | None = None  # streaming-diloco: α, local share when merging (None:
    # 0.5 with overlap, the Streaming DiLoCo paper's choice; 0 without, i.e. DiLoCo's replace)

    def __post_init__(self) -> None:
        validate(self)
        if self.global_batch_size is not None:
            # The per-worker batch follows from the global one; keep both fields consistent.
            object.__setattr__(self, "batch_size", self.global_batch_size // self.replicas)

    @property
    def model_parallel_size(self) -> int:
        """Workers that share one model: a pipeline's stages, the tensor-parallel degree."""
        if families.has(self.strategy, "pipeline"):
            return self.stages or self.workers
        return self.workers if families.has(self.strategy, "splits_model") else 1

    @property
    def replicas(self) -> int:
        """Model replicas, each trained on its own shard (data parallelism across them)."""
        return self.workers // self.model_parallel_size

    @property
    def effective_batch_size(self) -> int:
        """Samples per update: ``batch_size`` per replica (per worker without model splits),
        times ``accumulate`` micro-batches (at the start: a batch schedule grows it)."""
        return self.replicas * self.batch_size * self.accumulate

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64 if self.precision == "float64" else torch.float32

    @property
    def resolved_topology(self) -> str:
        """The topology a decentralised strategy uses (a ring unless one is given)."""
        return self.topology or "ring"

    @property
    def label(self) -> str:
        return self.name or f"{self.strategy}-{self.runtime}-{self.workers}w"

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A copy with some fields changed (validated again)."""
        if "batch_size" in changes and "global_batch_size" not in changes:
            changes["global_batch_size"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ExperimentConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        if values.get("extra") == {}:  # results saved before options were typed fields
            values = {k: v for k, v in values.items() if k != "extra"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; allowed: {sorted(known)}")
        return cls(**values)


def validate(cfg: ExperimentConfig) -> None:
    """Raise ConfigError for the first invalid field; runs before any cluster starts."""
    if cfg.strategy not in CONTRACT_STRATEGIES:
        raise ConfigError(
            f"strategy={cfg.strategy!r} is unknown; allowed: {choices(CONTRACT_STRATEGIES)}"
        )
    families.family_of(cfg.strategy)  # the records are filled (scaledl_lab.strategies)
    if cfg.runtime not in RUNTIMES:
        raise ConfigError(f"runtime={cfg.runtime!r} is unknown; allowed: {choices(RUNTIMES)}")
    if cfg.runtime not in IMPLEMENTED_RUNTIMES:
        raise ConfigError(
            f"runtime={cfg.runtime!r} is not implemented yet; available: "
            f"{choices(IMPLEMENTED_RUNTIMES)}"
        )
    if cfg.dataset not in DATASETS:
        raise ConfigError(f"dataset={cfg.dataset!r} is unknown; allowed: {choices(DATASETS)}")
    if cfg.model not in MODELS:
        raise ConfigError(f"model={cfg.model!r} is unknown; allowed: {choices(MODELS)}")
    if cfg.dataset not in _MODEL_DATASETS[cfg.model]:
        raise ConfigError(
            f"model={cfg.model!r} does not fit dataset={cfg.dataset!r}; "
            f"it takes: {choices(_MODEL_DATASETS[cfg.model])}"
        )
    if cfg.optimizer not in OPTIMIZERS:
        raise ConfigError(f"optimizer={cfg.optimizer!r} is unknown; allowed: {choices(OPTIMIZERS)}")
    if cfg.sharding not in SHARDINGS:
        raise ConfigError(f"sharding={cfg.sharding!r} is unknown; allowed: {choices(SHARDINGS)}")
    if cfg.device not in DEVICES:
        raise ConfigError(f"device={cfg.device!r} is unknown; allowed: {choices(DEVICES)}")
    if cfg.precision not in PRECISIONS:
        raise ConfigError(f"precision={cfg.precision!r} is unknown; allowed: {choices(PRECISIONS)}")
    if cfg.server_transport in REMOVED_SERVER_TRANSPORTS:
        removed = REMOVED_SERVER_TRANSPORTS[cfg.server_transport]
        raise ConfigError(f"server_transport={cfg.server_transport!r} {removed}")
    if cfg.server_transport not in SERVER_TRANSPORTS:
        raise ConfigError(
            f"server_transport={cfg.server_transport!r} is unknown; "
            f"allowed: {choices(SERVER_TRANSPORTS)}"
        )
    for name in ("workers", "epochs", "batch_size"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name}={value!r} must be a positive integer")
    for name in ("global_batch_size", "train_subset", "test_subset", "max_steps"):
        value = getattr(cfg, name)
        if value is not None and (not isinstance(value, int) or value <= 0):
            raise ConfigError(f"{name}={value!r} must be a positive integer or None")
    if not isinstance(cfg.val_size, int) or cfg.val_size < 0:
        raise ConfigError(f"val_size={cfg.val_size!r} must be a non-negative integer")
    for name in ("lr", "bucket_mb", "timeout_s"):
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or not value > 0:
            raise ConfigError(f"{name}={value!r} must be a positive number")
    for name in ("momentum", "weight_decay"):
        value = getattr(cfg, name)
        if not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{name}={value!r} must be a non-negative number")
    if cfg.momentum >= 1:
        raise ConfigError(f"momentum={cfg.momentum!r} must be below 1")
    clip = cfg.clip_gradient
    if clip is not None and (not isinstance(clip, (int, float)) or not clip > 0):
        raise ConfigError(
            f"clip_gradient={clip!r} must be a positive number (each gradient element is "
            "clipped into [-clip_gradient, clip_gradient]), or None for no clipping"
        )
    from .runtime.sim.cost_checks import check_config

    check_config(cfg)
    families.check(cfg)  # each family checks its options and its strategies' constraints
    if cfg.global_batch_size is not None and cfg.global_batch_size % cfg.replicas:
        raise ConfigError(
            f"global_batch_size={cfg.global_batch_size} is not divisible by the "
            f"{cfg.replicas} replicas (workers={cfg.workers}); choose a multiple of "
            f"{cfg.replicas} or set batch_size (per replica) instead"
        )
    from .training.checkpoint import check_config as check_checkpoints
    from .training.faults import parse_faults

    parse_faults(cfg.faults, cfg.workers)
    check_checkpoints(cfg.strategy, cfg.compress, cfg.checkpoint_every)


def check_resources(cfg: ExperimentConfig, cores: int | None = None) -> None:
    """Refuse more real workers than CPU cores unless ``oversubscribe=True`` says it is meant."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if cfg.runtime == "dask" and cfg.workers > cores and not cfg.oversubscribe:
        raise ConfigError(
            f"workers={cfg.workers} exceeds the {cores} CPU cores of this machine; real workers "
            "would time-share cores and every timing would be wrong. Use runtime='sim' for many "
            "virtual workers, or set oversubscribe=True (CLI --oversubscribe) to run anyway"
        )


def quick(cfg: ExperimentConfig) -> ExperimentConfig:
    """The quick-mode version of a config: a data subset and at most two epochs, same code path.

    The subsets never exceed the dataset as published (MNIST-1D has 4000 test samples); a
    smaller copy on disk (a fixture) needs explicit subsets, which quick mode keeps.
    """
    from .data import standard_sizes

    val_size = min(cfg.val_size, QUICK_VAL)
    n_train, n_test = standard_sizes(cfg.dataset)
    return cfg.replace(
        epochs=min(cfg.epochs, 2),
        train_subset=min(cfg.train_subset or QUICK_TRAIN, QUICK_TRAIN, n_train - val_size),
        test_subset=min(cfg.test_subset or QUICK_TEST, QUICK_TEST, n_test),
        val_size=val_size,
    )


QUICK_TRAIN, QUICK_TEST, QUICK_VAL = 10_000, 5_000, 2_000
