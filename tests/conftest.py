"""Shared fixtures: a real two-worker Dask LocalCluster (no mocks of Dask or torch).

Most tests train on small subsets of Fashion-MNIST. Without it, the session stops before
collecting anything, with one message saying where the data was looked for and how to get it.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


def _cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n``, each test process and what it starts (notebook kernels, commands) computes
    on its share of the cores: one thread each when there are as many processes as cores.
    With two processes of torch's default two threads on two cores, OpenMP's threads wait for
    each other's core, spinning: tests/test_gpt.py and test_recompute.py took 72 CPU-s that way
    and 53 with one thread each (the Dask workers and simulated runs already use one)."""
    processes = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not processes:
        return
    import torch

    threads = max(1, _cores() // int(processes))
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)  # children read it as they start
    torch.set_num_threads(threads)


# Notebook kernels forked from one preloaded process per test process (tests/forked_kernel.py):
# the kernel spec named python3 that nbval, otter and JupyterLab look up first runs its launcher.
FORKED_KERNEL = Path(__file__).with_name("forked_kernel.py")
_kernel_server: dict[str, object] = {}


def _start_kernel_server() -> None:
    """Start the preloading server in the background and put its kernel spec first on
    ``JUPYTER_PATH`` (the first kernel waits until the server listens; without the server the
    launcher starts the ordinary kernel)."""
    home = Path(tempfile.mkdtemp(prefix="scaledl-kernels-"))
    spec = home / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, str(FORKED_KERNEL), "launch", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(json.dumps({
        "argv": argv, "display_name": "Python 3 (ipykernel)", "language": "python",
        "metadata": {"debugger": True},
    }))  # fmt: skip
    socket_path = str(home / "server.sock")
    # What a kernel reads once, as matplotlib loads: the backend ipykernel would have chosen.
    env = {**os.environ, "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    log = (home / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, str(FORKED_KERNEL), "serve", socket_path],
        env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    _kernel_server.update(home=home, server=server, log=log)
    os.environ["SCALEDL_KERNEL_SERVER"] = socket_path
    os.environ["JUPYTER_PATH"] = os.pathsep.join(
        [str(home), *filter(None, [os.environ.get("JUPYTER_PATH")])]
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """A kernel server in each process that will run notebooks (not pytest-xdist's controller)."""
    controller = (
        "PYTEST_XDIST_WORKER_COUNT" in os.environ and "PYTEST_XDIST_WORKER" not in os.environ
    )
    notebooks = any(type(item).__name__ == "IPyNbCell" for item in session.items)
    wanted = os.environ.get("SCALEDL_FORK_KERNELS", "1") != "0"  # 0: every kernel started anew
    linux = sys.platform.startswith("linux")  # fork, as runtime/processes.py forks workers
    if notebooks and wanted and linux and not controller and not _kernel_server:
        _start_kernel_server()


def pytest_unconfigure(config: pytest.Config) -> None:
    server = _kernel_server.pop("server", None)
    if server is not None:
        server.terminate()  # it kills the kernels it forked
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        _kernel_server.pop("log").close()
        shutil.rmtree(_kernel_server.pop("home"), ignore_errors=True)


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

    cores = _cores()
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
