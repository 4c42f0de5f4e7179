"""A graded assignment's reference solution, read from its master notebook, and the submissions
the tests make of it: the notebook's first code cell (its imports) and every solution cell,
with (old, new) edits applied (a student's typical mistake), run as one module of its own (as a
notebook's functions are: Dask ships them by value, since no worker can import it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nbformat

ASSIGNMENTS = Path(__file__).resolve().parents[1] / "notebooks" / "assignment"
MARKERS = ("# BEGIN SOLUTION", "# END SOLUTION")


def solution_cells(nb: Any) -> list[str]:
    """The sources of the code cells between the raw BEGIN/END SOLUTION cells, in order."""
    solutions, inside = [], False
    for cell in nb.cells:
        if cell.cell_type == "raw" and cell.source.strip() in MARKERS:
            inside = cell.source.strip() == MARKERS[0]
        elif inside and cell.cell_type == "code":
            solutions.append(cell.source)
    return solutions


def submission(master: str, *edits: tuple[str, str]) -> dict[str, Any]:
    """The namespace of ``master``'s reference solution with each (old, new) text replaced
    once (each old text must occur exactly once)."""
    nb = nbformat.read(ASSIGNMENTS / master, as_version=4)
    setup = next(c.source for c in nb.cells if c.cell_type == "code")
    source = "\n\n".join([setup, *solution_cells(nb)])
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    namespace: dict[str, Any] = {"__name__": "student_submission"}
    exec(compile(source, "<submission>", "exec"), namespace)
    return namespace
