"""Runs a student can trust: each strategy family's default optimiser, and a warning for a run
that ends near chance or whose loss explodes, naming the likely cause.

One SGD setting does not suit every family. NNT applies 1 + degree gradients per step with its
local optimiser (the paper's runs used AdaGrad 0.01, weight decay 1e-4); an asynchronous
parameter server applies gradients up to N − 1 steps stale, which momentum compounds. Each
family's record says which of its strategies train with what, and why
(:class:`scaledl_lab.families.OptimiserDefault`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .. import families
from ..config import DEFAULT_OPTIMISER, ExperimentConfig
from ..data import num_classes
from ..errors import DivergenceError
from ..families import OPTIMISER_FIELDS

NEAR_CHANCE = 1.5  # a final test accuracy below 1.5 × chance (15% of ten classes) counts
EXPLODED = 3.0  # a final test loss above 3 × ln(classes), the loss of a uniform guess


def recommended(strategy: str) -> dict[str, Any]:
    """The optimiser settings a strategy's family trains with (the config's own defaults for
    the synchronous and the remaining families)."""
    default = families.optimiser_default(strategy)
    if default is not None:
        return dict(default.settings)
    return {name: DEFAULT_OPTIMISER[name] for name in OPTIMISER_FIELDS}


def _setting(cfg: ExperimentConfig) -> str:
    text = f"{cfg.optimizer} lr {cfg.lr:g}"
    text += f", momentum {cfg.momentum:g}" if cfg.optimizer == "sgd" and cfg.momentum else ""
    return text + (f", weight decay {cfg.weight_decay:g}" if cfg.weight_decay else "")


def likely_cause(cfg: ExperimentConfig) -> str:
    """Why a run of ``cfg`` may fail to train, in words, and what trains instead."""
    fix = recommended(cfg.strategy)
    flags = f"--optimizer {fix['optimizer']} --lr {fix['lr']:g} --momentum {fix['momentum']:g}"
    flags += f" --weight-decay {fix['weight_decay']:g}"
    if all(getattr(cfg, name) == value for name, value in fix.items()):
        return (
            f"it already uses its family's setting ({_setting(cfg)}); too few steps or samples "
            "to learn (a tiny or one-epoch run), or a learning rate too large for this model: "
            "try more epochs or data, or a smaller --lr"
        )
    default = families.optimiser_default(cfg.strategy)
    if default is not None and cfg.workers > 1:
        return default.why(cfg, _setting(cfg), flags)
    return f"the step size may be too large for {_setting(cfg)}; try a smaller --lr"


def run_warnings(summary: pd.DataFrame, configs: Sequence[ExperimentConfig]) -> list[str]:
    """One warning per run of ``summary`` (:func:`scaledl_lab.viz.plots.summary_table`) that ends
    near chance or whose test loss exploded, with its likely cause."""
    by_label = {cfg.label: cfg for cfg in configs}
    out = []
    for r in summary.itertuples(index=False):
        cfg = by_label.get(r.run)
        acc, loss = float(r.test_accuracy), float(r.test_loss)
        if cfg is None or math.isnan(acc):
            continue
        classes = num_classes(cfg.dataset)  # a text corpus's: its vocabulary
        chance = 1 / classes
        what = []
        if acc < NEAR_CHANCE * chance:
            what.append(f"ends near chance ({acc:.1%} test accuracy; chance is {chance:.0%})")
        if not math.isfinite(loss) or loss > EXPLODED * math.log(classes):
            what.append(
                f"its test loss exploded ({loss:.3g}; a uniform guess scores "
                f"{math.log(classes):.2f})"
            )
        if what:
            out.append(f"run {r.run}: {' and '.join(what)}; likely cause: {likely_cause(cfg)}")
    return out


def check_finite(loss: float, *, rank: int, epoch: int, step: int) -> None:
    """Stop a diverged run with a recorded reason rather than training on NaNs."""
    if not math.isfinite(loss):
        raise DivergenceError(
            f"training diverged: loss={loss} at epoch {epoch}, step {step} (rank {rank}); "
            "lower the learning rate or add warmup"
        )
