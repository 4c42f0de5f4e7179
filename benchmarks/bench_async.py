"""Side by side: asynchronous parameter server and Hogwild! on real Dask workers vs plain PyTorch.

1. `ps-async` with 2 Dask workers and one parameter server (a Dask actor beside rank 0, called
   through torch.distributed point-to-point messages, the default, and through actor calls,
   `--server-transport actor`): gradients applied per second, against the steps per second of
   a plain single-process PyTorch SGD loop (one thread) on the same model, batch size and data.
2. `hogwild` with 2 worker processes sharing the parameters in /dev/shm against `hogwild` with
   1 process: updates per second.

Rates are over steady-state steps (the first WARMUP steps of each rank are left out). The two
sides of each comparison alternate, and medians over the rounds are reported, since this
machine is noisy (±20%).

    python benchmarks/bench_async.py [--quick] [--model mlp] [--batch 64] [--steps 150]
        [--rounds 3] [--sides ps ps-actor plain hog2 hog1]
"""

from __future__ import annotations

import argparse
import statistics

import torch
from plain_loop import timed_steps  # benchmarks/plain_loop.py

from scaledl_lab import ExperimentConfig
from scaledl_lab.data import epoch_batches, shard_indices
from scaledl_lab.models import build_model
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.strategies.launch import execute
from scaledl_lab.training.worker import load_for, make_optimizer

WARMUP = 10
DATA = dict(train_subset=40_000, test_subset=200, val_size=200)


def _config(
    strategy: str, workers: int, model: str, batch: int, steps: int, transport: str = "auto"
) -> ExperimentConfig:
    return ExperimentConfig(
        server_transport=transport,
        strategy=strategy,
        workers=workers,
        model=model,
        batch_size=batch,
        max_steps=WARMUP + steps,
        momentum=0.0,
        lr=0.01,
        **DATA,
    )


def updates_per_second(rows: list[dict]) -> float:
    """Applied updates per second over the steady state, all ranks together.

    An update is a train row with a measured staleness (a push the server applied, or a
    Hogwild! write); each rank's first WARMUP steps are left out.
    """
    train = [r for r in rows if r["kind"] == "train" and r["step"] > WARMUP]
    applied = [r for r in train if r["staleness"] == r["staleness"]]  # not NaN
    start = min(r["time"] for r in train)
    end = max(r["time"] for r in applied)
    # Updates finished after `start`, from a moment when every rank was past its warm-up.
    return sum(start < r["time"] <= end for r in applied) / (end - start)


def dask_rate(
    client, strategy: str, workers: int, model: str, batch: int, steps: int, transport="auto"
) -> float:
    cfg = _config(strategy, workers, model, batch, steps, transport)
    rows: list[dict] = []
    execute(cfg, cfg.label, rows.extend, client=client)
    return updates_per_second(rows)


def plain_sgd_rate(model_name: str, batch: int, steps: int) -> float:
    """Steps/s of a plain PyTorch SGD loop, one process, one thread, the same model and data."""
    cfg = _config("ps-async", 1, model_name, batch, steps)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = load_for(cfg)
        model = build_model(model_name, data.input_shape, data.num_classes, seed=0)
        optimizer = make_optimizer(cfg, model.parameters())
        shard = shard_indices(data.train.y, 1, 0, seed=0)
        order = epoch_batches(shard, batch, seed=0, epoch=0, rank=0)
        return steps / timed_steps(model, optimizer, data, order, WARMUP, steps)
    finally:
        torch.set_num_threads(threads)


SIDES = ("ps", "ps-actor", "plain", "hog2", "hog1")
TRANSPORTS = {"ps": "auto", "ps-actor": "actor"}


def measure(
    client, model: str, batch: int, steps: int, rounds: int, sides: tuple[str, ...] = SIDES
) -> dict[str, list[float]]:
    """Updates/s of each side per round, the sides taking turns in the order of ``SIDES``.

    ps / ps-actor: ``ps-async`` on 2 workers, the server called through torch.distributed
    point-to-point messages / actor calls;
    plain: the single-process loop (2 × ``steps`` steps);
    hog2 / hog1: ``hogwild`` with 2 processes / 1 process.
    """
    dask_rate(client, "ps-async", 2, model, batch, 20)  # start torch and load data on the workers
    runs: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side in (s for s in SIDES if s in sides):
            if side in TRANSPORTS:
                rate = dask_rate(client, "ps-async", 2, model, batch, steps, TRANSPORTS[side])
            elif side == "plain":
                rate = plain_sgd_rate(model, batch, 2 * steps)
            elif side == "hog2":
                rate = dask_rate(client, "hogwild", 2, model, batch, steps)
            else:
                rate = dask_rate(client, "hogwild", 1, model, batch, 2 * steps)
            runs[side].append(rate)
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=150, help="timed steps per worker")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer steps (seconds, not minutes)")
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    args = parser.parse_args(argv)
    if args.quick:
        args.steps = min(args.steps, 60)
    m, b, s = args.model, args.batch, args.steps
    with connect(2, dashboard=False, log=None) as client:
        print(
            f"model={m}, batch {b} per worker, {s} timed steps per worker after {WARMUP} "
            f"warm-up, median of {args.rounds} rounds (sides alternate)"
        )
        runs = measure(client, m, b, s, args.rounds, tuple(args.sides))
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"\n{'what':<56} {'updates/s':>10} {'rounds':>24}")
    for label, key in (
        ("ps-async, 2 Dask workers + 1 server, torch.distributed p2p", "ps"),
        ("ps-async, 2 Dask workers + 1 server, actor calls", "ps-actor"),
        ("plain PyTorch SGD loop, 1 process, 1 thread", "plain"),
        ("hogwild, 2 Dask worker processes, shared memory", "hog2"),
        ("hogwild, 1 Dask worker process", "hog1"),
    ):
        if key in runs:
            values = " ".join(f"{v:7.1f}" for v in runs[key])
            print(f"{label:<56} {med[key]:>10.1f} {values:>24}")
    print()
    if "ps" in med and "ps-actor" in med:
        ratio = med["ps-actor"] / med["ps"]
        print(f"ratio ps-async through actor calls / through p2p messages: {ratio:.2f}")
    if "plain" in med:
        for key in (k for k in TRANSPORTS if k in med):
            ratio = med[key] / med["plain"]
            print(f"ratio {key} (2 workers) / plain single-process SGD: {ratio:.2f}")
    if "hog1" in med and "hog2" in med:
        print(f"ratio hogwild 2 processes / 1 process: {med['hog2'] / med['hog1']:.2f}")


if __name__ == "__main__":
    main()
