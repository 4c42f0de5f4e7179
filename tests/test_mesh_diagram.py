"""The mesh's diagram draws the grid's groups: one ring per group of each dimension, dashed
exactly where a hop joins two nodes, every rank labelled with its coordinates."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch

from scaledl_lab.strategies.mesh.grid import Mesh
from scaledl_lab.viz.mesh import mesh_diagram


def _links(ax) -> list[FancyArrowPatch]:
    return [p for p in ax.patches if isinstance(p, FancyArrowPatch)]


def test_each_dimension_draws_its_groups_and_the_node_boundaries():
    mesh = Mesh.parse("dp=2,tp=2,pp=2")
    axes = mesh_diagram(mesh, gpus_per_node=4, axes=Figure().subplots(1, 3))
    by_name = dict(zip(mesh.names, axes, strict=True))
    for name, ax in by_name.items():
        drawn = {p.get_label().split(" ", 1)[1].rsplit(" ", 1)[0] for p in _links(ax)}
        assert drawn == {str(g) for g in mesh.groups(name)}, name
        assert len(_links(ax)) == 4  # four pairs, one link each
    dashed = {n: sum(p.get_linestyle() == "--" for p in _links(ax)) for n, ax in by_name.items()}
    assert dashed == {"dp": 4, "tp": 0, "pp": 0}  # dp pairs rank r with r + 4: the other node
    assert by_name["dp"].get_title() == "dp=2: 4 groups, 4 of 4 cross nodes"
    assert by_name["tp"].get_title() == "tp=2: 4 groups, all inside a node"
    texts = [t.get_text() for t in by_name["pp"].texts]
    assert "rank 5\ndp1 tp0 pp1" in texts and texts.count("node 1") == 1


def test_a_group_of_four_is_a_ring_and_tp_outermost_crosses_nodes():
    axes = mesh_diagram("tp=4,dp=2", gpus_per_node=4, axes=Figure().subplots(1, 2))
    tp = _links(axes[0])
    assert len(tp) == 2 * 4  # two rings of four hops
    assert sorted(p.get_label() for p in tp if p.get_linestyle() == "--") == [
        "tp (0, 2, 4, 6) 2-4", "tp (0, 2, 4, 6) 6-0", "tp (1, 3, 5, 7) 3-5", "tp (1, 3, 5, 7) 7-1",
    ]  # fmt: skip
    assert axes[0].get_title() == "tp=4: 2 groups, 2 of 2 cross nodes"


def test_a_dimension_of_size_one_gets_no_panel_and_the_axes_must_match():
    assert len(mesh_diagram("dp=1,tp=4", axes=[Figure().subplots()])) == 1
    with pytest.raises(ValueError, match=r"mesh dp=2,tp=4 has 2 dimensions above 1; got 1 axes"):
        mesh_diagram("dp=2,tp=4", axes=[Figure().subplots()])
