"""Does the simulator predict real runs? Calibrate on one config, predict another, measure it.

1. Calibrate this machine with `scaledl-lab calibrate`'s code: gloo's α, β between two Dask
   workers, and real 2-worker runs of each model at batches 32 and 128.
2. Predict the time per step of *different* configs (batch 64: between the calibration points;
   batch 256: beyond them) on 2 workers with the simulated runtime and that calibration.
3. Run the same configs on 2 real Dask workers and measure the median wall time per step.

    python benchmarks/bench_sim_fidelity.py [--targets cnn:64 cnn:256 mlp:64 mlp:256]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scaledl_lab import ExperimentConfig
from scaledl_lab.experiment import compare
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.studies.calibrate import calibrate
from scaledl_lab.studies.scaling import step_time

DATA = dict(train_subset=20_000, val_size=200, test_subset=200)


def measure(
    client, targets: list[tuple[str, int]], steps: int, rounds: int, log=print
) -> list[tuple[str, int, float, float]]:
    """(model, batch, predicted s/step, measured s/step) for every target in every round.

    ``log`` gets the first round's calibration report (None: quiet).
    """
    models = sorted({m for m, _ in targets})
    rows = []
    for round_ in range(rounds):
        # Calibrate and measure close together: this machine's speed drifts over minutes.
        path = calibrate(
            tuple(models),
            Path(tempfile.mkdtemp()) / "calibration.json",
            client=client,
            log=log if round_ == 0 else None,
        )
        for model, batch in targets:
            cfg = ExperimentConfig(
                strategy="allreduce",
                workers=2,
                model=model,
                batch_size=batch,
                max_steps=steps,
                **DATA,
            )
            sim = cfg.replace(runtime="sim", compute_profile=str(path), network=str(path))
            predicted = step_time(compare([sim], progress=False).frame)
            measured = step_time(compare([cfg], client=client, progress=False).frame)
            rows.append((model, batch, predicted, measured))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["cnn:64", "cnn:256", "mlp:64", "mlp:256"])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    targets = [(t.split(":")[0], int(t.split(":")[1])) for t in args.targets]

    with connect(2, dashboard=False, log=None) as client:
        rows = measure(client, targets, args.steps, args.rounds)
    print(
        f"\n{'model':>6} {'batch':>6} {'predicted ms':>13} {'measured ms':>12} {'error':>7}"
        f"   (median of {args.rounds} rounds; calibrated at batch 32 and 128)"
    )
    for model, batch in targets:
        mine = [(p, m) for mo, b, p, m in rows if (mo, b) == (model, batch)]
        p = statistics.median(p for p, _ in mine)
        m = statistics.median(m for _, m in mine)
        errors = ", ".join(f"{(pp - mm) / mm:+.0%}" for pp, mm in mine)
        print(
            f"{model:>6} {batch:>6} {p * 1e3:>13.1f} {m * 1e3:>12.1f} {(p - m) / m:>+7.1%}"
            f"   rounds: {errors}",
            flush=True,
        )


if __name__ == "__main__":
    main()
