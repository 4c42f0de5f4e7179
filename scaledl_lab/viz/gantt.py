"""The pipeline timeline: the bubble measured from the events table, and its Gantt chart.

Every forward and backward of a pipeline stage is one row of the events table (run, rank,
replica, stage, step, micro-batch, phase, start, end). Within one step of one replica, a stage is
busy for the sum of its events and the step lasts from the first start to the last end; the
bubble is the rest. With equal stage costs it is (p − 1)/(M + p − 1) for GPipe and 1F1B alike,
(p − 1)/(V·M + p − 1) for interleaved 1F1B and about a third of 1F1B's for zero bubble H1
(:func:`~scaledl_lab.strategies.model_parallel.schedules.bubble`);
:func:`scaledl_lab.studies.model_parallel.study.compare_schedules` draws the four side by
side.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch, Rectangle
from matplotlib.text import Text

from .. import families
from ..strategies.model_parallel import schedules

PHASE_COLOURS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
PHASE_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}
LATER_CHUNK_TINT = 0.55  # a worker's later chunks: its phase's colour this far towards white
LABEL_FONT = 8  # points: a label is drawn only inside a bar wide enough to hold it
LABEL_PAD_PX = 2  # pixels of bar left free on each side of a label


def tint(colour: str, share: float) -> tuple[float, float, float]:
    """``colour`` moved ``share`` of the way towards white: opaque, so the idle time's hatching
    does not show through it as it would through a transparent bar."""
    return tuple(c + (1 - c) * share for c in to_rgb(colour))  # type: ignore[return-value]


class BarLabel(Text):
    """A bar's label, drawn only if it fits inside its bar at the size the figure is drawn.

    Whether a label fits depends on the axes' final width and x range (constrained layout,
    shared axes, the dpi), which are known only when the figure is drawn; so the test is made
    then, and a label too wide for its bar (a short op of a long step) is left out rather than
    spilling over its neighbours."""

    def __init__(self, bar: Rectangle, text: str, **kwargs: Any) -> None:
        x, y = bar.get_x() + bar.get_width() / 2, bar.get_y() + bar.get_height() / 2
        super().__init__(x, y, text, ha="center", va="center", **kwargs)
        self.bar = bar

    def fits(self, renderer: Any) -> bool:
        room = self.bar.get_window_extent(renderer).width
        return super().get_window_extent(renderer).width + 2 * LABEL_PAD_PX <= room

    def draw(self, renderer: Any) -> None:
        if self.get_visible() and self.fits(renderer):
            super().draw(renderer)


def bubble_theory(
    stages: int, micro_batches: int, stage_costs: Sequence[float] | None = None
) -> float:
    """The idle fraction of a fill–drain (or 1F1B) step: (p − 1)/(M + p − 1) with equal stage
    costs. Given each stage's cost t_s (free messages), a fill–drain pass lasts
    Σt + (M − 1)·max t — the first micro-batch crosses every stage, the others follow at the pace
    of the slowest — while stage s works M·t_s of it: the mean idle fraction is
    1 − M·mean(t)/(Σt + (M − 1)·max t), which tends to 1 − mean(t)/max(t), not 0, as M grows.
    That is exact for fill–drain; 1F1B's interleaving can hide a little of an imbalance."""
    if stage_costs is None:
        return (stages - 1) / (micro_batches + stages - 1)
    costs = [float(c) for c in stage_costs]
    if len(costs) != stages or min(costs) < 0 or max(costs) <= 0:
        raise ValueError(f"stage_costs needs {stages} non-negative costs, not all zero: {costs}")
    span = sum(costs) + (micro_batches - 1) * max(costs)
    return 1 - micro_batches * sum(costs) / stages / span


def step_bubbles(events: pd.DataFrame) -> pd.DataFrame:
    """Idle fraction of every stage in every step of every replica: columns run, replica,
    step, stage, busy, span, idle."""
    records = []
    for (run, replica, step), rows in events.groupby(["run", "replica", "step"], sort=True):
        span = float(rows["end"].max() - rows["start"].min())
        for stage, mine in rows.groupby("stage", sort=True):
            busy = float((mine["end"] - mine["start"]).sum())
            idle = 1 - busy / span if span > 0 else 0.0
            records.append((run, replica, step, stage, busy, span, idle))
    columns = ["run", "replica", "step", "stage", "busy", "span", "idle"]
    return pd.DataFrame(records, columns=columns)


def bubble_summary(events: pd.DataFrame, outputs: dict[str, list[dict[str, Any]]] | None = None):
    """Per run and stage: the mean bubble over the steps (the first step, which warms up, is
    left out when there are others), and, from the runs' outputs, the peak number and bytes
    of stashed activations."""
    bubbles = step_bubbles(events)
    later = bubbles[bubbles["step"] > 0]
    bubbles = later if len(later) else bubbles
    table = bubbles.groupby(["run", "stage"], sort=False)["idle"].mean().rename("bubble")
    table = table.reset_index()
    if outputs:
        peaks = {
            (run, out["stage"]): (out["peak_stashed"], out["peak_stashed_bytes"])
            for run, outs in outputs.items()
            for out in outs
            if "peak_stashed" in out and out.get("replica", 0) == 0
        }
        keys = zip(table["run"], table["stage"], strict=True)
        found = [peaks.get(key, (None, None)) for key in keys]
        table["peak_stashed"] = [count for count, _ in found]
        table["peak_stashed_bytes"] = [nbytes for _, nbytes in found]
    return table


