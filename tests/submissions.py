"""A graded assignment's submissions, from its master notebook: the reference solution with
some of its lines replaced (a student's typical mistake), and the student version that
``otter assign`` makes of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat

ASSIGNMENTS = Path(__file__).resolve().parents[1] / "notebooks" / "assignment"


def _setup_and_solutions(nb: Any) -> tuple[str, list[str]]:
    """The master notebook's first code cell (its imports) and its solution cells' sources."""
    setup = next(c.source for c in nb.cells if c.cell_type == "code")
    solutions, inside = [], False
    for cell in nb.cells:
        marker = cell.source.strip() if cell.cell_type == "raw" else ""
        if marker in ("# BEGIN SOLUTION", "# END SOLUTION"):
            inside = marker == "# BEGIN SOLUTION"
        elif inside and cell.cell_type == "code":
            solutions.append(cell.source)
    return setup, solutions


def submission(notebook: str, *edits: tuple[str, str]) -> dict[str, Any]:
    """The reference solution of ``notebook`` with each (old, new) text replaced once, defined
    in a module of its own (as a notebook's functions are)."""
    setup, solutions = _setup_and_solutions(nbformat.read(ASSIGNMENTS / notebook, as_version=4))
    source = "\n\n".join([setup, *solutions])
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    namespace: dict[str, Any] = {"__name__": "student_submission"}
    exec(compile(source, "<submission>", "exec"), namespace)
    return namespace


def student_code(notebook: str, tmp: Path) -> str:
    """The code cells of the student version ``otter assign`` makes of ``notebook``."""
    master = tmp / notebook
    master.write_bytes((ASSIGNMENTS / notebook).read_bytes())
    made = subprocess.run(
        [sys.executable, "-m", "otter", "assign", notebook, "dist"],
        cwd=tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    student = nbformat.read(tmp / "dist" / "student" / notebook, as_version=4)
    return "\n".join(c.source for c in student.cells if c.cell_type == "code")
