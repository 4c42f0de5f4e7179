"""The ZeRO-1 assignment: its grader gives the master notebook's solution full marks on the
simulator and names the check each typical wrong solution fails, with the words a student
reads (shards cut without the padding: the hidden check alone); the student version ``otter
assign`` makes holds no solution."""

from __future__ import annotations

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


def test_stepping_the_whole_optimiser_on_every_rank_fails_the_memory_check():
    """Allreduce, then every rank steps every parameter: right, and the same traffic, but a
    whole replica of optimiser state on each rank."""
    wrong = submission(
        NOTEBOOK,
        (SHARD, "    shard = torch.nn.Parameter(flat.clone())\n"),
        (
            "        shard.grad = await comm.reduce_scatter(grads) / n\n",
            "        shard.grad = await comm.allreduce(grads) / n\n",
        ),
        (GATHER, "        flat.copy_(shard.detach())\n"),
    )
    report = grader.report(wrong["zero1_train"])
    assert report.failed == ["q1-memory-sim"]
    with pytest.raises(AssertionError, match=r"^q1-memory-sim failed: 3 workers: a rank holds "):
        report.require("q1-memory-sim")
    assert report["q1-memory-sim"].detail.startswith(
        "3 workers: a rank holds 2310240 bytes of optimiser state; sharded over 3 ranks it is "
        "1/3 of the unsharded 2310224"
    )


def test_forgetting_the_all_gather_fails_the_twins_and_the_traffic():
    wrong = submission(NOTEBOOK, (GATHER, ""))
    report = grader.report(wrong["zero1_train"], hidden=True)
    assert report.failed == ["q1-twin-sim", "q1-traffic-sim", "q1-padding-hidden"]
    assert "every shard all-gathered back into the parameters" in report["q1-twin-sim"].detail
    assert report["q1-traffic-sim"].detail.startswith("3 workers: rank 0 logged 1540160 bytes")


def test_shards_cut_without_the_padding_fail_only_the_hidden_check():
    """Each rank's shard taken at rank x floor(P/N): the same as rank x ceil(P/N) on 2
    workers (288,778 is even), one element off on 3, where only the hidden check compares the
    parameters (the memory and the traffic are right)."""
    wrong = submission(
        NOTEBOOK,
        (
            SHARD,
            "    shard = torch.nn.Parameter(\n"
            "        flat[rank * (numel // n) : rank * (numel // n) + chunk].clone()\n"
            "    )\n",
        ),
    )
    assert grader.report(wrong["zero1_train"]).failed == []
    report = grader.report(wrong["zero1_train"], hidden=True)
    assert report.failed == ["q1-padding-hidden"]
    detail = report["q1-padding-hidden"].detail
    assert detail.startswith("3 workers: the parameters differ from the lab's zero1 by up to ")
    assert "(a shard of the padded flat tensor on each rank?)" in detail
