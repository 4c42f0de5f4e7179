"""Side by side, in one run: the synchronous parameter server vs allreduce on 2 real Dask workers.

`ps-sync` (one server; each step pushes the gradient and pulls the next version) against
`allreduce` (the default, bucketed reducer): same model, seed, per-worker batch, data and
optimiser. The server is called through torch.distributed point-to-point messages (the
default, "ps") and, for comparison, through Dask actor calls ("ps-actor",
`--server-transport actor`). Throughput
is samples/s over steady-state steps, read from the metrics table's time column as
`bench_sync_sgd.py` reads it (the first WARMUP steps of each rank left out, ranks summed). The
sides alternate and medians over the rounds are reported; ratio = ps-sync / allreduce (the
target is at least 0.85).

    python benchmarks/bench_ps_sync.py [--models mlp cnn] [--batch 64] [--steps 60] [--rounds 3]
        [--sides ps ps-actor allreduce]
"""

from __future__ import annotations

import argparse
import statistics

from bench_sync_sgd import WARMUP, ours_throughput  # benchmarks/bench_sync_sgd.py

from scaledl_lab.runtime.dask.cluster import connect

SIDES = ("ps", "ps-actor", "allreduce")
TRANSPORTS = {"ps": "auto", "ps-actor": "actor"}


def measure(
    client, model: str, batch: int, steps: int, rounds: int, sides: tuple[str, ...] = SIDES
) -> dict[str, list[float]]:
    """Samples/s per round of ``ps-sync`` through torch.distributed messages ("ps") and actor
    calls ("ps-actor"), and of ``allreduce``, the sides taking turns."""
    runs: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side in (s for s in SIDES if s in sides):
            if side == "allreduce":
                rate = ours_throughput(client, "allreduce", model, batch, steps)
            else:
                rate = ours_throughput(
                    client, "ps-sync", model, batch, steps, server_transport=TRANSPORTS[side]
                )
            runs[side].append(rate)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=60, help="timed steps per worker")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    args = parser.parse_args()
    with connect(2, dashboard=False, log=None) as client:
        print(
            f"2 Dask workers x 1 thread, batch {args.batch} per worker, {args.steps} timed steps "
            f"after {WARMUP} warm-up, median of {args.rounds} rounds (sides alternate)"
        )
        sides = [s for s in SIDES if s in args.sides]
        base = "allreduce" if "allreduce" in sides else sides[0]
        print(f"samples/s (median, then each round); ratio = side / {base}")
        for model in args.models:
            runs = measure(client, model, args.batch, args.steps, args.rounds, tuple(sides))
            med = {k: statistics.median(v) for k, v in runs.items()}
            for side in sides:
                rounds = " ".join(f"{v:8.1f}" for v in runs[side])
                ratio = med[side] / med[base]
                print(f"{model:>6} {side:>10} {med[side]:>9.1f} {ratio:>6.2f}   {rounds}")


if __name__ == "__main__":
    main()
