"""`scaledl-lab reproduce --long`: does NNT eventually match synchronous SGD?

The quick comparison stops after two epochs, which cannot say whether NNT converges to the same
accuracy later. The long mode runs the simulated methods only (16 workers, the 4×4 torus) on the
full Fashion-MNIST training set with the MLP, every method with the paper's optimiser
(:data:`scaledl_lab.studies.reproduce.PAPER_NNT` for NNT, Adam clipped at 10 for the
baselines), in two phases:

1. **Learning rate.** Each method runs ``TUNE_EPOCHS`` epochs (seed 0) at each rate of the grid
   :data:`scaledl_lab.studies.reproduce.LR_GRID` (its base rate × ⅓, × 1, × 3); the rate whose best
   worker scores highest on the validation split (never the test split) is kept
   (:func:`choose_rates`; the tuning runs are in ``tuning/``).
2. **Convergence.** Each method runs ``LONG.epochs`` (≥ 20) epochs at its chosen rate for every
   seed of ``SEEDS``.

The report adds, per run, the virtual time at which the mean test accuracy of its workers first
reaches ``TARGET`` (``time_to_target_s``), and draws accuracy against epochs and against time
with a band of ± one standard deviation over seeds. The simulated runs are independent: ``jobs``
processes run them side by side (one core each; the numbers do not depend on it).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from ..experiment import Results
from ..viz.plots import line_styles
from .claims import LR_VARIANT, SEED, by_method, markdown_line, verdicts
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
from .side_by_side import compare_side_by_side

LONG = Setting("fashion-mnist", "mlp", 20, 64, "adam", 1e-3, 0.0, None, 0)
TUNE_EPOCHS = 2  # the learning-rate phase: each rate of the grid, one seed
SEEDS = (0, 1, 2)
TARGET = 0.85  # test accuracy (mean of workers) the time-to-target column waits for
# The paper's method on its main topology against its asynchronous baseline and synchronous SGD
# (one simulated epoch of NNT on the torus costs ~25 s of one core here: 3 methods × 3 seeds × 20
# epochs plus the rate phase fit in about an hour on two idle cores).
LONG_METHODS = ("allreduce", "ps-async", "nnt-torus")


def _sim_methods(setting: Setting) -> list[tuple[str, Any]]:
    """(label, config) of each method of the long comparison at the setting's base rate."""
    sim = _base(setting).replace(runtime="sim", workers=SIM_WORKERS)
    return [
        (label, sim.replace(name=f"{label} · sim · {SIM_WORKERS}w", **changes))
        for label, changes in _methods(SIM_WORKERS, TORUS)
        if label in LONG_METHODS
    ]


def tune_configs(
    setting: Setting = LONG,
    lr_factors: tuple[float, ...] = LR_GRID,
    epochs: int = TUNE_EPOCHS,
) -> list[Any]:
    """The learning-rate phase: each method × rate of the grid, seed 0, ``epochs`` epochs."""
    runs = []
    for _, cfg in _sim_methods(setting):
        runs += _repeat(cfg.replace(epochs=epochs), (0,), lr_factors)
    return runs


def choose_rates(tuning: pd.DataFrame) -> dict[str, float]:
    """The learning rate of each method (run name without its " · lr×F"), chosen on the
    validation accuracy of its best worker (:func:`scaledl_lab.studies.claims.by_method`)."""
    best = by_method(tuning)
    return {
        LR_VARIANT.sub("", run): float(lr) for run, lr in zip(best["run"], best["lr"], strict=True)
    }


