"""Start an embedded Dask LocalCluster, or attach to an existing scheduler; always shut down."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import dask
from distributed import Client, LocalCluster

# Dask's statistical profiler samples each worker's running thread every 10 ms; for a task that
# trains for minutes it measurably slows the step (~10-25% here) and profiles nothing useful.
WORKER_CONFIG = {"distributed.worker.profile.enabled": False}


def local_cluster(workers: int, *, dashboard: bool = True) -> LocalCluster:
    """An embedded cluster: one process and one thread per worker, dashboard on 127.0.0.1."""
    with dask.config.set(WORKER_CONFIG):
        return _local_cluster(workers, dashboard)


def _local_cluster(workers: int, dashboard: bool) -> LocalCluster:
    return LocalCluster(
        n_workers=workers,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        dashboard_address="127.0.0.1:0",  # a free port; `dashboard` only decides if we print it
        silence_logs=logging.WARNING,  # a dying worker says why (e.g. killed by signal 9)
        # Each worker runs one long task that uses one core; no memory-based pausing/killing
        # of a worker in the middle of a collective.
        memory_limit=0,
    )


def start_local(workers: int, *, dashboard: bool = True) -> Client:
    """For notebooks: a client of a new embedded cluster; ``client.shutdown()`` stops both."""
    client = Client(local_cluster(workers, dashboard=dashboard))
    if dashboard:
        print(f"Dask dashboard: {client.dashboard_link}")
    return client


@contextlib.contextmanager
def connect(
    workers: int,
    address: str | None = None,
    *,
    dashboard: bool = True,
    log: Callable[[str], None] | None = print,
) -> Iterator[Client]:
    """A client for ``workers`` real workers.

    Without ``address``: an embedded LocalCluster, one process and one thread per worker, its
    dashboard on 127.0.0.1 (the link is logged). With ``address`` (``tcp://host:8786``): attach
    to a running scheduler (dask-jobqueue, dask-cuda, Kubernetes ...) and leave it running.
    """
    if address is not None:
        client = Client(address)
        try:
            if log:
                log(f"Attached to Dask scheduler {address} (dashboard: {client.dashboard_link})")
            yield client
        finally:
            client.close()
        return
    cluster = local_cluster(workers, dashboard=dashboard)
    try:
        client = Client(cluster)
        try:
            if log and dashboard:
                log(f"Dask dashboard: {client.dashboard_link} ({workers} local workers)")
            yield client
        finally:
            client.close()
    finally:
        cluster.close()
