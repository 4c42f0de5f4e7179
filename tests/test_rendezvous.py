"""The torch.distributed rendezvous (rank 0's store, a parameter server's store) and gloo's
listeners bind to the Dask worker's interface: loopback for the embedded cluster, never every
interface (the stores are unauthenticated)."""

from __future__ import annotations

import ipaddress
import os
import threading
from datetime import timedelta

import psutil
import pytest
from common import SMALL

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.runtime.dask import rendezvous


def listeners(pids: list[int]) -> set[tuple[str, int]]:
    """The (address, port) every TCP socket of ``pids`` listens on."""
    found = set()
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.NoSuchProcess:
            continue
        found |= {(c.laddr.ip, c.laddr.port) for c in connections if c.status == "LISTEN"}
    return found


def is_loopback(ip: str) -> bool:
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


@pytest.mark.parametrize(
    "strategy,options",
    [("allreduce", {}), ("ps-sync", {"server_transport": "p2p"})],
)
def test_a_dask_run_listens_on_loopback_only(strategy, options, client):
    pids = list(client.run(os.getpid).values())
    before = listeners(pids)  # the workers' and nannies' own: Dask's, on 127.0.0.1
    seen: set[tuple[str, int]] = set()
    done = threading.Event()

    def watch() -> None:  # while the run goes on
        while not done.is_set():
            seen.update(listeners(pids))
            done.wait(0.05)

    cfg = ExperimentConfig(strategy=strategy, runtime="dask", workers=2, model="mlp",
                           **SMALL, **options)  # fmt: skip
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run(cfg, client=client, progress=False, log=None)
    finally:
        done.set()
        watcher.join()
    during = seen - before
    assert during, "the run's stores and gloo listeners were seen"
    assert [s for s in sorted(seen | before) if not is_loopback(s[0])] == []


def test_the_store_listens_on_the_host_it_is_given():
    store = rendezvous.master_store("127.0.0.1", 0, timedelta(seconds=10))
    ours = {(ip, port) for ip, port in listeners([os.getpid()]) if port == store.port}
    assert ours == {("127.0.0.1", store.port)}
    peer = rendezvous.rank_store("127.0.0.1", store.port, 1, timedelta(seconds=10))
    peer.set("key", "value")
    assert store.get("key") == b"value"
    assert rendezvous.interface_of("127.0.0.1") is not None  # loopback has an interface
