"""The Dask runtime, a worker's side: the long-running task of each rank, the actor that hosts a
server object, and the queue that carries metric rows to the driver."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from distributed import Queue, get_worker

from ...errors import DivergenceError
from ..base import Launch, clone_tensors
from ..memory import freed_memory_kept
from ..servers import ServerLoop
from . import serial  # noqa: F401  (bfloat16 results and rows: pickled)
from .comm import TorchComm
from .devices import use_device
from .p2p import P2PServer
from .rendezvous import gloo_interface, rank_store, worker_host

FLUSH_S = 0.5


class ServerHost:
    """A Dask actor hosting one plain server object of a strategy, in the shared
    :class:`~..servers.ServerLoop`.

    Actor calls are coroutines, so they run on the worker's event loop one at a time: the
    server needs no locks. A call the loop parks waits for the call that lets it go. A run
    whose ranks call through torch.distributed messages (``server_transport`` ``auto`` or
    ``p2p``, :mod:`.p2p`) starts that server thread here; the actor then keeps placement,
    counters and shutdown.
    """

    def __init__(self, make: Callable[[], Any]) -> None:
        self.loop = ServerLoop(make())
        self._link: Any = None

    async def call(self, method: str, args: tuple[Any, ...]) -> Any:
        reply = asyncio.get_running_loop().create_future()
        for answer in self.loop.take(reply, method, args):
            if answer.error is not None:
                answer.caller.set_exception(answer.error)
            else:  # the reply is serialised later, after other calls may change the server
                answer.caller.set_result(clone_tensors(answer.value))
        return await reply

    def serve_p2p(self, ranks: int, timeout_s: float) -> dict[str, Any]:
        """From now on answer ``ranks`` ranks' calls as torch.distributed messages; returns what
        a rank needs to reach this server (:meth:`.p2p.P2PServer.address`)."""
        self._link = P2PServer(self.loop, ranks, timeout_s)
        return self._link.address()

    def close(self) -> None:
        """The run is over: stop the server thread of the ranks' messages."""
        if self._link is not None:
            self._link.close()
            self._link = None

    def stats(self) -> dict[str, int]:
        return self.loop.stats()


