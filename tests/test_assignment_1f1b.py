"""The 1F1B schedule assignment: its grader (the lab's dependency checker, count of activations in
flight and replay of a step) gives the master notebook's reference full marks and names the
checks each typical wrong schedule fails, with what a student reads (pure functions: a few
milliseconds); a warm-up fitted to the visible cases fails the hidden check alone. Otter grades
the reference and three of them (tests/otter_grading.py; skipped without otter-grader), and one
of them once more with ``otter run``'s Jupyter kernel: the same results."""

from __future__ import annotations

import otter_grading
import pytest
from submissions import submission

from scaledl_lab.assignments import one_f_one_b as schedule_grader
from scaledl_lab.strategies.model_parallel import schedules

MASTER = "one_f_one_b.ipynb"
STEADY = '            ops += [("F", warmup + i), ("B", i)]\n'
WARMUP = "        warmup = min(stages - stage - 1, micro_batches)"


def test_reference_solution_gets_full_marks_and_is_the_labs_order():
    mine = submission(MASTER)["one_f_one_b"]
    report = schedule_grader.grade(mine, hidden=True)
    assert [c.name for c in report.checks] == [
        "q1-complete", "q1-deadlock-free", "q1-memory", "q1-bubble", "q1-edge-hidden",
    ]  # fmt: skip
    assert report.failed == [], str(report)
    assert report.score == report.total == 10
    assert schedule_grader.grade(mine).total == 8  # what the student version shows
    for p, m in schedule_grader.CASES + schedule_grader.EDGE_CASES:
        assert mine(p, m) == schedules.one_f_one_b(p, m)
    # The visible cases have M >= P; the hidden ones M = 1, M < P and P = 1.
    assert all(m >= p for p, m in schedule_grader.CASES)
    edges = schedule_grader.EDGE_CASES
    assert {(m == 1, m < p, p == 1) for p, m in edges} >= {(1, 1, 0), (0, 1, 0), (1, 0, 1)}


# otter assign of the master: a few hundredths of a CPU-second (importing otter, once per
# process: ~1.7).
@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> otter_grading.Autograder:
    return otter_grading.autograder("one_f_one_b", tmp_path_factory)


def test_otter_gives_the_reference_full_marks(autograder, tmp_path):
    graded = autograder.grade(tmp_path)
    assert graded.scores == {"q1": (10, 10)}, graded.results  # 2 hidden
    assert graded.failed == [] and graded.visible.endswith("All test cases passed!")


def test_a_warm_up_fitted_to_the_visible_cases_fails_the_hidden_check(autograder, tmp_path):
    """P - s - 1 forwards of warm-up without asking whether there are that many micro-batches:
    right whenever M >= P (every visible case), forwards of micro-batches that do not exist
    when M < P. The student reads every public test passed; the score says the hidden one
    did not."""
    graded = autograder.grade(tmp_path, (WARMUP, "        warmup = stages - stage - 1"))
    assert graded.scores == {"q1": (8, 10)}, graded.results
    assert graded.failed == ["q1-edge-hidden"]
    assert graded.detail("q1-edge-hidden") == (
        "P=4, M=1: stage 0 runs ('F', 1) 1 time too many (each of ('F', m) and ('B', m), "
        "m = 0 … 0, once)"
    )
    assert graded.visible.endswith("All test cases passed!"), graded.visible
    assert "q1-edge-hidden" in graded.output("q1")


def test_gpipe_order_is_right_but_holds_every_micro_batch(autograder, tmp_path):
    graded = autograder.grade(tmp_path, (WARMUP, "        warmup = micro_batches"))
    assert graded.scores == {"q1": (6, 10)}, graded.results
    assert graded.failed == ["q1-memory", "q1-edge-hidden"]
    assert graded.detail("q1-memory") == (
        "P=4, M=4: stage 1 holds 4 micro-batches' activations at its peak (forwards run whose "
        "backward has not); 1F1B holds at most P - s = 3"
    )
    assert "q1-memory failed: P=4, M=4: stage 1 holds 4" in graded.visible


def test_a_warm_up_one_forward_short_deadlocks(autograder, tmp_path):
    """The steady state as backward-then-forward, whose warm-up needs P - s forwards, with the
    P - s - 1 of the forward-first order: the last stage's first op waits for its own forward."""
    steady = STEADY.replace('("F", warmup + i), ("B", i)', '("B", i), ("F", warmup + i)')
    graded = autograder.grade(tmp_path, (STEADY, steady))
    assert graded.scores == {"q1": (4, 10)}, graded.results
    assert graded.failed == ["q1-deadlock-free", "q1-bubble", "q1-edge-hidden"]
    assert graded.detail("q1-deadlock-free").startswith(
        "P=4, M=4: the schedule deadlocks: stages [0, 1, 2, 3] wait for each other (each stage "
        "runs its list in order;"
    )


# ~5 CPU-s alone (a kernel that imports torch, the lab and otter), ~3.5 in the suite (its kernels
# fork from a preloaded server, tests/forked_kernel.py).
def test_otter_run_in_its_jupyter_kernel_gives_the_same_results(autograder, tmp_path):
    """The one submission graded as ``otter run`` grades it, the notebook executed in a Jupyter
    kernel: the results every other test reads, run in this process, are the same, to the
    last character of the feedback."""
    wrong = (WARMUP, "        warmup = micro_batches")
    kernel = autograder.grade(tmp_path / "kernel", wrong, kernel=True)
    assert kernel.results == autograder.grade(tmp_path / "here", wrong).results
    assert kernel.failed == ["q1-memory", "q1-edge-hidden"]


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
        "P=4, M=4: stage 0 never runs the backward of micro-batch 3"
    )


def test_no_warm_up_is_safe_and_lean_but_idles_more():
    """One micro-batch at a time on every stage: complete, deadlock-free, within the memory
    bound; only the bubble says the pipeline never fills."""
    wrong = submission(
        MASTER,
        (WARMUP, "        warmup = 0"),
    )
    report = schedule_grader.grade(wrong["one_f_one_b"])
    assert report.failed == ["q1-bubble"], str(report)
    assert report["q1-bubble"].detail == (
        "P=4, M=4: the stages idle 0.7500 of the step on average; the paper's bubble is 0.4286: "
        "does each stage start a backward as soon as it can?"
    )
