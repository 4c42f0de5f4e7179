"""A refactor changes no number: one small fixed-seed simulated run of every strategy, saved.

Each run's metrics table (and, for pipelines, its events table) goes to ``OUT/NAME.csv``, so a
tree before and after a change can be compared byte for byte:

    python benchmarks/fixed_seed_runs.py --out /tmp/before      # on the old tree
    python benchmarks/fixed_seed_runs.py --out /tmp/after       # on the new one
    diff -r /tmp/before /tmp/after && echo "no number changed"

Every strategy of the contract runs, plus the variants that take other code paths (compression,
Downpour's exchange, DC-ASGD-a, backup workers, a straggler, large-batch schedules, pipelines
with recomputation, a killed worker). On one machine and torch build the files are identical
for an unchanged tree (the simulator is deterministic); compare only on one machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.contract import CONTRACT_STRATEGIES

SMALL = dict(
    runtime="sim", dataset="fashion-mnist", model="mlp", batch_size=16, train_subset=512,
    val_size=64, test_subset=128, epochs=2, seed=3, optimizer="sgd", lr=0.01, momentum=0.0,
    weight_decay=0.0,
)  # fmt: skip

PER_STRATEGY = {
    "nnt": dict(workers=4, topology="ring"),
    "nnt-lockstep": dict(workers=4, topology="ring"),
    "nnt-staged": dict(workers=9, topology="torus:3x3"),
    "dpsgd": dict(workers=9, topology="torus:3x3"),
    "adpsgd": dict(workers=4, topology="ring"),
    "local-sgd": dict(workers=4, sync_period=3),
    "easgd": dict(workers=4, sync_period=3),
    "model-parallel": dict(workers=2, stages=2),
    "gpipe": dict(workers=2, stages=2, micro_batches=4),
    "1f1b": dict(workers=4, stages=2, micro_batches=4),
    "tensor-parallel": dict(workers=2),
    "hogwild": dict(workers=4),
    "diloco": dict(workers=4, sync_period=5, optimizer="adamw", lr=1e-3),
    "streaming-diloco": dict(workers=4, sync_period=6, fragments=3, overlap_steps=2),
    "mesh": dict(
        workers=8,
        mesh="dp=2,tp=2,pp=2",
        model="gpt-tiny",
        dataset="licenses",
        micro_batches=2,
        zero_stage=1,
        sequence_parallel=True,
        train_subset=256,
        val_size=32,
        test_subset=32,
        batch_size=8,
    ),  # fmt: skip
}

VARIANTS = {
    "allreduce-topk": dict(strategy="allreduce", workers=4, compress="topk:0.01"),
    "allreduce-powersgd": dict(strategy="allreduce", workers=4, compress="powersgd:2"),
    "ps-async-qsgd-2servers": dict(strategy="ps-async", workers=4, compress="qsgd:4", servers=2),
    "downpour-4": dict(strategy="downpour", workers=4, n_push=4, n_fetch=4),
    "dc-asgd-a": dict(strategy="dc-asgd", workers=4, dc_adaptive=True, dc_lambda=2.0),
    "backup-straggler": dict(strategy="backup-workers", workers=4, stragglers="slow:1:3"),
    "allreduce-large-batch": dict(
        strategy="allreduce",
        workers=4,
        lr_scaling="linear",
        warmup_epochs=1,
        lr_schedule="cosine",
        optimizer="lars",
    ),  # fmt: skip
    "allreduce-accumulate": dict(strategy="allreduce", workers=2, accumulate=2),
    "1f1b-recompute": dict(strategy="1f1b", workers=2, stages=2, micro_batches=4, recompute=True),
    "nnt-adagrad-lead": dict(
        strategy="nnt",
        workers=4,
        topology="ring",
        optimizer="adagrad",
        lr=0.01,
        nnt_max_lead=2,
    ),  # fmt: skip
    "dpsgd-kill": dict(strategy="dpsgd", workers=4, topology="ring", faults="kill:1:3"),
    "streaming-diloco-wan-kill": dict(
        strategy="streaming-diloco",
        workers=4,
        sync_period=4,
        fragments=2,
        overlap_steps=1,
        network="wan",
        faults="kill:2:5",
    ),  # fmt: skip
}


def configs() -> dict[str, ExperimentConfig]:
    out = {}
    for name in CONTRACT_STRATEGIES:
        out[name] = ExperimentConfig(
            strategy=name, **{"workers": 4, **SMALL, **PER_STRATEGY.get(name, {})}
        )
    for name, options in VARIANTS.items():
        out[name] = ExperimentConfig(**{**SMALL, **options})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for one CSV per run")
    parser.add_argument("--only", nargs="+", help="only these runs")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for name, cfg in configs().items():
        if args.only and name not in args.only:
            continue
        res = run(cfg.replace(name=name), progress=False, log=None)
        res.frame.to_csv(out / f"{name}.csv", index=False)
        events = res.timeline()
        if len(events):
            events.to_csv(out / f"{name}.events.csv", index=False)
        print(f"{name:<24} {len(res.frame):5d} rows")
    print(f"{time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
