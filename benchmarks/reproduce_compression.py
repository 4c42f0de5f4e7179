"""The gradient-compression study at full size, into a results folder the notebook loads.

Every compressor (with and without error feedback) on 2 simulated workers, Fashion-MNIST, MLP,
5 epochs (`scaledl_lab.studies.compression.study`); time per step on a slow and a fast
simulated network (16 workers); then `summary.md` with the tables and the verdicts. PowerSGD
beside torch's hook comes from `python benchmarks/bench_compression.py --skip-resnet --out
results/compression` (run it after this script; `--report-only` then rewrites summary.md with
its table).

    python benchmarks/reproduce_compression.py [--out results/compression] [--report-only] [--quick]
    python benchmarks/reproduce_compression.py --seeds 1 2   # seed spread of the 1-point claims

``--seeds`` reruns the uncompressed run, top-k 0.4% and 1-bit (both with error feedback) with
other seeds into ``seeds.csv``: whether a gap of about one point is the compressor or the seed.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from scaledl_lab.config import ExperimentConfig
from scaledl_lab.experiment import Results, compare
from scaledl_lab.studies.compression import report, study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/compression")
    parser.add_argument("--report-only", action="store_true", help="rewrite summary.md only")
    parser.add_argument("--quick", action="store_true", help="quick mode: a subset, 2 epochs")
    parser.add_argument("--seeds", type=int, nargs="+", help="only the seed-spread runs")
    args = parser.parse_args()
    out = Path(args.out)
    if args.seeds:
        seed_spread(out, args.seeds, is_quick=args.quick)
        return
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


SEED_RUNS = (("none", True), ("topk:0.004", True), ("onebit", True))


def seed_configs(seeds: list[int], is_quick: bool = False) -> list[ExperimentConfig]:
    base = study.base_config(is_quick)
    return [
        base.replace(compress=c, error_feedback=ef, seed=s, name=f"{study.label(c, ef)} seed {s}")
        for s in seeds
        for c, ef in SEED_RUNS
    ]


def seed_table(results: Results) -> pd.DataFrame:
    """Final test accuracy per run, each gap against its own seed's uncompressed run."""
    table = report.accuracy_table(results)
    table["seed"] = [cfg.seed for cfg in results.configs]
    none = table[table["compress"] == "none"].set_index("seed")["test_accuracy"]
    table["points_vs_none"] = 100 * (table["test_accuracy"] - table["seed"].map(none))
    return table[["seed", "compress", "error_feedback", "test_accuracy", "points_vs_none"]]


def seed_spread(out: Path, seeds: list[int], is_quick: bool = False) -> None:
    start = time.perf_counter()
    results = study.run_study(None, configs=seed_configs(seeds, is_quick))
    table = seed_table(results)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "seeds.csv", index=False, float_format="%.6g")
    print(table.to_string(index=False))
    print(f"seeds: {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
