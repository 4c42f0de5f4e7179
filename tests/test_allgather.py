"""Comm.allgather on both runtimes: every member's tensor in rank order, (p − 1) × its bytes
counted as sent, and on the simulator the time of a ring allgather."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from common import SMALL

from scaledl_lab import ExperimentConfig
from scaledl_lab.runtime.sim.cost import (
    ComputeProfile,
    CostModel,
    NetworkProfile,
    Stragglers,
    allgather_time,
)
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.launch import execute

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NET = NetworkProfile("test", 1e-3, 1e6)


def _cost(algorithm: str = "ring") -> CostModel:
    return CostModel(ComputeProfile("test", 1e-2, 1e-4), NET, algorithm, Stragglers())


@pytest.mark.parametrize("algorithm", ["ring", "recursive-doubling"])
def test_allgather_on_sim_returns_every_piece_in_rank_order(algorithm):
    world = SimWorld(4, _cost(algorithm))
    seen = {}

    async def program(comm):
        pieces = await comm.allgather(torch.full((250,), float(comm.rank)))  # 1 KB each
        seen[comm.rank] = ([p[0].item() for p in pieces], comm.now(), comm.bytes_sent)

    world.run([program] * 4)
    steps = 3 if algorithm == "ring" else 2
    for rank in range(4):
        values, now, sent = seen[rank]
        assert values == [0.0, 1.0, 2.0, 3.0]
        assert sent == 3 * 1000
        assert now == pytest.approx(steps * 1e-3 + 3 * 1000 / 1e6)
        assert now == pytest.approx(allgather_time(1000, 4, NET, algorithm))


def test_allgather_of_a_group_on_sim():
    world = SimWorld(4, _cost())
    seen = {}

    async def program(comm):
        group = comm.new_group([1, 3])
        if comm.rank in group:
            pieces = await comm.allgather(torch.tensor([comm.rank], dtype=torch.uint8), group)
            seen[comm.rank] = [int(p) for p in pieces]

    world.run([program] * 4)
    assert seen == {1: [1, 3], 3: [1, 3]}


async def _gather_program(ctx):
    comm = ctx.comm
    before = comm.bytes_sent
    small = await comm.allgather(torch.arange(5, dtype=torch.uint8) + 10 * comm.rank)
    wide = await comm.allgather(torch.full((3,), comm.rank + 0.5, dtype=torch.float64))
    ctx.result["small"] = [p.tolist() for p in small]
    ctx.result["wide"] = [p.tolist() for p in wide]
    ctx.result["sent"] = comm.bytes_sent - before


@pytest.mark.parametrize("runtime", ["dask", "sim"])
def test_allgather_on_both_runtimes(runtime, request):
    client = request.getfixturevalue("client") if runtime == "dask" else None
    cfg = ExperimentConfig(strategy="allreduce", runtime=runtime, workers=2, model="mlp", **SMALL)
    results = execute(cfg, "gather", lambda rows: None, client=client, program=_gather_program)
    for res in results.results:
        assert res["small"] == [[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]]
        assert res["wide"] == [[0.5] * 3, [1.5] * 3]
        assert res["sent"] == 5 + 3 * 8  # one piece to the one other worker, each
