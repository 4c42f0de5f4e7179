"""Scaling studies on the simulated runtime: speed-up, efficiency, traffic, per-worker timelines.

Weak scaling, as in the paper (the per-worker batch is fixed, the effective batch grows):
speed-up S(N) = N · t_step(1) / t_step(N), efficiency E(N) = S(N) / N. Synchronous data
parallelism adds an allreduce to every step, so E(N) ≈ t_compute / (t_compute + t_allreduce(N))
and the compute/communication ratio decides how far it scales.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from ..analysis import TRAFFIC, method_label, traffic_table
from ..config import ExperimentConfig, check_resources
from ..experiment import compare
from ..strategies.launch import check_data
from ..training.plan import load_for, total_steps

WORKERS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
KIND_COLOURS = {"compute": "#4C72B0", "comm": "#DD8452", "idle": "#CCCCCC"}


def step_time(frame: pd.DataFrame) -> float:
    """Median virtual seconds between consecutive training steps of rank 0."""
    t = frame[(frame["kind"] == "train") & (frame["rank"] == 0)]["time"].to_numpy()
    if len(t) < 2:
        raise ValueError("need at least two training steps to measure a step time")
    return float(np.median(np.diff(t)))


DEFAULT_SETTINGS: dict[str, dict[str, Any]] = {
    "10gbe": {"network": "10gbe"},
    "100g-ib": {"network": "100g-ib"},
}


def scaling_sweep(
    base: ExperimentConfig,
    workers: Sequence[int] = WORKERS,
    settings: dict[str, dict[str, Any]] | None = None,
    steps: int = 4,
) -> pd.DataFrame:
    """Run ``base`` on the sim for every (setting, N); one row each with time split, speed-up.

    ``settings`` maps a label to config changes (network, compute profile, ...).
    ``compute_s`` and ``comm_s`` are rank 0's compute and communication time per step over the
    training steps, read from the recorded timeline; ``idle_s`` is its waiting, ``hidden_s``
    its transfers that ran behind compute (in neither: the step is compute + comm + idle).
    """
    settings = settings or DEFAULT_SETTINGS
    # The sweep reads the clock of the training steps only: no validation, one test sample
    # (evaluation comes before the first step and after the last, outside the steps timed; it
    # was half of a sweep's work).
    quiet = dict(val_size=0, test_subset=1)
    runs = [
        (
            label,
            base.replace(
                runtime="sim",
                workers=n,
                max_steps=steps,
                epochs=1,
                name=f"{label}/{n}w",
                **{**quiet, **changes},
            ),
        )
        for label, changes in settings.items()
        for n in workers
    ]
    for _, cfg in runs:  # every config checked before the first run starts, as compare() does
        check_resources(cfg)
        check_data(cfg)
        if (have := total_steps(cfg)) < max(steps, 2):  # one epoch, N × batch samples a step
            raise ValueError(
                f"scaling sweep: {cfg.label} takes {have} training step(s) of the {steps} asked "
                f"(one epoch of {len(load_for(cfg).train):,} samples, {cfg.workers} workers × "
                f"batch {cfg.batch_size} a step); give it at least "
                f"{max(steps, 2) * cfg.workers * cfg.batch_size:,} training samples"
            )
    records = []
    for setting, cfg in runs:
        # One run at a time, its weights (every worker's, 4.8 MB each for the CNN) dropped
        # with it: the sweep reads the table and the timeline only.
        results = compare([cfg], progress=False)
        frame = results.frame
        train = frame[(frame["kind"] == "train") & (frame["rank"] == 0)]
        t0, t1 = train["time"].iloc[0], train["time"].iloc[-1]  # after step 1 .. last step
        tl = results.timeline(cfg.label)
        del results
        tl = tl[(tl["rank"] == 0) & (tl["start"] >= t0) & (tl["end"] <= t1)]
        spent = (tl["end"] - tl["start"]).groupby(tl["kind"]).sum() / (len(train) - 1)
        records.append(
            {
                "setting": setting,
                "workers": cfg.workers,
                "step_time_s": step_time(frame),
                "compute_s": spent.get("compute", 0.0),
                "comm_s": spent.get("comm", 0.0),
                "idle_s": spent.get("idle", 0.0),
                "hidden_s": spent.get("overlapped", 0.0),  # transfers behind compute
                "bytes_per_step": int(train["bytes_sent"].median()),
            }
        )
    table = pd.DataFrame(records)
    one = table[table["workers"] == 1].set_index("setting")["step_time_s"]
    table["speedup"] = table["workers"] * table["setting"].map(one) / table["step_time_s"]
    table["efficiency"] = table["speedup"] / table["workers"]
    table["compute_comm_ratio"] = table["compute_s"] / table["comm_s"].replace(0.0, np.nan)
    return table


TRAFFIC_WORKERS = (4, 16, 64)
TRAFFIC_EVAL = 64  # samples in each evaluation split of a traffic run (only the bytes matter)


def _square_torus(workers: int) -> str | None:
    side = math.isqrt(workers)
    return f"torus:{side}x{side}" if side * side == workers and side >= 3 else None


def traffic_configs(
    base: ExperimentConfig,
    methods: Sequence[dict[str, Any]],
    workers: Sequence[int] = TRAFFIC_WORKERS,
    steps: int = 2,
) -> list[ExperimentConfig]:
    """Tiny simulated runs of each method at each worker count, to measure how traffic scales.

    Each run takes ``steps`` steps on ``max(workers) × batch × steps`` training samples (one
    subset for all) with small evaluation splits; ``methods`` are config changes, where
    ``topology="torus"`` stands for the square torus of each worker count (counts without one,
    such as 4, are skipped). Runs are named ``traffic · METHOD · Nw``.
    """
    small = dict(
        runtime="sim",
        epochs=1,
        max_steps=steps,
        train_subset=max(workers) * base.batch_size * steps,
        val_size=min(base.val_size, TRAFFIC_EVAL),
        test_subset=min(base.test_subset or TRAFFIC_EVAL, TRAFFIC_EVAL),
        stragglers=None,
    )
    runs = []
    for changes in methods:
        for n in workers:
            topology = changes.get("topology", base.topology)
            if topology == "torus" and (topology := _square_torus(n)) is None:
                continue
            cfg = base.replace(**{**small, **changes, "topology": topology, "workers": n})
            runs.append(cfg.replace(name=f"{TRAFFIC} · {method_label(cfg)} · {n}w"))
    return runs


def traffic_sweep(
    base: ExperimentConfig,
    methods: Sequence[dict[str, Any]],
    workers: Sequence[int] = TRAFFIC_WORKERS,
    steps: int = 2,
) -> pd.DataFrame:
    """Run :func:`traffic_configs` on the simulator; one row per run (see
    :func:`scaledl_lab.analysis.traffic_table`): method, workers, bytes per worker per step,
    bytes through the busiest server per round."""
    results = compare(traffic_configs(base, methods, workers, steps), progress=False, log=None)
    return traffic_table(results)


def workers_axis(ax: Axes, workers: Sequence[int]) -> None:
    """A worker-count x axis on a log2 scale, one labelled tick per count (1, 2, 4, …)."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(workers), labels=[str(n) for n in workers])
    ax.minorticks_off()
    ax.set_xlabel("workers")


