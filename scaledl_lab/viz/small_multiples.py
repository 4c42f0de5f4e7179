"""Many runs as small multiples: a few curves per panel, each panel zoomed to where its curves
part, so that a comparison of a dozen runs stays readable (projected, too)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd
from matplotlib.figure import Figure

from .legends import line_styles
from .plots import plot_curves


def zoom_to_later_evaluations(ax, rows: pd.DataFrame, metric: str, x: str) -> None:
    """Limit ``ax`` to the evaluations after the first (the start, where every run scores the
    same untrained model): the y axis then spans only the differences between the runs."""
    later = rows[rows["epoch"] > rows["epoch"].min()]
    if later.empty:
        return
    lo, hi = float(later[metric].min()), float(later[metric].max())
    pad = 0.08 * (hi - lo) or 0.01
    ax.set_ylim(lo - pad, hi + pad)
    left, right = float(later[x].min()), float(later[x].max())
    margin = 0.05 * (right - left) or 0.05
    ax.set_xlim(left - margin, right + margin)


def small_multiples(
    frame: pd.DataFrame,
    panels: Mapping[str, Sequence[str]],
    *,
    metric: str = "accuracy",
    x: str = "epoch",
    kind: str = "test",
    zoom: bool = True,
    labels: Mapping[str, str] | None = None,
    same_y: bool = False,
) -> Figure:
    """One panel per entry of ``panels`` (its title → its runs), side by side, each run in the
    colour and line style it has in every figure of ``frame`` (:func:`line_styles`), each
    panel's legend under it (over no curve) and, with ``zoom``, its axes zoomed to the
    evaluations after the first (:func:`zoom_to_later_evaluations`). ``labels`` replaces the
    legend entries of the runs it names (to say what differs between panels, an optimiser
    say); ``same_y`` gives every panel one y range, so that heights compare across panels."""
    styles = line_styles(frame)
    fig = Figure(figsize=(4.6 * len(panels), 5.2), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, runs) in zip(axes, panels.items(), strict=True):
        part = frame[frame["run"].isin(list(runs))]
        plot_curves(part, metric=metric, x=x, kind=kind, ax=ax, title=title, styles=styles,
                    legend="none")  # fmt: skip
        for line in ax.get_lines():
            line.set_label((labels or {}).get(line.get_label(), line.get_label()))
        if zoom:
            zoom_to_later_evaluations(ax, part[part["kind"] == kind], metric, x)
        ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.14),
                  handlelength=3.0)  # fmt: skip
    if same_y:
        low = min(ax.get_ylim()[0] for ax in axes)
        high = max(ax.get_ylim()[1] for ax in axes)
        for ax in axes:
            ax.set_ylim(low, high)
    return fig
