"""Side by side, in one run: a collective through our ``Comm`` vs the raw torch.distributed call.

Two Dask workers (one rank each, gloo) time ``Comm.allreduce`` against ``dist.all_reduce`` on
the same tensor in the same process group, and ``Comm.allreduce_start(...).wait()`` (the
overlapping form the bucketed reducer uses) against ``dist.all_reduce(async_op=True).wait()``.
Every repetition runs all four after a barrier, in an order that rotates from one repetition
to the next so that neither side always goes first. On 2 shared cores one call's time spreads
from ~0.7 to ~5 ms at 1 MB (10th to 90th percentile), with no single peak, so a median of a
hundred calls moved by ±40% from run to run; the means without the fastest and slowest 5% are
reported instead, over many repetitions. The ratio is raw time / ours (1.0: no overhead).

    python benchmarks/bench_collectives.py [--reps 500]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from scaledl_lab import ExperimentConfig
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.strategies.launch import execute

SIZES = (2**20, 4 * 2**20, 16 * 2**20)
DATA = dict(train_subset=2000, test_subset=200, val_size=200)
KINDS = ("ours", "raw", "ours_async", "raw_async")


async def _one(ctx, kind: str, tensor: torch.Tensor) -> None:
    if kind == "ours":
        await ctx.comm.allreduce(tensor)
    elif kind == "raw":
        dist.all_reduce(tensor)
    elif kind == "ours_async":
        await ctx.comm.allreduce_start(tensor).wait()
    else:
        dist.all_reduce(tensor, async_op=True).wait()


def trimmed_mean(values: list[float], cut: float = 0.05) -> float:
    """The mean without the ``cut`` fastest and ``cut`` slowest of ``values``."""
    k = int(len(values) * cut)
    kept = sorted(values)[k : len(values) - k]
    return statistics.fmean(kept)


def make_program(reps: int):
    async def program(ctx) -> None:
        for nbytes in SIZES:
            tensor = torch.ones(nbytes // 4)
            times: dict[str, list[float]] = {k: [] for k in KINDS}
            for rep in range(reps + 2):
                for j in range(len(KINDS)):
                    kind = KINDS[(rep + j) % len(KINDS)]
                    dist.barrier()
                    start = time.perf_counter()
                    await _one(ctx, kind, tensor)
                    if rep >= 2:  # two warm-up repetitions
                        times[kind].append(time.perf_counter() - start)
            ctx.result[nbytes] = {k: trimmed_mean(v) for k, v in times.items()}

    return program


def measure(client, reps: int = 500) -> dict[int, dict[str, float]]:
    """Seconds (trimmed mean) of each kind in ``KINDS`` per size in ``SIZES``, timed on rank 0."""
    cfg = ExperimentConfig(workers=2, model="mlp", **DATA)
    program = make_program(reps)
    results = execute(cfg, "collectives", lambda rows: None, client=client, program=program)
    return results.results[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=500)
    args = parser.parse_args()
    with connect(2, dashboard=False, log=None) as client:
        timings = measure(client, args.reps)
    print(f"allreduce, 2 Dask workers (gloo), {args.reps} interleaved repetitions, trimmed means")
    print("ratio = raw time / ours (1.00: no overhead)")
    print(
        f"{'size':>6} {'ours ms':>8} {'raw ms':>7} {'ratio':>6}   "
        f"{'ours async':>10} {'raw async':>9} {'ratio':>6}"
    )
    for nbytes in SIZES:
        t = {k: v * 1e3 for k, v in timings[nbytes].items()}
        print(
            f"{nbytes >> 20:>4}MB {t['ours']:>8.2f} {t['raw']:>7.2f} "
            f"{t['raw'] / t['ours']:>6.2f}   "
            f"{t['ours_async']:>10.2f} {t['raw_async']:>9.2f} "
            f"{t['raw_async'] / t['ours_async']:>6.2f}"
        )


if __name__ == "__main__":
    main()
