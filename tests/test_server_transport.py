"""Server calls through shared memory (runtime/dask/shm_link.py): the wire, the server's thread,
its errors, and real runs that must train exactly as they do through Dask actor calls."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.cli import _parser
from scaledl_lab.config import validate
from scaledl_lab.errors import ConfigError
from scaledl_lab.runtime.base import NOT_READY
from scaledl_lab.runtime.dask.shm_link import (
    MIN_SLOT,
    ShmClient,
    ShmServer,
    _Mapped,
    _Slot,
    _write,
    decode,
    encode,
    host_key,
    use_shared_memory,
)


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b


def test_a_message_carries_nested_tensors_of_every_kind(tmp_path):
    value = (
        "push",
        (
            3,
            torch.randn(5, 7),
            {"state": {0: {"step": torch.tensor(4.0), "sum": torch.rand(3, dtype=torch.float64)}}},
            [torch.arange(6, dtype=torch.int64)[::2], torch.zeros(0), torch.tensor([True, False])],
            float("inf"),
        ),
    )
    slot, mapped = _Slot(tmp_path, "out"), _Mapped(tmp_path)
    got = decode(encode(value, slot), mapped)
    _same(got, value)
    # Copied out: writing the next message leaves the first one's tensors as they were.
    decode(encode(("x", (torch.full((5, 7), 9.0),)), slot), mapped)
    _same(got, value)


def test_server_side_views_alias_the_senders_slot_until_its_next_message(tmp_path):
    slot, mapped = _Slot(tmp_path, "in"), _Mapped(tmp_path)
    grad = torch.randn(100)
    (view,) = decode(encode((grad,), slot), mapped, copy=False)
    assert torch.equal(view, grad)
    encode((torch.zeros(100),), slot)
    assert torch.equal(view, torch.zeros(100))  # what the contract of ServerSpec warns about


def test_a_slot_grows_into_a_new_file_and_the_old_one_goes(tmp_path):
    slot, mapped = _Slot(tmp_path, "in"), _Mapped(tmp_path)
    small = torch.randn(10)
    assert torch.equal(decode(encode(small, slot), mapped), small)
    first = slot.name
    big = torch.randn(MIN_SLOT // 4 + 1000)  # more bytes than the first slot holds
    assert torch.equal(decode(encode(big, slot), mapped), big)
    assert slot.name != first and not (tmp_path / first).exists()
    assert (tmp_path / slot.name).exists()
    slot.close()
    assert not (tmp_path / slot.name).exists()


class Counter:
    """A server whose ``wait_for`` is parked until ``add`` has reached a total."""

    def __init__(self) -> None:
        self.total = torch.zeros(3)
        self.calls: list[str] = []

    def add(self, x: torch.Tensor) -> torch.Tensor:
        self.total += x
        self.calls.append("add")
        return self.total

    def wait_for(self, at_least: float) -> torch.Tensor:
        if self.total.sum() < at_least:
            return NOT_READY
        self.calls.append("wait_for")
        return self.total * 2

    def fail(self) -> None:
        raise ValueError("no such shard")


@pytest.fixture()
def served(tmp_path):
    obj = Counter()
    server = ShmServer(tmp_path / "server", 2, lambda m, a: getattr(obj, m)(*a))
    clients = [ShmClient(server.address(), rank) for rank in range(2)]
    yield obj, clients
    for c in clients:
        c.close()
    server.close()
    assert not (tmp_path / "server").exists()


def test_calls_are_answered_and_a_parked_call_goes_once_the_server_has_changed(served):
    obj, (a, b) = served
    a.start("wait_for", (4.0,))  # parked: the total is 0
    b.start("add", (torch.ones(3),))
    assert torch.equal(b.wait(5), torch.ones(3))
    assert obj.calls == ["add"]
    b.start("add", (torch.ones(3) / 2,))
    b.wait(5)
    assert torch.equal(a.wait(5), torch.full((3,), 3.0))  # answered after the second add
    assert obj.calls == ["add", "add", "wait_for"]


def test_an_error_in_the_server_is_raised_in_the_caller_and_the_server_goes_on(served):
    _, (a, _) = served
    a.start("fail", ())
    with pytest.raises(RuntimeError, match="ValueError: no such shard"):
        a.wait(5)
    a.start("add", (torch.ones(3),))
    assert torch.equal(a.wait(5), torch.ones(3))


def test_an_unreadable_call_is_answered_with_the_reason_and_the_server_goes_on(served):
    _, (a, _) = served
    _write(a.request, b"not a pickle")
    a.waiting = True
    with pytest.raises(RuntimeError, match="unreadable call"):
        a.wait(5)
    a.start("add", (torch.ones(3),))
    assert torch.equal(a.wait(5), torch.ones(3))


def test_one_call_at_a_time_per_rank_and_server(served):
    _, (a, _) = served
    a.start("wait_for", (100.0,))
    with pytest.raises(RuntimeError, match="still waiting for its reply"):
        a.start("add", (torch.ones(3),))
    with pytest.raises(TimeoutError, match="no reply within 0.3 s"):
        a.wait(0.3)


def test_a_server_whose_process_is_gone_is_named(tmp_path):
    server = ShmServer(tmp_path / "s", 1, lambda m, a: NOT_READY)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    client = ShmClient({**server.address(), "pid": gone.pid}, 0)
    client.start("anything", ())
    with pytest.raises(ProcessLookupError, match=f"process {gone.pid} is gone"):
        client.wait(30)
    client.close()
    server.close()


def test_the_transport_is_chosen_from_where_everything_runs():
    here = host_key()
    assert here
    assert use_shared_memory("auto", [here, here, here], "r")
    assert not use_shared_memory("auto", [here, "other/1", here], "r")
    assert not use_shared_memory("actor", [here, here], "r")
    assert use_shared_memory("shm", [here, here], "r")
    with pytest.raises(ConfigError, match=r"'shm' needs the servers and every worker on one"):
        use_shared_memory("shm", [here, "other/1"], "run-x")


def test_config_and_cli_name_the_transports():
    with pytest.raises(ConfigError, match=r"server_transport='tcp' is unknown; allowed: .*actor"):
        validate(ExperimentConfig(strategy="ps-sync", server_transport="tcp"))
    args = _parser().parse_args(["run", "--strategy", "ps-async", "--server-transport", "actor"])
    assert args.server_transport == "actor"


SMALL = dict(
    runtime="dask", workers=2, model="mlp", batch_size=32, max_steps=12, momentum=0.0, lr=0.01,
    train_subset=2000, test_subset=200, val_size=200, optimizer="adam",
)  # fmt: skip


@pytest.mark.parametrize("strategy", ["ps-sync", "backup-workers"])
def test_synchronous_servers_train_the_same_through_either_transport(strategy):
    def frame(transport):
        cfg = ExperimentConfig(strategy=strategy, server_transport=transport, servers=2, **SMALL)
        f = run(cfg, progress=False).frame
        return f.sort_values(["kind", "rank", "step"]).reset_index(drop=True)

    shm, actor = frame("shm"), frame("actor")
    columns = ["kind", "rank", "step", "loss", "accuracy", "bytes_sent"]
    trained = shm[shm.kind.isin(["train", "test"])]
    if strategy == "ps-sync":  # backup-workers: which worker is left out depends on timing
        assert trained[columns].equals(actor[actor.kind.isin(["train", "test"])][columns])
    servers = shm[shm.kind == "server"]
    assert len(servers) == 2
    assert (servers.calls >= 2 * 12).all()  # every push and pull was counted
    assert (
        servers[["calls", "bytes_received"]].equals(
            actor[actor.kind == "server"][["calls", "bytes_received"]]
        )
        or strategy == "backup-workers"
    )


def _serve_and_leave(directory: str) -> None:
    ShmServer(Path(directory), 1, lambda m, a: None)  # never closed


def test_a_server_never_closed_leaves_no_files_once_its_process_ends(tmp_path):
    directory = tmp_path / "left"
    child = multiprocessing.get_context("spawn").Process(
        target=_serve_and_leave, args=(str(directory),)
    )
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert not directory.exists()
