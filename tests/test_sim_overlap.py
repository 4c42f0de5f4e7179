"""The simulator's background allreduces started inside a compute block (DDP's buckets, from
gradient hooks during backward): each is timed from the point of backward that produced its
bytes, one transfer after the other, and the timeline shows the part hidden behind the block.
Outside a block (Streaming DiLoCo) and with ``allreduce_start`` nothing changes."""

from __future__ import annotations

import pytest
import torch

from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile
from scaledl_lab.runtime.sim.scheduler import SimWorld

LATENCY, BANDWIDTH = 1e-3, 1e6  # an allreduce of n bytes over 2 ranks: n/β + 2α
BLOCK = 30e-3  # the compute block: forward 10 ms, backward 20 ms


def _world() -> SimWorld:
    cost = CostModel(ComputeProfile("test", BLOCK, 1e-9), NetworkProfile("t", LATENCY, BANDWIDTH))
    return SimWorld(2, cost)


def _program(start: str, ends: dict[int, list[float]], sums: dict[int, list[float]]):
    async def program(comm):
        first, second = torch.full((1000,), 1.0 + comm.rank), torch.full((3000,), 1.0)
        begin = getattr(comm, start)
        async with comm.compute(0):  # 4 KB, then 12 KB of "gradients" as backward goes
            pending = [begin(first), begin(second)]
        ends[comm.rank] = []
        for p in pending:
            await p.wait()
            ends[comm.rank].append(comm.now())
        sums[comm.rank] = [first[0].item(), second[0].item()]

    return program


# 4 KB ready at 10 + 20 x 1/4 = 15 ms, 4 ms + 2 ms on the wire: until 21 ms, behind the block;
# 12 KB ready at 30 ms: 12 + 2 ms, until 44 ms. Started with allreduce_start, both go after
# the block: 30 + 6 = 36 ms, then + 14 = 50 ms.
@pytest.mark.parametrize(
    "start, expected",
    [("allreduce_background", [30e-3, 44e-3]), ("allreduce_start", [36e-3, 50e-3])],
)
def test_a_bucket_started_in_backward_runs_behind_it(start, expected):
    world, ends, sums = _world(), {}, {}
    world.run([_program(start, ends, sums)] * 2)
    assert ends[0] == pytest.approx(expected) and ends[1] == pytest.approx(expected)
    assert sums[0] == sums[1] == [3.0, 2.0]  # the sums themselves, as any allreduce
    hidden = [(e.start, e.end) for e in world.events if e.kind == "overlapped" and e.rank == 0]
    comm = sum(e.end - e.start for e in world.events if e.kind == "comm" and e.rank == 0)
    if start == "allreduce_background":
        assert hidden == [pytest.approx((15e-3, 21e-3))]
        assert comm == pytest.approx(14e-3)  # only the second, after the block
    else:
        assert hidden == [] and comm == pytest.approx(20e-3)


def test_transfers_started_in_one_block_wait_for_each_other():
    """A second bucket ready while the first is still on the wire starts after it."""
    world, ends = _world(), {}

    async def program(comm):
        async with comm.compute(0):
            pending = [comm.allreduce_background(torch.ones(2000)) for _ in range(2)]
        for p in pending:
            await p.wait()
        ends[comm.rank] = comm.now()

    world.run([program] * 2)
    # ready at 20 and 30 ms; the first (8 + 2 ms) until 30 ms, the second then until 40 ms.
    assert ends == {0: pytest.approx(40e-3), 1: pytest.approx(40e-3)}
    hidden = [(e.start, e.end) for e in world.events if e.kind == "overlapped" and e.rank == 0]
    assert hidden == [pytest.approx((20e-3, 30e-3))]


def _lab_run(strategy: str):
    """The lab's own reducer on the sim: the MLP's 2.6 MB of gradients in buckets of 0.5 MiB
    (6 of them), 12 steps so that the first steps' timing of both modes has chosen (step 10)."""
    from common import small_for

    from scaledl_lab import ExperimentConfig, run

    cfg = ExperimentConfig(
        strategy=strategy, runtime="sim", workers=2, model="mlp", bucket_mb=0.5,
        network="10gbe", **small_for(12, batch_size=16),
    )  # fmt: skip
    return run(cfg, progress=False, log=None)


def test_the_labs_bucketed_allreduce_overlaps_backward_on_the_sim():
    """``allreduce`` starts each full bucket from its gradient hook in the background: the
    timeline shows transfers behind backward, its steps are shorter than one allreduce after
    backward (``allreduce-naive``), the first steps' timing keeps overlap on every rank, and
    the parameters are the naive reducer's bit for bit (the same sums, only earlier)."""
    bucketed, naive = _lab_run("allreduce"), _lab_run("allreduce-naive")
    assert [o["overlap"] for o in bucketed.outputs[bucketed.configs[0].label]] == [True, True]
    hidden = bucketed.timeline().query("kind == 'overlapped'")
    assert len(hidden) >= 12 and set(hidden["rank"]) == {0, 1}  # some transfer in every step
    assert naive.timeline().query("kind == 'overlapped'").empty

    def step_s(res) -> float:  # rank 0's steps after the trial (both modes tried until step 10)
        times = res.frame.query("kind == 'train' and rank == 0")["time"].to_numpy()
        return float(times[-1] - times[-2])

    assert step_s(bucketed) < 0.9 * step_s(naive)
    for name, value in naive.model_state_dict().items():
        assert torch.equal(bucketed.model_state_dict()[name], value), name
