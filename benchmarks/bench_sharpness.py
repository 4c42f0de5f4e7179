"""What the sharpness analysis costs: scaledl_lab.strategies.large_batch.sharpness.analyse on the
MLP against one epoch of the MLP's training (Fashion-MNIST, batch 128, a plain PyTorch loop, one
process).

    python benchmarks/bench_sharpness.py [--repeats 3] [--samples 1000] [--threads 1]

The analysis scores train (10k samples) and test accuracy, runs up to 20 power iterations of
Hessian-vector products on the probe set, and 5 steps of ε-sharpness ascent. Both sides use
the same number of threads (one by default: on a shared machine two OpenMP threads that wait for
each other can make a plain epoch many times slower than it is). The two sides
alternate and the median of the per-pair ratios is reported: this machine's speed drifts by
±20% over minutes. The issue's budget: a ratio below 1.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from scaledl_lab import ExperimentConfig
from scaledl_lab.data import epoch_batches, shard_indices
from scaledl_lab.experiment import Results
from scaledl_lab.metrics import to_frame
from scaledl_lab.models import build_model
from scaledl_lab.strategies.large_batch.sharpness import analyse
from scaledl_lab.training.worker import load_for, make_optimizer


def train_one_epoch(cfg: ExperimentConfig, model: torch.nn.Module) -> float:
    """Seconds for one epoch of plain training (what the analysis is measured against)."""
    data = load_for(cfg)
    optimizer = make_optimizer(cfg, model.parameters())
    shard = shard_indices(data.train.y, 1, 0, seed=cfg.seed)
    start = time.perf_counter()
    for idx in epoch_batches(shard, cfg.batch_size, seed=cfg.seed, epoch=0, rank=0):
        optimizer.zero_grad()
        F.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
        optimizer.step()
    return time.perf_counter() - start


def analysis(cfg: ExperimentConfig, model: torch.nn.Module, samples: int) -> tuple[float, dict]:
    """Seconds for the sharpness analysis of ``model``, and its table's row."""
    results = Results(
        frame=to_frame([]),
        configs=[cfg],
        outputs={cfg.label: [{"state_dict": model.state_dict()}]},
    )
    start = time.perf_counter()
    table = analyse(results, samples=samples)
    return time.perf_counter() - start, table.iloc[0].to_dict()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=1, model="mlp", batch_size=128, lr=0.05
    )
    data = load_for(cfg)
    model = build_model("mlp", data.input_shape, data.num_classes, seed=0)
    train_one_epoch(cfg, model)  # warm up (and train: the analysis sees a trained MLP)
    ratios, epochs, analyses = [], [], []
    for _ in range(args.repeats):
        epoch = train_one_epoch(cfg, model)
        seconds, row = analysis(cfg, model, args.samples)
        epochs.append(epoch)
        analyses.append(seconds)
        ratios.append(seconds / epoch)
    print(f"threads: {torch.get_num_threads()}; MLP on Fashion-MNIST ({len(data.train)} samples)")
    print(f"one training epoch (batch 128): median {statistics.median(epochs):.2f} s")
    print(
        f"sharpness analysis: median {statistics.median(analyses):.2f} s "
        f"(top eigenvalue {row['top_eigenvalue']:.3g} after {row['hessian_iterations']} "
        f"iterations, ε-sharpness {row['epsilon_sharpness']:.3g}%, gap {row['gap']:.2f} points)"
    )
    print(f"analysis / epoch: {statistics.median(ratios):.2f} (median of {args.repeats} pairs)")


if __name__ == "__main__":
    main()
