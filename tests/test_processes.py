"""Started processes (Dask workers of embedded clusters, the PyTorch references' ranks):
forked from a server that imported torch and the lab once, yet with this process's environment
as it is when each starts (not as when the server did)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from distributed import Client

from scaledl_lab.runtime import processes
from scaledl_lab.runtime.dask import cluster

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="workers fork from the server on Linux only"
)


def _what_it_sees(_: int, out: str | None = None) -> dict:
    import sys

    import torch

    seen = {
        "lab": "scaledl_lab.strategies" in sys.modules,
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "arenas": os.environ.get("MALLOC_ARENA_MAX"),
        "later": os.environ.get("SCALEDL_TEST_LATER"),
        "parent": os.getppid(),
    }
    if out is not None:
        Path(out).write_text(json.dumps(seen))
    return seen


def _tick_interval(dask_worker=None, dask_scheduler=None) -> float:
    """Seconds between the event-loop checks of the server it runs on (Dask's attribute)."""
    return (dask_worker or dask_scheduler)._tick_interval


def _worker_sees(monkeypatch: pytest.MonkeyPatch, value: str) -> dict:
    monkeypatch.setenv("SCALEDL_TEST_LATER", value)
    with Client(cluster.local_cluster(1, dashboard=False)) as client:
        seen = client.submit(_what_it_sees, 0, pure=False).result()
        # How often each Dask server wakes to check its event loop (cluster.WORKER_CONFIG).
        seen["ticks"] = [
            *client.run(_tick_interval).values(),
            client.run_on_scheduler(_tick_interval),
        ]
        client.shutdown()
    return seen


def _assert_forked(seen: dict) -> None:
    assert seen["lab"], "it imported the lab itself: it was not forked from the server"
    # Read by OpenMP and glibc as they load: set in the server's environment, inherited.
    assert seen["threads"] == 1 and seen["omp"] == "1" and seen["arenas"] == "1"
    assert seen["parent"] != os.getpid()  # the server's child, not this process's


def test_dask_workers_start_forked_with_the_lab_loaded_and_the_environment_of_now(monkeypatch):
    first, second = _worker_sees(monkeypatch, "one"), _worker_sees(monkeypatch, "two")
    _assert_forked(first)
    _assert_forked(second)
    # Set after the server started: each cluster's workers see the value of their start.
    assert (first["later"], second["later"]) == ("one", "two")
    assert first["parent"] == second["parent"]  # one server for every cluster of the process
    assert processes.start_method() == "forkserver"
    # Once a second, not Dask's 20 ms: an idle cluster costs a third of the CPU it did.
    assert first["ticks"] == [1.0, 1.0]


def test_started_ranks_are_forked_too_with_the_environment_of_now(monkeypatch, tmp_path):
    monkeypatch.setenv("SCALEDL_TEST_LATER", "ranks")
    processes.run_processes(_what_it_sees, (str(tmp_path / "seen.json"),), 1)
    seen = json.loads((tmp_path / "seen.json").read_text())
    _assert_forked(seen)
    assert seen["later"] == "ranks"
