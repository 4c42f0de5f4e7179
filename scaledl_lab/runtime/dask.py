"""The real runtime: one long-running task per Dask worker, tensors moved by torch.distributed.

Dask does placement, lifecycle, data loading and progress; per-step tensors travel over a
torch.distributed process group (gloo on CPU, NCCL on GPU) that the ranks rendezvous on a free
port of rank 0's host. A Dask task per step would cap a run below ~90 steps/s.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
from distributed import Client, Queue, get_worker

from ..config import ConfigError, ExperimentConfig
from .base import (
    NOT_READY,
    Comm,
    Incoming,
    Pending,
    RunError,
    ServerLostError,
    ServerSpec,
    WorkerLostError,
    clone_tensors,
    ring_allreduce_bytes,
    tensor_bytes,
)
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


class _Posted(Incoming):
    """A posted gloo receive. Gloo's recv work reports ``is_completed()`` only after ``wait()``
    (and has no future), so the first ``ready()`` starts a helper thread that waits for it."""

    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        self.work, self.tensor = work, tensor
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def _wait_in_thread(self) -> None:
        try:
            self.work.wait()
        except BaseException as exc:  # re-raised by wait() in the worker's own thread
            self._error = exc
        finally:
            self._done.set()

    def ready(self) -> bool:
        if self._thread is None:
            self._thread = threading.Thread(target=self._wait_in_thread, daemon=True)
            self._thread.start()
        return self._done.is_set()

    async def wait(self) -> torch.Tensor:
        if self._thread is None:
            self.work.wait()
        else:
            self._thread.join()
            if self._error is not None:
                raise self._error
        return self.tensor


class _ActorCall(Pending):
    def __init__(self, comm: TorchComm, server: int, future: Any) -> None:
        self.comm, self.server, self.future = comm, server, future

    async def wait(self) -> Any:
        try:
            return self.future.result(timeout=self.comm.timeout_s)
        except Exception as exc:  # a dead host: OSError, CommClosedError or the timeout
            raise self.comm.server_lost(
                self.server, f"did not answer within {self.comm.timeout_s:g} s", exc
            ) from None


class TorchComm(Comm):
    """:class:`Comm` over an initialised torch.distributed process group, wall-clock time.

    Hosted servers are Dask actors; memory shared between workers is a file in /dev/shm.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        t0: float,
        *,
        run_id: str = "",
        servers: list[Any] | None = None,
        server_addresses: list[str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        super().__init__(rank, world_size)
        self.t0 = t0
        self.run_id = run_id
        self.servers = servers or []
        self.server_addresses = server_addresses or []
        self.timeout_s = timeout_s

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

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        return _Work(dist.isend(tensor, dst), tensor)

    def irecv(self, tensor: torch.Tensor, src: int) -> Incoming:
        return _Posted(dist.irecv(tensor, src), tensor)

    async def send(self, tensor: torch.Tensor, dst: int) -> None:
        self.bytes_sent += tensor.numel() * tensor.element_size()
        dist.send(tensor, dst)

    async def recv(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        dist.recv(tensor, src)
        return tensor

    @property
    def num_servers(self) -> int:
        return len(self.servers)

    def call_start(self, server: int, method: str, *args: Any) -> Pending:
        if not 0 <= server < len(self.servers):
            return super().call_start(server, method, *args)
        self.bytes_sent += tensor_bytes(args)
        try:
            future = self.servers[server].call(method, args)
        except Exception as exc:  # the actor's worker is already gone
            raise self.server_lost(server, "is gone", exc) from None
        return _ActorCall(self, server, future)

    def server_lost(self, server: int, what: str, exc: Exception) -> ServerLostError:
        return ServerLostError(
            f"server {server} on worker {self.server_addresses[server]} {what} "
            f"({type(exc).__name__}: {exc}); the run cannot go on without it"
        )

    async def shared_tensor(self, name: str, init: torch.Tensor) -> torch.Tensor:
        hosts = [None] * self.world_size
        dist.all_gather_object(hosts, socket.gethostname())
        if len(set(hosts)) > 1:
            raise RunError(
                f"shared memory needs every worker on one machine, but the workers run on "
                f"{sorted(set(hosts))}; run this strategy on a single-node cluster"
            )
        path = Path("/dev/shm") / f"scaledl-{self.run_id}-{name}"
        if self.is_root:
            init.detach().cpu().contiguous().numpy().tofile(path)
        dist.barrier()
        shared = torch.from_file(str(path), shared=True, size=init.numel(), dtype=init.dtype)
        dist.barrier()  # everyone has mapped it: the name can go, the memory stays
        if self.is_root:
            path.unlink(missing_ok=True)
        return shared.view_as(init)

    async def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


# -- worker side ---------------------------------------------------------------------------


class ServerHost:
    """A Dask actor hosting one plain server object of a strategy.

    Its methods are coroutines, so they run on the worker's event loop one at a time: the
    server needs no locks. A call the server answers with NOT_READY waits for the next call
    that changes the server's state, then is tried again.
    """

    def __init__(self, spec: ServerSpec, cfg: ExperimentConfig, index: int) -> None:
        self.obj = spec.create(cfg, index)
        self.calls = self.bytes_in = self.bytes_out = 0
        self._changed: asyncio.Condition | None = None

    async def call(self, method: str, args: tuple[Any, ...]) -> Any:
        if self._changed is None:
            self._changed = asyncio.Condition()
        self.bytes_in += tensor_bytes(args)
        async with self._changed:
            while (value := getattr(self.obj, method)(*args)) is NOT_READY:
                await self._changed.wait()
            self._changed.notify_all()
        self.calls += 1
        self.bytes_out += tensor_bytes(value)
        # The reply is serialised later, after other calls may have changed the server.
        return clone_tensors(value)

    def stats(self) -> dict[str, int]:
        return {"calls": self.calls, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}


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
    program: Callable[[Any], Any],
    cfg: ExperimentConfig,
    rank: int,
    world_size: int,
    init_method: str,
    queue_name: str,
    run_label: str,
    servers: list[Any] | None = None,
    server_addresses: list[str] | None = None,
) -> dict[str, Any]:
    """The one long-running task of a rank: rendezvous, run the program, always leave the group."""
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
            comm = TorchComm(
                rank,
                world_size,
                time.perf_counter(),
                run_id=queue_name,
                servers=servers,
                server_addresses=server_addresses,
                timeout_s=cfg.timeout_s,
            )
            ctx = WorkerContext(cfg, comm, data, device, sink.emit, run_label)
            try:
                asyncio.run(program(ctx))
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


def _place_servers(addresses: list[str], ranks: list[str], count: int) -> list[str]:
    """Servers go on workers that run no rank when the cluster has them, else beside ranks."""
    spare = [a for a in addresses if a not in ranks] or ranks
    return [spare[i % len(spare)] for i in range(count)]


def run_dask(
    client: Client,
    cfg: ExperimentConfig,
    run_label: str,
    on_rows: Callable[[list[dict[str, Any]]], None],
    program: Callable[[Any], Any] | None = None,
) -> list[dict[str, Any]]:
    """Run ``cfg`` on the first ``cfg.workers`` workers; stream rows to ``on_rows``.

    ``program`` replaces the config's strategy (a plain program, or a Strategy with its
    servers; benchmarks run their own programs this way). Returns each rank's result dict
    (empty for a rank whose worker died in a run that tolerates it). Raises :class:`RunError`
    with the failing rank's message when a rank fails, and :class:`WorkerLostError` when a
    worker dies in a run that cannot go on without it, or one hosting a server.
    """
    from ..strategies import Strategy, get_strategy
    from ..worker import server_rows

    strategy = program if isinstance(program, Strategy) else get_strategy(cfg.strategy)
    chosen = program if program is not None and not isinstance(program, Strategy) else None
    spec = strategy.servers if chosen is None else None
    tolerant = strategy.tolerates_worker_loss and chosen is None
    everyone = worker_addresses(client)
    addresses = everyone[: cfg.workers]
    if len(addresses) < cfg.workers:
        raise ConfigError(
            f"workers={cfg.workers} but the cluster has only {len(addresses)} worker(s)"
        )
    host = urlparse(addresses[0]).hostname
    port = client.submit(_free_port, workers=[addresses[0]], pure=False).result()
    queue_name = f"scaledl-{uuid.uuid4().hex}"
    queue = Queue(queue_name, client=client)
    n_servers = spec.count(cfg) if spec else 0
    server_hosts = _place_servers(everyone, addresses, n_servers)
    server_futures = [
        client.submit(
            ServerHost, spec, cfg, i, actor=True, workers=[addr], allow_other_workers=False
        )
        for i, addr in enumerate(server_hosts)
    ]
    actors = [f.result() for f in server_futures]
    futures = [
        client.submit(
            _run_rank,
            chosen or strategy.program,
            cfg,
            rank,
            cfg.workers,
            f"tcp://{host}:{port}",
            queue_name,
            run_label,
            actors,
            server_hosts,
            key=f"{run_label}-rank{rank}-{uuid.uuid4().hex[:8]}",
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
                alive = set(client.scheduler_info(n_workers=-1)["workers"])
                _check_servers(server_hosts, alive, run_label)
                for rank, addr in enumerate(addresses):
                    if addr in alive or rank in lost:
                        continue
                    if not tolerant:
                        raise WorkerLostError(
                            f"worker {addr} (rank {rank}) died during run {run_label!r}; a "
                            "synchronous run cannot continue without it, so the run was stopped"
                        )
                    lost[rank] = addr
                    on_rows([_lost_row(cfg, run_label, rank, time.perf_counter() - t0)])
                if len(lost) == len(addresses):
                    raise WorkerLostError(f"every worker of run {run_label!r} died")
            time.sleep(POLL_S)
        drain()
        errors = [(r, f) for r, f in enumerate(futures) if f.status == "error" and r not in lost]
        if errors:
            # A dead server makes its callers fail first: name the cause, not the symptom.
            if server_hosts:
                _check_servers(
                    server_hosts, set(client.scheduler_info(n_workers=-1)["workers"]), run_label
                )
            rank, fut = errors[0]
            exc = fut.exception()
            if isinstance(exc, RunError):
                raise type(exc)(str(exc))
            tb = "".join(traceback.format_exception(exc)).strip().splitlines()[-1]
            raise RunError(f"rank {rank} of run {run_label!r} failed: {tb}")
        results = [{} if r in lost else f.result() for r, f in enumerate(futures)]
        if actors:
            stats = [
                dict(a.stats().result(timeout=cfg.timeout_s), server=i)
                for i, a in enumerate(actors)
            ]
            on_rows(server_rows(cfg, run_label, stats, time.perf_counter() - t0))
        return results
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
        for f in server_futures:
            f.release()
        try:
            drain()
        except Exception:  # the scheduler may be gone when the cluster is closing
            pass
        queue.close()


def _check_servers(hosts: list[str], alive: set[str], run_label: str) -> None:
    for i, addr in enumerate(hosts):
        if addr not in alive:
            raise WorkerLostError(
                f"worker {addr}, host of server {i}, died during run {run_label!r}; the run "
                "cannot go on without the parameters it held, so it was stopped"
            )


def _lost_row(cfg: ExperimentConfig, run_label: str, rank: int, at: float) -> dict[str, Any]:
    """The metrics-table record of a worker's death in a run that goes on without it."""
    nan = float("nan")
    return {
        "run": run_label,
        "strategy": cfg.strategy,
        "runtime": cfg.runtime,
        "world_size": cfg.workers,
        "rank": rank,
        "kind": "worker-lost",
        "epoch": nan,
        "step": -1,
        "time": at,
        "loss": nan,
        "accuracy": nan,
        "samples": 0,
        "bytes_sent": 0,
    }
