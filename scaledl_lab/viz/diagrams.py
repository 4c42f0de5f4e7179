"""Diagrams of communication patterns, drawn by the library so that every notebook shows the
pattern it teaches the same way: who holds what, and what travels between whom."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from .colours import BACKWARD as BACKWARD
from .colours import COLLECTIVE as COLLECTIVE
from .colours import FORWARD as FORWARD
from .ring_diagram import ring_allreduce_diagram as ring_allreduce_diagram
from .ring_diagram import ring_allreduce_steps as ring_allreduce_steps


def _box(ax: Any, x: float, y: float, text: str, width: float = 1.6, height: float = 0.8) -> None:
    ax.add_patch(FancyBboxPatch((x - width / 2, y - height / 2), width, height,
                                boxstyle="round,pad=0.05", facecolor="#F2F2F2",
                                edgecolor="black"))  # fmt: skip
    ax.text(x, y, text, ha="center", va="center", fontsize=9)


def _arrow(ax: Any, start: tuple[float, float], end: tuple[float, float], colour: str,
           label: str = "", both: bool = False) -> None:  # fmt: skip
    style = "<|-|>" if both else "-|>"
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle=style, mutation_scale=12, color=colour,
                                 linewidth=1.5))  # fmt: skip
    if label:
        ax.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, label, ha="center",
                va="bottom", fontsize=7, color=colour)  # fmt: skip


def pipeline_diagram(stages: int, replicas: int = 1, layers: list[int] | None = None, ax=None):
    """Stages in a row (one per worker), activations forward and gradients back between
    neighbours; with several replicas, one row each and an allreduce linking every stage's
    replicas (data × pipeline)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(2.3 * stages + 0.5, 1.5 * replicas + 0.6))
    for r in range(replicas):
        y = -1.6 * r
        for s in range(stages):
            rank = r * stages + s
            detail = f"\n{layers[s]} layers" if layers else ""
            _box(ax, 2.3 * s, y, f"stage {s}\nrank {rank}{detail}")
            if s + 1 < stages:
                _arrow(ax, (2.3 * s + 0.85, y + 0.15), (2.3 * s + 1.45, y + 0.15), FORWARD,
                       "activations" if r == 0 else "")  # fmt: skip
                _arrow(ax, (2.3 * s + 1.45, y - 0.15), (2.3 * s + 0.85, y - 0.15), BACKWARD)
        if r == replicas - 1:
            ax.text(2.3 * (stages - 1) / 2, y - 0.62, "backward: gradients of the activations",
                    ha="center", fontsize=7, color=BACKWARD)  # fmt: skip
    if replicas > 1:
        for s in range(stages):
            _arrow(ax, (2.3 * s - 0.95, 0), (2.3 * s - 0.95, -1.6 * (replicas - 1)), COLLECTIVE,
                   both=True)  # fmt: skip
        ax.text(2.3 * stages - 1.3, -0.8, "allreduce of\neach stage's\ngradients", fontsize=7,
                color=COLLECTIVE)  # fmt: skip
    ax.set(xlim=(-1.2, 2.3 * stages), ylim=(-1.6 * replicas + 0.6, 0.8))
    ax.set_axis_off()
    ax.set_title(f"pipeline: {stages} stages" + (f" × {replicas} replicas" if replicas > 1 else ""))
    return ax


