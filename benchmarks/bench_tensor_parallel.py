"""Side by side, in one run: the tensor-parallel MLP on 2 Dask workers vs one plain PyTorch process.

Throughput (samples/s over steady-state steps) of `tensor-parallel` with degree 2 (each worker
holds half of the hidden layers and both read the same batches) against one process training the
unsplit MLP with plain PyTorch: same model, seed, batches and optimiser, with one thread (as each
worker has) and with two (the same two cores as the pair of workers). Runs alternate (ours,
plain, ours, plain ...) so that drift of the machine hits both; medians are reported. Then the
bytes each worker sent per step, from the metrics table, beside the theory: one allreduce of
batch × 512 float32 values per step, ring cost 2(p − 1)/p · n (the block's backward allreduce
has nothing to send: its input is the data).

    python benchmarks/bench_tensor_parallel.py [--batches 64 256 1024] [--steps 50] [--repeats 2]
        [--threads 1 2]
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch
from plain_loop import timed_steps  # benchmarks/plain_loop.py

from scaledl_lab import ExperimentConfig
from scaledl_lab.data import DataSplits, epoch_batches, load_dataset, shard_indices
from scaledl_lab.models import build_model
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.runtime.sim.cost import ring_allreduce_bytes
from scaledl_lab.strategies.launch import execute

WARMUP = 10
DATA = dict(train_subset=40_000, test_subset=200, val_size=200)
HIDDEN = 512


def epochs_for(batch: int, steps: int) -> int:
    """Epochs that hold the warm-up and timed steps at this batch size."""
    per_epoch = DATA["train_subset"] // batch
    return math.ceil((WARMUP + steps) / per_epoch)


def plain_throughput(data: DataSplits, batch: int, steps: int, threads: int) -> float:
    """One process, the unsplit MLP, the same batches as the tensor-parallel run."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = build_model("mlp", data.input_shape, 10, seed=0)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        shard = shard_indices(data.train.y, 1, 0, seed=0)
        order = [
            idx
            for epoch in range(epochs_for(batch, steps))
            for idx in epoch_batches(shard, batch, seed=0, epoch=epoch, rank=0)
        ]
        return steps * batch / timed_steps(model, optimizer, data, order, WARMUP, steps)
    finally:
        torch.set_num_threads(previous)


def ours_throughput(client, batch: int, steps: int) -> tuple[float, list[int]]:
    """Samples/s of the model (rank 0's clock: both ranks train on the same samples), and
    the bytes each train row says its worker sent."""
    cfg = ExperimentConfig(
        strategy="tensor-parallel",
        workers=2,
        model="mlp",
        batch_size=batch,
        epochs=epochs_for(batch, steps),
        max_steps=WARMUP + steps,
        **DATA,
    )
    rows: list[dict] = []
    execute(cfg, cfg.label, rows.extend, client=client)
    times = {r["step"]: r["time"] for r in rows if r["kind"] == "train" and r["rank"] == 0}
    sent = [r["bytes_sent"] for r in rows if r["kind"] == "train"]
    return steps * batch / (times[WARMUP + steps] - times[WARMUP]), sent


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--threads", type=int, nargs="+", default=[1, 2], help="threads of the plain process"
    )
    args = parser.parse_args(argv)
    data = load_dataset("fashion-mnist", seed=0, **DATA)

    with connect(2, dashboard=False, log=None) as client:
        print(
            f"MLP 784-512-512-10, tensor-parallel degree 2 on 2 Dask workers x 1 thread vs one "
            f"plain process; {args.steps} timed steps after {WARMUP} warm-up, median of "
            f"{args.repeats}"
        )
        print("ratio = ours / plain (samples/s of the model: both workers read the same batch)")
        plain = [f"plain {t}t" for t in args.threads]
        print(f"{'batch':>6} {'ours':>8} " + " ".join(f"{name:>9} {'ratio':>6}" for name in plain))
        traffic: dict[int, set[int]] = {}
        for batch in args.batches:
            ours: list[float] = []
            base: dict[int, list[float]] = {t: [] for t in args.threads}
            for _ in range(args.repeats):
                rate, sent = ours_throughput(client, batch, args.steps)
                ours.append(rate)
                traffic[batch] = set(sent)
                for t in args.threads:
                    base[t].append(plain_throughput(data, batch, args.steps, threads=t))
            o = statistics.median(ours)
            cells = [statistics.median(base[t]) for t in args.threads]
            print(
                f"{batch:>6} {o:>8.1f} " + " ".join(f"{p:>9.1f} {o / p:>6.2f}" for p in cells),
                flush=True,
            )

        print("\nbytes sent per worker per step: measured vs theory ring(batch x 512 x 4 B, 2)")
        print(f"{'batch':>6} {'measured':>10} {'theory':>10} {'ratio':>6}")
        for batch, measured in traffic.items():
            theory = ring_allreduce_bytes(batch * HIDDEN * 4, 2)
            value = max(measured)
            flag = "" if measured == {theory} else "  (varies: " + str(sorted(measured)) + ")"
            print(f"{batch:>6} {value:>10} {theory:>10} {value / theory:>6.2f}{flag}")


if __name__ == "__main__":
    main()
