"""NNT with a straggler: does a worker wait for its slow neighbour? Unbounded (FAST) vs lead 4.

1. Simulator: 16 workers on a 4×4 torus, rank 5 ten times slower (``slow:5:10``). For each
   variant, every other worker's step rate (virtual time) with the straggler over its rate
   without it: FAST never waits, so it should keep its rate; a lead bound couples it to rank 5.
2. Dask: 2 real workers (a ring of two), rank 1 slowed by a sleep per step (``slow:1:FACTOR``,
   FACTOR − 1 times its measured compute), for ``--steps`` steps: rank 0's step rate (wall
   clock) with the straggler over its rate without it, for the unbounded variant (a receiver
   thread per neighbour keeps a gloo receive posted) and for lead 4 (the receives posted by the
   training loop itself, gloo's plain sends). Every run reports the messages each worker
   applied (exactly the sender's step count from every neighbour).

Step rates run from a worker's first train row to its second-to-last (the last step waits for
every message still owed to it: that is the end of the run, not its pace).

    python benchmarks/bench_nnt_straggler.py [--quick] [--steps 1000] [--factor 10] [--skip-sim]
"""

from __future__ import annotations

import argparse
import time

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.analysis import step_rates
from scaledl_lab.runtime.dask.cluster import connect

COMMON = dict(
    strategy="nnt", model="cnn1d", dataset="mnist1d", batch_size=16, optimizer="adagrad",
    lr=0.01, momentum=0.0, weight_decay=1e-4, test_subset=160, val_size=160,
)  # fmt: skip
VARIANTS = {"unbounded (FAST)": None, "lead 4": 4}


def _kept(even, slow, ranks: list[int]) -> tuple[float, float]:
    """(min, mean) over ``ranks`` of the step rate with the straggler over the rate without."""
    ratio = step_rates(slow.frame)[ranks] / step_rates(even.frame)[ranks]
    return float(ratio.min()), float(ratio.mean())


def _applied(res) -> str:
    outs = res.outputs[res.configs[0].label]
    counts = {n for out in outs for n in out["messages_applied"].values()}
    return f"each worker applied {sorted(counts)} messages per neighbour"


def simulated(steps: int, factor: float) -> None:
    base = ExperimentConfig(
        runtime="sim", workers=16, topology="torus:4x4", train_subset=16 * 16 * steps, **COMMON
    )
    print(f"simulator, 4x4 torus, rank 5 x{factor:g} slower, {steps} steps per worker")
    for name, lead in VARIANTS.items():
        cfg = base.replace(nnt_max_lead=lead)
        even, slow = (
            run(cfg, progress=False),
            run(cfg.replace(stragglers=f"slow:5:{factor:g}"), progress=False),
        )
        low, mean = _kept(even, slow, [r for r in range(16) if r != 5])
        print(
            f"  {name:<17} others keep {low:.1%} (min) / {mean:.1%} (mean) of their step rate; "
            f"{_applied(slow)}"
        )


def real(steps: int, factor: float) -> None:
    # Four epochs of steps / 4 steps each (MNIST-1D has 15,840 training samples beside val).
    base = ExperimentConfig(runtime="dask", workers=2, epochs=4, train_subset=8 * steps, **COMMON)
    print(f"\nDask, 2 workers, rank 1 x{factor:g} slower (a sleep per step), {steps} steps")
    with connect(2, dashboard=False, log=None) as client:
        run(base.replace(max_steps=20), client=client, progress=False)  # warm the workers
        for name, lead in VARIANTS.items():
            cfg = base.replace(nnt_max_lead=lead)
            start = time.perf_counter()
            even = run(cfg, client=client, progress=False)
            slow = run(cfg.replace(stragglers=f"slow:1:{factor:g}"), client=client, progress=False)
            low, _ = _kept(even, slow, [0])
            rate = step_rates(even.frame)[0]
            print(
                f"  {name:<17} rank 0 keeps {low:.1%} of its step rate ({rate:.0f} steps/s "
                f"without the straggler); {_applied(slow)}; {time.perf_counter() - start:.0f} s"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps per worker on Dask")
    parser.add_argument("--sim-steps", type=int, default=16, help="steps per worker, simulated")
    parser.add_argument("--factor", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="200 steps on Dask")
    parser.add_argument("--skip-sim", action="store_true", help="the Dask part only")
    args = parser.parse_args(argv)
    if not args.skip_sim:
        simulated(args.sim_steps, args.factor)
    real(200 if args.quick else args.steps, args.factor)


if __name__ == "__main__":
    main()
