"""Side by side, in one run: our synchronous data parallelism on Dask vs raw PyTorch DDP.

Throughput (samples/s over steady-state steps) of `allreduce` (bucketed) and `allreduce-naive`
on 2 Dask workers against plain `DistributedDataParallel` with gloo on 2 processes started by
torch.multiprocessing: same model, seed, per-worker batch, data shards and batch order, one
thread per process (the cost of one collective through our Comm against the raw call is
`bench_collectives.py`). Runs alternate (ours, DDP, ours, DDP ...) so that drift of
the machine hits both; medians are reported. One more side runs the same DDP loop as a task on
each of the 2 Dask workers ours use: it tells what hosting a rank in a Dask worker costs from
what our code costs.

    python benchmarks/bench_sync_sgd.py [--batches 64 256] [--steps 60] [--repeats 2]
"""

from __future__ import annotations

import argparse
import queue
import socket
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from scaledl_lab import ExperimentConfig
from scaledl_lab.data import epoch_batches, load_dataset, shard_indices
from scaledl_lab.models import build_model
from scaledl_lab.runtime.dask.cluster import connect, live_workers
from scaledl_lab.runtime.memory import keep_freed_memory
from scaledl_lab.strategies.launch import execute

WARMUP = 10
CHOSEN: list[list[bool]] = []
DATA = dict(train_subset=40_000, test_subset=200, val_size=200)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(
    rank: int,
    world: int,
    port: int,
    model_name: str,
    batch: int,
    steps: int,
    tuned: bool,
    out: mp.Queue,
) -> None:
    torch.set_num_threads(1)
    if tuned:
        keep_freed_memory()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    data = load_dataset("fashion-mnist", seed=0, **DATA)
    model = DistributedDataParallel(build_model(model_name, data.input_shape, 10, seed=0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    shard = shard_indices(data.train.y, world, rank, seed=0)
    order = epoch_batches(shard, batch, seed=0, epoch=0, rank=rank)
    for i, idx in enumerate(order[: WARMUP + steps]):
        if i == WARMUP:
            dist.barrier()
            start = time.perf_counter()
        x, y = data.train.x[idx], data.train.y[idx]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        loss.item()
    elapsed = time.perf_counter() - start
    out.put((rank, steps * batch / elapsed))
    dist.destroy_process_group()


def _ddp_task(rank: int, port: int, model: str, batch: int, steps: int) -> float:
    out: queue.SimpleQueue = queue.SimpleQueue()  # what a spawned rank reports to, in-process
    _ddp_rank(rank, 2, port, model, batch, steps, True, out)  # type: ignore[arg-type]
    return out.get()[1]


def ddp_in_dask_throughput(client, model: str, batch: int, steps: int) -> float:
    """The DDP loop (with the malloc tuning) as one task on each of 2 Dask workers."""
    port = _free_port()
    workers = sorted(live_workers(client))[:2]
    futures = [
        client.submit(_ddp_task, r, port, model, batch, steps, workers=[w], pure=False)
        for r, w in enumerate(workers)
    ]
    return sum(client.gather(futures))


def ddp_throughput(model: str, batch: int, steps: int, tuned: bool, world: int = 2) -> float:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_ddp_rank, args=(r, world, port, model, batch, steps, tuned, out))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    rates = [out.get(timeout=600)[1] for _ in procs]
    for p in procs:
        p.join()
    return sum(rates)


def ours_throughput(
    client, strategy: str, model: str, batch: int, steps: int, **options: Any
) -> float:
    cfg = ExperimentConfig(
        strategy=strategy,
        workers=2,
        model=model,
        batch_size=batch,
        max_steps=WARMUP + steps,
        **DATA,
        **options,
    )
    rows: list[dict] = []
    results = execute(cfg, cfg.label, rows.extend, client=client).results
    if "overlap" in results[0]:  # what the bucketed reducer's first steps chose, per rank
        CHOSEN.append([r["overlap"] for r in results])
    rate = 0.0
    for rank in (0, 1):
        times = {r["step"]: r["time"] for r in rows if r["kind"] == "train" and r["rank"] == rank}
        rate += steps * batch / (times[WARMUP + steps] - times[WARMUP])
    return rate


SIDES = ("ours", "ddp", "naive", "ddpm", "ddpd")


def measure(
    client, model: str, batch: int, steps: int, repeats: int, sides: tuple[str, ...] = SIDES
) -> dict[str, list[float]]:
    """Samples/s of each side per repeat, the sides taking turns in the order of ``SIDES``.

    ours: the default (bucketed) reducer; naive: ``allreduce-naive``; ddp: plain DDP;
    ddpm: DDP with the malloc tuning our workers apply; ddpd: that DDP loop on our Dask workers.
    """
    runs: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(repeats):
        for side in (s for s in SIDES if s in sides):
            if side in ("ours", "naive"):
                strategy = "allreduce" if side == "ours" else "allreduce-naive"
                runs[side].append(ours_throughput(client, strategy, model, batch, steps))
            elif side == "ddpd":
                runs[side].append(ddp_in_dask_throughput(client, model, batch, steps))
            else:
                runs[side].append(ddp_throughput(model, batch, steps, tuned=side == "ddpm"))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    with connect(2, dashboard=False, log=None) as client:
        print(
            f"model={args.model}, 2 workers x 1 thread, {args.steps} timed steps after "
            f"{WARMUP} warm-up, median of {args.repeats}"
        )
        print(
            "ratio = ours / plain DDP; 'DDP+malloc' is DDP with the same malloc tuning our "
            "workers apply (runtime/memory.py)"
        )
        print(
            f"{'batch/worker':>12} {'DDP':>8} {'DDP+malloc':>10} {'ours':>8} {'ratio':>6} "
            f"{'vs +malloc':>10} {'naive':>8} {'ratio':>6} {'DDP in Dask':>11} {'ratio':>6}"
        )
        for batch in args.batches:
            runs = measure(client, args.model, batch, args.steps, args.repeats)
            d, dm, o, n, dd = (
                statistics.median(runs[k]) for k in ("ddp", "ddpm", "ours", "naive", "ddpd")
            )
            print(
                f"{batch:>12} {d:>8.1f} {dm:>10.1f} {o:>8.1f} {o / d:>6.2f} {o / dm:>10.2f} "
                f"{n:>8.1f} {n / d:>6.2f} {dd:>11.1f} {o / dd:>6.2f}",
                flush=True,
            )
        print("the last ratio: ours / DDP (with the malloc tuning) run as tasks on our workers")
        print(f"bucketed reducer, overlap chosen per rank in each run: {CHOSEN}")


if __name__ == "__main__":
    main()
