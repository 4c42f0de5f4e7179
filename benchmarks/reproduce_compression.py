"""The gradient-compression study at full size, into a results folder the notebook loads.

Every compressor (with and without error feedback) on 2 simulated workers, Fashion-MNIST, MLP,
5 epochs (`scaledl_lab.compression_study`); time per step on a slow and a fast simulated network
(16 workers); then `summary.md` with the tables and the verdicts. PowerSGD beside torch's hook
comes from `python benchmarks/bench_compression.py --skip-resnet --out results/compression`
(run it after this script; `--report-only` then rewrites summary.md with its table).

    python benchmarks/reproduce_compression.py [--out results/compression] [--report-only] [--quick]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from scaledl_lab import compression_report as report
from scaledl_lab import compression_study as study
from scaledl_lab.experiment import compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/compression")
    parser.add_argument("--report-only", action="store_true", help="rewrite summary.md only")
    parser.add_argument("--quick", action="store_true", help="quick mode: a subset, 2 epochs")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.report_only:
        start = time.perf_counter()
        study.run_study(out, is_quick=args.quick)
        configs = study.step_time_configs(
            study.STEP_COMPRESSORS, study.NETWORKS, workers=study.STEP_WORKERS
        )
        steps = study.step_times(compare(configs, progress=False, log=None))
        steps.to_csv(out / "step_times.csv", index=False)
        print(f"study: {time.perf_counter() - start:.0f} s")
    print(report.write_report(out))


if __name__ == "__main__":
    main()
