"""Every graded assignment's student version, as ``otter assign`` makes it from the master
notebook: its solutions stripped, and its hidden tests (``hidden: true`` in a test cell's
config) gone from the student notebook but kept in the autograder's tests, which score them.
``otter assign`` of the five notebooks, in this process (a tenth of a CPU-second once otter is
imported; skipped without otter-grader). Also, with no otter: each master marks hidden exactly
the cells that require a ``-hidden`` check."""

from __future__ import annotations

import re
import zipfile

import nbformat
import otter_grading
import pytest
import yaml
from submissions import ASSIGNMENTS, MARKERS

NAMES = ("ring_allreduce", "bucketed_ddp", "zero1", "tensor_parallel_mlp", "one_f_one_b")
CONFIG = re.compile(r'^""" # BEGIN TEST CONFIG\n(.*?)""" # END TEST CONFIG\n', re.S)


def _test_cells(nb: nbformat.NotebookNode) -> list[tuple[dict, str]]:
    """Each test cell's config and the check it requires (its ``.require("...")``)."""
    cells = []
    for cell in nb.cells:
        config = CONFIG.match(cell.source) if cell.cell_type == "code" else None
        if config:
            (check,) = re.findall(r'\.require\("([^"]+)"\)', cell.source)
            cells.append((yaml.safe_load(config.group(1)), check))
    return cells


def test_each_master_marks_hidden_exactly_its_hidden_checks():
    for name in NAMES:
        cells = _test_cells(nbformat.read(ASSIGNMENTS / f"{name}.ipynb", as_version=4))
        hidden = [check for config, check in cells if config.get("hidden")]
        assert hidden, f"{name}: no hidden test"
        assert all(check.endswith("-hidden") for check in hidden), (name, hidden)
        shown = [check for config, check in cells if not config.get("hidden")]
        assert not any(check.endswith("-hidden") for check in shown), (name, shown)


def test_otter_assign_strips_solutions_and_hidden_tests_from_every_student_version(tmp_path):
    pytest.importorskip("otter", reason="needs otter-grader (pip install -e '.[course]')")
    made = otter_grading.assign(NAMES, tmp_path)
    for name in NAMES:
        master = nbformat.read(ASSIGNMENTS / f"{name}.ipynb", as_version=4)
        dist = made[name]
        path = dist / "student" / f"{name}.ipynb"
        student = nbformat.read(path, as_version=4)
        code = "\n".join(c.source for c in student.cells if c.cell_type == "code")
        assert all(m not in code for m in MARKERS) and "..." in code
        assert not any(c.get("outputs") for c in student.cells if c.cell_type == "code")
        # Every line of the reference between the solution markers is gone.
        solved = _solution_lines(master)
        assert len(solved) >= 5, solved
        left = [line for line in solved if line in code]
        assert left == [], left
        # The hidden tests: nowhere in the student's file (cells or the tests otter keeps in
        # its metadata), in the autograder's tests with their points.
        cells = _test_cells(master)
        hidden = [check for config, check in cells if config.get("hidden")]
        shown = [check for config, check in cells if not config.get("hidden")]
        assert hidden and shown, name
        text = path.read_text()
        assert not [check for check in hidden if check in text], name
        assert all(check in text for check in shown), name
        (autograder,) = (dist / "autograder").glob("*.zip")
        with zipfile.ZipFile(autograder) as zipped:
            tests = "\n".join(
                zipped.read(n).decode() for n in zipped.namelist() if n.startswith("tests/")
            )
        for check in hidden + shown:
            assert check in tests, (name, check)
        assert len(re.findall(r"'hidden': True", tests)) == len(hidden), (name, tests)


def _solution_lines(nb: nbformat.NotebookNode) -> list[str]:
    """The stripped lines between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` in code cells."""
    lines, inside = [], False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for line in cell.source.splitlines():
            if line.strip() in MARKERS:
                inside = line.strip() == MARKERS[0]
            elif inside and line.strip() and not line.strip().startswith("#"):
                lines.append(line.strip())
    return lines
