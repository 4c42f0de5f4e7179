"""`scaledl-lab reproduce --long`: does NNT eventually match synchronous SGD?

The quick comparison stops after two epochs, which cannot say whether NNT converges to the same
accuracy later. The long mode runs the simulated methods only (16 workers, the 4×4 torus) on the
full Fashion-MNIST training set with the MLP for ``LONG.epochs`` (≥ 20) epochs, every method
with the paper's optimiser (:data:`scaledl_lab.reproduce.PAPER_NNT` for NNT, Adam for the
others), over ``SEEDS`` and the learning-rate grid :data:`scaledl_lab.reproduce.LR_GRID` (each
method's rate chosen on validation by :func:`scaledl_lab.claims.by_method`). It adds, per run,
the virtual time at which the mean test accuracy of its workers first reaches ``TARGET``
(``time_to_target_s``), and draws accuracy against epochs and against time with a band of ± one
standard deviation over seeds.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from .claims import SEED, verdicts
from .experiment import Results, compare
from .reproduce import (
    LR_GRID,
    SIM_WORKERS,
    TORUS,
    Setting,
    _base,
    _methods,
    _repeat,
    paper_table,
    report_markdown,
)

LONG = Setting("fashion-mnist", "mlp", 20, 64, "adam", 1e-3, 0.0, None, 0)
SEEDS = (0, 1, 2)
TARGET = 0.85  # test accuracy (mean of workers) the time-to-target column waits for
LONG_METHODS = ("allreduce", "ps-async", "nnt-ring", "nnt-torus", "dpsgd-torus")


def long_configs(
    setting: Setting = LONG,
    seeds: tuple[int, ...] = SEEDS,
    lr_factors: tuple[float, ...] = LR_GRID,
) -> list[Any]:
    """The simulated runs of the long comparison: each method × learning rate × seed."""
    sim = _base(setting).replace(runtime="sim", workers=SIM_WORKERS)
    runs = []
    for label, changes in _methods(SIM_WORKERS, TORUS):
        if label in LONG_METHODS:
            cfg = sim.replace(name=f"{label} · sim · {SIM_WORKERS}w", **changes)
            runs += _repeat(cfg, seeds, lr_factors)
    return runs


def _mean_test_curve(frame: pd.DataFrame, run: str) -> pd.DataFrame:
    """Epoch, time (latest worker) and mean test accuracy over workers of each evaluation."""
    test = frame[(frame["run"] == run) & (frame["kind"] == "test")]
    return test.groupby("epoch").agg(time=("time", "max"), accuracy=("accuracy", "mean"))


def time_to_target(frame: pd.DataFrame, run: str, target: float = TARGET) -> float:
    """Time of the first evaluation at which the workers' mean test accuracy reaches
    ``target``; NaN if it never does."""
    curve = _mean_test_curve(frame, run)
    hit = curve[curve["accuracy"] >= target]
    return float(hit["time"].iloc[0]) if len(hit) else math.nan


def seed_bands(frame: pd.DataFrame, x: str = "epoch") -> Figure:
    """Mean test accuracy (of the workers) against ``x`` (epoch or time), one line per method
    (seeds averaged; the band spans ± one standard deviation over seeds)."""
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.add_subplot()
    runs = list(dict.fromkeys(frame.loc[frame["kind"] == "test", "run"]))
    methods: dict[str, list[pd.DataFrame]] = {}
    for run in runs:
        methods.setdefault(SEED.sub("", run), []).append(_mean_test_curve(frame, run))
    for i, (method, curves) in enumerate(methods.items()):
        joined = pd.concat(curves, keys=range(len(curves))).groupby(level=1)
        mean, sd = joined.mean(), joined.std(ddof=1).fillna(0.0)
        xs = mean.index if x == "epoch" else mean["time"]
        colour = f"C{i % 10}"
        ax.plot(xs, mean["accuracy"], color=colour, label=method)
        lo, hi = mean["accuracy"] - sd["accuracy"], mean["accuracy"] + sd["accuracy"]
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.2)
    ax.set_xlabel("epoch" if x == "epoch" else "virtual time (s)")
    ax.set_ylabel("test accuracy (mean of workers)")
    ax.set_title(f"test accuracy vs {x}, ± 1 sd over seeds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def write_long_report(results: Results, out: Path, target: float = TARGET) -> pd.DataFrame:
    """The comparison table with ``time_to_target_s``, the seed-band figures and the verdicts,
    appended to summary.md; returns the table."""
    table = paper_table(results)
    table["time_to_target_s"] = [time_to_target(results.frame, r, target) for r in table["run"]]
    table.to_csv(out / "comparison.csv", index=False)
    for x in ("epoch", "time"):
        seed_bands(results.frame, x).savefig(out / f"seed_bands_vs_{x}.png", dpi=120)
    cols = table[["run", "time_to_target_s"]].to_string(index=False)
    lines = [
        "",
        "## The long comparison (simulated, seeds and learning-rate grid)",
        "",
        report_markdown(table),
        f"Virtual time to a mean test accuracy of {target:.0%} (NaN: never reached):",
        "",
        "```",
        cols,
        "```",
        "",
        "## Claims of the paper, checked against these figures",
        "",
        *verdicts(table),
        "",
    ]
    with (out / "summary.md").open("a") as f:
        f.write("\n".join(lines))
    return table


def reproduce_long(
    *, out: str | os.PathLike[str], configs: list[Any] | None = None, progress: bool = True
) -> Results:
    """Run the long comparison (simulated only) and write its results folder."""
    results = compare(configs or long_configs(), out=out, progress=progress)
    write_long_report(results, Path(out))
    return results
