"""Otter-grader's own grading of a submission, in this process: ``otter assign`` makes an
assignment's autograder from its master notebook, and ``otter run`` (:func:`otter.run.main`,
what the command calls) grades a notebook with it: it unpacks the autograder, copies in its test
files, runs the submission's cells (less those tagged ``otter_ignore``), runs every test file
against what they defined, and writes ``results.json``: each question's points, and the
feedback a student reads.

One step is swapped. Otter runs the cells in a Jupyter kernel (``otter.execute.grade_notebook``:
a kernel process per submission that imports torch and the lab again, ~5 CPU-s before the first
check); :func:`grade_in_process` runs them in this process, with what otter's kernel runs before
and after them (its grading mode; then ``Checker.check_if_not_already_checked`` on every test
file), and hands otter the same ``GradingResults``. The tests, points, doctest feedback, hidden
tests and results are otter's. ``tests/test_assignment_1f1b.py`` grades one submission both ways
and finds the same results.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import nbformat
import pytest
from submissions import ASSIGNMENTS

FAILED = re.compile(r"^\s*AssertionError: (\S+) failed: (.*)$", re.M)


def assign(names: tuple[str, ...], where: Path) -> dict[str, Path]:
    """``otter assign`` of each master notebook of ``names``, copied into ``where``: the folder
    otter writes for each (``dist-NAME``, with ``student/`` and ``autograder/``)."""
    from otter.assign import main

    made = {}
    for name in names:
        (where / f"{name}.ipynb").write_bytes((ASSIGNMENTS / f"{name}.ipynb").read_bytes())
        main(str(where / f"{name}.ipynb"), str(where / f"dist-{name}"))
        made[name] = where / f"dist-{name}"
    return made


def autograder(name: str, tmp_path_factory: pytest.TempPathFactory) -> Autograder:
    """The :class:`Autograder` of assignment ``name`` (a module fixture's body; skipped without
    otter-grader, the [course] extra)."""
    pytest.importorskip("otter", reason="needs otter-grader (pip install -e '.[course]')")
    where = tmp_path_factory.mktemp("otter")
    return Autograder(name, assign((name,), where)[name])


@dataclass(frozen=True)
class Graded:
    """What ``otter run`` wrote for one submission (``results``: its results.json)."""

    results: dict[str, Any]

    @property
    def scores(self) -> dict[str, tuple[float, float]]:
        """Each question's (score, out of)."""
        return {
            t["name"]: (t["score"], t["max_score"]) for t in self.results["tests"] if "score" in t
        }

    def output(self, name: str) -> str:
        """The feedback of one entry: a question (its every test case, the hidden ones
        included) or ``Public Tests`` (what a student reads on submitting)."""
        (test,) = [t for t in self.results["tests"] if t["name"] == name]
        return test["output"]

    @property
    def visible(self) -> str:
        return self.output("Public Tests")

    @property
    def failed(self) -> list[str]:
        """The checks whose failure otter reports, question by question (hidden ones included)."""
        return [
            check
            for t in self.results["tests"]
            if "score" in t
            for check, _ in FAILED.findall(t["output"])
        ]

    def detail(self, check: str) -> str:
        """What a failed check says, as otter's feedback prints it (its first line)."""
        found = [
            why
            for t in self.results["tests"]
            for c, why in FAILED.findall(t["output"])
            if c == check
        ]
        assert found, f"otter reports no failure of {check}: {self.failed}"
        return found[0]


