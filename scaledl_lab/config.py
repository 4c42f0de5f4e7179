"""Experiment configuration: frozen dataclasses, validated before any cluster starts."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
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
    TEXT_DATASETS,
)
from .errors import ConfigError, choices
from .families import OPTIMISER_FIELDS, number_or_text, option, steps_or_text
from .models import MODEL_DATASETS, MODELS

__all__ = [
    "CONTRACT_STRATEGIES",
    "DATASETS",
    "ConfigError",
    "ExperimentConfig",
    "DEFAULT_OPTIMISER",
    "check_resources",
    "CORE_FIELDS",
    "field_names",
    "is_quick",
    "quick",
    "validate",
]


def is_quick() -> bool:
    """True when quick mode (``SCALEDL_QUICK=1``) is on: small data, few epochs, same code."""
    return os.environ.get("SCALEDL_QUICK", "").strip().lower() not in ("", "0", "false", "no")


def _o(default: Any, help: str, **cli: Any) -> Any:
    """A core field: its default and how it reads on the command line."""
    return field(default=default, metadata=option(help, **cli))


# What trains when neither the run nor its strategy's family says otherwise (SGD's own setting).
DEFAULT_OPTIMISER: dict[str, Any] = families.OPTIMISER_DEFAULTS["sgd"]


@dataclass(frozen=True, init=False)
class ExperimentConfig:
    """One training run. ``batch_size`` is per worker, as in the paper (effective: × workers).

    The fields below are the ones every strategy shares. Each technique family adds its
    options (:attr:`scaledl_lab.families.Family.options`): they are keyword arguments and
    attributes like these (``ExperimentConfig(strategy="ps-async", servers=2).servers``), held
    in :attr:`options`, one frozen dataclass per family. The optimiser fields left out take
    the strategy family's setting, else :data:`DEFAULT_OPTIMISER`, or another optimiser's own
    (:func:`scaledl_lab.families.optimiser_setting`): the same from Python and the CLI.
    """

    strategy: str = _o("allreduce", "a strategy of `scaledl-lab list`")
    runtime: str = _o("dask", "real processes or the simulator", choices=RUNTIMES)
    workers: int = _o(2, "workers (one process or simulated rank each)")
    dataset: str = _o("fashion-mnist", "the data", choices=DATASETS)
    model: str = _o("cnn", "the network", choices=tuple(MODELS))
    epochs: int = _o(1, "passes over the training set")
    batch_size: int = _o(64, "per worker (effective batch = workers x batch-size)")
    global_batch_size: int | None = _o(None, "effective batch; must be divisible by --workers")
    lr: float = _o(None, "learning rate (default: the strategy family's, else 0.05)")
    momentum: float = _o(None, "SGD momentum (default: the strategy family's, else 0.9)")
    weight_decay: float = _o(None, "L2 penalty (default: the strategy family's, else 0)")
    optimizer: str = _o(None, "default: the strategy family's, else sgd", choices=OPTIMIZERS)
    clip_gradient: float | None = _o(  # each gradient element into [-c, c] (MXNet)
        None, "clip every gradient element into [-C, C] before each step (MXNet's)", metavar="C"
    )
    seed: int = _o(0, "seeds the data order and the initial weights")
    topology: str | None = _o(None, "ring | torus:HxW | complete (decentralised only)")
    sharding: str = _o("iid", "how the training set is split over workers", choices=SHARDINGS)
    val_size: int = _o(5000, "training samples held out for validation")
    train_subset: int | None = _o(None, "train on this many samples")
    test_subset: int | None = _o(None, "test on this many samples")
    max_steps: int | None = _o(None, "stop every worker after this many steps")
    bucket_mb: float = _o(4.0, "allreduce: gradient bucket size in MiB")
    device: str = _o("auto", "dask: auto uses GPUs if every worker has one", choices=DEVICES)
    precision: str = _o("float32", "the dtype of weights and data", choices=PRECISIONS)
    loss_scale: float | str | None = _o(  # float16 only (scaledl_lab.training.precision)
        None, "float16: dynamic (the default: 2**16, halved on overflow, doubled after 2000 "
        "good steps) or a static scale N", metavar="dynamic|N", parse=number_or_text,
    )  # fmt: skip
    data_dir: str | None = _o(None, "where the datasets are (default: the usual places)")
    timeout_s: float = _o(60.0, "dask: seconds a collective or server call may wait")
    oversubscribe: bool = _o(False, "allow more real workers than CPU cores")
    name: str | None = _o(None, "the run's label (default STRATEGY-RUNTIME-Nw)")
    server_transport: str = _o(  # Dask runtime, hosted servers' calls (runtime/dask/p2p)
        "auto",
        "PS and EASGD servers on real workers: auto (= p2p: torch.distributed "
        "point-to-point messages) | p2p | actor (Dask actor calls)",
    )
    # Simulated runtime only: the cost model (see scaledl_lab.runtime.sim.cost).
    compute_profile: str = _o("cpu-core", "sim: cpu-core, v100, a100, h100 or a calibration .json")
    network: str = _o("loopback", "sim: a network of `scaledl-lab list`, custom:LAT:BW, .json")
    gpus_per_node: int | None = _o(None, "sim: rank r on node r // G (default 1 node)", metavar="G")
    allreduce_algorithm: str = _o("ring", "sim: ring | recursive-doubling")
    stragglers: str | None = _o(None, "sim: slow:RANK:FACTOR, spread:SIGMA, hiccup:PROB:S (commas)")
    # Faults and checkpoints (scaledl_lab.training.faults, scaledl_lab.training.checkpoint).
    faults: str | None = _o(None, "kill:RANK:STEP (commas): worker RANK dies after STEP")
    profile_step: int | None = _o(None, "step K as a Chrome trace (trace-*.json)", metavar="K")
    checkpoint_every: int | str | None = _o(
        None,
        "N (steps) or Nepochs: checkpoints beside the metrics, for `scaledl-lab resume`",
        metavar="N|Nepochs",
        parse=steps_or_text,
    )
    # The families' options, one frozen dataclass per family that declares some.
    options: tuple[Any, ...] = field(default=())
    # The optimiser fields filled from the strategy's family (a new strategy refills them).
    resolved: frozenset[str] = field(default=frozenset(), init=False, compare=False, repr=False)

    def __init__(self, **values: Any) -> None:
        given = {f.name: values.pop(f.name) for f in CORE_FIELDS if f.name in values}
        values.pop("resolved", None)  # dataclasses.replace passes it: resolved again below
        held = {type(o): o for o in values.pop("options", ())}
        options = []
        for family in families.with_options():
            changes = {n: values.pop(n) for n in family.option_names() if n in values}
            base = held[family.options] if family.options in held else family.options()
            opts = dataclasses.replace(base, **changes) if changes else base
            options.append(opts)
            for name in family.option_names():  # read like a field: cfg.servers
                object.__setattr__(self, name, getattr(opts, name))
        if values:
            raise ConfigError(
                f"unknown config field(s) {sorted(values)}; allowed: {sorted(field_names())}"
            )
        for f in CORE_FIELDS:
            object.__setattr__(self, f.name, given.get(f.name, f.default))
        object.__setattr__(self, "options", tuple(options))
        self.__post_init__()

    def __post_init__(self) -> None:
        if not isinstance(self.strategy, str) or self.strategy not in CONTRACT_STRATEGIES:
            validate(self)  # the unknown strategy's message, before its family is asked
        defaults = families.optimiser_setting(self.strategy, self.optimizer)
        resolved = frozenset(n for n in OPTIMISER_FIELDS if getattr(self, n) is None)
        for name in resolved:
            object.__setattr__(self, name, defaults[name])
        object.__setattr__(self, "resolved", resolved)
        validate(self)
        if self.global_batch_size is not None:
            # The per-worker batch follows from the global one; keep both fields consistent.
            object.__setattr__(self, "batch_size", self.global_batch_size // self.replicas)

    def __repr__(self) -> str:  # flat, as to_dict: the shared fields, then the families' options
        fields = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items())
        return f"{type(self).__name__}({fields})"

    @property
    def model_parallel_size(self) -> int:
        """Workers that share one model: a pipeline's stages, the tensor-parallel degree."""
        return families.placement(self)[0]  # a mesh's: every dimension but dp

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
        """The dtype of the model's weights, gradients and data (16-bit precisions train
        against float32 master weights: :mod:`scaledl_lab.training.precision`)."""
        return getattr(torch, self.precision)

    @property
    def resolved_topology(self) -> str:
        """The topology a decentralised strategy uses (a ring unless one is given)."""
        return self.topology or "ring"

    @property
    def label(self) -> str:
        return self.name or f"{self.strategy}-{self.runtime}-{self.workers}w"

    def replace(self, **changes: Any) -> ExperimentConfig:
        """A copy with some fields changed (validated again). A new strategy (or optimiser) takes
        its setting for the optimiser fields neither this config nor ``changes`` gave."""
        if "batch_size" in changes and "global_batch_size" not in changes:
            changes["global_batch_size"] = None
        values = {**self.to_dict(), **changes}
        if values["strategy"] != self.strategy or values["optimizer"] != self.optimizer:
            values.update({n: None for n in self.resolved if n not in changes})
        return type(self)(**values)

    def to_dict(self) -> dict[str, Any]:
        """Every field by name, the families' options among them (flat: ``config.json``)."""
        out = {f.name: getattr(self, f.name) for f in CORE_FIELDS}
        for opts in self.options:
            out.update(dataclasses.asdict(opts))
        return out

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ExperimentConfig:
        if values.get("extra") == {}:  # results saved before options were typed fields
            values = {k: v for k, v in values.items() if k != "extra"}
        return cls(**values)