def tensor_parallel_diagram(degree: int, ax=None):
    """One MLP block split over ``degree`` workers: each holds a column slice of the first
    Linear and the matching row slice of the second; an allreduce (Megatron's g) sums their
    partial outputs in the forward pass. Its backward twin (f) sums the partial gradients of
    the block's input, which carries data only when that input needs a gradient: not when the
    block reads the data, as the lab's MLP does, so there one allreduce per step moves data."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 0.9 * degree + 1.0))
    for k in range(degree):
        y = -1.0 * k
        _box(ax, 0, y, f"rank {k}: outputs {k + 1}/{degree} of W1", width=2.4, height=0.6)
        _box(ax, 3.0, y, f"inputs {k + 1}/{degree} of W2", width=1.8, height=0.6)
        _arrow(ax, (1.25, y), (2.05, y), FORWARD, "ReLU" if k == 0 else "")
    _box(ax, 5.6, -0.5 * (degree - 1), "allreduce\n(sum)", width=1.3, height=0.8)
    for k in range(degree):
        _arrow(ax, (3.95, -1.0 * k), (4.9, -0.5 * (degree - 1)), COLLECTIVE)
    ax.text(-1.3, 0.55, "x (every rank)", fontsize=8)
    ax.set(xlim=(-1.5, 6.5), ylim=(-1.0 * degree + 0.3, 0.9))
    ax.set_axis_off()
    ax.set_title(
        f"tensor parallelism, degree {degree}: forward, g allreduces the partial outputs;\n"
        "backward, f allreduces the input's gradient (nothing to send when x is the data)",
        fontsize="medium",
    )
    return ax


def large_batch_diagram(workers: int = 4, accumulate: int = 2, ax=None):
    """Where a large effective batch comes from: each of ``workers`` replicas runs
    ``accumulate`` forward/backward passes on micro-batches of B samples, adding up gradients;
    one allreduce averages them; every replica steps once, on workers × K × B samples."""
    if ax is None:
        _, ax = plt.subplots(figsize=(2.0 * accumulate + 5.0, 0.95 * workers + 1.1))
    for w in range(workers):
        y = -1.0 * w
        for k in range(accumulate):
            _box(ax, 1.9 * k, y, f"rank {w}: micro-batch {k + 1}\nforward, backward", width=1.7,
                 height=0.6)  # fmt: skip
            if k + 1 < accumulate:
                _arrow(ax, (1.9 * k + 0.85, y), (1.9 * k + 1.05, y), FORWARD)
        _arrow(ax, (1.9 * accumulate - 1.05, y), (1.9 * accumulate - 0.1, -0.5 * (workers - 1)),
               COLLECTIVE)  # fmt: skip
    x = 1.9 * accumulate + 0.6
    _box(ax, x, -0.5 * (workers - 1), "allreduce\n(average)", width=1.3, height=0.8)
    _box(ax, x + 2.0, -0.5 * (workers - 1), "one update\nlr(step)", width=1.3, height=0.8)
    _arrow(ax, (x + 0.65, -0.5 * (workers - 1)), (x + 1.35, -0.5 * (workers - 1)), BACKWARD)
    ax.text(-0.9, 0.55, "gradients add up over the micro-batches (1/K each)", fontsize=8,
            color=FORWARD)  # fmt: skip
    ax.set(xlim=(-1.0, x + 2.8), ylim=(-1.0 * workers + 0.4, 0.9))
    ax.set_axis_off()
    ax.set_title(f"effective batch = {workers} workers × {accumulate} micro-batches × B samples "
                 "per update (--accumulate K)")  # fmt: skip
    return ax


def compression_diagram(workers: int = 2, ax=None):
    """Compressed synchronous SGD: each worker adds its residual to its gradient, compresses,
    keeps what the payload left out (error feedback); the payloads are allgathered (PowerSGD:
    P and Q allreduced) and every worker decodes and averages them."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9.5, 1.5 * workers + 0.8))
    for k in range(workers):
        y = -1.5 * k
        _box(ax, 0, y, f"rank {k}\ngradient g{k}", width=1.5)
        _box(ax, 2.3, y, f"p{k} = g{k} + e{k}", width=1.6)
        _box(ax, 4.6, y, "compress C(p)\nbits, levels,\ntop-k, P and Q", width=1.8, height=1.0)
        _arrow(ax, (0.8, y), (1.45, y), FORWARD)
        _arrow(ax, (3.15, y), (3.65, y), FORWARD)
        _arrow(ax, (4.6, y - 0.55), (2.3, y - 0.45), BACKWARD, "")
        ax.text(3.45, y - 0.78, f"e{k} = p{k} − decode(C(p{k}))", fontsize=7, color=BACKWARD,
                ha="center")  # fmt: skip
        _arrow(ax, (5.55, y), (6.9, -0.75 * (workers - 1)), COLLECTIVE, "payload" if k == 0 else "")
    _box(ax, 7.9, -0.75 * (workers - 1), "allgather\n(PowerSGD:\nallreduce P, Q)", width=1.8,
         height=1.1)  # fmt: skip
    _box(ax, 10.2, -0.75 * (workers - 1), "decode all,\naverage", width=1.5)
    _arrow(ax, (8.85, -0.75 * (workers - 1)), (9.4, -0.75 * (workers - 1)), COLLECTIVE)
    ax.set(xlim=(-0.9, 11.1), ylim=(-1.5 * workers + 0.4, 0.8))
    ax.set_axis_off()
    ax.set_title("compressed allreduce with error feedback: what is not sent now is sent later")
    return ax


