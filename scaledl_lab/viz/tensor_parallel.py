"""Tensor and sequence parallelism of a transformer block, drawn: who holds which heads and
positions, and where f and g communicate (:mod:`..strategies.model_parallel.
parallel_transformer`). What sequence parallelism saves against plain tensor parallelism is
measured by :func:`scaledl_lab.studies.model_parallel.study.sequence_parallel_costs`."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt

from .diagrams import BACKWARD, COLLECTIVE, FORWARD, _arrow, _box

_STEPS = (  # x position, what a rank holds there (TP, SP), communication after it or None
    (0.0, ("LN1\n(all S)", "LN1\nS chunk {p}"), "f"),
    (2.4, ("attention\nheads {h}", "attention\nheads {h}"), "g"),
    (4.8, ("+ and LN2\n(all S)", "+ and LN2\nS chunk {p}"), "f"),
    (7.2, ("MLP\ncolumns {m}", "MLP\ncolumns {m}"), "g"),
    (9.6, ("+\n(all S)", "+\nS chunk {p}"), None),
)


def transformer_block_diagram(
    degree: int = 2, heads: int = 4, *, sequence_parallel: bool = False, ax: Any = None
) -> Any:
    """One pre-LayerNorm block split over ``degree`` ranks (one row each): rank r's heads and
    MLP columns; between the parts, f (forward identity, backward allreduce) and g (forward
    allreduce, backward identity) as vertical links over every rank; with
    ``sequence_parallel``, the LayerNorm regions hold 1/degree of the positions and f, g become
    all-gather and reduce-scatter (the same bytes)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 1.0 * degree + 1.6))
    per = heads // degree
    for r in range(degree):
        y = -1.1 * r
        fill = {
            "p": f"{r + 1} of {degree}",
            "h": f"{r * per}-{(r + 1) * per - 1}" if per > 1 else str(r),
            "m": f"{r + 1}/{degree} of 4h",
        }
        for x, texts, _ in _STEPS:
            _box(ax, x, y, texts[sequence_parallel].format(**fill), width=1.6, height=0.75)
        ax.text(-1.6, y, f"rank {r}", ha="right", va="center", fontsize=9)
    bottom = -1.1 * (degree - 1)
    for x, _, op in _STEPS:
        if op is None:
            continue
        mid = x + 1.2
        if sequence_parallel:
            label = (
                "all-gather\n(bwd: reduce-scatter)"
                if op == "f"
                else "reduce-scatter\n(bwd: all-gather)"
            )
        else:
            label = (
                "f: identity\n(bwd: allreduce)" if op == "f" else "g: allreduce\n(bwd: identity)"
            )
        colour = BACKWARD if op == "f" and not sequence_parallel else COLLECTIVE
        if degree > 1:
            _arrow(ax, (mid, 0.3), (mid, bottom - 0.3), colour, both=True)
        else:
            _arrow(ax, (mid - 0.35, 0), (mid + 0.35, 0), FORWARD)
        ax.text(mid, 0.55, label, ha="center", va="bottom", fontsize=7, color=colour)
    ax.set(xlim=(-2.4, 10.6), ylim=(bottom - 0.7, 1.4))
    ax.set_axis_off()
    what = "sequence parallelism" if sequence_parallel else "tensor parallelism"
    per_block = (
        "an all-gather before and a reduce-scatter after each sub-layer (reversed in backward)"
        if sequence_parallel
        else "g allreduces forward, f backward, around each sub-layer"
    )
    ax.set_title(f"a transformer block under {what}, degree {degree}: {per_block}", fontsize=10)
    return ax
