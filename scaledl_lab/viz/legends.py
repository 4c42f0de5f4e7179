"""Legends and line styles of the results figures: one entry per method (seeds share it),
beside the axes when there are many (:mod:`.plots` draws the figures)."""

from __future__ import annotations

import re

import matplotlib
import pandas as pd
from matplotlib.axes import Axes


def _choice(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")


def _runs(frame: pd.DataFrame) -> list[str]:
    return list(pd.unique(frame["run"]))


LINE_STYLES = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)))
SEED = re.compile(r" · seed (\d+)$")  # runs that differ only in their seed: one legend entry
LEGEND_INSIDE = 6  # at most this many legend entries inside the axes; more go beside them


def method_of(run: str) -> tuple[str, str]:
    """(method, variant) of a run named "method · variant …": "nnt-torus · sim · 16w" is
    method "nnt-torus", variant "sim · 16w"; a name without " · " is its own method. A seed
    suffix (" · seed N") is not part of the variant: the seeds of a run look alike."""
    method, _, variant = SEED.sub("", str(run)).partition(" · ")
    return method, variant


def legend_labels(runs: list[str]) -> dict[str, str | None]:
    """The legend entry of each run: runs that differ only in their seed share one entry
    ("allreduce · sim (seeds 0, 1, 2)", on the first of them; None for the others)."""
    seeds: dict[str, list[str]] = {}
    for run in map(str, runs):
        match = SEED.search(run)
        seeds.setdefault(SEED.sub("", run), []).append(match.group(1) if match else "")
    out: dict[str, str | None] = {}
    for run in map(str, runs):
        base = SEED.sub("", run)
        numbers = [n for n in seeds.pop(base, []) if n]  # only the first run finds its base
        if base not in seeds and not numbers and run != base:
            out[run] = None  # a later seed of a run already labelled
        elif len(numbers) > 1:
            out[run] = f"{base} (seeds {', '.join(numbers)})"
        else:
            out[run] = run
    return out


def place_legend(ax: Axes, where: str = "auto") -> None:
    """The axes' legend: inside ("best") when it has at most :data:`LEGEND_INSIDE` entries,
    else beside the axes on the right, so that it covers no curve ("inside"/"outside" force
    one; "none" draws none). Constrained layout and ``bbox_inches="tight"`` make room for it."""
    _choice(where, ("auto", "inside", "outside", "none"), "legend placement")
    entries = len(ax.get_legend_handles_labels()[1])
    if where == "none" or entries == 0:
        return
    if where == "inside" or (where == "auto" and entries <= LEGEND_INSIDE):
        ax.legend(fontsize="small")
    else:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1.0),
                  borderaxespad=0.0, handlelength=3.0)  # fmt: skip


def line_styles(frame: pd.DataFrame) -> dict[str, tuple[str, str]]:
    """(colour, line style) of every run: one colour per method and one line style per variant,
    in order of first appearance, so a method looks the same in every figure of the frame."""
    methods: dict[str, int] = {}
    variants: dict[str, int] = {}
    out = {}
    for run in _runs(frame):
        method, variant = method_of(run)
        m = methods.setdefault(method, len(methods))
        v = variants.setdefault(variant, len(variants))
        colour = f"C{m}" if m < 10 else matplotlib.colormaps["tab20b"](m % 20)
        out[run] = (colour, LINE_STYLES[v % len(LINE_STYLES)])
    return out
