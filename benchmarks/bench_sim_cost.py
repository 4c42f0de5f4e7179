"""What simulating costs: N virtual workers × S steps vs the same N×S gradients computed plainly.

The simulator computes every worker's gradient for real; its own overhead (N model replicas,
optimiser steps, summing N gradients per allreduce, the event scheduler, metrics) should stay
small next to that work. Both sides use one thread and the same mini-batches.

    python benchmarks/bench_sim_cost.py [--workers 16 64] [--steps 10] [--models cnn mlp]

Each side is the best of two runs. A third column, the replicas' own arithmetic, runs what the
N workers' programs compute, without the simulator: each replica's forward and backward, its
gradients laid out in the default reducer's buckets, every bucket's sum in rank order and its
copy back, the division and each replica's optimiser step. It is the floor under the simulated
side for as long as every virtual worker runs its own program on its own replica.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
import torch.nn.functional as F

from scaledl_lab import ExperimentConfig
from scaledl_lab.data import epoch_batches, shard_indices
from scaledl_lab.models import build_model
from scaledl_lab.runtime.memory import keep_freed_memory
from scaledl_lab.strategies.data_parallel.sync_sgd import BucketedAllreduce
from scaledl_lab.strategies.launch import execute
from scaledl_lab.training.plan import make_optimizer
from scaledl_lab.training.worker import load_for


def rank_batches(cfg: ExperimentConfig, data) -> list[list]:
    """Each rank's first ``max_steps`` mini-batch indices, as its worker draws them."""
    return [
        epoch_batches(shard_indices(data.train.y, cfg.workers, rank, seed=cfg.seed),
                      cfg.batch_size, seed=cfg.seed, epoch=0, rank=rank)[: cfg.max_steps]
        for rank in range(cfg.workers)
    ]  # fmt: skip


def plain_gradients(cfg: ExperimentConfig) -> float:
    """Seconds to compute the same workers × steps mini-batch gradients in one plain loop."""
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    batches = [idx for mine in rank_batches(cfg, data) for idx in mine]
    torch.set_num_threads(1)
    start = time.perf_counter()
    for idx in batches:
        model.zero_grad()
        F.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
    return time.perf_counter() - start


def replica_arithmetic(cfg: ExperimentConfig) -> float:
    """Seconds for what the ``allreduce`` program of ``cfg.workers`` replicas computes, run plainly
    in the simulator's order (every replica's gradient, then the averaging, then every step).

    Each replica's buckets are the default reducer's own (``BucketedAllreduce._flatten``: a
    one-parameter bucket is its gradient, a larger one a buffer the gradients are copied into).
    """
    data = load_for(cfg)
    template = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    models = [copy.deepcopy(template) for _ in range(cfg.workers)]
    optimizers = [make_optimizer(cfg, m.parameters()) for m in models]
    reducers = [BucketedAllreduce(m, None, cfg.bucket_mb) for m in models]  # type: ignore[arg-type]
    for reducer in reducers:
        reducer.reducing = False  # no collectives from backward: the buckets are summed below
    batches = rank_batches(cfg, data)
    torch.set_num_threads(1)
    start = time.perf_counter()
    for step in range(cfg.max_steps):
        for model, optimizer, mine in zip(models, optimizers, batches, strict=True):
            optimizer.zero_grad()
            idx = mine[step]
            F.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
        flats = [[r._flatten(b) for b in range(len(r.buckets))] for r in reducers]
        for bucket in zip(*flats, strict=True):  # one bucket of every replica, in rank order
            for flat in bucket[1:]:
                bucket[0].add_(flat)
            for flat in bucket[1:]:
                flat.copy_(bucket[0])
            for flat in bucket:
                flat.div_(cfg.workers)
        for optimizer in optimizers:
            optimizer.step()
    return time.perf_counter() - start


def best_of_two(side, cfg: ExperimentConfig) -> float:
    return min(side(cfg) for _ in range(2))


def simulated(cfg: ExperimentConfig) -> float:
    start = time.perf_counter()
    execute(cfg, cfg.label, lambda rows: None)
    return time.perf_counter() - start


def config(model: str, workers: int, steps: int, batch_size: int = 32) -> ExperimentConfig:
    # Evaluation sets of one sample per worker: the comparison is about training steps.
    cfg = ExperimentConfig(
        strategy="allreduce",
        runtime="sim",
        workers=workers,
        model=model,
        batch_size=batch_size,
        max_steps=steps,
        train_subset=workers * batch_size * steps,
        val_size=workers,
        test_subset=workers,
    )
    load_for(cfg)  # data loading is not part of any side
    return cfg


def measure(model: str, workers: int, steps: int, batch_size: int = 32) -> tuple[float, float]:
    """Seconds (best of 2) for the plain gradients and for the simulated run, in that order."""
    cfg = config(model, workers, steps, batch_size)
    return best_of_two(plain_gradients, cfg), best_of_two(simulated, cfg)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=["cnn", "mlp"])
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    keep_freed_memory()  # both sides run in this process with the tuning the simulator applies
    print(f"{'':23} {'seconds':^28} {'ratio to plain':^17}")
    print(
        f"{'model':>6} {'workers':>8} {'steps':>6} {'plain':>8} {'sim':>8} {'arith.':>8}"
        f"   {'sim':>6} {'arith.':>7}"
    )
    for model in args.models:
        for n in args.workers:
            cfg = config(model, n, args.steps, args.batch_size)
            plain, sim, arith = (
                best_of_two(side, cfg) for side in (plain_gradients, simulated, replica_arithmetic)
            )
            print(
                f"{model:>6} {n:>8} {args.steps:>6} {plain:>8.2f} {sim:>8.2f} {arith:>8.2f}"
                f"   {sim / plain:>6.2f} {arith / plain:>7.2f}",
                flush=True,
            )
    print("arith.: the replicas' own arithmetic without the simulator (see the docstring)")


if __name__ == "__main__":
    main()
