"""Imports point one way (DESIGN.md, "Layout"), lazy ones included: errors, the contract's
names and the families' records → the shared foundations at the root → runtime/ (the Comm
interface, then the two runtimes, which do not import each other) → training/ → strategies/ →
the front door (experiment) → studies/ (the families' studies among them), the notebooks'
panels → cli/. Every import is read from the source. Folders are layers: LAYERS names folders
and root modules, never a module inside a folder of another layer. KNOWN_UPWARD would list an
import that still runs back up, with its reason; it is empty and may only stay so."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "scaledl_lab"

# The layer of each folder and root module below scaledl_lab: a key covers the modules below it.
# A module may import only modules of its own layer or below; imports within a layer must not
# form a cycle. No key sits below another of a different layer: a module that belongs to
# another layer moves to that layer's folder.
LAYERS: dict[str, int] = {
    # what every layer may raise or name, and the families' records every layer may ask (the
    # families fill them from above; the config validates by asking them)
    "errors": 0, "contract": 0, "families": 0,
    # the shared foundations at the root, and the data sources
    "config": 1, "models": 1, "params": 1, "topology": 1, "metrics": 1, "environment": 1,
    "data": 1, "gpt": 1, "moe": 1, "objective": 1, "folders": 1,
    # the communication interface (base.py), what both runtimes share (memory.py) and the two
    # runtimes, peers (PEERS): the simulator with its cost model; Dask with its cluster. The
    # interface imports neither runtime (test_the_comm_interface_imports_neither_runtime).
    "runtime": 2,
    # the per-worker loop and what every strategy uses
    "training": 3,
    # the technique families, one folder each, beside the registry and launch.py (which binds a
    # config's strategy to a runtime, once every family has registered)
    "strategies": 4,
    # reading results tables: the numbers comparisons report, figures and diagrams
    "analysis": 5, "viz": 5,
    # the front door at the root: run / compare / Results (sdl.run)
    "experiment": 6,
    # what runs experiments or reads their results folders: the studies (each family's in
    # studies/<family>/), resuming a run, the notebooks' panels, the graded assignments, the
    # labs' student versions
    "studies": 7, "resume": 7, "panels": 7, "assignments": 7, "course": 7,
    # the command line and the package's public names
    "cli": 8, "__init__": 8,
}  # fmt: skip

# Folders of one layer that must not import each other: such an import counts as running up.
PEERS: tuple[str, ...] = ("runtime.sim", "runtime.dask")

# The imports that still run back up, as (importer, imported) below scaledl_lab, each with its
# reason; none is left (a listed pair that no longer occurs fails the test).
KNOWN_UPWARD: set[tuple[str, str]] = set()


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


def _key(module: str) -> str:
    """The longest key of LAYERS that names ``module`` or a package above it."""
    name = module.partition(".")[2] or "__init__"
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        key = ".".join(parts[:k])
        if key in LAYERS:
            return key
    raise AssertionError(f"{module} has no layer: add it to LAYERS in {Path(__file__).name}")


def _layer(module: str) -> int:
    return LAYERS[_key(module)]


def _peer(module: str) -> str | None:
    name = module.partition(".")[2]
    return next((p for p in PEERS if name == p or name.startswith(p + ".")), None)


def _runs_up(module: str, target: str) -> bool:
    if _layer(target) > _layer(module):
        return True
    mine, theirs = _peer(module), _peer(target)
    return mine is not None and theirs is not None and mine != theirs


def _short(module: str) -> str:
    return module.partition(".")[2] or "__init__"


def _upward() -> set[tuple[str, str]]:
    return {
        (_short(m), _short(t)) for m, targets in _graph().items() for t in targets if _runs_up(m, t)
    }


def test_every_import_points_down_or_sideways():
    wrong = [
        f"{m} (layer {_layer('scaledl_lab.' + m)}) imports {t} (layer {_layer('scaledl_lab.' + t)})"
        for m, t in sorted(_upward() - KNOWN_UPWARD)
    ]
    assert not wrong, "\n".join(wrong)


def test_every_known_upward_import_still_runs_up():
    gone = sorted(KNOWN_UPWARD - _upward())
    assert not gone, f"no longer imported upward, remove from KNOWN_UPWARD: {gone}"


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


def test_layers_name_folders_without_per_file_overrides():
    """Folders are layers: no key of LAYERS sits below a key of another layer, and every key
    names a folder or a module of the package."""
    below = [
        f"{key} (layer {layer}) is below {outer} (layer {LAYERS[outer]}): move it to a folder "
        f"of layer {layer}"
        for key, layer in LAYERS.items()
        for outer in LAYERS
        if key.startswith(outer + ".") and LAYERS[outer] != layer
    ]
    missing = [key for key in LAYERS if not _is_module(f"scaledl_lab.{key}")]
    assert not below, "\n".join(below)
    assert not missing, f"LAYERS names no module or folder: {missing}"


def test_the_comm_interface_imports_neither_runtime():
    offenders = [
        f"{_short(m)} imports {_short(t)}"
        for m, targets in _graph().items()
        if m.startswith("scaledl_lab.runtime") and _peer(m) is None
        for t in targets
        if _peer(t) is not None
    ]
    assert not offenders, offenders


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
