"""The 1F1B schedule assignment: its grader (the lab's dependency checker, count of activations in
flight and replay of a step) gives the master notebook's reference full marks and names the
checks each typical wrong schedule fails, with what a student reads (pure functions: a few
milliseconds). Also: ``otter assign`` strips the solutions from both new assignments' student
notebooks (one process for both, about 5 CPU-seconds; skipped without otter-grader)."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from assignment_sources import ASSIGNMENTS, MARKERS, submission

from scaledl_lab.assignments import one_f_one_b as schedule_grader
from scaledl_lab.strategies.model_parallel import schedules

MASTER = "one_f_one_b.ipynb"
STEADY = '            ops += [("F", warmup + i), ("B", i)]\n'


def test_reference_solution_gets_full_marks_and_is_the_labs_order():
    mine = submission(MASTER)["one_f_one_b"]
    report = schedule_grader.grade(mine)
    assert [c.name for c in report.checks] == [
        "q1-complete", "q1-deadlock-free", "q1-memory", "q1-bubble",
    ]  # fmt: skip
    assert report.failed == [], str(report)
    assert report.score == report.total == 8
    for p, m in schedule_grader.CASES:
        assert mine(p, m) == schedules.one_f_one_b(p, m)
    assert (1, 1) in {(m < p, m == 1) for p, m in schedule_grader.CASES}  # M = 1 < P is graded


def test_gpipe_order_is_right_but_holds_every_micro_batch():
    wrong = submission(
        MASTER,
        (
            "        warmup = min(stages - stage - 1, micro_batches)",
            "        warmup = micro_batches",
        ),
    )
    report = schedule_grader.grade(wrong["one_f_one_b"])
    assert report.failed == ["q1-memory"], str(report)
    assert report["q1-memory"].detail == (
        "P=4, M=2: stage 3 holds 2 micro-batches' activations at its peak (forwards run whose "
        "backward has not); 1F1B holds at most P - s = 1"
    )
    with pytest.raises(AssertionError, match=r"^q1-memory failed: P=4, M=2: stage 3 holds 2"):
        report.require("q1-memory")


def test_a_warm_up_one_forward_short_deadlocks():
    """The steady state as backward-then-forward, whose warm-up needs P - s forwards, with the
    P - s - 1 of the forward-first order: the last stage's first op waits for its own forward."""
    wrong = submission(
        MASTER,
        (STEADY, STEADY.replace('("F", warmup + i), ("B", i)', '("B", i), ("F", warmup + i)')),
    )
    report = schedule_grader.grade(wrong["one_f_one_b"])
    assert report.failed == ["q1-deadlock-free", "q1-bubble"], str(report)
    assert report["q1-deadlock-free"].detail.startswith(
        "P=2, M=1: the schedule deadlocks: stages [0, 1] wait for each other (each stage runs its "
        "list in order;"
    )


def test_skipping_the_last_backward_is_caught_as_incomplete():
    wrong = submission(
        MASTER,
        (
            "range(micro_batches - warmup, micro_batches)]",
            "range(micro_batches - warmup, micro_batches - 1)]",
        ),
    )
    report = schedule_grader.grade(wrong["one_f_one_b"])
    assert report.failed == ["q1-complete", "q1-bubble"], str(report)
    assert report["q1-complete"].detail == (
        "P=2, M=1: stage 0 never runs the backward of micro-batch 0"
    )


def test_no_warm_up_is_safe_and_lean_but_idles_more():
    """One micro-batch at a time on every stage: complete, deadlock-free, within the memory
    bound; only the bubble says the pipeline never fills."""
    wrong = submission(
        MASTER,
        (
            "        warmup = min(stages - stage - 1, micro_batches)",
            "        warmup = 0",
        ),
    )
    report = schedule_grader.grade(wrong["one_f_one_b"])
    assert report.failed == ["q1-bubble"], str(report)
    assert report["q1-bubble"].detail == (
        "P=4, M=2: the stages idle 0.7500 of the step on average; the paper's bubble is 0.6000: "
        "does each stage start a backward as soon as it can?"
    )


def test_otter_assign_strips_the_solutions_of_both_new_assignments(tmp_path):
    pytest.importorskip("otter", reason="needs otter-grader (pip install -e '.[course]')")
    names = ("one_f_one_b", "tensor_parallel_mlp")
    for name in names:
        (tmp_path / f"{name}.ipynb").write_bytes((ASSIGNMENTS / f"{name}.ipynb").read_bytes())
    script = "from otter.assign import main\n" + "".join(
        f"main('{n}.ipynb', 'dist-{n}')\n" for n in names
    )
    made = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stdout + made.stderr
    for name in names:
        master = nbformat.read(ASSIGNMENTS / f"{name}.ipynb", as_version=4)
        student = nbformat.read(tmp_path / f"dist-{name}" / "student" / f"{name}.ipynb", 4)
        assert list((tmp_path / f"dist-{name}" / "autograder").glob("*.zip"))
        code = "\n".join(c.source for c in student.cells if c.cell_type == "code")
        assert all(m not in code for m in MARKERS) and "..." in code
        assert not any(c.get("outputs") for c in student.cells if c.cell_type == "code")
        # Every line of the reference between the solution markers is gone.
        solved = _solution_lines(master)
        assert len(solved) >= 5, solved
        left = [line for line in solved if line in code]
        assert left == [], left


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