def field_names() -> tuple[str, ...]:
    """Every config field: the shared ones, then each family's options."""
    names = tuple(f.name for f in CORE_FIELDS)
    for family in families.with_options():
        clash = set(family.option_names()) & set(names)
        if clash:
            raise ConfigError(f"family {family.name!r} declares fields of the config: {clash}")
        names += family.option_names()
    return names


# The fields every strategy shares (the families' options are not among them).
CORE_FIELDS = tuple(
    f for f in dataclasses.fields(ExperimentConfig) if f.name not in ("options", "resolved")
)


_NUMBERS: tuple[tuple[tuple[str, ...], str, Any], ...] = (
    (("workers", "epochs", "batch_size"), "a positive integer",
     lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
    (("global_batch_size", "train_subset", "test_subset", "max_steps", "gpus_per_node",
      "profile_step"),
     "a positive integer or None", lambda v: v is None or (isinstance(v, int) and v > 0)),
    (("val_size",), "a non-negative integer", lambda v: isinstance(v, int) and not v < 0),
    (("lr", "bucket_mb", "timeout_s"), "a positive number",
     lambda v: isinstance(v, (int, float)) and v > 0),
    (("momentum", "weight_decay"), "a non-negative number",
     lambda v: isinstance(v, (int, float)) and not v < 0),
)  # fmt: skip


def _one_of(cfg: ExperimentConfig, **allowed: tuple[str, ...]) -> None:
    for name, values in allowed.items():
        value = getattr(cfg, name)
        if value not in values:
            raise ConfigError(f"{name}={value!r} is unknown; allowed: {choices(values)}")


def validate(cfg: ExperimentConfig) -> None:
    """Raise ConfigError for the first invalid field; runs before any cluster starts."""
    if cfg.strategy not in CONTRACT_STRATEGIES:
        raise ConfigError(
            f"strategy={cfg.strategy!r} is unknown; allowed: {choices(CONTRACT_STRATEGIES)}"
        )
    families.family_of(cfg.strategy)  # the records are filled (scaledl_lab.strategies)
    _one_of(cfg, runtime=RUNTIMES)
    if cfg.runtime not in IMPLEMENTED_RUNTIMES:
        raise ConfigError(
            f"runtime={cfg.runtime!r} is not implemented yet; available: "
            f"{choices(IMPLEMENTED_RUNTIMES)}"
        )
    _one_of(cfg, dataset=DATASETS, model=tuple(MODELS))
    if cfg.dataset not in MODEL_DATASETS[cfg.model]:
        raise ConfigError(
            f"model={cfg.model!r} does not fit dataset={cfg.dataset!r}; "
            f"it takes: {choices(MODEL_DATASETS[cfg.model])}"
        )
    if cfg.sharding == "label-skew" and cfg.dataset in TEXT_DATASETS:
        raise ConfigError(
            f"sharding='label-skew' needs class labels; dataset={cfg.dataset!r} is next-token "
            "text, use sharding='iid'"
        )
    if cfg.server_transport in REMOVED_SERVER_TRANSPORTS:
        removed = REMOVED_SERVER_TRANSPORTS[cfg.server_transport]
        raise ConfigError(f"server_transport={cfg.server_transport!r} {removed}")
    _one_of(
        cfg,
        optimizer=OPTIMIZERS,
        sharding=SHARDINGS,
        device=DEVICES,
        precision=PRECISIONS,
        server_transport=SERVER_TRANSPORTS,
    )
    families.check_finite(cfg)  # inf and NaN pass a comparison (inf > 0): refused by name
    for names, what, holds in _NUMBERS:
        for name in names:
            if not holds(value := getattr(cfg, name)):
                raise ConfigError(f"{name}={value!r} must be {what}")
    if cfg.momentum >= 1:
        raise ConfigError(f"momentum={cfg.momentum!r} must be below 1")
    clip = cfg.clip_gradient
    if clip is not None and (not isinstance(clip, (int, float)) or not clip > 0):
        raise ConfigError(
            f"clip_gradient={clip!r} must be a positive number (each gradient element is "
            "clipped into [-clip_gradient, clip_gradient]), or None for no clipping"
        )
    # each family checks its options and its strategies' constraints; then the checks the
    # lower layers registered (the cost model's fields, faults, checkpoints)
    families.check(cfg)
    if cfg.global_batch_size is not None and cfg.global_batch_size % cfg.replicas:
        raise ConfigError(
            f"global_batch_size={cfg.global_batch_size} is not divisible by the "
            f"{cfg.replicas} replicas (workers={cfg.workers}); choose a multiple of "
            f"{cfg.replicas} or set batch_size (per replica) instead"
        )


def check_resources(cfg: ExperimentConfig, cores: int | None = None) -> None:
    """Refuse more real workers than CPU cores unless ``oversubscribe=True`` says it is meant."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if cfg.runtime == "dask" and cfg.workers > cores and not cfg.oversubscribe:
        raise ConfigError(
            f"workers={cfg.workers} exceeds the {cores} CPU cores of this machine; real workers "
            "would time-share cores and every timing would be wrong. Use runtime='sim' for many "
            "virtual workers, or set oversubscribe=True (CLI --oversubscribe) to run anyway"
        )


def quick(cfg: ExperimentConfig, keep: Any = ()) -> ExperimentConfig:
    """The quick-mode version of a config: a data subset and at most two epochs, same code path.

    The subsets never exceed the dataset as published (MNIST-1D has 4000 test samples); a
    smaller copy on disk (a fixture) needs explicit subsets, kept as the fields in ``keep`` are.
    """
    from .data import standard_sizes

    val_size = cfg.val_size if "val_size" in keep else min(cfg.val_size, QUICK_VAL)
    n_train, n_test = standard_sizes(cfg.dataset)
    shrunk = dict(
        epochs=min(cfg.epochs, 2),  # below: a val_size past the data is the data's to refuse
        train_subset=min(cfg.train_subset or QUICK_TRAIN, QUICK_TRAIN, max(n_train - val_size, 1)),
        test_subset=min(cfg.test_subset or QUICK_TEST, QUICK_TEST, n_test),
        val_size=val_size,
    )
    return cfg.replace(**{k: v for k, v in shrunk.items() if k not in keep})


QUICK_TRAIN, QUICK_TEST, QUICK_VAL = 10_000, 5_000, 2_000
