"""Side by side: ZeRO stages 1-3 against allreduce on 2 Dask workers, and against PyTorch's
own on 2 gloo processes (ZeroRedundancyOptimizer after an allreduce of gradients for stage 1,
FSDP2 ``fully_shard`` on every layer for stage 3): same model, seed, batches and Adam.

Throughput is samples/s from the median step time after the first WARMUP steps (ours: the
train rows' time stamps on rank 0; PyTorch's: each step timed in its loop). Memory is rank 0's
model states after its last step, as the ledger counts them (PyTorch's: its local shards
counted the same way, so FSDP2's per-parameter padding shows beside our per-layer padding).

    python benchmarks/bench_zero.py [--model mlp] [--steps 60] [--batch 64]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.strategies.memory.pytorch import run_pytorch

WARMUP = 5
STATES = ["mem_params", "mem_grads", "mem_optim"]


def _ours(cfg: ExperimentConfig) -> tuple[float, dict[str, float]]:
    res = run(cfg, progress=False)
    train = res.frame.query("kind == 'train' and rank == 0").sort_values("step")
    step_s = statistics.median(np.diff(train["time"].to_numpy())[WARMUP:])
    last = train.iloc[-1]
    memory = {c.removeprefix("mem_"): float(last[c]) for c in [*STATES, "mem_buffers"]}
    return cfg.batch_size * cfg.workers / step_s, memory


def _theirs(cfg: ExperimentConfig, kind: str) -> tuple[float, dict[str, float]]:
    out = run_pytorch(cfg, kind)
    step_s = statistics.median(out["step_s"][WARMUP:])
    return cfg.batch_size * cfg.workers / step_s, {k: float(v) for k, v in out["memory"].items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    base = ExperimentConfig(
        strategy="allreduce", runtime="dask", workers=2, model=args.model,
        dataset="fashion-mnist", batch_size=args.batch, optimizer="adam", lr=1e-3,
        train_subset=2 * args.batch * (args.steps + 1), val_size=200, test_subset=200,
        max_steps=args.steps,
    )  # fmt: skip
    rows = []
    for strategy in ("allreduce", "zero1", "zero2", "zero3"):
        rows.append((f"ours: {strategy}", *_ours(base.replace(strategy=strategy))))
    for kind, label in (("zero-redundancy", "ZeroRedundancyOptimizer"), ("fully-shard", "FSDP2")):
        rows.append((f"PyTorch: {label}", *_theirs(base, kind)))
    print(f"{args.model}, 2 workers, batch {args.batch} each, Adam, {args.steps} steps")
    print(f"{'':32} {'samples/s':>10} {'params MB':>10} {'grads MB':>9} {'optim MB':>9}")
    for label, rate, mem in rows:
        cells = [mem[k] / 1e6 for k in ("params", "grads", "optim")]
        print(f"{label:32} {rate:10.0f} " + " ".join(f"{c:9.3f}" for c in cells))


if __name__ == "__main__":
    main()