def plot_speedup(table: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Speed-up against workers (log-log), one line per setting, with the ideal line."""
    fig = ax.figure if ax is not None else Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = ax or fig.add_subplot()
    for setting, rows in table.groupby("setting", sort=False):
        ax.plot(rows["workers"], rows["speedup"], marker="o", label=setting)
    n = np.array(sorted(table["workers"].unique()))
    ax.plot(n, n, "k--", linewidth=1, label="ideal")
    ax.set(yscale="log", ylabel="speed-up (samples/s vs 1)",
           title="How much faster N workers are than one (weak scaling)")  # fmt: skip
    low = min(1.0, float(table["speedup"].min()))
    ticks = [2.0**k for k in range(math.floor(math.log2(low)), int(math.log2(n.max())) + 1)]
    ax.set_yticks(ticks, labels=[f"{t:g}" for t in ticks])
    ax.yaxis.set_minor_formatter("")
    workers_axis(ax, n)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return fig


def plot_timeline(
    timeline: pd.DataFrame,
    *,
    start: float = 0.0,
    end: float | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Figure:
    """A Gantt chart of compute, communication and idle time per worker, from recorded events."""
    if timeline.empty:
        raise ValueError("the timeline is empty: only simulated runs record events")
    end = timeline["end"].max() if end is None else end
    shown = timeline[(timeline["end"] > start) & (timeline["start"] < end)]
    ranks = sorted(shown["rank"].unique())
    fig = (
        ax.figure
        if ax is not None
        else Figure(figsize=(9, 0.35 * len(ranks) + 1.4), layout="constrained")
    )
    ax = ax or fig.add_subplot()
    for kind, colour in KIND_COLOURS.items():
        bars = shown[shown["kind"] == kind]
        for rank, rows in bars.groupby("rank"):
            spans = [
                (max(s, start), min(e, end) - max(s, start))
                for s, e in zip(rows["start"], rows["end"], strict=False)
            ]
            ax.broken_barh(spans, (rank - 0.4, 0.8), facecolors=colour)
    ax.set(
        xlim=(start, end),
        yticks=ranks,
        xlabel="virtual time (s)",
        ylabel="rank",
        title=title or "per-worker timeline",
    )
    ax.invert_yaxis()
    handles = [Patch(facecolor=c, label=k) for k, c in KIND_COLOURS.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=3)
    return fig
