"""The kernel-drift study's cloud (``benchmarks/kernel_drift.py``): one config's test accuracy
over seeds and CPU kernel sets, one column per run, beside the run a notebook just made."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from matplotlib.figure import Figure


def drift_cloud(runs: pd.DataFrame, this_run: pd.Series, order: Sequence[str]) -> Figure:
    """Each draw of ``runs`` (the study's ``runs.csv`` rows of one case: run, kernel,
    capability, test_acc) as a dot, kernel sets side by side within a run's column, and
    ``this_run`` (test accuracy by run) as a black diamond. The legend sits under the axes,
    clear of the dots and of the title."""
    order = list(order)
    fig = Figure(figsize=(9.5, 4.0), layout="constrained")
    ax = fig.subplots()
    kernels = list(dict.fromkeys(runs["kernel"]))
    for k, kernel in enumerate(kernels):
        rows = runs[runs["kernel"] == kernel]
        shift = 0.12 * (k - (len(kernels) - 1) / 2)
        x = [order.index(r) + shift for r in rows["run"]]
        seeds = rows["seed"].nunique() if "seed" in rows else len(rows)
        label = f"{kernel} ({rows['capability'].iloc[0]}) kernels, {seeds} seeds"
        ax.scatter(x, rows["test_acc"], s=18, alpha=0.8, label=label)
    ax.scatter(range(len(order)), this_run[order], marker="D", color="black", zorder=3,
               label="this run (seed 0)")  # fmt: skip
    ax.set_xticks(range(len(order)), order)
    ax.set(ylabel="test accuracy",
           title="One config, seeds × kernel sets: which runs a rounding change moves")  # fmt: skip
    ax.grid(axis="y", alpha=0.3)
    fig.legend(loc="outside lower center", ncols=len(kernels) + 1, fontsize="small")
    return fig
