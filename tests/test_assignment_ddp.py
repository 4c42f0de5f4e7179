"""The bucketed DDP assignment: its grader gives the master notebook's solution full marks on
the simulator and names the check each typical wrong solution fails, with the words a student
reads (buckets sized as if float32: the hidden check alone); the student version ``otter
assign`` makes holds no solution."""

from __future__ import annotations

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


# ~0.6 s (plus the lab's runs, ~1.4 s, where it is the module's first test): one more run of
# the submission for its visible checks, 0.3 s for the hidden one.
def test_buckets_sized_as_if_float32_fail_only_the_hidden_check():
    """Each gradient's bytes counted as 4 a value: the same three buckets at the visible 1 MB
    (the middle tensor fills a bucket of its own either way), four where each tensor should
    have a bucket of its own."""
    wrong = submission(
        NOTEBOOK,
        (
            "            nbytes = p.numel() * p.element_size()\n",
            "            nbytes = p.numel() * 4  # float32\n",
        ),
    )
    report = grader.report(wrong["ddp_train"], hidden=True)
    assert report.failed == HIDDEN, str(report)
    assert report["q1-buckets-hidden"].detail.startswith(
        "bucket_mb=0.03: rank 0, step 1: 4 allreduces of [5642, 262144, 512, 20480] elements; "
        "buckets of at most 0.03 MB filled from the last parameter to the first make 6, of "
        "[10, 5120, 512, 262144, 512, 20480] elements"
    )


def test_forgetting_to_divide_by_the_world_size_fails_the_twin():
    wrong = submission(NOTEBOOK, (AVERAGE, ""))
    report = grader.report(wrong["ddp_train"])
    assert report.failed == ["q1-twin-sim"]
    with pytest.raises(AssertionError, match=r"^q1-twin-sim failed: 3 workers: the parameters "):
        report.require("q1-twin-sim")
    assert "is every gradient averaged (the sum divided by N)" in report["q1-twin-sim"].detail


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


def test_waiting_for_each_bucket_after_backward_fails_the_overlap():
    """The buckets noted in the hook but each allreduced, and waited for, after backward."""
    wrong = submission(
        NOTEBOOK,
        (START, "            self.started.append((b, None))\n"),
        (
            "            flat = await pending.wait()\n",
            "            flat = await self.comm.allreduce(self.flat[b])\n",
        ),
    )
    report = grader.report(wrong["ddp_train"])
    assert report.failed == ["q1-overlap-sim"]
    assert report["q1-overlap-sim"].detail.startswith("no allreduce ran during backward (")
    assert "start each bucket's allreduce from the gradient hook" in report["q1-overlap-sim"].detail


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
