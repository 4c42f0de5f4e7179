"""The communication diagrams draw what they claim: one arrow per message direction."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from scaledl_lab.viz import diagrams


def _arrows(ax) -> int:
    return sum(isinstance(p, FancyArrowPatch) for p in ax.patches)


def test_ring_allreduce_has_one_arrow_per_rank():
    ax = diagrams.ring_allreduce_diagram(5, ax=Figure().subplots())
    assert _arrows(ax) == 5
    assert "N = 5" in ax.get_title()


def test_parameter_server_links_every_worker_to_every_server_both_ways():
    ax = diagrams.parameter_server_diagram(workers=3, servers=2, ax=Figure().subplots())
    assert _arrows(ax) == 2 * 3 * 2  # a push and a pull per (worker, server)


def test_topology_diagram_draws_each_link_once():
    ring = diagrams.topology_diagram("ring", 8, ax=Figure().subplots())
    assert _arrows(ring) == 8 and "2 neighbours" in ring.get_title()
    # A 3×3 torus has 18 links; 12 lie on the grid, 6 wrap around (drawn as two stubs each).
    torus = diagrams.topology_diagram("torus:3x3", 9, ax=Figure().subplots())
    assert _arrows(torus) == 12 + 2 * 6


def test_workers_axis_labels_every_power_of_two_once():
    from scaledl_lab.studies.scaling import workers_axis

    ax = Figure().subplots()
    ax.plot([1, 2, 4, 8, 16], [1, 2, 3, 4, 5])
    workers_axis(ax, [1, 2, 4, 8, 16])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8", "16"]
    assert ax.get_xscale() == "log"


def test_zero_diagram_fills_what_each_stage_keeps():
    from matplotlib.patches import Rectangle

    n = 4
    for stage in range(4):
        ax = diagrams.zero_diagram(stage, n, ax=Figure().subplots())
        filled = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_label()]
        whole = 3 - stage  # states kept whole: the first 3 - stage of params, grads, optimiser
        assert len(filled) == n * (whole * n + stage), stage


def test_diloco_diagram_chains_h_inner_steps_per_worker_into_one_allreduce():
    ax = diagrams.diloco_diagram(workers=3, inner_steps=4, ax=Figure().subplots())
    # per worker: H arrows along its inner steps and one to the allreduce; then the outer step
    # and the way back to every worker's start
    assert _arrows(ax) == 3 * (4 + 1) + 2
    assert "H = 4" in ax.get_title()
