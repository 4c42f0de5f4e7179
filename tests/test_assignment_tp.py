"""The tensor-parallel MLP assignment: its grader gives the master notebook's reference full
marks and names the checks each typical wrong submission fails, with what a student reads
(all on the simulator, tp = 2 and 4, and 3 and 8 for the hidden check: well under a second per
report). Otter grades the reference and three of them (tests/otter_grading.py; skipped without
otter-grader)."""

from __future__ import annotations

import otter_grading
import pytest
from submissions import submission

from scaledl_lab.assignments import tensor_parallel_mlp as tp_grader

MASTER = "tensor_parallel_mlp.ipynb"


def grade(namespace: dict, hidden: bool = False) -> tp_grader.Report:
    ops = tuple(namespace[n] for n in ("f", "f_backward", "g", "g_backward"))
    return tp_grader.grade(
        namespace["column_parallel"],
        namespace["row_parallel"],
        ops,
        namespace["ParallelMLP"],
        hidden=hidden,
    )


def test_reference_solution_gets_full_marks():
    report = grade(submission(MASTER), hidden=True)
    assert [c.name for c in report.checks] == [
        "q1-shards", "q2-f", "q2-g",
        "q3-forward", "q3-input-grad", "q3-weight-grads", "q3-communication", "q3-block-hidden",
    ]  # fmt: skip
    assert report.failed == [], str(report)
    assert report.score == report.total == 14
    assert grade(submission(MASTER)).total == 12  # what the student version shows
    assert report["q3-communication"].detail == (
        "one allreduce of 320 bytes forward, one backward, per rank"
    )
    assert report["q3-block-hidden"].detail.startswith("h=6, a batch of 3, tp = (3, 8): the output")


# otter assign of the master: a few hundredths of a CPU-second (importing otter, once per
# process: ~1.7).
@pytest.fixture(scope="module")
def autograder(tmp_path_factory) -> otter_grading.Autograder:
    return otter_grading.autograder("tensor_parallel_mlp", tmp_path_factory)


def test_otter_gives_the_reference_full_marks(autograder, tmp_path):
    graded = autograder.grade(tmp_path)
    assert graded.scores == {"q1": (2, 2), "q2": (2, 2), "q3": (10, 10)}, graded.results
    assert graded.failed == [] and graded.visible.endswith("All test cases passed!")


def test_shards_sized_for_the_visible_block_fail_the_hidden_check(autograder, tmp_path):
    """The hidden units written as the notebook's 4h = 32: every visible check (h = 8) passes,
    the hidden block of h = 6 cannot multiply."""
    graded = autograder.grade(
        tmp_path, ("    width = linear.out_features // tp\n", "    width = 32 // tp  # 4h\n")
    )
    assert graded.scores == {"q1": (2, 2), "q2": (2, 2), "q3": (8, 10)}, graded.results
    assert graded.failed == ["q3-block-hidden"]
    assert graded.detail("q3-block-hidden").startswith(
        "h=6, a batch of 3, RuntimeError: mat1 and mat2 shapes cannot be multiplied (3x10 and 8x6)"
    )
    assert graded.visible.endswith("All test cases passed!"), graded.visible


def test_a_g_that_forgets_its_allreduce_leaves_the_output_partial(autograder, tmp_path):
    graded = autograder.grade(
        tmp_path,
        (
            "    summed = partial.clone()\n"
            "    await comm.allreduce(summed)  # the row-parallel products are partial sums of "
            "the output\n    return summed\n",
            "    return partial\n",
        ),
    )
    # The backward never needed g's sum: the gradients stay right.
    assert graded.failed == ["q2-g", "q3-forward", "q3-communication", "q3-block-hidden"]
    assert graded.scores == {"q1": (2, 2), "q2": (1, 2), "q3": (4, 10)}, graded.results
    assert graded.detail("q2-g").startswith("tp=2, rank 0: g(comm, x) is off by up to ")
    assert graded.detail("q2-g").endswith("it must return the sum over the ranks")
    assert "against the unsplit block: are the ranks' parts combined" in graded.detail("q3-forward")
    assert graded.detail("q3-communication").startswith(
        "tp=2, rank 0: the forward called comm.allreduce 0 times (bytes: []); Megatron's block"
    )
    assert "q3-forward failed: tp=2, rank 0: the block's" in graded.visible


def test_an_f_that_also_allreduces_forward_doubles_the_input(autograder, tmp_path):
    graded = autograder.grade(
        tmp_path,
        (
            "    return x  # every rank already holds the whole input\n",
            "    x = x.clone()\n    await comm.allreduce(x)\n    return x\n",
        ),
    )
    assert graded.failed == [
        "q2-f", "q3-forward", "q3-input-grad", "q3-weight-grads", "q3-communication",
        "q3-block-hidden",
    ]  # fmt: skip
    assert graded.scores == {"q1": (2, 2), "q2": (1, 2), "q3": (0, 10)}, graded.results
    assert graded.detail("q2-f").endswith("it must return its input, unchanged")
    assert "the gradient of first.weight is off by up to" in graded.detail("q3-weight-grads")
    assert "the forward called comm.allreduce 2 times (bytes: [320, 320])" in graded.detail(
        "q3-communication"
    )


def test_a_second_linear_split_by_columns_fails_its_shapes_first():
    """Megatron's B split by its columns (nn.Linear's outputs) instead of its rows: the shard
    check names the shape a row-parallel shard has, and the block cannot multiply."""
    wrong = submission(
        MASTER,
        (
            "    width = linear.in_features // tp\n",
            "    width = linear.out_features // tp\n",
        ),
        (
            "    shard = nn.Linear(width, linear.out_features, dtype=linear.weight.dtype)\n",
            "    shard = nn.Linear(linear.in_features, width, dtype=linear.weight.dtype)\n",
        ),
        (
            "        shard.weight.copy_(linear.weight[:, mine])\n",
            "        shard.weight.copy_(linear.weight[mine])\n",
        ),
        (
            "        shard.bias.copy_(linear.bias)  # whole",
            "        shard.bias.copy_(linear.bias[mine])  #",
        ),
    )
    report = grade(wrong)
    assert report.failed == [
        "q1-shards", "q3-forward", "q3-input-grad", "q3-weight-grads", "q3-communication",
    ], str(report)  # fmt: skip
    assert report["q1-shards"].detail == (
        "row_parallel(Linear(32, 8), rank=0, tp=2).weight has shape (4, 32), not (8, 16)"
    )
    assert report["q3-forward"].detail.startswith("on the simulator: RuntimeError: mat1 and mat2")