class _QueueSink:
    """Batches metric rows and ships them to the driver through a Dask Queue twice a second."""

    def __init__(self, name: str) -> None:
        self.queue = Queue(name)
        self.rows: list[dict[str, Any]] = []
        self.last = time.monotonic()

    def emit(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if time.monotonic() - self.last > FLUSH_S:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.queue.put(self.rows)
            self.rows = []
        self.last = time.monotonic()


@contextlib.contextmanager
def _profiler_paused() -> Iterator[None]:
    """Pause Dask's statistical profiler on this worker while the rank trains.

    It samples the running thread every 10 ms, which slows a training step measurably and
    profiles nothing useful for one long task. Embedded clusters start with it disabled
    (cluster.WORKER_CONFIG); this covers clusters we attach to.
    """
    try:
        worker = get_worker()
    except ValueError:
        yield
        return
    names = ("profile", "profile-cycle")
    paused = [worker.periodic_callbacks[n] for n in names if n in worker.periodic_callbacks]
    paused = [pc for pc in paused if pc.is_running()]
    for pc in paused:
        worker.loop.add_callback(pc.stop)
    try:
        yield
    finally:
        for pc in paused:
            worker.loop.add_callback(pc.start)


class _ExpectedFailure(logging.Filter):
    """Drops the worker's "Compute Failed" report (key, task, exception and traceback) of a rank
    whose run diverged: the driver says so in one line, the error the run stops with. Every
    other task failure is still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Compute Failed"):
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not (len(args) > 3 and str(args[3]).startswith(f"{DivergenceError.__name__}("))


class _ClosedRank(logging.Filter):
    """Drops "Async instruction for <Task ... execute('<run>-rank<R>-<id>')> ended with
    CancelledError", which a worker logs when it closes under a running rank: its cluster is
    closing (Ctrl-C reaches every process of the embedded cluster), and the driver says why."""

    RANK_TASK = re.compile(r"^Async instruction for .*-rank\d+-[0-9a-f]{8}.* ended with Cancel")

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.RANK_TASK.match(str(record.msg))


def _quiet_expected_failures() -> None:
    """Install :class:`_ExpectedFailure` and :class:`_ClosedRank` on this worker process's
    loggers, once."""
    for name, kind in (
        ("distributed.worker", _ExpectedFailure),
        ("distributed.worker.state_machine", _ClosedRank),
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


_SINKS: dict[str, list[_QueueSink]] = {}  # this process's ranks' sinks, by queue


def take_rows(queue_name: str) -> list[dict[str, Any]]:
    """The rows this worker's ranks logged and have not shipped yet (run by the driver through
    ``client.run`` when it stops a run early, while the ranks may be blocked)."""
    rows: list[dict[str, Any]] = []
    for sink in _SINKS.get(queue_name, []):
        taken, sink.rows = sink.rows, []
        rows += taken
    return rows


def _shared_origin(device: torch.device) -> float:
    """This rank's ``perf_counter`` reading at the moment rank 0's wall clock read when the
    barrier ended: every rank then counts time from the same instant (exactly on one host,
    to the hosts' clock synchronisation across hosts), so events of different ranks line up."""
    start = torch.tensor([_clocks()[1]], dtype=torch.float64, device=device)
    dist.broadcast(start, 0)
    counter, wall = _clocks()
    return counter - (wall - start.item())


def _clocks() -> tuple[float, float]:
    """``perf_counter`` and ``time.time`` read at one instant: the tightest of a few pairs, so
    that a preemption between the two reads (a loaded machine) does not shift the origin."""
    pairs = []
    for _ in range(5):
        before, wall, after = time.perf_counter(), time.time(), time.perf_counter()
        pairs.append((after - before, (before + after) / 2, wall))
    _, counter, wall = min(pairs)
    return counter, wall


def run_rank(
    launch: Launch,
    rank: int,
    rendezvous: tuple[str, int],
    queue_name: str,
    servers: list[Any],
    server_addresses: list[str],
    device: str = "cpu",
    server_links: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The one long-running task of a rank: rendezvous, run the program, always leave the group.

    ``rendezvous``: the host and port of rank 0's store (on rank 0's worker, listening on that
    worker's interface only: :mod:`.rendezvous`); ``device``: the one the driver planned for
    this worker (:mod:`.devices`); ``server_links``: each server's address for
    torch.distributed messages (:mod:`.p2p`), or None for actor calls."""
    torch.set_num_threads(1)  # one core per worker, as in the reference measurements
    where = use_device(device)
    launch.program.prepare()  # the data first: its arrays are mapped, and go back when freed
    backend = "nccl" if where.type == "cuda" else "gloo"
    timeout = timedelta(seconds=launch.timeout_s)
    _quiet_expected_failures()
    with gloo_interface(worker_host()):  # this rank's groups listen where its worker does
        dist.init_process_group(
            backend,
            store=rank_store(*rendezvous, rank, timeout),
            rank=rank,
            world_size=launch.world_size,
            timeout=timeout,
        )
        return _run_in_group(launch, rank, queue_name, servers, server_addresses, where,
                             server_links)  # fmt: skip


def _run_in_group(
    launch: Launch,
    rank: int,
    queue_name: str,
    servers: list[Any],
    server_addresses: list[str],
    where: torch.device,
    server_links: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    # the tuning for one run: the worker outlives it, and keeps neither the tuning nor its peak
    with freed_memory_kept():
        try:
            with _profiler_paused():
                dist.barrier()
                t0 = _shared_origin(where)
                sink = _QueueSink(queue_name)
                _SINKS.setdefault(queue_name, []).append(sink)
                comm = TorchComm(
                    rank,
                    launch.world_size,
                    t0,
                    run_id=queue_name,
                    servers=servers,
                    server_addresses=server_addresses,
                    server_links=server_links,
                    timeout_s=launch.timeout_s,
                    device=where,
                    before_exit=sink.flush,
                    lost_ranks=f"{queue_name}-lost" if launch.tolerates_worker_loss else None,
                    stragglers=launch.stragglers,
                )
                try:
                    return asyncio.run(launch.program(comm, where, sink.emit))
                finally:
                    comm.close_links()
                    sink.flush()
                    _SINKS.pop(queue_name, None)
        finally:
            dist.destroy_process_group()
