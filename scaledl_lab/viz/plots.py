"""Figures and summary tables built only from the tidy metrics table of a run (one row per step).

They show the comparisons asked for by Viviani et al. 2019 ("Deep Learning at Scale"): accuracy
against epochs and time, throughput, and bytes sent per worker per step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..metrics import compression_ratio
from .legends import (  # noqa: F401  (public here too)
    LEGEND_INSIDE,
    LINE_STYLES,
    SEED,
    _choice,
    _runs,
    legend_labels,
    line_styles,
    method_of,
    place_legend,
)
from .utilisation import utilisation_markdown, utilisation_table

METRICS: tuple[str, ...] = ("loss", "accuracy")
X_AXES: tuple[str, ...] = ("epoch", "time", "step")
KINDS: tuple[str, ...] = ("train", "val", "test")
WARMUP_FRACTION = 0.1  # share of each worker's first steps left out of steady-state throughput

_X_LABELS = {"epoch": "epoch", "time": "time (s)", "step": "step"}
_SUMMARY_COLUMNS = (
    "run strategy runtime world_size epochs test_accuracy best_val_accuracy test_loss time_s "
    "samples_per_s bytes_per_step staleness compression_ratio mfu hfu"
).split()


def _require(frame: pd.DataFrame, columns: list[str]) -> None:
    if frame is None or len(frame) == 0:
        raise ValueError("the metrics frame is empty: nothing to plot or summarise")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"the metrics frame lacks column(s) {missing}")


def _new_axes(ax: Axes | None) -> tuple[Figure, Axes]:
    if ax is not None:
        return ax.figure, ax  # type: ignore[return-value]
    # A bare Figure (not pyplot) is never registered globally: nothing to close, no leaks, and
    # Jupyter shows it once when returned.
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    return fig, fig.add_subplot()


def _eval_curve(rows: pd.DataFrame, metric: str, x: str) -> pd.DataFrame:
    """Mean, min and max over ranks of each evaluation (an evaluation is identified by epoch)."""
    agg = rows.groupby("epoch", sort=True).agg(
        x=(x, "mean"),
        y=(metric, "mean"),
        lo=(metric, "min"),
        hi=(metric, "max"),
        n=(metric, "size"),
    )
    return agg.sort_values("x")


def _rows_per_epoch(rows: pd.DataFrame) -> float:
    per_rank = rows.groupby("rank").agg(n=("step", "size"), e=("epoch", "max"))
    per_rank = per_rank[per_rank["e"] > 0]
    return float((per_rank["n"] / per_rank["e"]).median()) if len(per_rank) else 1.0


def _train_curve(rows: pd.DataFrame, metric: str, x: str) -> pd.DataFrame:
    """Average ranks per step, then a rolling mean over about a tenth of an epoch."""
    by_step = rows.groupby("step", sort=True).agg(x=(x, "mean"), y=(metric, "mean"))
    window = max(1, round(_rows_per_epoch(rows) / 10))
    by_step["y"] = by_step["y"].rolling(window, min_periods=1).mean()
    return by_step


def plot_curves(
    frame: pd.DataFrame,
    *,
    metric: str = "accuracy",
    x: str = "epoch",
    kind: str = "test",
    ax: Axes | None = None,
    title: str | None = None,
    styles: dict[str, tuple[str, str]] | None = None,
    legend: str = "auto",
) -> Figure:
    """One line per run of `metric` against `x` for the `kind` rows (train, val or test).

    When several ranks evaluated the same run at the same epoch, the line is their mean and a
    shaded band spans their min and max. Colours and line styles: :func:`line_styles` of
    `frame` (or `styles`, to share them between figures of different frames); runs that differ
    only in their seed share one legend entry (:func:`legend_labels`), placed as
    :func:`place_legend` says of `legend`.
    """
    _choice(metric, METRICS, "metric")
    _choice(x, X_AXES, "x")
    _choice(kind, KINDS, "kind")
    _require(frame, ["run", "kind", "rank", "epoch", "step", x, metric])
    rows = frame[frame["kind"] == kind]
    if rows.empty:
        raise ValueError(f"no rows with kind={kind!r} in the metrics frame")
    fig, ax = _new_axes(ax)
    styles = styles or line_styles(frame)
    labels = legend_labels(_runs(rows))
    for run in _runs(rows):
        run_rows = rows[rows["run"] == run]
        colour, style = styles[run]
        if kind == "train":
            curve = _train_curve(run_rows, metric, x)
        else:
            curve = _eval_curve(run_rows, metric, x)
            if (curve["n"] > 1).any():
                ax.fill_between(curve["x"], curve["lo"], curve["hi"], color=colour, alpha=0.2)
        marker = "o" if kind != "train" and len(curve) <= 30 else None
        label = labels[run] or "_" + str(run)  # a leading underscore: no legend entry
        ax.plot(curve["x"], curve["y"], label=label, color=colour, ls=style, marker=marker, ms=3)
    ax.set_xlabel(_X_LABELS[x])
    ax.set_ylabel(f"{kind} {metric}")
    ax.set_title(title if title is not None else f"{kind} {metric} vs {_X_LABELS[x]}")
    ax.grid(True, alpha=0.3)
    place_legend(ax, legend)
    return fig


def throughput(frame: pd.DataFrame) -> pd.DataFrame:
    """Steady-state throughput per run, from the train rows (one per worker per step).

    Each rank drops its first 10% of steps; its rate is the samples of the remaining steps over
    the time from the end of its last warm-up step (or the run start, if none was dropped) to
    the end of its last step. `samples_per_s` is the sum of the ranks' rates (the whole
    cluster); `steps_per_s` is the mean of the ranks' step rates (steps per worker per second).
    Returns columns run, samples_per_s, steps_per_s, one row per run with train rows.
    """
    _require(frame, ["run", "kind", "rank", "step", "time", "samples"])
    train = frame[frame["kind"] == "train"]
    records = []
    for run in _runs(train):
        sample_rates, step_rates = [], []
        for _, rows in train[train["run"] == run].groupby("rank", sort=True):
            rows = rows.sort_values("step")
            warm = int(WARMUP_FRACTION * len(rows))
            kept = rows.iloc[warm:]
            start = float(rows["time"].iloc[warm - 1]) if warm > 0 else 0.0
            span = float(kept["time"].iloc[-1]) - start
            if span > 0:
                sample_rates.append(float(kept["samples"].sum()) / span)
                step_rates.append(len(kept) / span)
        records.append(
            {
                "run": run,
                "samples_per_s": float(np.sum(sample_rates)) if sample_rates else math.nan,
                "steps_per_s": float(np.mean(step_rates)) if step_rates else math.nan,
            }
        )
    return pd.DataFrame(records, columns=["run", "samples_per_s", "steps_per_s"])


def plot_throughput(frame: pd.DataFrame, ax: Axes | None = None) -> Figure:
    """Bar chart of steady-state samples/s per run (all workers together), see `throughput`."""
    table = throughput(frame)
    fig, ax = _new_axes(ax)
    styles = line_styles(frame)
    labels = [str(r) for r in table["run"]]
    ax.bar(labels, table["samples_per_s"], color=[styles[r][0] for r in table["run"]])
    ax.set_xlabel("run")
    ax.set_ylabel("samples/s (steady state, all workers)")
    ax.set_title("throughput")
    ax.tick_params(axis="x", labelrotation=30)
    for label in ax.get_xticklabels():
        label.set_horizontalalignment("right")
    ax.grid(True, axis="y", alpha=0.3)
    return fig


def _final_eval(rows: pd.DataFrame, metric: str) -> float:
    if rows.empty:
        return math.nan
    last = rows[rows["epoch"] == rows["epoch"].max()]
    return float(last[metric].mean())


def summary_table(frame: pd.DataFrame, configs: Sequence[Any] = ()) -> pd.DataFrame:
    """One row per run: setup, final results, speed, communication and FLOP utilisation.

    epochs: last evaluated epoch; test_accuracy / test_loss: mean over evaluating ranks at the
    last test epoch; best_val_accuracy: best rank-mean validation accuracy over epochs;
    time_s: latest time in the run; bytes_per_step: mean bytes sent per worker per train step;
    staleness: mean over train rows that have one (NaN if none); compression_ratio: bytes the
    train rows would have sent uncompressed over those they sent (1.0 without compression);
    mfu / hfu: model and hardware FLOP utilisation (:mod:`.utilisation`), NaN without the runs'
    ``configs`` or a peak for their device.
    """
    needed = ["run", "strategy", "runtime", "world_size", "rank", "kind", "epoch", "step"]
    needed += ["time", "loss", "accuracy", "samples", "bytes_sent", "staleness"]
    _require(frame, needed)
    rates = throughput(frame).set_index("run")["samples_per_s"]
    used = utilisation_table(configs, rates.to_dict()).set_index("run")[["mfu", "hfu"]]
    used = used.to_dict("index")
    records = []
    for run in _runs(frame):
        rows = frame[frame["run"] == run]
        train = rows[rows["kind"] == "train"]
        test = rows[rows["kind"] == "test"]
        val = rows[rows["kind"] == "val"]
        evals = rows[rows["kind"] != "train"]
        epochs = (evals if len(evals) else rows)["epoch"].max()
        best_val = val.groupby("epoch")["accuracy"].mean().max() if len(val) else math.nan
        records.append(
            {
                "run": run,
                "strategy": rows["strategy"].iloc[0],
                "runtime": rows["runtime"].iloc[0],
                "world_size": int(rows["world_size"].iloc[0]),
                "epochs": float(epochs),
                "test_accuracy": _final_eval(test, "accuracy"),
                "best_val_accuracy": float(best_val),
                "test_loss": _final_eval(test, "loss"),
                "time_s": float(rows["time"].max()),
                "samples_per_s": float(rates.get(run, math.nan)),
                "bytes_per_step": float(train["bytes_sent"].mean()) if len(train) else math.nan,
                # Series.mean skips NaN and gives NaN (without a warning) when all are NaN.
                "staleness": float(train["staleness"].astype(float).mean()),
                "compression_ratio": compression_ratio(train),
                **used.get(run, {"mfu": math.nan, "hfu": math.nan}),
            }
        )
    return pd.DataFrame(records, columns=_SUMMARY_COLUMNS)


def _fmt(value: float, spec: str) -> str:
    return "n/a" if value is None or pd.isna(value) else format(value, spec)


def _fmt_bytes(value: float) -> str:
    if pd.isna(value):
        return "n/a"
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def summary_markdown(frame: pd.DataFrame, configs: Sequence[Any] = ()) -> str:
    """`summary_table` as a GitHub markdown table with human-readable numbers; with the runs'
    ``configs``, their MFU and HFU, and a section that states the formula and each peak."""
    table = summary_table(frame, configs)
    header = ["run", "strategy", "runtime", "workers", "epochs", "test acc (mean of workers)"]
    header += ["val acc (best epoch, mean of workers)"]
    header += ["test loss", "time (s)", "samples/s", "sent/worker/step", "staleness"]
    compressed = bool((table["compression_ratio"].fillna(1.0) != 1.0).any())
    header += ["compression"] if compressed else []
    header += ["MFU", "HFU"] if configs else []
    # Text columns left-aligned, numbers right-aligned.
    align = [":---"] * 3 + ["---:"] * (len(header) - 3)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    for r in table.itertuples(index=False):
        cells = [
            str(r.run).replace("|", "\\|"),
            str(r.strategy).replace("|", "\\|"),
            str(r.runtime),
            str(r.world_size),
            _fmt(r.epochs, "g"),
            _fmt(r.test_accuracy, ".2%"),
            _fmt(r.best_val_accuracy, ".2%"),
            _fmt(r.test_loss, ".4f"),
            _fmt(r.time_s, ".1f"),
            _fmt(r.samples_per_s, ",.1f"),
            _fmt_bytes(r.bytes_per_step),
            _fmt(r.staleness, ".2f"),
        ] + ([f"×{_fmt(r.compression_ratio, '.1f')}"] if compressed else [])
        cells += [_fmt(r.mfu, ".2%"), _fmt(r.hfu, ".2%")] if configs else []
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    if not configs:
        return text
    rates = throughput(frame).set_index("run")["samples_per_s"].to_dict()
    return text + utilisation_markdown(utilisation_table(configs, rates))


def _runtime_words(runtime: str) -> str:
    return {"sim": "simulated workers", "dask": "real Dask workers"}.get(runtime, runtime)


def standard_figures(frame: pd.DataFrame) -> list[tuple[str, Figure]]:
    """The standard figures of `frame`, by file name: accuracy and loss against epoch and time,
    and the throughput.

    Curves use the test split, or the validation split when there are no test rows (or the
    smoothed training curves when there is neither).
    """
    _require(frame, ["run", "kind"])
    kinds = set(frame["kind"])
    kind = "test" if "test" in kinds else "val" if "val" in kinds else "train"
    figures: list[tuple[str, Figure]] = []
    styles = line_styles(frame)
    runtimes = list(dict.fromkeys(frame["runtime"].dropna())) if "runtime" in frame else []
    for x in ("epoch", "time"):
        for metric in ("accuracy", "loss"):
            if len(runtimes) > 1:
                # Wall-clock and virtual time do not share an axis, and real and simulated runs
                # differ in scale: one panel per runtime (stacked, each legend beside its panel).
                fig = Figure(figsize=(9.6, 4.2 * len(runtimes)), layout="constrained")
                for ax, runtime in zip(fig.subplots(len(runtimes), 1), runtimes, strict=True):
                    part = frame[frame["runtime"] == runtime]
                    clock = "virtual" if runtime == "sim" else "wall-clock"
                    axis = f"{clock} time" if x == "time" else "epoch"
                    title = f"{kind} {metric} vs {axis} ({runtime}: {_runtime_words(runtime)})"
                    plot_curves(part, metric=metric, x=x, kind=kind, ax=ax, title=title,
                                styles=styles, legend="outside")  # fmt: skip
            else:
                fig = plot_curves(frame, metric=metric, x=x, kind=kind, styles=styles)
            figures.append((f"{metric}_vs_{x}.png", fig))
    figures.append(("throughput.png", plot_throughput(frame)))
    return figures


def save_standard_plots(frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write :func:`standard_figures` as PNGs into `out_dir` and return their paths (each
    cropped to what it draws, its legends included)."""
    _require(frame, ["run", "kind"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, fig in standard_figures(frame):
        path = out / name
        fig.savefig(path, dpi=120, bbox_inches="tight")
        # Bare Figures are not tracked by pyplot; clearing frees their artists right away.
        fig.clear()
        paths.append(path)
    return paths