class Autograder:
    """One assignment as ``otter assign`` made it (``dist``), and ``otter run`` on its
    submissions: the solved notebook otter keeps, with a student's edits."""

    def __init__(self, name: str, dist: Path) -> None:
        self.name, self.dist = name, dist
        (self.zip,) = (dist / "autograder").glob("*.zip")

    def submission(self, *edits: tuple[str, str]) -> nbformat.NotebookNode:
        """The notebook otter keeps beside the autograder (its solutions in place, the
        student's checks), with each (old, new) text replaced once in its code cells."""
        nb = nbformat.read(self.dist / "autograder" / f"{self.name}.ipynb", as_version=4)
        for old, new in edits:
            cells = [c for c in nb.cells if c.cell_type == "code" and old in c.source]
            assert len(cells) == 1 and cells[0].source.count(old) == 1, old
            cells[0].source = cells[0].source.replace(old, new)
        return nb

    def grade(self, where: Path, *edits: tuple[str, str], kernel: bool = False) -> Graded:
        """``otter run -a AUTOGRADER -o OUT NAME.ipynb`` on the submission with ``edits``, its
        cells run here (:func:`grade_in_process`), or in otter's Jupyter kernel if ``kernel``."""
        from otter.run import main
        from otter.run.run_autograder.runners import python_runner

        folder, out = where / "submission", where / "graded"
        folder.mkdir(parents=True)
        out.mkdir()
        nbformat.write(self.submission(*edits), folder / f"{self.name}.ipynb")
        swap = (
            kernel_log_closed()
            if kernel
            else mock.patch.object(python_runner, "grade_notebook", grade_in_process)
        )
        path = os.environ["PATH"]  # otter puts its container's conda first on PATH, for good
        try:
            with swap:
                main(
                    str(folder / f"{self.name}.ipynb"),
                    autograder=str(self.zip),
                    output_dir=str(out),
                )
        finally:
            os.environ["PATH"] = path
        return Graded(json.loads((out / "results.json").read_text()))


def kernel_log_closed() -> Any:
    """Otter's kernel sends its logs to a server that stops without closing its socket (a
    ResourceWarning once collected, an error here): closed as its loop ends."""
    from otter.execute.logging import LogRecordSocketReceiver

    serve = LogRecordSocketReceiver.serve_until_stopped

    def serve_then_close(server: LogRecordSocketReceiver) -> None:
        try:
            serve(server)
        finally:
            server.server_close()

    return mock.patch.object(LogRecordSocketReceiver, "serve_until_stopped", serve_then_close)


def grade_in_process(
    submission_path: str,
    *,
    tests_glob: list[str],
    test_dir: str,
    ignore_errors: bool,
    seed: int | None,
    log: Any,
    plugin_collection: Any,
    script: bool,
    **_: Any,
) -> Any:
    """``otter.execute.grade_notebook`` with the notebook run in this process: otter's grading
    mode on (what its kernel's first cell does), each code cell run in order in one namespace,
    as a kernel would (an error noted, the next cell run: otter allows errors unless
    debugging), then every test file not yet checked (its last cell). Otter's class-level
    grading state is put back afterwards. Left out: the kernel's log forwarding and the
    submission's folder on ``sys.path`` (for support files, which these assignments have
    none of)."""
    from otter import Notebook
    from otter.execute import Checker
    from otter.execute.preprocessor import GradingPreprocessor
    from otter.test_files import GradingResults

    # What these autograders leave unset (seeds, logs, plugins, scripts): refused, not skipped.
    assert seed is None and log is None and plugin_collection is None and not script
    nb = nbformat.read(submission_path, as_version=4)
    GradingPreprocessor().filter_ignored_cells(nb)
    state = [(Notebook, "_grading_mode"), (Notebook, "_tests_dir_override")]
    state += [(Checker, "_track_results"), (Checker, "_test_files")]
    with contextlib.ExitStack() as stack:
        for owner, attr in state:
            stack.enter_context(mock.patch.object(owner, attr, getattr(owner, attr)))
        Notebook.init_grading_mode(test_dir)
        # A notebook's module: Dask pickles the functions it defines by value.
        namespace: dict[str, Any] = {"__name__": "__main__"}
        for cell in nb.cells:
            if cell.cell_type == "code":
                _run_cell(cell, namespace, ignore_errors)
        for test in tests_glob:
            Checker.check_if_not_already_checked(test, namespace)
        results = GradingResults(Checker.get_results())
    results.notebook = nb
    return results


def _run_cell(cell: nbformat.NotebookNode, namespace: dict[str, Any], ignore_errors: bool) -> None:
    """Run one code cell in ``namespace``; what it prints and any error become its outputs."""
    printed = io.StringIO()
    cell.outputs = []
    try:
        with contextlib.redirect_stdout(printed):
            exec(compile(cell.source, "<cell>", "exec"), namespace)
    except Exception as exc:
        if not ignore_errors:
            raise
        error = nbformat.v4.new_output("error", ename=type(exc).__name__, evalue=str(exc))
        cell.outputs.append(error)
    if printed.getvalue():
        cell.outputs.insert(
            0, nbformat.v4.new_output("stream", name="stdout", text=printed.getvalue())
        )
