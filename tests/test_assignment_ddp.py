"""The bucketed DDP assignment: otter grades the master notebook's solution (full marks) and
three typical wrong ones, each losing the points of the checks it breaks with the words a
student reads (buckets sized as if float32: the hidden check alone; tests/otter_grading.py,
skipped without otter-grader); the grader itself names the check two more fail, and reads the
reference's measurements (--runslow)."""

from __future__ import annotations

import otter_grading
import pytest
from submissions import submission

from scaledl_lab.assignments import bucketed_ddp as grader

NOTEBOOK = "bucketed_ddp.ipynb"
NAMES = ["q1-twin-sim", "q1-traffic-sim", "q1-buckets-sim", "q1-overlap-sim"]
HIDDEN = ["q1-buckets-hidden"]
# Where a bucket's allreduce starts in the reference, and where its sum becomes the average.
START = "            self.started.append((b, self.comm.allreduce_background(flat)))\n"
AVERAGE = "            flat /= n\n"


# ~5 s; every suite runs the master notebook under nbval, whose test cells require each check
# of the reference solution.
@pytest.mark.slow
def test_the_reference_solution_gets_full_marks():
    mine = submission(NOTEBOOK)["ddp_train"]
    assert [c.name for c in grader.grade(mine).checks] == NAMES  # the student's view
    report = grader.grade(mine, hidden=True)
    assert [c.name for c in report.checks] == NAMES + HIDDEN
    assert report.failed == [], str(report)
    assert report.score == report.total == 10
    # What was measured: the lab's allreduce to the bit, three buckets, some time hidden.
    assert report["q1-twin-sim"].detail.startswith("3 workers: within 0.0e+00 of the lab's")
    assert report["q1-buckets-sim"].detail == (
        "3 allreduces a step, buckets of [5642, 262144, 20992] elements"
    )
    assert report["q1-buckets-hidden"].detail == (
        "the lab's buckets (6 at 0.03 MB, 1 at 4 MB) and its parameters"
    )


# otter assign of the master: a few hundredths of a CPU-second (importing otter, once per
# process: ~1.7).
@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> otter_grading.Autograder:
    return otter_grading.autograder("bucketed_ddp", tmp_path_factory)


def test_otter_gives_the_reference_full_marks(autograder, tmp_path):
    graded = autograder.grade(tmp_path)
    assert graded.scores == {"q1": (10, 10)}, graded.results  # 2 hidden
    assert graded.failed == [] and graded.visible.endswith("All test cases passed!")


def test_buckets_sized_as_if_float32_fail_only_the_hidden_check(autograder, tmp_path):
    """Each gradient's bytes counted as 4 a value: the same three buckets at the visible 1 MB
    (the middle tensor fills a bucket of its own either way), four where each tensor should
    have a bucket of its own. The student reads every public test passed."""
    graded = autograder.grade(
        tmp_path,
        (
            "            nbytes = p.numel() * p.element_size()\n",
            "            nbytes = p.numel() * 4  # float32\n",
        ),
    )
    assert graded.scores == {"q1": (8, 10)}, graded.results
    assert graded.failed == HIDDEN
    assert graded.detail("q1-buckets-hidden").startswith(
        "bucket_mb=0.03: rank 0, step 1: 4 allreduces of [5642, 262144, 512, 20480] elements; "
        "buckets of at most 0.03 MB filled from the last parameter to the first make 6, of "
        "[10, 5120, 512, 262144, 512, 20480] elements"
    )
    assert graded.visible.endswith("All test cases passed!"), graded.visible


def test_forgetting_to_divide_by_the_world_size_fails_the_twin(autograder, tmp_path):
    graded = autograder.grade(tmp_path, (AVERAGE, ""))
    assert graded.failed == ["q1-twin-sim", "q1-buckets-hidden"]
    assert graded.scores == {"q1": (5, 10)}, graded.results
    assert graded.detail("q1-twin-sim").startswith("3 workers: the parameters ")
    assert "is every gradient averaged (the sum divided by N)" in graded.detail("q1-twin-sim")
    assert "q1-twin-sim failed: 3 workers: the parameters " in graded.visible


def test_an_allreduce_per_parameter_fails_the_bucket_count():
    """Every gradient reduced on its own as soon as it is ready: right, and overlapped, but
    six allreduces a step where the buckets make three."""
    wrong = submission(
        NOTEBOOK,
        (
            "            if self.buckets[-1] and size + nbytes > bucket_bytes:\n",
            "            if self.buckets[-1]:\n",
        ),
    )
    report = grader.report(wrong["ddp_train"])
    assert report.failed == ["q1-buckets-sim"]
    assert report["q1-buckets-sim"].detail.startswith(
        "rank 0, step 1: 6 allreduces of [10, 5120, 512, 262144, 512, 20480] elements; buckets "
        "of at most 1 MB filled from the last parameter to the first make 3"
    )


def test_waiting_for_each_bucket_after_backward_fails_the_overlap(autograder, tmp_path):
    """The buckets noted in the hook but each allreduced, and waited for, after backward."""
    graded = autograder.grade(
        tmp_path,
        (START, "            self.started.append((b, None))\n"),
        (
            "            flat = await pending.wait()\n",
            "            flat = await self.comm.allreduce(self.flat[b])\n",
        ),
    )
    assert graded.failed == ["q1-overlap-sim"]
    assert graded.scores == {"q1": (8, 10)}, graded.results
    detail = graded.detail("q1-overlap-sim")
    assert detail.startswith("no allreduce ran during backward (")
    assert "start each bucket's allreduce from the gradient hook" in detail
    assert "q1-overlap-sim failed: no allreduce ran during backward" in graded.visible


def test_a_program_that_waits_on_one_rank_only_stops_and_fails_every_check():
    """Rank 0 waits for its buckets, the others go on to the next collective: the simulator
    stops the run at once (a deadlock on real workers) and every check says why."""
    wrong = submission(
        NOTEBOOK,
        (
            "        await buckets.wait_all()\n",
            "        if ctx.rank == 0:\n            await buckets.wait_all()\n",
        ),
    )
    report = grader.report(wrong["ddp_train"])
    assert report.failed == NAMES and report.score == 0
    assert report["q1-twin-sim"].detail.startswith(
        "on 3 simulated workers: the run failed: RunError: collective mismatch: the ranks called"
    )
