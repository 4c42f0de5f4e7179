"""Mixed precision on the lab's models (Micikevicius et al. 2018): why float16 needs loss
scaling (:func:`gradient_underflow`: the gradient elements that float16 flushes to zero) and
what 16 bits cost in accuracy, bytes and memory (:func:`compare_precisions`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from ...config import ExperimentConfig
from ...experiment import Results, compare
from ...models import build_model
from ...training.plan import load_for
from ...training.precision import INIT_SCALE, Precision
from ...training.reference import one_thread


@one_thread()
def gradient_underflow(
    cfg: ExperimentConfig,
    state: dict[str, torch.Tensor] | None = None,
    *,
    scales: Sequence[float] = (1.0, INIT_SCALE),
    samples: int = 256,
) -> pd.DataFrame:
    """How many of the weight-gradient elements of one batch that are non-zero in float32
    become zero in float16, at each loss scale S (the gradient of S·loss, as a run's backward
    computes it, then divided by S): ``cfg``'s model at ``state`` (default: its initial
    weights), on the first ``samples`` training samples.

    One row per scale: ``loss_scale``, ``nonzero_float32`` (elements), ``zero_in_float16``
    (of those, the ones float16 made zero), ``fraction`` (the ratio), ``overflowed`` (elements
    that became inf or NaN: S too large). Gradients below float16's smallest subnormal, 2**-24,
    flush to zero; a trained model's are smaller than a fresh one's, so a float32-trained
    state shows what a float16 run without scaling loses (a few percent on the MLP)."""
    data = load_for(cfg)
    x, y = data.train.x[:samples], data.train.y[:samples]
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    if state is not None:
        model.load_state_dict(state)
    F.cross_entropy(model(x), y).backward()
    reference = [p.grad for p in model.parameters()]
    rows = []
    for scale in scales:
        half = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        half.load_state_dict(model.state_dict())
        half = Precision("float16", float(scale)).attach(half.half())
        F.cross_entropy(half(x.half()), y).backward()
        pairs = list(zip(reference, (p.grad for p in half.parameters()), strict=True))
        nonzero = sum(int((g != 0).sum()) for g, _ in pairs)
        lost = sum(int(((g != 0) & (h == 0)).sum()) for g, h in pairs)
        rows.append({
            "loss_scale": float(scale),
            "nonzero_float32": nonzero,
            "zero_in_float16": lost,
            "fraction": lost / nonzero if nonzero else float("nan"),
            "overflowed": sum(int((~torch.isfinite(h)).sum()) for _, h in pairs),
        })  # fmt: skip
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class PrecisionComparison:
    """:func:`compare_precisions`' table (one row per precision) and the runs behind it."""

    table: pd.DataFrame
    results: Results  # the runs, one per precision, in the table's order


def compare_precisions(
    cfg: ExperimentConfig,
    precisions: Sequence[str] = ("float32", "bfloat16", "float16"),
    *,
    loss_scale: float | str | None = None,
    **run_options: Any,
) -> PrecisionComparison:
    """Train ``cfg`` once per precision (same seed, batches and epochs; ``loss_scale`` for
    float16, default dynamic) and tabulate, per precision: the final test accuracy and its
    difference from float32's in points, the bytes one worker sent per step, its model states
    (parameters + gradients + optimiser state, the ledger's bytes), the steps skipped on a
    gradient overflow and the last loss scale (float16)."""
    configs = [
        cfg.replace(
            precision=p,
            loss_scale=loss_scale if p == "float16" else None,
            name=f"{cfg.label}-{p}",
        )
        for p in precisions
    ]
    results = compare(configs, **{"progress": False, **run_options})
    frame = results.frame
    rows = []
    for config in configs:
        rows_of = frame[frame["run"] == config.label]
        test = rows_of[rows_of["kind"] == "test"].sort_values("step")
        train = rows_of[(rows_of["kind"] == "train") & (rows_of["rank"] == 0)].sort_values("step")
        states = train[["mem_params", "mem_grads", "mem_optim"]].sum(axis=1)
        rows.append({
            "precision": config.precision,
            "test_accuracy": float(test["accuracy"].iloc[-1]),
            "bytes_per_step": float(train["bytes_sent"].median()),
            "model_states": float(states.iloc[-1]),
            "skipped_steps": int(train["skipped"].fillna(0).sum()),
            "loss_scale": float(train["loss_scale"].iloc[-1]),
        })  # fmt: skip
    table = pd.DataFrame(rows)
    base = table.loc[table["precision"] == "float32", "test_accuracy"]
    reference = float(base.iloc[0]) if len(base) else float("nan")
    table.insert(2, "points_vs_float32", 100 * (table["test_accuracy"] - reference))
    return PrecisionComparison(table, results)