def diloco_diagram(workers: int = 3, inner_steps: int = 3, ax=None):
    """DiLoCo's round: every worker starts from the global weights θ, takes H inner steps alone
    with its own optimiser, then one allreduce averages the outer gradients Δ = θ − θ_i and the
    outer optimiser (Nesterov) steps θ; every worker goes on from the new θ."""
    if ax is None:
        _, ax = plt.subplots(figsize=(1.7 * inner_steps + 7.5, 1.05 * workers + 1.4))
    middle, gap = -0.5 * (workers - 1), 1.7
    end = 2.0 + gap * inner_steps  # where the arrows to the allreduce start
    for w in range(workers):
        y = -1.0 * w
        _box(ax, 0, y, f"rank {w}: θ{w} ← θ", width=1.4, height=0.6)
        for k in range(inner_steps):
            x = 1.9 + gap * k
            _arrow(ax, (x - gap + 0.66 if k else 0.76, y), (x - 0.66, y), FORWARD)
            _box(ax, x, y, f"inner step {k + 1}\n(own AdamW)", width=1.2, height=0.6)
        _arrow(ax, (end - 0.9, y), (end + 0.55, middle), COLLECTIVE)
    ax.text(end - 0.2, -1.0 * workers + 0.55, "outer gradients θ − θᵢ", fontsize=8,
            color=COLLECTIVE, ha="center")  # fmt: skip
    _box(ax, end + 1.45, middle, "allreduce:\nΔ = mean(θ − θᵢ)", width=1.7, height=0.9)
    _box(ax, end + 3.75, middle, "outer step\nθ ← θ − η(Δ + μv)", width=1.9, height=0.9)
    _arrow(ax, (end + 2.35, middle), (end + 2.75, middle), BACKWARD)
    top = 0.75  # the new θ goes back above the rows, to every worker's next round
    ax.plot([end + 3.75, end + 3.75, 0.0], [middle + 0.5, top, top], color=BACKWARD, lw=1.5)
    _arrow(ax, (0.0, top), (0.0, 0.36), BACKWARD)
    ax.text(end / 2 + 1.5, top + 0.05, "θ, the same on every worker: the next round starts from it",
            fontsize=8, color=BACKWARD, ha="center", va="bottom")  # fmt: skip
    ax.set(xlim=(-0.9, end + 4.85), ylim=(-1.0 * workers + 0.3, top + 0.45))
    ax.set_axis_off()
    ax.set_title(f"DiLoCo: H = {inner_steps} inner steps alone, then one allreduce and one outer "
                 "step per round (local SGD: η = 1, μ = 0)")  # fmt: skip
    return ax


def _ring_positions(count: int, radius: float = 1.6) -> list[tuple[float, float]]:
    angles = [math.pi / 2 - 2 * math.pi * k / count for k in range(count)]  # clockwise from top
    return [(radius * math.cos(a), radius * math.sin(a)) for a in angles]


def _towards(a: tuple[float, float], b: tuple[float, float], gap: float):
    # The segment a → b shortened by ``gap`` at both ends (so arrows stop at the boxes).
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = math.hypot(dx, dy) or 1.0
    ux, uy = dx / length, dy / length
    return (a[0] + gap * ux, a[1] + gap * uy), (b[0] - gap * ux, b[1] - gap * uy)


def parameter_server_diagram(workers: int = 4, servers: int = 2, ax=None):
    """Workers pull the weights from the servers and push gradients back; server ``s`` holds
    shard ``s`` of the flat parameter vector, so every worker talks to every server."""
    if ax is None:
        _, ax = plt.subplots(figsize=(max(6.0, 1.7 * workers + 1.0), 3.6))
    span = 1.7 * (workers - 1)
    server_x = [span * (s + 0.5) / servers for s in range(servers)]
    for s, x in enumerate(server_x):
        _box(ax, x, 1.6, f"server {s}\nshard {s + 1}/{servers} of w", width=1.5)
    for w in range(workers):
        _box(ax, 1.7 * w, -1.0, f"worker {w}\nits own batch", width=1.4)
        for x in server_x:
            a, b = (1.7 * w, -0.55), (x, 1.15)
            nx, ny = b[1] - a[1], a[0] - b[0]  # a normal: push and pull side by side
            nx, ny = 0.09 * nx / math.hypot(nx, ny), 0.09 * ny / math.hypot(nx, ny)
            _arrow(ax, (a[0] - nx, a[1] - ny), (b[0] - nx, b[1] - ny), BACKWARD)
            _arrow(ax, (b[0] + nx, b[1] + ny), (a[0] + nx, a[1] + ny), FORWARD)
    ax.text(span + 0.9, 0.5, "push gradient\nslice", color=BACKWARD, fontsize=8, va="bottom")
    ax.text(span + 0.9, 0.1, "pull weights\nslice", color=FORWARD, fontsize=8, va="top")
    ax.set(xlim=(-0.9, span + 2.3), ylim=(-1.6, 2.2))
    ax.set_axis_off()
    ax.set_title(f"parameter server: {workers} workers, {servers} server shards")
    return ax


