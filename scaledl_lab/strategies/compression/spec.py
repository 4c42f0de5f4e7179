"""``compress`` specs (``none``, ``onebit``, ``qsgd:LEVELS``, ``topk:RATIO``, ``dgc:RATIO``,
``powersgd:RANK``): parsing, validation before any cluster starts, and building the compressor
and the memory (error feedback, DGC's momentum correction) one worker uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ... import families
from ...contract import COMPRESSORS
from ...errors import ConfigError, choices
from .compressors import DGC, QSGD, Compressor, NoCompression, OneBit, TopK
from .feedback import DGCMemory, ErrorFeedback
from .powersgd import PowerSGD
from .wire import Layout

SPELLINGS = "none, onebit, qsgd:LEVELS, topk:RATIO, dgc:RATIO, powersgd:RANK"
MAX_QSGD_LEVELS = 2**15 - 1  # the widest fixed-width code is 16 bits


@dataclass(frozen=True)
class CompressionSpec:
    """A parsed ``compress`` value: the compressor's name and its one parameter."""

    name: str
    ratio: float | None = None  # topk, dgc
    levels: int | None = None  # qsgd
    rank: int | None = None  # powersgd

    @property
    def is_none(self) -> bool:
        return self.name == "none"

    def compressor(
        self,
        layout: Layout,
        *,
        seed: int = 0,
        warmup: bool = True,
        error_feedback: bool = False,
    ) -> Compressor:
        """A compressor for flat vectors of ``layout``. ``seed``: QSGD's draws, PowerSGD's first
        Q (equal on every worker of an allreduce); ``warmup``: DGC's sparsity warm-up;
        ``error_feedback``: the compressor is used with it (QSGD is then made contractive)."""
        if self.name == "onebit":
            return OneBit(layout)
        if self.name == "qsgd":
            assert self.levels is not None
            return QSGD(layout, self.levels, seed=seed, contractive=error_feedback)
        if self.name == "topk":
            assert self.ratio is not None
            return TopK(layout, self.ratio)
        if self.name == "dgc":
            assert self.ratio is not None
            return DGC(layout, self.ratio, warmup=warmup)
        if self.name == "powersgd":
            assert self.rank is not None
            return PowerSGD(layout, self.rank, seed=seed)
        return NoCompression(layout)

    def memory(
        self, *, error_feedback: bool, momentum: float = 0.0, world_size: int = 1
    ) -> ErrorFeedback:
        """Error feedback (``error_feedback``), or DGC's memory: its momentum correction takes
        ``momentum`` (0: none) and its clipping threshold is scaled by 1/√world_size."""
        if self.name == "dgc":
            return DGCMemory(momentum, world_size, enabled=error_feedback)
        return ErrorFeedback(enabled=error_feedback)


def parse(spec: str) -> CompressionSpec:
    """A ``compress`` value, or a ConfigError that names the spellings and the allowed range."""
    if not isinstance(spec, str):
        raise ConfigError(f"compress={spec!r} must be a string: one of {SPELLINGS}")
    name, _, arg = spec.partition(":")
    if name not in COMPRESSORS:
        raise ConfigError(f"compress={spec!r} is unknown; allowed: {SPELLINGS}")
    if name in ("none", "onebit"):
        if arg:
            raise ConfigError(f"compress={spec!r}: {name} takes no parameter; write {name!r}")
        return CompressionSpec(name)
    what = {"qsgd": "LEVELS", "topk": "RATIO", "dgc": "RATIO", "powersgd": "RANK"}[name]
    if not arg:
        raise ConfigError(f"compress={spec!r} needs its parameter: {name}:{what}")
    if name in ("topk", "dgc"):
        try:
            ratio = float(arg)
        except ValueError:
            ratio = float("nan")
        if not 0 < ratio <= 1:
            raise ConfigError(
                f"compress={spec!r}: the ratio (the fraction of gradient entries sent) must lie "
                f"in (0, 1], e.g. {name}:0.01; got {arg!r}"
            )
        return CompressionSpec(name, ratio=ratio)
    try:
        value = int(arg)
    except ValueError:
        value = 0
    if name == "powersgd" and value < 1:
        raise ConfigError(
            f"compress={spec!r}: the rank must be a positive integer (rank 0 sends nothing), "
            f"e.g. powersgd:2; got {arg!r}"
        )
    if name == "qsgd" and not 1 <= value <= MAX_QSGD_LEVELS:
        raise ConfigError(
            f"compress={spec!r}: the number of levels must be an integer from 1 to "
            f"{MAX_QSGD_LEVELS}, e.g. qsgd:4; got {arg!r}"
        )
    return (
        CompressionSpec(name, levels=value) if name == "qsgd" else CompressionSpec(name, rank=value)
    )


def check_config(cfg: Any) -> None:
    """ConfigErrors of the compression fields (runs before any cluster starts)."""
    spec = parse(cfg.compress)
    if not isinstance(cfg.error_feedback, bool):
        raise ConfigError(f"error_feedback={cfg.error_feedback!r} must be True or False")
    if not spec.is_none and not families.has(cfg.strategy, "compressible"):
        raise ConfigError(
            f"compress={cfg.compress!r} does not apply to strategy={cfg.strategy!r}: its "
            "messages carry no gradients (shared memory, weights or activations); compression "
            f"applies to {choices(families.with_capability('compressible'))}"
        )


def momentum_correction(cfg: Any) -> float:
    """The momentum that DGC's correction takes over from the optimiser (0.0 when it does not):
    SGD with momentum, on a strategy whose sent gradient is a replica's whole update (not NNT,
    whose receivers step with their own optimiser, nor D-PSGD, which sends weights)."""
    if (
        str(cfg.compress).startswith("dgc:")
        and cfg.optimizer == "sgd"
        and families.has(cfg.strategy, "sends_replica_update")
    ):
        return float(cfg.momentum)
    return 0.0


def optimiser_changes(cfg: Any) -> families.OptimiserChanges:
    """DGC's momentum correction keeps the momentum in each worker's compressor: the optimiser
    then steps without it (the family's record hands this to the loop)."""
    return families.OptimiserChanges(momentum=0.0 if momentum_correction(cfg) else None)
