"""Non-blocking messages, hosted servers and shared memory, on the simulator and on Dask."""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from common import SMALL

from scaledl_lab import ExperimentConfig
from scaledl_lab.errors import RunError
from scaledl_lab.runtime.base import NOT_READY
from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile, Stragglers
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies import ServerSpec, Strategy
from scaledl_lab.strategies.launch import execute

# The Dask workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _cost(latency=1e-3, bandwidth=1e6):
    return CostModel(
        ComputeProfile("test", 1e-2, 1e-4), NetworkProfile("test", latency, bandwidth), "ring",
        Stragglers(),
    )  # fmt: skip


class Counter:
    """A toy server: ``add`` bumps a version; ``wait_for`` is parked until it is reached."""

    def __init__(self) -> None:
        self.version = 0

    def add(self, payload: torch.Tensor) -> int:
        self.version += 1
        return self.version

    def wait_for(self, version: int) -> torch.Tensor:
        if self.version < version:
            return NOT_READY
        return torch.tensor([float(self.version)])


class CounterSpec(ServerSpec):
    def count(self, cfg) -> int:
        return 2

    def create(self, cfg, index: int) -> Counter:
        return Counter()


def test_irecv_is_ready_only_once_the_message_has_arrived_in_virtual_time():
    world = SimWorld(2, _cost(latency=1e-3, bandwidth=1e6))
    seen = {}

    async def program(comm):
        if comm.rank == 0:
            async with comm.compute(0):  # 10 ms of work, then two messages
                pass
            first = comm.isend(torch.full((250,), 1.0), dst=1)  # 1 KB: 1 ms on the wire
            second = comm.isend(torch.full((250,), 2.0), dst=1)
            await first.wait()
            await second.wait()
            return
        a = comm.irecv(torch.zeros(250), src=0)
        b = comm.irecv(torch.zeros(250), src=0)
        seen["at_start"] = (a.ready(), b.ready())
        async with comm.compute(0):  # rank 1 is at 10 ms: nothing has arrived yet
            pass
        seen["at_10ms"] = (a.ready(), b.ready())
        await b.wait()  # sent second: 10 ms + 2 x 1 ms on the wire + 1 ms latency
        seen["b_at"] = comm.now()
        seen["values"] = (a.ready(), a.tensor[0].item(), b.tensor[0].item())

    world.run([program] * 2)
    assert seen["at_start"] == (False, False)
    assert seen["at_10ms"] == (False, False)
    assert seen["b_at"] == pytest.approx(10e-3 + 2e-3 + 1e-3)
    assert seen["values"] == (True, 1.0, 2.0)  # matched in the order they were sent


def test_a_message_is_what_was_sent_whichever_way_it_is_received():
    """Sent to a posted receive (copied into its buffer), to a mailbox's posted receive, or
    before any receive (queued): each message holds the sender's tensor as it was when sent."""
    world = SimWorld(2, _cost())
    got = {}

    async def program(comm):
        if comm.rank == 0:
            async with comm.compute(0):  # rank 1 posts its receives meanwhile
                pass
            x = torch.zeros(3)
            sends = []
            for value in (1.0, 2.0, 3.0):
                x.fill_(value)  # the same tensor, changed after each send
                sends.append(comm.isend(x, dst=1))
            for pending in sends:
                await pending.wait()
            x.fill_(-1.0)
            return
        posted = comm.irecv(torch.zeros(3), src=0)
        box = comm.mailbox(0, torch.zeros(3), total=2)  # keeps one receive posted
        got["posted"] = (await posted.wait()).tolist()
        first, second = await box.get(), await box.get()  # the second was queued
        got["box"] = [first.tolist(), second.tolist()]
        got["distinct"] = first.data_ptr() != second.data_ptr()

    world.run([program] * 2)
    assert got == {"posted": [1.0] * 3, "box": [[2.0] * 3, [3.0] * 3], "distinct": True}


