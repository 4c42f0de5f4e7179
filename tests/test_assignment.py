"""The ring allreduce assignment: otter grades the master notebook's reference (full marks) and
three wrong submissions (a ring SGD that forgets to divide by N, a ring that deadlocks, chunk
indices fitted to the drawing of N = 3: the hidden check alone), each losing the points of the
checks it breaks with the message a student reads (tests/otter_grading.py; skipped without
otter-grader, the [course] extra). The grader itself gives the reference full marks on both
runtimes (--runslow) and names the check three more wrong submissions fail."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import otter_grading
import pytest
import submissions

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.assignments import ring_allreduce as ring_grader
from scaledl_lab.assignments.grading import Check, Report

# Where the ring's body starts in the reference: a submission of one's own replaces it.
RING_HEAD = "    right, left = (rank + 1) % n, (rank - 1) % n\n"
RING_BODY = RING_HEAD + "    # BEGIN SOLUTION\n"
MASTER = Path(__file__).resolve().parents[1] / "notebooks" / "assignment" / "ring_allreduce.ipynb"


def submission(*edits: tuple[str, str]) -> dict[str, Any]:
    """The ring's reference solution with each (old, new) text replaced once: a student's
    submission (:func:`submissions.submission`)."""
    return submissions.submission(MASTER.name, *edits)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return submission()


# ~35 s; every suite runs the assignment notebook under nbval, whose cells require each of these
# checks of the reference solution.
@pytest.mark.slow
def test_reference_solution_gets_full_marks_on_both_runtimes(reference):
    report = ring_grader.grade(reference["ring_allreduce"], reference["ring_sgd"], hidden=True)
    assert [c.name for c in report.checks] == [
        "q1-sum-sim", "q1-traffic-sim", "q1-rounds-sim", "q1-dask", "q1-ring-hidden",
        "q2-twin-sim", "q2-allreduce-sim", "q2-replicas-sim", "q2-traffic-sim",
        "q2-twin-dask", "q2-traffic-dask",
    ]  # fmt: skip
    assert report.failed == [], str(report)
    assert report.score == report.total == 17
    # What was measured, not only that it passed: the twins to float64 rounding.
    assert "within" in report["q2-twin-sim"].detail and "e-1" in report["q2-twin-sim"].detail
    assert report["q2-traffic-dask"].detail.startswith("2 workers: 2310224 bytes per step")


# otter assign of the master: a few hundredths of a CPU-second (importing otter, once per
# process: ~1.7).
@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> otter_grading.Autograder:
    return otter_grading.autograder(MASTER.stem, tmp_path_factory)


# Each ring submission otter grades: its simulated runs and two 2-worker Dask clusters (one a
# question), ~2-3 CPU-s and 4-10 s (the deadlock waits out two 5 s Dask timeouts).
def test_otter_gives_the_reference_full_marks(autograder, tmp_path):
    graded = autograder.grade(tmp_path)
    assert graded.scores == {"q1": (9, 9), "q2": (8, 8)}, graded.results  # q1: 2 hidden
    assert graded.failed == [] and graded.visible.endswith("All test cases passed!")


def test_a_ring_sgd_that_forgets_to_divide_by_n_fails_the_twins(autograder, tmp_path):
    graded = autograder.grade(tmp_path, ("        flat /= ctx.world_size\n", ""))
    assert graded.scores == {"q1": (9, 9), "q2": (8 - 2 - 1 - 2, 8)}, graded.results
    # The traffic and the replicas are a ring's all the same.
    assert graded.failed == ["q2-twin-sim", "q2-allreduce-sim", "q2-twin-dask"]
    assert graded.detail("q2-twin-sim").startswith("3 workers: the parameters differ from single")
    assert "is the gradient the average over the workers" in graded.detail("q2-twin-sim")
    assert "differ from the lab's allreduce-naive" in graded.detail("q2-allreduce-sim")
    assert "q2-twin-sim failed: 3 workers: the parameters" in graded.visible


def test_a_ring_that_receives_first_deadlocks_and_fails_by_timeout(
    autograder, tmp_path, monkeypatch
):
    # Every rank waits for its predecessor before sending: nobody ever sends. The simulator
    # says so at once; each Dask run (one a question) ends at its timeout.
    monkeypatch.setitem(ring_grader.RUN, "timeout_s", 5.0)
    graded = autograder.grade(
        tmp_path,
        (
            "        sending = comm.isend(chunks[out].clone(), right)\n"
            "        chunks[into].add_(await comm.recv(torch.empty_like(chunks[into]), left))\n",
            "        chunks[into].add_(await comm.recv(torch.empty_like(chunks[into]), left))\n"
            "        sending = comm.isend(chunks[out].clone(), right)\n",
        ),
    )
    assert graded.scores == {"q1": (0, 9), "q2": (0, 8)}, graded.results
    assert graded.failed == [
        "q1-sum-sim", "q1-traffic-sim", "q1-rounds-sim", "q1-dask", "q1-ring-hidden",
        "q2-twin-sim", "q2-allreduce-sim", "q2-replicas-sim", "q2-traffic-sim", "q2-twin-dask",
        "q2-traffic-dask",
    ]  # fmt: skip
    assert "simulated deadlock" in graded.detail("q1-sum-sim")
    assert graded.detail("q1-sum-sim").startswith("on 2 simulated workers: the run failed")
    assert graded.detail("q1-dask").startswith("the run failed:"), graded.detail("q1-dask")
    assert graded.detail("q2-twin-dask").startswith("the run failed:")


def test_chunk_indices_read_off_the_drawing_of_three_fail_only_the_hidden_check(
    autograder, tmp_path
):
    """Each index written with +2s for -s, as on a ring of 3 (and of 2, with one round): right
    on every visible world size, the wrong chunks from N = 4 on; the student reads every
    public test passed, and the score says the hidden one did not."""
    graded = autograder.grade(
        tmp_path,
        (
            "        out, into = (rank - s) % n, (rank - s - 1) % n\n",
            "        out, into = (rank + 2 * s) % n, (rank + 2 * s - 1) % n\n",
        ),
        (
            "        out, into = (rank + 1 - s) % n, (rank - s) % n\n",
            "        out, into = (rank + 1 + 2 * s) % n, (rank + 2 * s) % n\n",
        ),
    )
    assert graded.scores == {"q1": (7, 9), "q2": (8, 8)}, graded.results
    assert graded.failed == ["q1-ring-hidden"]
    assert graded.detail("q1-ring-hidden").startswith(
        "4 workers, 60 elements: rank 0's tensor after the call is off the sum by up to "
    )
    assert graded.visible.endswith("All test cases passed!"), graded.visible


def test_a_ring_that_asks_for_the_library_allreduce_is_refused():
    wrong = submission((RING_BODY, RING_HEAD + "    return await comm.allreduce(flat)\n"))
    report = ring_grader.collective_report(wrong["ring_allreduce"], dask=False)
    assert report.failed == ["q1-sum-sim", "q1-traffic-sim", "q1-rounds-sim"]
    assert "comm.allreduce is not part of this exercise" in report["q1-sum-sim"].detail


def test_a_ring_that_passes_whole_tensors_is_right_but_sends_too_much():
    """N - 1 rounds passing every rank's whole tensor around also sums: the traffic and the
    rounds say it is not the bandwidth-optimal ring."""
    naive = submission(
        (
            RING_BODY,
            RING_HEAD + "    passing = flat.clone()\n"
            "    for _ in range(n - 1):\n"
            "        sending = comm.isend(passing, right)\n"
            "        passing = await comm.recv(torch.empty_like(flat), left)\n"
            "        await sending.wait()\n"
            "        flat.add_(passing)\n"
            "    return flat\n",
        )
    )
    report = ring_grader.collective_report(naive["ring_allreduce"], dask=False)
    assert report.failed == ["q1-traffic-sim", "q1-rounds-sim"]
    assert (
        "3 workers, 60 float64 elements: rank 0 sent 960 bytes" in report["q1-traffic-sim"].detail
    )
    assert (
        "2 workers: rank 0 sent 1 message for one allreduce; a ring sends"
        in report["q1-rounds-sim"].detail
    )


def test_a_ring_sgd_that_logs_no_traffic_fails_the_traffic_check():
    wrong = submission(("sent=comm.bytes_sent - sent, ", ""))
    report = ring_grader.strategy_report(wrong["ring_sgd"], dask=False)
    assert report.failed == ["q2-traffic-sim"]
    assert "logged 0 bytes at step 1" in report["q2-traffic-sim"].detail


def test_run_takes_a_program_of_ones_own_and_refuses_what_is_not_one():
    cfg = ExperimentConfig(runtime="sim", **{**ring_grader.RUN, "max_steps": 2})

    def not_async(ctx):
        return None

    async def two_arguments(ctx, extra):
        return None

    with pytest.raises(ConfigError, match=r"strategy= takes the program one worker runs, an "):
        run(cfg, strategy=not_async, progress=False)
    with pytest.raises(ConfigError, match=r"must take one argument, the worker's context"):
        run(cfg, strategy=two_arguments, progress=False)

    async def keeps_rank(ctx):
        ctx.result["seen"] = (ctx.rank, ctx.world_size, ctx.config.strategy)

    res = run(cfg.replace(workers=3, name="mine"), strategy=keeps_rank, progress=False)
    assert [o["seen"] for o in res.outputs["mine"]] == [(r, 3, "allreduce-naive") for r in range(3)]


def test_report_names_its_checks():
    report = Report((Check("a", 2, True, "fine"), Check("b", 1, False, "why")))
    assert (report.score, report.total, report.failed) == (2, 3, ["b"])
    report.require("a")
    with pytest.raises(AssertionError, match=r"^b failed: why$"):
        report.require("b")
    with pytest.raises(KeyError, match=r"no check 'c'; the checks are \['a', 'b'\]"):
        report.require("c")
    assert str(report).splitlines() == [
        "2 / 3 points",
        "  pass  a                    2/2  fine",
        "  FAIL  b                    0/1  why",
    ]
    assert list(report.frame()["score"]) == [2, 0]
