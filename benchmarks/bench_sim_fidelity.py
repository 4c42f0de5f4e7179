"""Does the simulator predict real runs? Calibrate on one config, predict another, measure it.

1. Calibrate this machine: the model's step time at batches 32 and 64 (one thread) and gloo's
   α, β between two real Dask workers (`scaledl_lab.calibrate`).
2. Predict the time per step of *different* configs (larger batches) on 2 workers with the
   simulated runtime and that calibration.
3. Run the same configs on 2 real Dask workers and measure the median wall time per step.

    python benchmarks/bench_sim_fidelity.py [--targets cnn:128 cnn:256 mlp:256]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from scaledl_lab import ExperimentConfig
from scaledl_lab.calibrate import calibrate_compute, calibrate_network
from scaledl_lab.cluster import connect
from scaledl_lab.cost import save_calibration
from scaledl_lab.experiment import compare
from scaledl_lab.scaling import step_time

DATA = dict(train_subset=20_000, val_size=200, test_subset=200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", nargs="+", default=["cnn:128", "cnn:256", "mlp:256"])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    targets = [(t.split(":")[0], int(t.split(":")[1])) for t in args.targets]
    models = sorted({m for m, _ in targets})

    with connect(2, dashboard=False, log=None) as client:
        compute = {m: calibrate_compute(m, batches=(32, 64)) for m in models}
        network = calibrate_network(client)
        path = save_calibration(Path(tempfile.mkdtemp()) / "calibration.json", compute,
                                network, {"calibrated_at_batches": [32, 64]})
        print("calibrated at batch 32 and 64 (one thread):")
        for m, p in compute.items():
            print(f"  {m}: {p.per_step_s * 1e3:.2f} ms/step + {p.per_sample_s * 1e3:.4f} "
                  "ms/sample")
        print(f"  gloo: latency {network.latency_s * 1e6:.0f} us, "
              f"bandwidth {network.bandwidth_Bps / 1e9:.2f} GB/s\n")
        print(f"{'model':>6} {'batch':>6} {'predicted ms':>13} {'measured ms':>12} "
              f"{'error':>7}")
        for model, batch in targets:
            cfg = ExperimentConfig(strategy="allreduce", workers=2, model=model,
                                   batch_size=batch, max_steps=args.steps, **DATA)
            sim = cfg.replace(runtime="sim", compute_profile=str(path), network=str(path))
            predicted = step_time(compare([sim], progress=False).frame)
            measured = step_time(compare([cfg], client=client, progress=False).frame)
            print(f"{model:>6} {batch:>6} {predicted * 1e3:>13.1f} {measured * 1e3:>12.1f} "
                  f"{(predicted - measured) / measured:>+7.1%}", flush=True)


if __name__ == "__main__":
    main()
