"""Shared fixtures: a real two-worker Dask LocalCluster (no mocks of Dask or torch).

Most tests train on small subsets of Fashion-MNIST. Without it, the session stops before
collecting anything, with one message saying where the data was looked for and how to get it.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path

import pytest
from distributed import Client

from scaledl_lab.data import DatasetNotFoundError, locate
from scaledl_lab.runtime.dask.cluster import connect


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        locate("fashion-mnist")
    except DatasetNotFoundError as exc:
        # A usage error stops the session before collection and is printed once.
        raise pytest.UsageError(
            f"the tests train on Fashion-MNIST, which is not installed; get it once and "
            f"rerun.\n{exc}"
        ) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", help="also run the tests marked slow")


# Seconds per test file (and notebook) in the last measured run of the whole suite, written by
# benchmarks/suite_durations.py: the order in which pytest-xdist hands files out.
COSTS = Path(__file__).resolve().parents[1] / "results" / "suite-durations" / "files.csv"
GB_PER_PROCESS = 3  # a test process with its own two-worker LocalCluster and a notebook kernel


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without it, never called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one test process per core, as many as memory allows (each holds torch, its
    own two-worker LocalCluster and, for a notebook, a kernel: about 3 GB at their peak)."""
    import psutil

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    by_memory = int(psutil.virtual_memory().available / 2**30 // GB_PER_PROCESS)
    return max(1, min(cores or 1, by_memory))


def costliest_first(items: list[pytest.Item], costs: dict[str, float]) -> list[pytest.Item]:
    """The items, file by file, the costliest file first (each file's items in their order).

    pytest-xdist's ``--dist loadscope`` sends each file whole to one process, in collection
    order (``--no-loadscope-reorder``): handing out the longest first keeps the last file to
    start short, so neither process idles long at the end (longest processing time first). A
    file not measured yet counts as the median file."""
    known = sorted(costs.values())
    median = known[len(known) // 2] if known else 0.0
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    order = sorted(files, key=lambda f: -costs.get(f, median))  # stable: ties keep their order
    return [item for f in order for item in files[f]]


def _file_costs() -> dict[str, float]:
    if not COSTS.is_file():
        return {}
    with COSTS.open(newline="") as f:
        return {row["file"]: float(row["seconds"]) for row in csv.DictReader(f)}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    items[:] = costliest_first(items, _file_costs())

    if not config.getoption("--runslow"):
        slow = pytest.mark.skip(reason="slow: run with --runslow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(slow)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def client() -> Client:
    with connect(2, dashboard=False, log=None) as c:
        yield c


@pytest.fixture(scope="module")
def four_workers() -> Client:
    """Four Dask workers for the tests that split one model over four ranks."""
    with connect(4, dashboard=False, log=None) as c:
        yield c
