"""Embedded clusters' workers: forked from a server that imported torch and the lab once, yet
with this process's environment as it is when each cluster starts (not as when the server did)."""

from __future__ import annotations

import multiprocessing
import os

import pytest
from distributed import Client

from scaledl_lab.runtime.dask import cluster


def _what_a_worker_sees(_: int) -> dict:
    import sys

    import torch

    return {
        "lab": "scaledl_lab.strategies" in sys.modules,
        "threads": torch.get_num_threads(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "arenas": os.environ.get("MALLOC_ARENA_MAX"),
        "later": os.environ.get("SCALEDL_TEST_LATER"),
        "parent": os.getppid(),
    }


def _seen(monkeypatch: pytest.MonkeyPatch, value: str) -> dict:
    monkeypatch.setenv("SCALEDL_TEST_LATER", value)
    with Client(cluster.local_cluster(1, dashboard=False)) as client:
        seen = client.submit(_what_a_worker_sees, 0, pure=False).result()
        client.shutdown()
    return seen


@pytest.mark.skipif(
    "forkserver" not in multiprocessing.get_all_start_methods(), reason="no fork server here"
)
def test_workers_start_forked_with_the_lab_loaded_and_the_environment_of_now(monkeypatch):
    first, second = _seen(monkeypatch, "one"), _seen(monkeypatch, "two")
    for seen in (first, second):
        assert seen["lab"], "the worker imported the lab itself: it was not forked from the server"
        # Read by OpenMP and glibc as they load: set in the server's environment, inherited.
        assert seen["threads"] == 1 and seen["omp"] == "1" and seen["arenas"] == "1"
        assert seen["parent"] != os.getpid()  # the server's child, not this process's
    # Set after the server started: each cluster's workers see the value of their start.
    assert (first["later"], second["later"]) == ("one", "two")
    assert first["parent"] == second["parent"]  # one server for every cluster of the process
    assert cluster._start_method() == "forkserver"