def plot_pipeline(
    events: pd.DataFrame,
    run: str | None = None,
    step: int = 1,
    replica: int = 0,
    ax: Any = None,
    from_zero: bool = False,
):
    """Gantt chart of one step of one replica: a row per stage, forwards and backwards as
    bars labelled by micro-batch where the label fits (:class:`BarLabel`), the idle time (the
    bubble) shaded. Under interleaving a bar's label ends in the worker's chunk (``F3.1``:
    micro-batch 3's forward through the worker's chunk 1) and its later chunks are tinted. An
    op the cost model charges no time (a chunk holding only the embedding) draws no bar.
    ``from_zero`` counts time from the step's start, so that the charts of several runs line
    up."""
    run = run or events["run"].iloc[0]
    rows = events[(events["run"] == run) & (events["replica"] == replica)]
    if step not in set(rows["step"]):
        step = int(rows["step"].min())
    rows = rows[rows["step"] == step]
    if from_zero:
        origin = rows["start"].min()
        rows = rows.assign(start=rows["start"] - origin, end=rows["end"] - origin)
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * rows["stage"].nunique() + 1.2))
    t0, t1 = rows["start"].min(), rows["end"].max()
    stages = sorted(rows["stage"].unique())
    chunked = "chunk" in rows and rows["chunk"].nunique() > 1  # interleaved: chunks tinted
    for s in stages:
        ax.barh(s, t1 - t0, left=t0, height=0.8, color="#DDDDDD", hatch="//", edgecolor="white")
        for e in rows[(rows["stage"] == s) & (rows["end"] > rows["start"])].itertuples():
            chunk = int(e.chunk) if chunked else 0
            colour = PHASE_COLOURS[e.phase]
            (bar,) = ax.barh(s, e.end - e.start, left=e.start, height=0.8,
                             color=tint(colour, LATER_CHUNK_TINT) if chunk else colour,
                             edgecolor="black", linewidth=0.4)  # fmt: skip
            label = f"{e.phase}{e.micro_batch}" + (f".{chunk}" if chunked else "")
            ax.add_artist(BarLabel(bar, label, fontsize=LABEL_FONT,
                                   color="black" if chunk else "white"))  # fmt: skip
    idle = step_bubbles(rows)["idle"].mean()
    xlabel = "time from the step's start (s)" if from_zero else "time (s)"
    ax.set(yticks=stages, yticklabels=[f"stage {s}" for s in stages], xlabel=xlabel)
    ax.invert_yaxis()
    handles = [Patch(color=PHASE_COLOURS[ph], label=PHASE_NAMES[ph])
               for ph in PHASE_COLOURS if ph in set(rows["phase"])]  # fmt: skip
    if chunked:
        later = tint("#555555", LATER_CHUNK_TINT)
        handles.append(Patch(facecolor=later, label="worker's chunk 1 (.1)"))
    handles.append(Patch(facecolor="#DDDDDD", hatch="//", label="idle (bubble)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_title(f"{run}, step {step}: bubble (hatched) {idle:.0%} of the step")
    return ax


def summary_markdown(events: pd.DataFrame, outputs: dict[str, list[dict[str, Any]]], configs):
    """The pipeline section of summary.md: per run, the measured bubble beside the theory and
    the peak stashed activations of every stage."""
    table = bubble_summary(events, outputs)
    lines = [
        "| run | stages | micro-batches | bubble measured (mean over stages) | theory "
        "(p−1)/(M+p−1), equal stages (interleaved: (p−1)/(V·M+p−1); zb-h1: "
        "(p−1)/(3M+p−1) for M ≥ p) | peak stashed micro-batches per stage | peak stashed MiB "
        "per stage |",
        "| :--- | ---: | ---: | ---: | ---: | :--- | :--- |",
    ]
    for cfg in configs:
        rows = table[table["run"] == cfg.label]
        if rows.empty:
            continue
        # the stages that ran (a mesh's pp, not its tp × pp), and the schedule they ran
        p, m = rows["stage"].nunique(), cfg.micro_batches
        pipeline = families.has(cfg.strategy, "pipeline")  # else a mesh's pp dimension
        schedule = cfg.strategy if pipeline else cfg.pipeline_schedule
        peaks = ", ".join(_or_dash(v, str) for v in rows.get("peak_stashed", []))
        mib = ", ".join(
            _or_dash(v, lambda b: f"{b / 2**20:.2f}") for v in rows.get("peak_stashed_bytes", [])
        )
        lines.append(
            f"| {cfg.label} | {p} | {m} | {rows['bubble'].mean():.1%} | "
            f"{schedules.bubble(schedule, p, m, cfg.virtual_stages):.1%} | {peaks} | {mib} |"
        )
    return "\n".join(lines) + "\n"


def _or_dash(value: Any, show: Any) -> str:
    """A stage's figure, or – where the run did not measure it."""
    return "–" if value is None or value != value else show(value)
