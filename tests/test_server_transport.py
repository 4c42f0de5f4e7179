"""Server calls as torch.distributed point-to-point messages (runtime/dask/p2p.py): a real gloo
group of the server's own, its ranks here as threads of one process (or a server in a process
that is killed); how a config names the transports; and every parameter-server family's
strategy on real Dask workers through it, against actor calls and the simulator."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch
from common import SMALL, max_diff

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.cli import _parser
from scaledl_lab.config import validate
from scaledl_lab.errors import ConfigError
from scaledl_lab.runtime.base import NOT_READY
from scaledl_lab.runtime.dask.p2p import FIRST, P2PClient, P2PServer
from scaledl_lab.runtime.servers import ServerLoop
from scaledl_lab.strategies.parameter_server.twins import replay_async_server, server_push_order
from scaledl_lab.training.worker import load_for


class Ledger:
    """Keeps who called in which order; ``wait_for`` is parked until ``add`` reached a total."""

    def __init__(self) -> None:
        self.total = torch.zeros(3, dtype=torch.float64)
        self.order: list[tuple[int, int]] = []

    def add(self, rank: int, n: int, x: torch.Tensor) -> torch.Tensor:
        self.total += x
        self.order.append((rank, n))
        return self.total

    def wait_for(self, at_least: float) -> torch.Tensor | object:
        return NOT_READY if self.total.sum() < at_least else self.total * 2

    def echo(self, value: object) -> object:
        return value

    def fail(self) -> None:
        raise ValueError("no such shard")


def _connect(server: P2PServer, ranks: int) -> list[P2PClient]:
    """Every rank's link (each joins the group from its own thread, as ranks would)."""
    address = {**server.address(), "transport": "p2p", "ip": "127.0.0.1"}
    clients: list[P2PClient | None] = [None] * ranks

    def join(rank: int) -> None:
        clients[rank] = P2PClient(address, rank, 20.0)

    threads = [threading.Thread(target=join, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(c is not None for c in clients)
    return clients  # type: ignore[return-value]


@pytest.fixture()
def served():
    obj = Ledger()
    server = P2PServer(ServerLoop(obj), 2, 20.0)
    clients = _connect(server, 2)
    yield obj, clients, server
    for c in clients:
        c.close()
    server.close()
    assert not server.thread.is_alive()


def test_values_of_every_kind_and_size_arrive_as_they_were_sent(served):
    _, (a, _), _ = served
    value = (
        3,
        torch.randn(5, 7)[:, ::2],  # not contiguous
        {"state": {0: {"step": torch.tensor(4.0), "sum": torch.rand(3, dtype=torch.float64)}}},
        [torch.arange(6)[::2], torch.zeros(0), torch.tensor([True, False]), float("inf")],
        "x" * (3 * FIRST),  # a description longer than the first message
    )
    a.start("echo", (value,))
    got = a.wait(10)
    assert got[0] == 3 and got[3][3] == float("inf") and got[4] == value[4]
    assert torch.equal(got[1], value[1]) and got[1].shape == (5, 4)
    state = got[2]["state"][0]
    assert torch.equal(state["step"], torch.tensor(4.0)) and state["sum"].dtype == torch.float64
    assert torch.equal(state["sum"], value[2]["state"][0]["sum"])
    for x, y in zip(got[3][:3], value[3][:3], strict=True):
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_a_parked_call_is_answered_once_another_rank_has_changed_the_server(served):
    obj, (a, b), _ = served
    a.start("wait_for", (4.0,))  # parked: the total is 0
    b.start("add", (1, 0, torch.ones(3, dtype=torch.float64)))
    assert torch.equal(b.wait(10), torch.ones(3, dtype=torch.float64))
    b.start("add", (1, 1, torch.full((3,), 0.5, dtype=torch.float64)))
    b.wait(10)
    assert torch.equal(a.wait(10), torch.full((3,), 3.0, dtype=torch.float64))
    # The reply was copied when answered: the server's later changes do not reach it.
    a.start("add", (0, 0, torch.ones(3, dtype=torch.float64)))
    assert a.wait(10)[0].item() == 2.5


def test_calls_from_many_ranks_are_served_one_at_a_time_each_rank_in_its_order(served):
    obj, clients, _ = served
    calls = 40

    def caller(rank: int) -> None:
        for n in range(calls):
            clients[rank].start("add", (rank, n, torch.ones(3, dtype=torch.float64)))
            clients[rank].wait(10)

    threads = [threading.Thread(target=caller, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(obj.order) == 2 * calls and obj.total[0].item() == 2 * calls
    for rank in range(2):
        assert [n for r, n in obj.order if r == rank] == list(range(calls))


def test_an_error_in_the_server_is_raised_in_the_caller_and_the_server_goes_on(served):
    _, (a, _), server = served
    a.start("fail", ())
    with pytest.raises(RuntimeError, match="ValueError: no such shard"):
        a.wait(10)
    a.start("add", (0, 0, torch.ones(3, dtype=torch.float64)))
    assert torch.equal(a.wait(10), torch.ones(3, dtype=torch.float64))
    assert server.loop.stats()["calls"] == 1  # the failed call is not counted


def test_one_call_at_a_time_per_rank_and_server(served):
    _, (a, _), _ = served
    with pytest.raises(RuntimeError, match="no call to this server is waiting"):
        a.wait(1)
    a.start("wait_for", (100.0,))
    with pytest.raises(RuntimeError, match="still waiting for its reply"):
        a.start("add", (0, 0, torch.ones(3, dtype=torch.float64)))
    with pytest.raises(ConnectionError, match="Timed out"):
        a.wait(0.3)


SERVE = """
import sys, time
from scaledl_lab.runtime.dask.p2p import P2PServer
from scaledl_lab.runtime.servers import ServerLoop
from scaledl_lab.runtime.base import NOT_READY
class Parks:
    def wait(self):
        return NOT_READY
server = P2PServer(ServerLoop(Parks()), 1, 20.0)
print(server.address()["port"], flush=True)
time.sleep(120)
"""


def test_a_server_whose_process_dies_is_named_within_seconds():
    child = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True)
    try:
        port = int(child.stdout.readline())
        client = P2PClient({"ip": "127.0.0.1", "port": port, "size": 2}, 0, 60.0)
        client.start("wait", ())  # parked for good
        threading.Timer(1.0, child.kill).start()
        started = time.monotonic()
        with pytest.raises(ConnectionError, match="Connection closed by peer"):
            client.wait(60)
        assert time.monotonic() - started < 10  # not the 60 s timeout
        client.close()  # saying goodbye to a dead server does not fail
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_config_and_cli_name_the_transports_and_say_what_replaced_shared_memory():
    with pytest.raises(ConfigError, match=r"server_transport='tcp' is unknown; allowed: .*'p2p'"):
        validate(ExperimentConfig(strategy="ps-sync", server_transport="tcp"))
    with pytest.raises(
        ConfigError,
        match=r"server_transport='shm' \(calls through shared memory\) was removed: 'p2p', "
        r"torch.distributed point-to-point messages .* replaced it .*'auto', the default, takes",
    ):
        validate(ExperimentConfig(strategy="ps-async", server_transport="shm"))
    for transport in ("p2p", "actor", "auto"):
        validate(ExperimentConfig(strategy="ps-async", server_transport=transport))
        argv = ["run", "--strategy", "ps-async", "--server-transport", transport]
        assert _parser().parse_args(argv).server_transport == transport


# -- every parameter-server family's strategy on real Dask workers, through p2p ---------------

TWO = dict(
    runtime="dask", workers=2, model="mlp", batch_size=32, max_steps=12, momentum=0.0, lr=0.01,
    train_subset=2000, test_subset=200, val_size=200, optimizer="adam",
)  # fmt: skip


@pytest.mark.parametrize("strategy", ["ps-sync", "backup-workers"])
def test_synchronous_servers_train_the_same_through_p2p_as_through_actor_calls(client, strategy):
    def frame(transport):
        cfg = ExperimentConfig(strategy=strategy, server_transport=transport, servers=2, **TWO)
        f = run(cfg, client=client, progress=False).frame
        return f.sort_values(["kind", "rank", "step"]).reset_index(drop=True)

    p2p, actor = frame("p2p"), frame("actor")
    columns = ["kind", "rank", "step", "loss", "accuracy", "bytes_sent"]
    trained = p2p[p2p.kind.isin(["train", "test"])]
    if strategy == "ps-sync":  # backup-workers: which worker is left out depends on timing
        assert trained[columns].equals(actor[actor.kind.isin(["train", "test"])][columns])
    servers = p2p[p2p.kind == "server"]
    assert len(servers) == 2
    assert (servers.calls >= 2 * 12).all()  # every push and pull was counted
    assert (
        servers[["calls", "bytes_received"]].equals(
            actor[actor.kind == "server"][["calls", "bytes_received"]]
        )
        or strategy == "backup-workers"
    )


ONE_WORKER = {
    "ps-async": {},
    "downpour": {"n_fetch": 2, "n_push": 2},
    "staleness-aware": {},
    "dc-asgd": {},
    "easgd": {"elastic_async": True, "sync_period": 2},
}


@pytest.mark.parametrize("strategy", list(ONE_WORKER))
def test_one_worker_through_p2p_trains_as_the_simulator_does(client, strategy):
    """One worker makes an asynchronous server deterministic: the real run through p2p lands on
    the simulator's weights (the simulator moves no bytes: its servers are objects)."""
    cfg = ExperimentConfig(
        strategy=strategy, workers=1, model="mlp", server_transport="p2p",
        **{**SMALL, **ONE_WORKER[strategy]},
    )  # fmt: skip
    real = run(cfg, client=client, progress=False)
    simulated = run(cfg.replace(runtime="sim"), progress=False)
    assert max_diff(real.state_dict(), simulated.state_dict()) < 1e-6
    servers = real.frame.query("kind == 'server'")
    assert servers["calls"].tolist() == simulated.frame.query("kind == 'server'")["calls"].tolist()


@pytest.mark.parametrize("strategy", ["ps-async", "staleness-aware"])
def test_two_workers_through_p2p_equal_the_replayed_update_sequence(client, strategy):
    """Two real workers push concurrently: the server applied their pushes one at a time, in
    the order the rows' staleness tells, and nothing else (float64, as test_async_ps_twins)."""
    cfg = ExperimentConfig(
        strategy=strategy, workers=2, model="mlp", precision="float64", server_transport="p2p",
        **{**SMALL, "momentum": 0.0, "max_steps": 12},
    )  # fmt: skip
    res = run(cfg, client=client, progress=False)
    train = res.frame.query("kind == 'train'")
    order = server_push_order(train, n_fetch=cfg.n_fetch, n_push=cfg.n_push)
    assert len(order) == 2 * 12 and set(order) == {0, 1}
    assert train["staleness"].max() >= 1  # both started from version 0: one push was stale
    replayed = replay_async_server(cfg, load_for(cfg), order)
    for rank in range(2):
        assert max_diff(res.state_dict(rank=rank), replayed) < 1e-10, rank