def test_a_parked_call_is_answered_after_the_state_change_it_waits_for():
    world = SimWorld(3, _cost(), [Counter()])
    replies = {}

    async def program(comm):
        if comm.rank == 2:
            replies["waiter"] = ((await comm.call(0, "wait_for", 2)).item(), comm.now())
            return
        async with comm.compute(100 * (comm.rank + 1)):
            pass
        replies[comm.rank] = (await comm.call(0, "add", torch.zeros(250)), comm.now())

    world.run([program] * 3)
    assert replies[0][0] == 1 and replies[1][0] == 2
    # The waiter is answered only once rank 1's push has been applied.
    assert replies["waiter"][0] == 2.0
    assert replies["waiter"][1] > replies[0][1]
    stats = world.server_stats()[0]
    assert stats["calls"] == 3 and stats["bytes_in"] == 2 * 1000 + 8


@pytest.mark.parametrize("n", [1, 4, 16])
def test_a_server_link_serialises_the_workers_pushes(n):
    # n workers push 1 KB at the same instant: the server's link takes them one after another.
    world = SimWorld(n, _cost(latency=1e-3, bandwidth=1e6), [Counter()])
    done = {}

    async def program(comm):
        await comm.call(0, "add", torch.zeros(250))
        done[comm.rank] = comm.now()

    world.run([program] * n)
    slowest = max(done.values())
    assert slowest == pytest.approx(1e-3 + n * 1e-3 + 8 / 1e6 + 1e-3, rel=1e-6)


def test_calling_a_server_that_the_strategy_did_not_declare_is_an_error():
    world = SimWorld(1, _cost())

    async def program(comm):
        await comm.call(0, "add", torch.zeros(1))

    with pytest.raises(RunError, match="this run hosts no servers"):
        world.run([program])


def test_shared_tensor_is_one_tensor_for_every_simulated_worker():
    world = SimWorld(3, _cost())
    seen = []

    async def program(comm):
        shared = await comm.shared_tensor("x", torch.zeros(3))
        shared[comm.rank] += comm.rank + 1
        await comm.barrier()
        seen.append(shared.tolist())

    world.run([program] * 3)
    assert seen == [[1.0, 2.0, 3.0]] * 3


async def _exercise(ctx):
    """Every messaging feature once, on whichever runtime hosts it."""
    comm, peer = ctx.comm, 1 - ctx.rank
    out = {}
    incoming = comm.irecv(torch.zeros(4), src=peer)
    sent = comm.isend(torch.full((4,), float(ctx.rank)), dst=peer)
    await sent.wait()
    out["from_peer"] = (await incoming.wait()).tolist()
    # Both ranks add to server 1; each then waits until both additions are in.
    out["added"] = await comm.call(1, "add", torch.zeros(8))
    out["seen_version"] = (await comm.call(1, "wait_for", 2)).item()
    pending = [comm.call_start(s, "wait_for", 0) for s in range(comm.num_servers)]
    out["versions"] = [(await p.wait()).item() for p in pending]
    shared = await comm.shared_tensor("slots", torch.zeros(2, dtype=torch.float64))
    shared[ctx.rank] = 10.0 + ctx.rank
    await comm.barrier()
    out["shared"] = shared.tolist()
    ctx.result.update(out)


EXERCISE = Strategy("exercise", _exercise, "messaging self-test", servers=CounterSpec())


def _check_exercise(results):
    for rank, res in enumerate(results):
        assert res["from_peer"] == [float(1 - rank)] * 4
        assert res["seen_version"] == 2.0
        assert res["versions"] == [0.0, 2.0]
        assert res["shared"] == [10.0, 11.0]
    assert sorted(r["added"] for r in results) == [1, 2]


def test_messaging_on_dask(client):
    cfg = ExperimentConfig(strategy="allreduce", workers=2, model="mlp", **SMALL)
    rows = []
    _check_exercise(execute(cfg, "exercise", rows.extend, client=client, program=EXERCISE).results)
    servers = [r for r in rows if r["kind"] == "server"]
    assert [(r["rank"], r["calls"]) for r in servers] == [(2, 2), (3, 6)]
    assert servers[1]["bytes_received"] == 2 * 32 + 4 * 8  # two tensors of 8 floats, 4 ints


def test_messaging_on_sim():
    cfg = ExperimentConfig(strategy="allreduce", runtime="sim", workers=2, model="mlp", **SMALL)
    rows = []
    _check_exercise(execute(cfg, "exercise", rows.extend, program=EXERCISE).results)
    servers = [r for r in rows if r["kind"] == "server"]
    assert [(r["rank"], r["calls"]) for r in servers] == [(2, 2), (3, 6)]
