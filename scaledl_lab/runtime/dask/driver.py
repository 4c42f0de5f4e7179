"""The real runtime: one long-running task per Dask worker, tensors moved by torch.distributed.

Dask does placement, lifecycle, data loading and progress; per-step tensors travel over a
torch.distributed process group (gloo on CPU, NCCL on GPU) that the ranks rendezvous on a free
port of rank 0's host (:mod:`.worker`, :mod:`.comm`). A Dask task per step would cap
a run below ~90 steps/s. This module is the driver's side: place the ranks and servers, stream
the rows, watch for dead workers.
"""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

from distributed import Client, Queue, Variable

from ...errors import ConfigError, RunError, WorkerLostError
from ..base import Launch, Outcome
from .cluster import live_workers
from .devices import plan_devices, probe
from .rendezvous import free_port
from .worker import ServerHost, run_rank, take_rows

POLL_S = 0.25
# How often the driver asks the scheduler which workers are alive. A worker missing from that
# list (asked afresh: :func:`.cluster.live_workers`) is lost at once: the live ranks once
# reported lost under load were read from the client's cached copy, which its periodic refresh
# empties; asked afresh, no live rank went missing in 20 runs of 1000 steps on 8 workers beside
# CPU hogs without one (``benchmarks/stress_workers.py --workers 8 --steps 1000``), so none
# is kept.
LIVENESS_S = 1.0
# After one rank fails, how long the others get to finish failing on their own.
GRACE_S = 5.0


def worker_addresses(client: Client) -> list[str]:
    """The cluster's workers in a stable order (by name, then address): rank i is the i-th."""
    info = live_workers(client)
    return sorted(info, key=lambda a: (str(info[a].get("name", "")), a))


def _place_servers(addresses: list[str], ranks: list[str], count: int) -> list[str]:
    """Servers go on workers that run no rank when the cluster has them, else beside ranks."""
    spare = [a for a in addresses if a not in ranks] or ranks
    return [spare[i % len(spare)] for i in range(count)]


