"""The real runtime: one long-running task per Dask worker, tensors moved by torch.distributed.

Dask does placement, lifecycle, data loading and progress; per-step tensors travel over a
torch.distributed process group (gloo on CPU, NCCL on GPU) that the ranks rendezvous on a free
port of rank 0's host. A Dask task per step would cap a run below ~90 steps/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from distributed import Client, Queue, get_worker

from ..config import ConfigError, ExperimentConfig
from .base import Comm, Pending, RunError, WorkerLostError, ring_allreduce_bytes
from .memory import keep_freed_memory

POLL_S = 0.25
LIVENESS_S = 1.0  # how often the driver asks the scheduler which workers are alive
FLUSH_S = 0.5
# After one rank fails, how long the others get to finish failing on their own.
GRACE_S = 5.0


class _Done(Pending):
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    async def wait(self) -> torch.Tensor:
        return self.tensor


class _Work(Pending):
    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        self.work, self.tensor = work, tensor

    async def wait(self) -> torch.Tensor:
        self.work.wait()
        return self.tensor


class TorchComm(Comm):
    """:class:`Comm` over an initialised torch.distributed process group, wall-clock time."""

    def __init__(self, rank: int, world_size: int, t0: float) -> None:
        super().__init__(rank, world_size)
        self.t0 = t0

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def allreduce_start(self, tensor: torch.Tensor) -> Pending:
        self.bytes_sent += ring_allreduce_bytes(
            tensor.numel() * tensor.element_size(), self.world_size
        )
        if self.world_size == 1:
            return _Done(tensor)
        return _Work(dist.all_reduce(tensor, async_op=True), tensor)

    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        if self.rank == src:
            self.bytes_sent += tensor.numel() * tensor.element_size() * (self.world_size - 1)
        if self.world_size > 1:
            dist.broadcast(tensor, src)
        return tensor

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        dist.send(tensor, dst)

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(tensor, src)
        return tensor

    async def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


# -- worker side ---------------------------------------------------------------------------


def pick_device(choice: str, rank: int) -> torch.device:
    """One device per worker: a GPU when there is one (round-robin by rank), else the CPU."""
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device='cuda' was asked for, but this worker sees no CUDA device")
    return torch.device("cuda", rank % torch.cuda.device_count())


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _run_rank(
    program: Callable[[Any], Any] | None,
    cfg: ExperimentConfig,
    rank: int,
    world_size: int,
    init_method: str,
    queue_name: str,
    run_label: str,
) -> dict[str, Any]:
    """The one long-running task of a rank: rendezvous, run the program, always leave the group."""
    from ..strategies import get_program
    from ..worker import WorkerContext, load_for

    torch.set_num_threads(1)  # one core per worker, as in the reference measurements
    keep_freed_memory()
    device = pick_device(cfg.device, rank)
    data = load_for(cfg)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=cfg.timeout_s),
    )
    try:
        with _profiler_paused():
            dist.barrier()
            sink = _QueueSink(queue_name)
            comm = TorchComm(rank, world_size, time.perf_counter())
            ctx = WorkerContext(cfg, comm, data, device, sink.emit, run_label)
            try:
                asyncio.run((program or get_program(cfg.strategy))(ctx))
            finally:
                sink.flush()
            return ctx.result
    finally:
        dist.destroy_process_group()


# -- driver side ---------------------------------------------------------------------------


def worker_addresses(client: Client) -> list[str]:
    """The cluster's workers in a stable order (by name, then address): rank i is the i-th."""
    info = client.scheduler_info(n_workers=-1)["workers"]
    return sorted(info, key=lambda a: (str(info[a].get("name", "")), a))


def run_dask(
    client: Client,
    cfg: ExperimentConfig,
    run_label: str,
    on_rows: Callable[[list[dict[str, Any]]], None],
    program: Callable[[Any], Any] | None = None,
) -> list[dict[str, Any]]:
    """Run ``cfg`` on the first ``cfg.workers`` workers; stream rows to ``on_rows``.

    ``program`` replaces the config's strategy (benchmarks run their own programs this way).
    Returns each rank's result dict. Raises :class:`RunError` (with the failing rank's
    message) when a rank fails, and :class:`WorkerLostError` when a worker process dies.
    """
    addresses = worker_addresses(client)[: cfg.workers]
    if len(addresses) < cfg.workers:
        raise ConfigError(
            f"workers={cfg.workers} but the cluster has only {len(addresses)} worker(s)"
        )
    host = urlparse(addresses[0]).hostname
    port = client.submit(_free_port, workers=[addresses[0]], pure=False).result()
    queue_name = f"scaledl-{uuid.uuid4().hex}"
    queue = Queue(queue_name, client=client)
    futures = [
        client.submit(
            _run_rank,
            program,
            cfg,
            rank,
            cfg.workers,
            f"tcp://{host}:{port}",
            queue_name,
            run_label,
            key=f"{run_label}-rank{rank}-{uuid.uuid4().hex[:8]}",
            workers=[addr],
            allow_other_workers=False,
            pure=False,
            retries=0,
        )
        for rank, addr in enumerate(addresses)
    ]

    def drain() -> None:
        for batch in queue.get(batch=True):
            on_rows(batch)

    failed_at: float | None = None
    checked, lost = time.monotonic(), []
    try:
        while True:
            drain()
            if all(f.done() for f in futures):
                break
            errors = [f for f in futures if f.status == "error"]
            if errors and failed_at is None:
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                break
            if time.monotonic() - checked > LIVENESS_S:
                checked = time.monotonic()
                alive = set(client.scheduler_info(n_workers=-1)["workers"])
                lost = [(r, a) for r, a in enumerate(addresses) if a not in alive]
            if lost:
                rank, addr = lost[0]
                raise WorkerLostError(
                    f"worker {addr} (rank {rank}) died during run {run_label!r}; a synchronous "
                    "run cannot continue without it, so the run was stopped"
                )
            time.sleep(POLL_S)
        drain()
        errors = [(r, f) for r, f in enumerate(futures) if f.status == "error"]
        if errors:
            rank, fut = errors[0]
            exc = fut.exception()
            if isinstance(exc, RunError):
                raise type(exc)(str(exc))
            tb = "".join(traceback.format_exception(exc)).strip().splitlines()[-1]
            raise RunError(f"rank {rank} of run {run_label!r} failed: {tb}")
        return client.gather(futures)
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
        try:
            drain()
        except Exception:  # the scheduler may be gone when the cluster is closing
            pass
        queue.close()
