"""Imports point one way (DESIGN.md): errors → foundations → runtime → worker → strategies →
analysis → experiment → tools. Every import is read from the source, lazy ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "scaledl_lab"

# The layer of each module (a key covers the modules below it; the longest key counts). A module
# may import only modules of its own layer or below; imports within a layer must not form a cycle.
LAYERS: dict[str, int] = {
    "errors": 0, "contract": 0,
    "config": 1, "topology": 1, "models": 1, "data": 1, "runtime.sim.cost": 1,
    "runtime.sim.cost_checks": 1, "metrics": 1, "params": 1,
    "runtime.dask.cluster": 1, "strategies.model_parallel.partition": 1, "training.plan": 1,
    "strategies.large_batch.recipe": 1, "training.schedule": 1, "strategies.large_batch.checks": 1,
    "training.optim": 1, "training": 1,
    "strategies.compression": 1, "training.faults": 1, "training.checkpoint": 1, "environment": 1,
    "runtime": 2,
    "training.worker": 3, "training.snapshots": 3,
    "strategies": 4, "strategies.compression.messages": 4, "strategies.compression.gossip": 4,
    "training.launch": 5, "analysis": 5, "studies.claims": 5, "viz.gantt": 5, "viz.diagrams": 5,
    "training.reference": 5, "viz.plots": 5, "strategies.large_batch.sharpness": 5,
    "strategies.large_batch.report": 5, "training.health": 5,
    "experiment": 6, "studies": 7, "viz": 5,
    "studies.reproduce": 7, "studies.scaling": 7, "studies.calibrate": 7, "viz.widgets": 7,
    "cli": 7, "__init__": 7,
    "strategies.large_batch.study": 7,
    "strategies.compression.study": 7, "strategies.compression.report": 7,
    "training.resume": 7, "studies.long_run": 7, "studies.side_by_side": 6,
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Package modules ``path`` imports anywhere in its body (functions included)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("scaledl_lab")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("scaledl_lab"):
                continue
            for alias in node.names:  # `from . import topology` imports a module
                sub = f"{target}.{alias.name}"
                found.add(sub if _is_module(sub) else target)
    found.discard(name)
    return found


def _is_module(name: str) -> bool:
    rel = Path(*name.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in sorted(PACKAGE.rglob("*.py"))}


def _layer(module: str) -> int:
    """The layer of the longest key of LAYERS that names ``module`` or a package above it."""
    name = module.partition(".")[2] or "__init__"
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        key = ".".join(parts[:k])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"{module} has no layer: add it to LAYERS in {Path(__file__).name}")


def test_every_import_points_down_or_sideways():
    wrong = [
        f"{m} (layer {_layer(m)}) imports {t} (layer {_layer(t)})"
        for m, targets in _graph().items()
        for t in sorted(targets)
        if _layer(t) > _layer(m)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles():
    graph = _graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert not cycles, "\n".join(" → ".join(c) for c in cycles)


@pytest.mark.parametrize("above", ["strategies", "training", "models", "experiment"])
def test_the_runtime_runs_what_it_is_given(above):
    offenders = [
        m
        for m, targets in _graph().items()
        if m.startswith("scaledl_lab.runtime")
        and any(
            t == f"scaledl_lab.{above}" or t.startswith(f"scaledl_lab.{above}.") for t in targets
        )
    ]
    assert not offenders, f"{offenders} import scaledl_lab.{above}"


def test_no_library_file_is_too_long():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 350
    }
    assert not long, long