def run_dask(
    client: Client,
    launch: Launch,
    on_rows: Callable[[list[dict[str, Any]]], None],
    on_lost: Callable[[int, float], None] = lambda rank, at: None,
) -> Outcome:
    """Run ``launch`` on the first ``launch.world_size`` workers; stream rows to ``on_rows``.

    Returns each rank's result (empty for a rank whose worker died in a run that tolerates it,
    which ``on_lost(rank, seconds)`` is told of when noticed). Raises :class:`RunError` with the
    failing rank's message when a rank fails, and :class:`WorkerLostError` when a worker dies in
    a run that cannot go on without it, or one hosting a server.
    """
    label = launch.label
    everyone = worker_addresses(client)
    addresses = everyone[: launch.world_size]
    if len(addresses) < launch.world_size:
        raise ConfigError(
            f"workers={launch.world_size} but the cluster has only {len(addresses)} worker(s)"
        )
    # Which device each rank trains on, from what its worker sees: errors before any work.
    probes = [client.submit(probe, workers=[a], pure=False) for a in addresses]
    devices = plan_devices(launch.device, client.gather(probes))
    # The rendezvous is on rank 0's worker, at the address the other workers reach it by (its
    # store listens on that interface only).
    host = urlparse(addresses[0]).hostname
    port = client.submit(free_port, host, workers=[addresses[0]], pure=False).result()
    queue_name = f"scaledl-{uuid.uuid4().hex}"
    queue = Queue(queue_name, client=client)
    lost_ranks = Variable(f"{queue_name}-lost", client=client)  # read by tolerant runs' ranks
    lost_ranks.set([])
    server_hosts = _place_servers(everyone, addresses, len(launch.servers))
    server_futures = [
        client.submit(ServerHost, make, actor=True, workers=[addr], allow_other_workers=False)
        for make, addr in zip(launch.servers, server_hosts, strict=True)
    ]
    actors = [f.result() for f in server_futures]
    links = _server_links(launch, actors, server_hosts)
    futures = [
        client.submit(
            run_rank,
            launch,
            rank,
            (host, port),
            queue_name,
            actors,
            server_hosts,
            device=devices[rank],
            server_links=links,
            key=f"{label}-rank{rank}-{uuid.uuid4().hex[:8]}",
            workers=[addr],
            allow_other_workers=False,
            pure=False,
            retries=0,
        )
        for rank, addr in enumerate(addresses)
    ]
    t0 = time.perf_counter()

    def drain() -> None:
        for batch in queue.get(batch=True):
            on_rows(batch)

    failed_at: float | None = None
    checked = time.monotonic()
    lost: dict[int, str] = {}
    try:
        while True:
            drain()
            if all(f.done() for r, f in enumerate(futures) if r not in lost):
                break
            errors = [f for r, f in enumerate(futures) if f.status == "error" and r not in lost]
            if errors and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                break
            if time.monotonic() - checked > LIVENESS_S:
                checked = time.monotonic()
                alive = set(live_workers(client))
                _check_servers(server_hosts, alive, label)
                for rank, addr in enumerate(addresses):
                    if addr in alive or rank in lost:
                        continue
                    if not launch.tolerates_worker_loss:
                        _collect_unsent(client, queue_name, drain, on_rows)
                        raise WorkerLostError(
                            f"worker {addr} (rank {rank}) died during run {label!r}; a "
                            "synchronous run cannot continue without it, so the run was stopped"
                        )
                    lost[rank] = addr
                    lost_ranks.set(sorted(lost))
                    on_lost(rank, time.perf_counter() - t0)
                if len(lost) == len(addresses):
                    raise WorkerLostError(f"every worker of run {label!r} died")
            time.sleep(POLL_S)
        drain()
        errors = [(r, f) for r, f in enumerate(futures) if f.status == "error" and r not in lost]
        if errors:
            _collect_unsent(client, queue_name, drain, on_rows)
            # A dead server makes its callers fail first: name the cause, not the symptom.
            if server_hosts:
                _check_servers(server_hosts, set(live_workers(client)), label)
            rank, fut = errors[0]
            exc = fut.exception()
            if isinstance(exc, RunError):
                raise type(exc)(str(exc))
            tb = "".join(traceback.format_exception(exc)).strip().splitlines()[-1]
            raise RunError(f"rank {rank} of run {label!r} failed: {tb}")
        results = [{} if r in lost else f.result() for r, f in enumerate(futures)]
        stats = [dict(a.stats().result(timeout=launch.timeout_s)) for a in actors]
        return Outcome(results, stats, time.perf_counter() - t0)
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
        for a in actors:  # stop each server's thread of the ranks' messages
            try:
                a.close().result(timeout=GRACE_S)
            except Exception:  # its worker may be gone
                pass
        for f in server_futures:
            f.release()
        try:
            drain()
            lost_ranks.delete()
        except Exception:  # the scheduler may be gone when the cluster is closing
            pass
        queue.close()


def _server_links(
    launch: Launch, actors: list[Any], server_hosts: list[str]
) -> list[dict[str, Any]] | None:
    """Each server's address for torch.distributed messages (:mod:`.p2p`; ``ip`` is where the
    ranks reach its worker), or None when the ranks make actor calls."""
    if not actors or launch.server_transport == "actor":
        return None
    calls = [a.serve_p2p(launch.world_size, launch.timeout_s) for a in actors]
    return [
        {**c.result(), "ip": urlparse(where).hostname}
        for c, where in zip(calls, server_hosts, strict=True)
    ]


def _collect_unsent(
    client: Client,
    queue_name: str,
    drain: Callable[[], None],
    on_rows: Callable[[list[dict[str, Any]]], None],
) -> None:
    """Before a run is stopped: every row already logged reaches the driver, those in flight
    and those the living ranks still hold (they may be blocked on the dead one)."""
    try:
        drain()
        for rows in client.run(take_rows, queue_name, on_error="ignore").values():
            if isinstance(rows, list) and rows:
                on_rows(rows)
    except Exception:  # best effort: the cluster may be failing too
        pass


def _check_servers(hosts: list[str], alive: set[str], label: str) -> None:
    for i, addr in enumerate(hosts):
        if addr not in alive:
            raise WorkerLostError(
                f"worker {addr}, host of server {i}, died during run {label!r}; the run "
                "cannot go on without the parameters it held, so it was stopped"
            )
