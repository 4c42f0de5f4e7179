"""The device mesh drawn: every rank in its node, and for each dimension the groups whose
members talk along it (:mod:`..strategies.mesh.grid` gives the groups; rank r lives on node
r // ``gpus_per_node``, as the simulator's two-tier network places it)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from ..strategies.mesh.grid import Mesh

_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3", "#8C8C8C")
_DX, _DY = 1.5, 1.7  # a rank's place: x by its slot in its node, y by its node


def _place(rank: int, per_node: int) -> tuple[float, float]:
    return _DX * (rank % per_node), -_DY * (rank // per_node)


def _links(group: tuple[int, ...]) -> list[tuple[int, int]]:
    """The hops of a ring over ``group`` in rank order (one link for a pair, none alone)."""
    if len(group) < 2:
        return []
    hops = list(zip(group, group[1:], strict=False))
    return hops + ([(group[-1], group[0])] if len(group) > 2 else [])


def _draw_links(ax: Any, name: str, groups: list[tuple[int, ...]], per_node: int) -> int:
    """Each group's ring in its own colour, dashed where a hop joins two nodes; returns how
    many groups cross a node boundary."""
    crossing = 0
    for g, group in enumerate(groups):
        colour = _COLOURS[g % len(_COLOURS)]
        between = False
        for a, b in _links(group):
            (xa, ya), (xb, yb) = _place(a, per_node), _place(b, per_node)
            inter = a // per_node != b // per_node
            between |= inter
            same_row, rows = ya == yb, round(abs(ya - yb) / _DY)
            if same_row and abs(xa - xb) == _DX:  # neighbours: edge to edge
                side = 0.55 if xb > xa else -0.55
                start, end, bend = (xa + side, ya), (xb - side, yb), 0.0
            elif same_row:  # over the ranks between them
                start, end, bend = (xa, ya + 0.3), (xb, yb + 0.3), 0.35
            else:  # from one row to another: leave the box's edge, around the rows between
                edge = 0.3 if yb < ya else -0.3
                shift = 0.1 * g
                start, end = (xa + shift, ya - edge), (xb + shift, yb + edge)
                bend = 0.12 if rows == 1 else 0.25
            ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-", color=colour, linewidth=2,
                                         linestyle="--" if inter else "-",
                                         connectionstyle=f"arc3,rad={-bend}",
                                         label=f"{name} {group} {a}-{b}"))  # fmt: skip
        crossing += between
    return crossing


def mesh_diagram(
    mesh: str | Mesh, gpus_per_node: int | None = None, *, axes: Any = None
) -> list[Any]:
    """One panel per dimension of size above 1, outermost first: the ranks in their nodes
    (each box: the rank and its coordinates), and each group of that dimension as a ring of
    its own colour, dashed where it crosses from one node to another. ``axes``: one per such
    dimension (None: a new figure). Returns the axes."""
    grid = mesh if isinstance(mesh, Mesh) else Mesh.parse(mesh)
    names = [n for n in grid.names if grid.size(n) > 1]
    world = grid.world_size
    per_node = gpus_per_node or world
    nodes = -(-world // per_node)
    if axes is None:
        _, axes = plt.subplots(
            1, len(names), figsize=(3.3 * len(names) * min(per_node, world) / 4, 2.2 * nodes)
        )
    axes = list(axes) if hasattr(axes, "__iter__") else [axes]
    if len(axes) != len(names):
        raise ValueError(f"mesh {grid} has {len(names)} dimensions above 1; got {len(axes)} axes")
    for ax, name in zip(axes, names, strict=True):
        for node in range(nodes):
            ax.add_patch(FancyBboxPatch((-0.75, -_DY * node - 0.55), _DX * per_node, 1.1,
                                        boxstyle="round,pad=0.08", facecolor="none",
                                        edgecolor="grey", linestyle=":"))  # fmt: skip
            ax.text(-0.8, -_DY * node + 0.62, f"node {node}", fontsize=7, color="grey")
        for rank in range(world):
            x, y = _place(rank, per_node)
            ax.add_patch(FancyBboxPatch((x - 0.55, y - 0.3), 1.1, 0.6, boxstyle="round,pad=0.03",
                                        facecolor="#F2F2F2", edgecolor="black"))  # fmt: skip
            where = " ".join(f"{n}{grid.coordinate(rank, n)}" for n in names)
            ax.text(x, y, f"rank {rank}\n{where}", ha="center", va="center", fontsize=7)
        groups = grid.groups(name)
        crossing = _draw_links(ax, name, groups, per_node)
        across = "all inside a node" if not crossing else f"{crossing} of {len(groups)} cross nodes"
        ax.set_title(f"{name}={grid.size(name)}: {len(groups)} groups, {across}", fontsize=9)
        ax.set(xlim=(-1.0, _DX * per_node - 0.6), ylim=(-_DY * (nodes - 1) - 0.8, 1.0))
        ax.set_axis_off()
    return axes
