"""The 1F1B schedule assignment: its grader (the lab's dependency checker, count of activations in
flight and replay of a step) gives the master notebook's reference full marks and names the
checks each typical wrong schedule fails, with what a student reads (pure functions: a few
milliseconds); a warm-up fitted to the visible cases fails the hidden check alone."""

from __future__ import annotations

import pytest
from submissions import submission

from scaledl_lab.assignments import one_f_one_b as schedule_grader
from scaledl_lab.strategies.model_parallel import schedules

MASTER = "one_f_one_b.ipynb"
STEADY = '            ops += [("F", warmup + i), ("B", i)]\n'


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


def test_a_warm_up_fitted_to_the_visible_cases_fails_the_hidden_check():
    """P - s - 1 forwards of warm-up without asking whether there are that many micro-batches:
    right whenever M >= P (every visible case), forwards of micro-batches that do not exist
    when M < P."""
    wrong = submission(
        MASTER,
        (
            "        warmup = min(stages - stage - 1, micro_batches)",
            "        warmup = stages - stage - 1",
        ),
    )
    assert schedule_grader.grade(wrong["one_f_one_b"]).failed == []
    report = schedule_grader.grade(wrong["one_f_one_b"], hidden=True)
    assert report.failed == ["q1-edge-hidden"], str(report)
    assert report["q1-edge-hidden"].detail == (
        "P=4, M=1: stage 0 runs ('F', 1) 1 time too many (each of ('F', m) and ('B', m), "
        "m = 0 … 0, once)"
    )


def test_gpipe_order_is_right_but_holds_every_micro_batch():
    wrong = submission(
        MASTER,
        (
            "        warmup = min(stages - stage - 1, micro_batches)",
            "        warmup = micro_batches",
        ),
    )
    report = schedule_grader.grade(wrong["one_f_one_b"], hidden=True)
    assert report.failed == ["q1-memory", "q1-edge-hidden"], str(report)
    assert report["q1-memory"].detail == (
        "P=4, M=4: stage 1 holds 4 micro-batches' activations at its peak (forwards run whose "
        "backward has not); 1F1B holds at most P - s = 3"
    )
    with pytest.raises(AssertionError, match=r"^q1-memory failed: P=4, M=4: stage 1 holds 4"):
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
        "P=4, M=4: the schedule deadlocks: stages [0, 1, 2, 3] wait for each other (each stage "
        "runs its list in order;"
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
        "P=4, M=4: stage 0 never runs the backward of micro-batch 3"
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
        "P=4, M=4: the stages idle 0.7500 of the step on average; the paper's bubble is 0.4286: "
        "does each stage start a backward as soon as it can?"
    )