def long_configs(
    setting: Setting = LONG,
    seeds: tuple[int, ...] = SEEDS,
    rates: dict[str, float] | None = None,
) -> list[Any]:
    """The convergence phase: each method at its chosen rate (``rates``, from
    :func:`choose_rates`; the base rate where absent) once per seed."""
    runs = []
    for _, cfg in _sim_methods(setting):
        lr = (rates or {}).get(cfg.name, cfg.lr)
        runs += _repeat(cfg.replace(lr=lr), seeds, (1.0,))
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
    styles = line_styles(frame)  # a method's colour as in the other figures of the report
    runs = list(dict.fromkeys(frame.loc[frame["kind"] == "test", "run"]))
    methods: dict[str, list[pd.DataFrame]] = {}
    colours: dict[str, str] = {}
    for run in runs:
        methods.setdefault(SEED.sub("", run), []).append(_mean_test_curve(frame, run))
        colours.setdefault(SEED.sub("", run), styles[run][0])
    for method, curves in methods.items():
        joined = pd.concat(curves, keys=range(len(curves))).groupby(level=1)
        mean, sd = joined.mean(), joined.std(ddof=1).fillna(0.0)
        xs = mean.index if x == "epoch" else mean["time"]
        colour = colours[method]
        ax.plot(xs, mean["accuracy"], color=colour, label=method)
        lo, hi = mean["accuracy"] - sd["accuracy"], mean["accuracy"] + sd["accuracy"]
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.2)
    ax.set_xlabel("epoch" if x == "epoch" else "virtual time (s)")
    ax.set_ylabel("test accuracy (mean of workers)")
    ax.set_title(f"test accuracy vs {x}, ± 1 sd over seeds")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def write_long_report(
    results: Results,
    out: Path,
    target: float = TARGET,
    tuning: pd.DataFrame | None = None,
    tune_epochs: int = TUNE_EPOCHS,
) -> pd.DataFrame:
    """The comparison table with ``time_to_target_s``, the seed-band figures, the learning-rate
    phase (``tuning``: its comparison table) and the verdicts, appended to summary.md; writes
    ``curves.csv`` (every evaluation row: small enough to keep) and returns the table."""
    table = paper_table(results)
    frame = results.frame
    frame[frame["kind"].isin(["val", "test"])].to_csv(out / "curves.csv", index=False)
    table["time_to_target_s"] = [time_to_target(results.frame, r, target) for r in table["run"]]
    table.to_csv(out / "comparison.csv", index=False)
    for x in ("epoch", "time"):
        seed_bands(results.frame, x).savefig(out / f"seed_bands_vs_{x}.png", dpi=120)
    cols = table[["run", "time_to_target_s"]].to_string(index=False)
    lines = ["", "## The long comparison (simulated, seeds and learning-rate grid)", ""]
    if tuning is not None:
        lines += [
            f"Learning rates, chosen on validation after {tune_epochs} epochs (seed 0); the rate "
            "of each method's kept row is the one every seed below ran with:",
            "",
            report_markdown(tuning),
        ]
    lines += [
        report_markdown(table),
        f"Virtual time to a mean test accuracy of {target:.0%} (NaN: never reached):",
        "",
        "```",
        cols,
        "```",
        "",
        "## Claims of the paper, checked against these figures",
        "",
        *(markdown_line(c) for c in verdicts(table)),
        "",
    ]
    with (out / "summary.md").open("a") as f:
        f.write("\n".join(lines))
    return table


def reproduce_long(
    *,
    out: str | os.PathLike[str],
    setting: Setting = LONG,
    seeds: tuple[int, ...] = SEEDS,
    lr_factors: tuple[float, ...] = LR_GRID,
    tune_epochs: int = TUNE_EPOCHS,
    jobs: int = 2,
    progress: bool = True,
) -> Results:
    """Run the long comparison (simulated only): the learning-rate phase into ``out/tuning``,
    then every method at its chosen rate for each seed into ``out``; write the report."""
    out = Path(out)
    tuning = None
    rates = None
    if len(lr_factors) > 1:
        tuned = compare_side_by_side(
            tune_configs(setting, lr_factors, tune_epochs), out=out / "tuning", jobs=jobs,
            progress=progress,
        )  # fmt: skip
        tuning = paper_table(tuned)
        tuning.to_csv(out / "tuning.csv", index=False)
        rates = choose_rates(tuning)
    configs = long_configs(setting, seeds, rates)
    results = compare_side_by_side(configs, out=out, jobs=jobs, progress=progress)
    write_long_report(results, out, tuning=tuning, tune_epochs=tune_epochs)
    return results


def rewrite_report(
    runs: str | os.PathLike[str], out: str | os.PathLike[str], tune_epochs: int = TUNE_EPOCHS
) -> pd.DataFrame:
    """The report of a finished long comparison (its folder ``runs``: metrics.csv, config.json,
    tuning.csv) written afresh into ``out`` by this version of the report code; no run repeated."""
    runs, out = Path(runs), Path(out)
    results = Results.load(runs)
    tuning_csv = runs / "tuning.csv"
    tuning = pd.read_csv(tuning_csv) if tuning_csv.is_file() else None
    results.save(out)
    if tuning is not None and runs != out:
        tuning.to_csv(out / "tuning.csv", index=False)
    return write_long_report(results, out, tuning=tuning, tune_epochs=tune_epochs)
