"""Notebook 11's measurements of the model-parallel family. The pipeline schedules side by side:
GPipe, 1F1B, interleaved 1F1B and zero bubble H1 run on the simulator, their Gantt charts on one
time axis, each bubble measured beside the cost model's prediction for the run's own stages and
the formula for equal ones (:mod:`scaledl_lab.strategies.model_parallel.schedules`). Tensor
against sequence parallelism: what one worker sends and saves for backward, per degree."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from ... import families
from ...config import ExperimentConfig
from ...experiment import run
from ...strategies.model_parallel import schedules
from ...viz.gantt import bubble_summary, plot_pipeline

FOUR_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")


def compare_schedules(
    stages: int = 4,
    micro_batches: int = 8,
    virtual_stages: int = 2,
    strategies: Sequence[str] = FOUR_SCHEDULES,
    fig: Any = None,
    zoom: tuple[float, float] | None = None,
    **config: Any,
) -> pd.DataFrame:
    """Run the pipeline schedules on the simulator (free messages unless ``network`` is given;
    the CNN on Fashion-MNIST unless ``config`` says otherwise) and draw their Gantt charts one
    above the other, on one time axis. Returns per strategy: the bubble measured from the
    events, the one the cost model predicts for the run's own stage costs (the schedule
    replayed, :func:`~scaledl_lab.strategies.model_parallel.schedules.predicted_bubble`), the
    formula with equal stages, and the peak stashed micro-batches (most over the stages).

    ``zoom`` (seconds from the step's start) adds a last panel: the interleaved schedule's
    chart again over that window, where the ops of its short chunks are wide enough to hold
    their labels."""
    base = dict(
        runtime="sim", workers=stages, model="cnn", dataset="fashion-mnist",
        micro_batches=micro_batches, batch_size=4 * micro_batches, max_steps=2,
        train_subset=16 * micro_batches, test_subset=16, val_size=16, network="custom:0:1e18",
    )  # fmt: skip
    base.update(config)
    interleaved = [name for name in strategies if families.has(name, "interleaves")]
    if zoom is not None and not interleaved:
        raise ValueError(f"zoom={zoom} shows an interleaved schedule, and {strategies} has none")
    panels = len(strategies) + (zoom is not None)
    if fig is None:
        fig = plt.figure(figsize=(11, 2.2 * panels))
    axes = fig.subplots(panels, 1, squeeze=False)[:, 0]
    for ax in axes[1 : len(strategies)]:
        ax.sharex(axes[0])  # the schedules on one time axis; the zoom on its own
    records = []
    for name, ax in zip(strategies, axes, strict=False):
        v = virtual_stages if families.has(name, "interleaves") else 1
        cfg = ExperimentConfig(strategy=name, virtual_stages=v, **base)
        res = run(cfg, progress=False)
        outs = [o for o in res.outputs[cfg.label] if o.get("replica", 0) == 0]
        shares = dict(kv for o in outs for kv in o["chunk_shares"].items())
        p, m = cfg.model_parallel_size, cfg.micro_batches
        measured = bubble_summary(res.events)["bubble"].mean()
        predicted = schedules.predicted_bubble(name, p, m, v, [shares[k] for k in sorted(shares)])
        formula = schedules.bubble(name, p, m, v)
        plot_pipeline(res.events, cfg.label, step=1, ax=ax, from_zero=True)
        ax.set_title(f"{name}" + (f" (V={v})" if v > 1 else "") + f": bubble measured "
                     f"{measured:.1%}, predicted {predicted:.1%}, equal stages {formula:.1%}",
                     fontsize=9)  # fmt: skip
        peak = max(o["peak_stashed"] for o in outs)
        records.append((name, v, measured, predicted, formula, peak))
        if zoom is not None and name == interleaved[0]:
            ax.axvspan(*zoom, facecolor="none", edgecolor="black", linestyle="--")
            plot_pipeline(res.events, cfg.label, step=1, ax=axes[-1], from_zero=True)
            axes[-1].set_xlim(*zoom)
            axes[-1].set_title(f"{name}: the dashed window ({1e3 * zoom[0]:g} to "
                               f"{1e3 * zoom[1]:g} ms), zoomed in", fontsize=9)  # fmt: skip
    for ax in axes[: len(strategies) - 1]:
        ax.set_xlabel("")  # one time axis: read under the last schedule
        ax.tick_params(labelbottom=False)
    columns = ["strategy", "virtual_stages", "measured", "predicted", "equal_stages",
               "peak_stashed"]  # fmt: skip
    return pd.DataFrame(records, columns=columns)


def sequence_parallel_costs(
    degrees: tuple[int, ...] = (2, 4), batch_size: int = 8, seed: int = 0
) -> pd.DataFrame:
    """One training step of gpt-tiny on the simulator under tensor parallelism and under
    sequence parallelism, per degree: what one worker sends, and the bytes it saves for
    backward (all of them, and the LayerNorm regions'), read from the runs themselves."""
    rows = []
    for degree in degrees:
        for sp in (False, True):
            cfg = ExperimentConfig(
                strategy="tensor-parallel", runtime="sim", workers=degree, model="gpt-tiny",
                dataset="licenses", batch_size=batch_size, train_subset=4 * batch_size,
                val_size=batch_size, test_subset=batch_size, epochs=1, max_steps=1, seed=seed,
                sequence_parallel=sp,
            )  # fmt: skip
            res = run(cfg, progress=False, log=None)
            train = res.frame[(res.frame["kind"] == "train") & (res.frame["rank"] == 0)]
            out = res.outputs[cfg.label][0]
            rows.append(
                {
                    "degree": degree,
                    "variant": "sequence parallel" if sp else "tensor parallel",
                    "bytes_sent": int(train["bytes_sent"].iloc[-1]),
                    "block_bytes_sent": out["block_bytes_sent"],
                    "activations": float(train["mem_activations"].iloc[-1]),
                    "norm_activations": out["norm_activations"],
                }
            )
    return pd.DataFrame(rows)
