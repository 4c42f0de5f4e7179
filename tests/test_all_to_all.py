"""Comm.all_to_all on both runtimes: member i's j-th chunk becomes member j's i-th, (p − 1)/p of
the bytes counted as sent, on the simulator the time of p − 1 pairwise rounds on the link its
group crosses, and a tensor that does not split into one chunk per member refused."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from common import SMALL

from scaledl_lab import ExperimentConfig
from scaledl_lab.errors import RunError
from scaledl_lab.runtime.collectives import all_to_all_bytes
from scaledl_lab.runtime.sim.cost import (
    ComputeProfile,
    CostModel,
    NetworkProfile,
    Stragglers,
    all_to_all_time,
)
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.launch import execute

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NET = NetworkProfile("test", 1e-3, 1e6)


def _cost(net=NET, gpus_per_node=None) -> CostModel:
    compute = ComputeProfile("test", 1e-2, 1e-4)
    return CostModel(compute, net, "ring", Stragglers(), gpus_per_node=gpus_per_node)


def test_all_to_all_bytes_formula():
    assert all_to_all_bytes(1000, 1) == 0
    assert all_to_all_bytes(1000, 4) == 750
    assert all_to_all_time(1000, 4, NET) == pytest.approx(3 * 1e-3 + 750 / 1e6)


def test_all_to_all_on_sim_moves_the_chunks_and_charges_them():
    world = SimWorld(4, _cost())
    seen = {}

    async def program(comm):
        mine = torch.arange(4 * 2 * 3, dtype=torch.float64).reshape(8, 3) + 100 * comm.rank
        got = await comm.all_to_all(mine)  # 192 bytes, 48 of them to each member
        seen[comm.rank] = (mine, got, comm.now(), comm.bytes_sent)

    world.run([program] * 4)
    for j in range(4):
        mine, got, now, sent = seen[j]
        assert got.shape == (8, 3)
        for i in range(4):
            assert torch.equal(got[2 * i : 2 * i + 2], seen[i][0][2 * j : 2 * j + 2])
        assert sent == 3 * 192 // 4
        assert now == pytest.approx(3 * 1e-3 + 3 * 192 / 4 / 1e6)


def test_all_to_all_of_a_group_is_charged_on_the_link_it_crosses():
    net = NetworkProfile("two", 1e-3, 1e6, inter_latency_s=1e-2, inter_bandwidth_Bps=1e5)
    world = SimWorld(4, _cost(net, gpus_per_node=2))
    seen = {}

    async def program(comm):
        inside, across = comm.new_group([0, 1]), comm.new_group([1, 3])
        for name, group in (("inside", inside), ("across", across)):
            if comm.rank in group:
                start = comm.now()
                got = await comm.all_to_all(torch.full((2, 500), float(comm.rank)), group)
                seen[(name, comm.rank)] = (got[:, 0].tolist(), comm.now() - start)

    world.run([program] * 4)
    assert seen[("inside", 0)][0] == [0.0, 1.0] == seen[("inside", 1)][0]
    assert seen[("across", 3)][0] == [1.0, 3.0]  # rank 3 waited for rank 1 to come
    assert seen[("inside", 0)][1] == pytest.approx(all_to_all_time(4000, 2, net.intra))
    assert seen[("across", 1)][1] == pytest.approx(all_to_all_time(4000, 2, net.inter))
    assert seen[("across", 1)][1] > 10 * seen[("inside", 0)][1]


def test_all_to_all_refuses_a_tensor_that_does_not_split():
    world = SimWorld(2, _cost())

    async def program(comm):
        await comm.all_to_all(torch.zeros(3, 2))

    with pytest.raises(RunError, match=r"first size must divide by 2"):
        world.run([program] * 2)


async def _exchange_program(ctx):
    comm = ctx.comm
    before = comm.bytes_sent
    mine = torch.arange(6, dtype=torch.float64).reshape(2, 3) + 10 * comm.rank
    ctx.result["got"] = (await comm.all_to_all_start(mine).wait()).tolist()
    ctx.result["sent"] = comm.bytes_sent - before
    try:
        await comm.all_to_all(torch.zeros(3))
    except RunError as exc:
        ctx.result["refused"] = str(exc)


@pytest.mark.parametrize("runtime", ["dask", "sim"])
def test_all_to_all_on_both_runtimes(runtime, request):
    client = request.getfixturevalue("client") if runtime == "dask" else None
    cfg = ExperimentConfig(strategy="allreduce", runtime=runtime, workers=2, model="mlp", **SMALL)
    results = execute(cfg, "a2a", lambda rows: None, client=client, program=_exchange_program)
    got = [res["got"] for res in results.results]
    assert got[0] == [[0.0, 1.0, 2.0], [10.0, 11.0, 12.0]]
    assert got[1] == [[3.0, 4.0, 5.0], [13.0, 14.0, 15.0]]
    for res in results.results:
        assert res["sent"] == 48 // 2
        assert "got shape (3,) over 2 members" in res["refused"]
