"""Processes that start in a fraction of a second: forked from one server per process that
imported torch and the lab once, with this process's environment of the moment.

A spawned process imports torch and the lab itself before it does anything: ~2.5 s of CPU each,
paid again by every Dask worker of every cluster a process starts (each notebook, each test),
every rank of the PyTorch references and every process of a side-by-side pool. On Linux they
fork from a server preloaded with those modules (multiprocessing's fork server): a
Dask cluster of four started and ran a task in ~0.2 s instead of ~4 s
(``benchmarks/bench_cluster_start.py``). A forked process has the modules as they were when the
server started: a process that edits the lab's code must restart to see it in its children.
Elsewhere they spawn, as before: Windows has no fork server, and on macOS a process forked after
the system's frameworks loaded may crash in them (Python's reason for spawning there).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import sys
from collections.abc import Callable
from typing import Any

import dask

# torch._dynamo: torch.optim imports it at the first optimizer a process builds (~1.2 s of CPU
# that every forked worker paid again; a Dask run of 2 workers: 6.6 → 4.3 CPU-s).
PRELOAD = (
    "distributed",
    "torch",
    "torch._dynamo",
    "scaledl_lab.runtime.dask.worker",
    "scaledl_lab.strategies",
)
_server_started = False


def start_method() -> str:
    """How children start: on Linux from the fork server, started here with the lab's modules
    once per process; elsewhere by spawning."""
    global _server_started
    if not sys.platform.startswith("linux"):  # macOS forbids much of what a fork inherits
        return "spawn"
    if not _server_started:
        from distributed.utils import get_mp_context

        with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
            context = get_mp_context()  # Dask sets its preload once per process: ours after it
        context.set_forkserver_preload(list(PRELOAD))
        # What the children's libraries read once, as they load (OpenMP's thread count, glibc's
        # arenas), must be in the server's environment: they inherit it, not this one's.
        server_environ = _pre_spawn_environ()
        before = {k: os.environ.get(k) for k in server_environ}
        os.environ.update(server_environ)
        try:
            multiprocessing.forkserver.ensure_running()
        finally:
            for k, v in before.items():
                if v is None:
                    os.environ.pop(k)
                else:
                    os.environ[k] = v
        _server_started = True
    return "forkserver"


def _pre_spawn_environ() -> dict[str, str]:
    """Dask's variables for a worker before it starts (one thread for OpenMP and BLAS ...)."""
    environ = dask.config.get("distributed.nanny.pre-spawn-environ")
    return {k: str(v) for k, v in environ.items() if v is not None}


def set_environ(environ: dict[str, str]) -> None:
    """In a started process: the environment its parent had then (a pool's initializer)."""
    os.environ.update(environ)


def run_processes(fn: Callable[..., Any], args: tuple, nprocs: int) -> None:
    """``torch.multiprocessing.start_processes(fn, args, nprocs)``, joined: ``fn(i, *args)`` in
    each, forked where :func:`start_method` can, with this process's environment of now."""
    import torch.multiprocessing as mp

    mp.start_processes(
        _in_environ,
        args=(dict(os.environ), fn, args),
        nprocs=nprocs,
        join=True,
        start_method=start_method(),
    )


def _in_environ(i: int, environ: dict[str, str], fn: Callable[..., Any], args: tuple) -> None:
    set_environ(environ)
    fn(i, *args)
