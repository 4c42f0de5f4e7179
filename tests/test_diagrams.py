"""The communication diagrams draw what they claim: one arrow per message direction."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from scaledl_lab.viz import diagrams


def _arrows(ax) -> int:
    return sum(isinstance(p, FancyArrowPatch) for p in ax.patches)


def test_ring_allreduce_steps_reduce_scatter_then_all_gather():
    n = 5
    steps = diagrams.ring_allreduce_steps(n)
    phases = [phase for phase, _, _ in steps]
    assert phases == ["start"] + ["reduce-scatter"] * (n - 1) + ["all-gather"] * (n - 1)
    for _, _, received in steps[1:]:  # every rank receives exactly one chunk per step
        assert sorted(received) == list(range(n))
    # After reduce-scatter every rank holds exactly one finished sum, chunk r + 1 ...
    _, counts, _ = steps[n - 1]
    for r, row in enumerate(counts):
        assert [c for c in range(n) if row[c] == n] == [(r + 1) % n]
    # ... and after all-gather every chunk of every rank sums all n gradients.
    assert steps[-1][1] == [[n] * n for _ in range(n)]


def test_ring_allreduce_diagram_draws_both_phases_and_outlines_each_received_chunk():
    from matplotlib.patches import Rectangle

    n = 5
    ax = diagrams.ring_allreduce_diagram(n, ax=Figure().subplots())
    chunks = [p for p in ax.patches if isinstance(p, Rectangle)]
    assert len(chunks) == (2 * (n - 1) + 1) * n * n  # a row of n chunks per rank per column
    outlined = [p for p in chunks if p.get_linewidth() > 1]
    assert len(outlined) == 2 * (n - 1) * n
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "reduce-scatter" in texts and "all-gather" in texts
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
