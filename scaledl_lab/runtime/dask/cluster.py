"""Start an embedded Dask LocalCluster, or attach to an existing scheduler; always shut down."""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dask
from distributed import Client, LocalCluster
from distributed.security import Security

from ...errors import ConfigError
from ..processes import start_method

# How long attaching to a scheduler may take (Dask's default is 30 s): an address that nobody
# answers fails in this time, with one line naming it.
CONNECT_S = 10.0

# Dask's statistical profiler samples each worker's running thread every 10 ms; for a task that
# trains for minutes it measurably slows the step (~10-25% here) and profiles nothing useful.
# glibc gives each thread that allocates its own malloc arena; a worker trains in a task thread,
# whose arena reused the CNN's batch-256 buffers worse than the main arena (plain DDP trained
# ~10% slower from a second thread than from the main one, and as fast with one arena). One
# arena per worker: ours vs DDP at batch 256 went from x0.86 to x0.95 (bench_sync_sgd.py).
# Every Dask server (scheduler, nanny, worker) checks its event loop's health every 20 ms by
# default: an idle two-worker cluster then costs ~5% of a core (1.3-1.6 CPU-s in 30 s here),
# which a notebook left open on a laptop, or every test process of the suite, pays all along.
# Once a second still catches the 3 s stalls it warns about (distributed.admin.tick.limit): the
# same cluster idles at 0.4-0.6 CPU-s in 30 s.
WORKER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX": 1,
    "distributed.admin.tick.interval": "1s",
}


class _SlowExitFilter(logging.Filter):
    """Drops the nanny's "Worker process still alive after 4.0 seconds, killing"."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Worker process still alive after")


class LabCluster(LocalCluster):
    """A LocalCluster whose shutdown does not warn about workers that are slow to exit.

    Closing a cluster, each nanny asks its worker to stop and waits 4 s (0.8 of its 5 s close
    timeout, not configurable) for the process to end, then kills it with a warning. A worker
    process that has imported torch and the lab takes longer than that to tear its interpreter
    down on a busy 2-core machine (a bare LocalCluster(2) closes in ~1 s; with torch imported
    in its workers ~3.5 s, with the lab ~4.2 s, measured under load), so every notebook's last
    cell printed the warning twice. By then the cluster has run its last task, the client has
    gone, and killing the process loses nothing: that one message is dropped while the cluster
    closes, and every other message of the nanny still shows.
    """

    async def _close(self) -> None:
        nanny = logging.getLogger("distributed.nanny")
        quiet = _SlowExitFilter()
        nanny.addFilter(quiet)
        try:
            await super()._close()
        finally:
            nanny.removeFilter(quiet)


def local_cluster(workers: int, *, dashboard: bool = True) -> LocalCluster:
    """An embedded cluster: one process and one thread per worker, dashboard on 127.0.0.1."""
    with dask.config.set(WORKER_CONFIG):
        method = start_method()
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            return _local_cluster(workers, dashboard)


def _local_cluster(workers: int, dashboard: bool) -> LocalCluster:
    return LabCluster(
        # Workers fork from the lab's server (runtime/processes.py), whose environment is the
        # one of its start: this process's now (data folders, network interface ...) is set in
        # each worker before it starts.
        env=dict(os.environ),
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


def live_workers(client: Client) -> dict[str, Any]:
    """The scheduler's workers now (address → info), asked afresh.

    ``client.scheduler_info()`` returns the client's cached copy, and the client's own refresh
    (every 2 s) replaces that with one that lists no workers, since it asks for none: read
    just after such a refresh, every live worker looks gone (seen on a loaded machine).
    """
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def tls_security(
    ca_file: str | None = None, cert: str | None = None, key: str | None = None
) -> Security | None:
    """Dask's :class:`Security` for a ``tls://`` scheduler from PEM files (the options of
    `dask scheduler` and `dask worker`: ``--tls-ca-file --tls-cert --tls-key``); None when none
    is given, and Dask's config (``distributed.comm.tls.*``) applies."""
    if ca_file is None and cert is None and key is None:
        return None
    missing = [n for n, v in (("ca_file", ca_file), ("cert", cert)) if v is None]
    if missing:
        raise ConfigError(
            f"TLS needs the CA file and this client's certificate; missing: {', '.join(missing)} "
            "(CLI: --tls-ca-file CA.pem --tls-cert CERT.pem [--tls-key KEY.pem])"
        )
    for path in (ca_file, cert, key):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"TLS file {path} does not exist")
    _check_pem(str(ca_file), str(cert), None if key is None else str(key))
    return Security(
        tls_ca_file=str(ca_file),
        tls_client_cert=str(cert),
        tls_client_key=None if key is None else str(key),
        require_encryption=True,
    )


def _check_pem(ca_file: str, cert: str, key: str | None) -> None:
    """A ConfigError naming the file that is not PEM (or a key that does not match its
    certificate), rather than the TLS layer's traceback when the client connects."""
    try:
        ssl.create_default_context().load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise ConfigError(
            f"TLS CA file {ca_file} is not a PEM certificate ({exc.reason})"
        ) from None
    try:
        ssl.create_default_context().load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        files = f"{cert} (with the key in {key})" if key else cert
        raise ConfigError(
            f"TLS certificate {files} is not a PEM certificate with its private key ({exc.reason})"
        ) from None


def _check_tls(address: str, security: Security | None) -> None:
    """A ``tls://`` scheduler without credentials fails deep in the TLS layer; say what to pass."""
    if not address.startswith("tls://"):
        return
    if (security or Security()).get_connection_args("client")["ssl_context"] is None:
        raise ConfigError(
            f"the scheduler {address} speaks TLS, but no certificate was given: pass "
            "--tls-ca-file, --tls-cert and --tls-key (Python: security=tls_security(...) or a "
            "distributed.security.Security), or set distributed.comm.tls.* in Dask's config"
        )


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


@contextlib.contextmanager
def connect(
    workers: int,
    address: str | None = None,
    *,
    dashboard: bool = True,
    log: Callable[[str], None] | None = print,
    security: Security | None = None,
) -> Iterator[Client]:
    """A client for ``workers`` real workers.

    Without ``address``: an embedded LocalCluster, one process and one thread per worker, its
    dashboard on 127.0.0.1 (the link is logged). With ``address`` (``tcp://host:8786``, or
    ``tls://`` with ``security``, or with Dask's ``distributed.comm.tls`` config): attach to a
    running scheduler (dask-jobqueue, dask-cuda, Kubernetes ...) and leave it running.
    """
    if address is not None:
        _check_tls(address, security)
        try:
            client = Client(address, security=security, timeout=CONNECT_S)
        except OSError as exc:  # refused, unreachable, or no answer in time
            raise ConfigError(
                f"cannot reach the Dask scheduler at {address} (waited {CONNECT_S:g} s): is it "
                f"running, and is the address right? ({_first_line(exc)})"
            ) from None
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
