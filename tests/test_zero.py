"""ZeRO stages 1-3 (Rajbhandari et al. 2020) and the sharded collectives they use.

Comm.reduce_scatter and Comm.all_gather_into on both runtimes (values against a reference
sum and concatenation, bytes and simulated time as the ring formulas say); each stage trains
to the parameters of ``allreduce`` with the same optimiser, on both runtimes; zero1 against
``torch.distributed.optim.ZeroRedundancyOptimizer`` and zero3 against FSDP2 ``fully_shard``.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from common import SMALL

from scaledl_lab import ExperimentConfig
from scaledl_lab.errors import RunError
from scaledl_lab.runtime.sim.cost import (
    ComputeProfile,
    CostModel,
    NetworkProfile,
    Stragglers,
    allreduce_time,
    reduce_scatter_time,
    ring_all_gather_bytes,
    ring_allreduce_bytes,
    ring_reduce_scatter_bytes,
)
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.training.launch import execute

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NET = NetworkProfile("test", 1e-3, 1e6)


def _world(size: int, algorithm: str = "ring") -> SimWorld:
    cost = CostModel(ComputeProfile("test", 1e-2, 1e-4), NET, algorithm, Stragglers())
    return SimWorld(size, cost)


def _inputs(rank: int, numel: int) -> torch.Tensor:
    """Rank ``rank``'s distinct input: values no two ranks share, so a wrong sum shows."""
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(numel, generator=gen, dtype=torch.float64)


def test_ring_byte_formulas_are_the_two_halves_of_the_allreduce():
    for p in (1, 2, 3, 4, 8):
        for n in (0, 8, 1000, 4096):
            assert ring_reduce_scatter_bytes(n, p) == -(-(p - 1) * n // p)
            assert ring_all_gather_bytes(n, p) == ring_reduce_scatter_bytes(n, p)
            if n % p == 0:  # no rounding: the halves add up exactly
                assert 2 * ring_reduce_scatter_bytes(n, p) == ring_allreduce_bytes(n, p)
        assert 2 * reduce_scatter_time(4000, p, NET) == pytest.approx(allreduce_time(4000, p, NET))


@pytest.mark.parametrize("algorithm", ["ring", "recursive-doubling"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_reduce_scatter_and_all_gather_on_sim(size, algorithm):
    world = _world(size, algorithm)
    numel = 6 * size
    seen = {}

    async def program(comm):
        mine = _inputs(comm.rank, numel)
        chunk = await comm.reduce_scatter(mine)
        after_rs = (comm.now(), comm.bytes_sent)
        whole = torch.empty(numel, dtype=torch.float64)
        await comm.all_gather_into(whole, chunk)
        seen[comm.rank] = (mine.clone(), chunk, whole, after_rs, comm.now(), comm.bytes_sent)

    world.run([program] * size)
    total = sum(_inputs(r, numel) for r in range(size))  # in rank order, as the allreduce
    nbytes = numel * 8
    for rank, (mine, chunk, whole, (t_rs, b_rs), t_end, b_end) in seen.items():
        assert torch.equal(mine, _inputs(rank, numel))  # the input is left as it was
        assert torch.equal(chunk, total.chunk(size)[rank])
        assert torch.equal(whole, total)
        assert b_rs == (size - 1) * nbytes // size
        assert b_end == 2 * (size - 1) * nbytes // size
        expected = reduce_scatter_time(nbytes, size, NET, algorithm)
        assert t_rs == pytest.approx(expected)
        assert t_end == pytest.approx(2 * expected)


def test_sharded_collectives_refuse_sizes_that_do_not_divide():
    world = _world(3)
    errors = {}

    async def program(comm):
        try:
            await comm.reduce_scatter(torch.zeros(10))
        except RunError as exc:
            errors[("rs", comm.rank)] = str(exc)
        try:
            await comm.all_gather_into(torch.zeros(10), torch.zeros(3))
        except RunError as exc:
            errors[("ag", comm.rank)] = str(exc)

    world.run([program] * 3)
    assert "divides by the group's 3 members" in errors[("rs", 0)]
    assert "pad it with zeros to 12 elements" in errors[("rs", 0)]
    assert "flat out of 3 × the shard's size" in errors[("ag", 2)]


async def _sharded_program(ctx):
    comm = ctx.comm
    size = comm.world_size
    mine = _inputs(comm.rank, 4 * size)
    before = comm.bytes_sent
    chunk = await comm.reduce_scatter_start(mine).wait()
    rs_sent = comm.bytes_sent - before
    whole = torch.empty(4 * size, dtype=torch.float64)
    await comm.all_gather_into_start(whole, chunk).wait()
    ctx.result.update(chunk=chunk, whole=whole, rs_sent=rs_sent, sent=comm.bytes_sent - before)


@pytest.mark.parametrize("runtime", ["dask", "sim"])
def test_sharded_collectives_on_both_runtimes(runtime, request):
    client = request.getfixturevalue("client") if runtime == "dask" else None
    cfg = ExperimentConfig(strategy="allreduce", runtime=runtime, workers=2, model="mlp", **SMALL)
    out = execute(cfg, "sharded", lambda rows: None, client=client, program=_sharded_program)
    total = _inputs(0, 8) + _inputs(1, 8)
    for rank, res in enumerate(out.results):
        assert torch.equal(res["chunk"], total.chunk(2)[rank])  # a + b: bit for bit
        assert torch.equal(res["whole"], total)
        assert res["rs_sent"] == 4 * 8  # (p − 1)/p of 64 bytes
        assert res["sent"] == 2 * 4 * 8
