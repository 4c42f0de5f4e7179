"""The ZeRO-1 assignment: otter grades the master notebook's solution (full marks) and three
typical wrong ones, each losing the points of the checks it breaks with the words a student
reads (shards cut without the padding: the hidden check alone; tests/otter_grading.py, skipped
without otter-grader); the grader itself reads the reference's measurements (--runslow)."""

from __future__ import annotations

import otter_grading
import pytest
from submissions import submission

from scaledl_lab.assignments import zero1 as grader

NOTEBOOK = "zero1.ipynb"
NAMES = ["q1-twin-sim", "q1-memory-sim", "q1-traffic-sim", "q1-padding-hidden"]
SHARD = "    shard = torch.nn.Parameter(flat[rank * chunk : (rank + 1) * chunk].clone())\n"
GATHER = "        await comm.all_gather_into(flat, shard.detach().clone())\n"


# ~5 s; every suite runs the master notebook under nbval, whose test cells require each check
# of the reference solution.
@pytest.mark.slow
def test_the_reference_solution_gets_full_marks():
    mine = submission(NOTEBOOK)["zero1_train"]
    report = grader.grade(mine, hidden=True)
    assert [c.name for c in report.checks] == NAMES
    assert report.failed == [], str(report)
    assert report.score == report.total == 8
    assert [c.name for c in grader.grade(mine).checks] == NAMES[:-1]  # the student's view
    # What was measured: the lab's zero1 to the bit, a third of the optimiser state.
    assert report["q1-padding-hidden"].detail.startswith("3 workers: within 0.0e+00 of the lab")
    assert report["q1-memory-sim"].detail == (
        "3 workers: 770080 bytes of optimiser state a rank, 1/3 of the unsharded 2310224 "
        "(the lab's zero1: 770080)"
    )


# otter assign of the master: a few hundredths of a CPU-second (importing otter, once per
# process: ~1.7).
@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> otter_grading.Autograder:
    return otter_grading.autograder("zero1", tmp_path_factory)


def test_otter_gives_the_reference_full_marks(autograder, tmp_path):
    graded = autograder.grade(tmp_path)
    assert graded.scores == {"q1": (8, 8)}, graded.results  # 2 hidden
    assert graded.failed == [] and graded.visible.endswith("All test cases passed!")


def test_stepping_the_whole_optimiser_on_every_rank_fails_the_memory_check(autograder, tmp_path):
    """Allreduce, then every rank steps every parameter: right, and the same traffic, but a
    whole replica of optimiser state on each rank."""
    graded = autograder.grade(
        tmp_path,
        (SHARD, "    shard = torch.nn.Parameter(flat.clone())\n"),
        (
            "        shard.grad = await comm.reduce_scatter(grads) / n\n",
            "        shard.grad = await comm.allreduce(grads) / n\n",
        ),
        (GATHER, "        flat.copy_(shard.detach())\n"),
    )
    assert graded.failed == ["q1-memory-sim"]
    assert graded.scores == {"q1": (6, 8)}, graded.results
    assert graded.detail("q1-memory-sim").startswith(
        "3 workers: a rank holds 2310240 bytes of optimiser state; sharded over 3 ranks it is "
        "1/3 of the unsharded 2310224"
    )
    assert "q1-memory-sim failed: 3 workers: a rank holds " in graded.visible


def test_forgetting_the_all_gather_fails_the_twins_and_the_traffic(autograder, tmp_path):
    graded = autograder.grade(tmp_path, (GATHER, ""))
    assert graded.failed == ["q1-twin-sim", "q1-traffic-sim", "q1-padding-hidden"]
    assert graded.scores == {"q1": (2, 8)}, graded.results
    assert "every shard all-gathered back into the parameters" in graded.detail("q1-twin-sim")
    assert graded.detail("q1-traffic-sim").startswith("3 workers: rank 0 logged 1540160 bytes")


def test_shards_cut_without_the_padding_fail_only_the_hidden_check(autograder, tmp_path):
    """Each rank's shard taken at rank x floor(P/N): the same as rank x ceil(P/N) on 2
    workers (288,778 is even), one element off on 3, where only the hidden check compares the
    parameters (the memory and the traffic are right). The student reads every public test
    passed."""
    graded = autograder.grade(
        tmp_path,
        (
            SHARD,
            "    shard = torch.nn.Parameter(\n"
            "        flat[rank * (numel // n) : rank * (numel // n) + chunk].clone()\n"
            "    )\n",
        ),
    )
    assert graded.failed == ["q1-padding-hidden"]
    assert graded.scores == {"q1": (6, 8)}, graded.results
    detail = graded.detail("q1-padding-hidden")
    assert detail.startswith("3 workers: the parameters differ from the lab's zero1 by up to ")
    assert "(a shard of the padded flat tensor on each rank?)" in detail
    assert graded.visible.endswith("All test cases passed!"), graded.visible