def topology_diagram(spec: str = "ring", workers: int = 8, what: str = "gradients", ax=None):
    """The workers of a ring or torus and the links to their neighbours (each link carries
    ``what`` both ways); torus links that wrap around are drawn as stubs off the grid."""
    from ..topology import neighbours, parse

    kind, height, width = parse(spec, workers)
    if ax is None:
        size = (1.3 * width + 1.4, 1.3 * height + 1.2) if kind == "torus" else (4.6, 4.2)
        _, ax = plt.subplots(figsize=size)
    if kind == "torus":
        spots = [(1.3 * (r % width), -1.3 * (r // width)) for r in range(workers)]
    else:
        spots = _ring_positions(workers, radius=0.28 * workers + 0.6)
    for rank, spot in enumerate(spots):
        ax.add_patch(plt.Circle(spot, 0.3, facecolor="#F2F2F2", edgecolor="black"))
        ax.text(*spot, str(rank), ha="center", va="center", fontsize=9)
    for rank in range(workers):
        for other in neighbours(spec, workers, rank):
            if other < rank:
                continue
            a, b = spots[rank], spots[other]
            if math.dist(a, b) <= 1.31 or kind != "torus":  # an edge on the grid or the ring
                _arrow(ax, *_towards(a, b, 0.32), COLLECTIVE, both=True)
            else:  # wrap-around: a stub leaving each end outwards
                ux, uy = (b[0] - a[0]) / math.dist(a, b), (b[1] - a[1]) / math.dist(a, b)
                for p, sign in ((a, -1), (b, 1)):
                    start = (p[0] + sign * 0.32 * ux, p[1] + sign * 0.32 * uy)
                    end = (p[0] + sign * 0.75 * ux, p[1] + sign * 0.75 * uy)
                    _arrow(ax, start, end, COLLECTIVE, both=True)
    xs, ys = [s[0] for s in spots], [s[1] for s in spots]
    ax.set(xlim=(min(xs) - 0.9, max(xs) + 0.9), ylim=(min(ys) - 0.9, max(ys) + 0.9), aspect="equal")
    ax.set_axis_off()
    degree = len(neighbours(spec, workers, 0))
    wrap = "\n(links leaving the grid wrap around to the other side)" if kind == "torus" else ""
    ax.set_title(f"{spec}, {workers} workers: each sends its {what}\n"
                 f"to its {degree} neighbours{wrap}", fontsize=10)  # fmt: skip
    return ax


ZERO_STATES = ("parameters", "gradients", "optimiser state")


def zero_diagram(stage: int, workers: int = 4, ax=None):
    """What each worker holds of the model states at ZeRO stage ``stage`` (0: data
    parallelism): each state a row of ``workers`` chunks, filled where the worker keeps it.
    Stage s shards the last s of parameters, gradients and optimiser state (Rajbhandari et al.
    2020, Figure 1)."""
    if not 0 <= stage <= 3:
        raise ValueError(f"stage must be 0 (data parallelism) to 3, not {stage}")
    if ax is None:
        _, ax = plt.subplots(figsize=(2.2 * workers + 1.5, 1.6))
    width, gap = 1.6, 0.35
    for w in range(workers):
        x0 = w * (width + gap)
        ax.text(x0 + width / 2, 0.55, f"rank {w}", ha="center", fontsize=8)
        for c, name in enumerate(ZERO_STATES):
            sharded = c >= 3 - stage
            for k in range(workers):
                held = not sharded or k == w
                ax.add_patch(plt.Rectangle(
                    (x0 + k * width / workers, -c * 0.5), width / workers, 0.38,
                    facecolor=f"C{c}" if held else "white", edgecolor="#999999",
                    linewidth=0.6, label=name if held else None))  # fmt: skip
    for c, name in enumerate(ZERO_STATES):
        ax.text(-0.1, -c * 0.5 + 0.19, name, ha="right", va="center", fontsize=8)
    ax.set(xlim=(-1.6, workers * (width + gap)), ylim=(-1.1, 0.8))
    ax.set_axis_off()
    title = "data parallelism (allreduce)" if stage == 0 else f"zero{stage}"
    ax.set_title(f"{title}: filled chunks are what each worker holds", fontsize=9)
    return ax
