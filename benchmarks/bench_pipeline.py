"""Side by side, in one run: a 2-stage pipeline on 2 real Dask workers vs one plain process.

The CNN (or ``--model resnet18``) split in two (balance by measured time) runs GPipe with
M = 1, 4, 8 micro-batches on 2 Dask workers (one thread each); a plain single-process PyTorch
loop trains the same model on the same batches with one thread, on the whole batch ("plain")
and accumulating the gradients of the same M micro-batches ("accum": GPipe's sequential twin,
the same arithmetic in one process, so that its ratio is the pipeline's parallelism alone,
micro-batching's own cost or gain on this processor's caches left out). For each M it prints
samples/s of all three and the ratios, the bubble measured from the events table beside
(p − 1)/(M + p − 1), and the throughput the bubble alone would allow (p × one process × (1 −
bubble theory), i.e. perfectly balanced stages and free communication). Runs alternate (ours,
plain, accum, ours, ...) and medians are reported. Then the
schedules side by side on the same workers: 1F1B, interleaved 1F1B (V = 2: the CNN in 4
virtual stages) and zero bubble H1, each with its measured bubble beside the formula for equal
stages and the cost model's prediction for the run's own stages (the schedule replayed with
each chunk's FLOPs share). Then the tensor-parallel MLP (benchmarks/bench_tensor_parallel.py),
when present.

    python benchmarks/bench_pipeline.py [--model cnn] [--batch 64] [--micro-batches 1 4 8]
        [--schedule-micro-batches 4 8] [--steps 30] [--repeats 2] [--no-tensor]

``--schedule-micro-batches`` with no value skips the schedules, ``--no-tensor`` the MLP.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.runtime.memory import keep_freed_memory
from scaledl_lab.strategies.model_parallel.schedules import bubble, predicted_bubble
from scaledl_lab.training.worker import load_for
from scaledl_lab.viz.gantt import bubble_summary, bubble_theory
from scaledl_lab.viz.plots import throughput

DATA = dict(dataset="fashion-mnist", train_subset=20_000, test_subset=100, val_size=100)
STAGES = 2
MODELS = {"cnn": "CNN", "resnet18": "ResNet-18"}


SCHEDULES = (("1f1b", 1), ("interleaved-1f1b", 2), ("zb-h1", 1))


def _config(
    micro_batches: int, batch: int, steps: int, strategy: str = "gpipe", virtual: int = 1,
    model: str = "cnn",
) -> ExperimentConfig:  # fmt: skip
    return ExperimentConfig(
        strategy=strategy, workers=STAGES, model=model, micro_batches=micro_batches,
        virtual_stages=virtual, batch_size=batch, max_steps=steps, balance="time", lr=0.05,
        momentum=0.9, **DATA,
    )  # fmt: skip


def schedules_table(
    client, micro_batches: list[int], batch: int, steps: int, model: str = "cnn"
) -> None:
    """Each schedule on the Dask workers: samples/s, bubble measured, formula, prediction."""
    print(f"\nSchedules, {MODELS[model]} on {STAGES} Dask workers (balance by time), "
          f"batch {batch}, {steps} steps")  # fmt: skip
    print(f"{'schedule':>20} {'M':>3} {'ours/s':>9} {'bubble':>7} {'equal':>7} {'predicted':>10}")
    for m in micro_batches:
        for strategy, v in SCHEDULES:
            cfg = _config(m, batch, steps, strategy, v, model)
            res = run(cfg, client=client, progress=False)
            rate = float(throughput(res.frame)["samples_per_s"].iloc[0])
            measured = float(bubble_summary(res.events)["bubble"].mean())
            shares = {k: x for o in res.outputs[cfg.label] for k, x in o["chunk_shares"].items()}
            ordered = [shares[k] for k in sorted(shares)]
            predicted = predicted_bubble(strategy, STAGES, m, v, ordered)
            name = strategy + (f" V={v}" if v > 1 else "")
            print(f"{name:>20} {m:>3} {rate:>9.1f} {measured:>7.1%} "
                  f"{bubble(strategy, STAGES, m, v):>7.1%} {predicted:>10.1%}")  # fmt: skip


def ours(
    client, micro_batches: int, batch: int, steps: int, model: str = "cnn"
) -> tuple[float, float]:
    """Steady-state samples/s of the pipeline, and its measured bubble (mean over stages)."""
    res = run(_config(micro_batches, batch, steps, model=model), client=client, progress=False)
    rate = float(throughput(res.frame)["samples_per_s"].iloc[0])
    return rate, float(bubble_summary(res.events)["bubble"].mean())


def plain(batch: int, steps: int, model: str = "cnn", micro_batches: int = 1) -> float:
    """Samples/s of a plain one-thread PyTorch loop on the same model and batches; with
    ``micro_batches`` > 1 each step accumulates the gradients of that many micro-batches (each
    loss weighted by its share of the batch, as the pipeline's)."""
    cfg = _config(1, batch, steps, model=model)
    data = load_for(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    keep_freed_memory()
    try:
        net = build_model(model, data.input_shape, data.num_classes, seed=0)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        micro = batch // micro_batches
        warm = max(1, steps // 10)
        for i in range(steps):
            if i == warm:
                start = time.perf_counter()
            idx = torch.arange(i * batch, (i + 1) * batch) % len(data.train)
            opt.zero_grad()
            xs, ys = data.train.x[idx].split(micro), data.train.y[idx].split(micro)
            for x, y in zip(xs, ys, strict=True):
                (F.cross_entropy(net(x), y) * (len(y) / batch)).backward()
            opt.step()
        return (steps - warm) * batch / (time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="cnn")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--schedule-micro-batches", type=int, nargs="*", default=[4, 8])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-tensor", action="store_true", help="skip the tensor-parallel MLP")
    args = parser.parse_args()
    model, batch, steps = args.model, args.batch, args.steps
    print(f"GPipe, {MODELS[model]} in {STAGES} stages (balance by time) on {STAGES} Dask workers "
          f"x 1 thread, batch {batch}, {steps} steps; medians of {args.repeats}")  # fmt: skip
    print(f"{'M':>3} {'ours/s':>9} {'plain/s':>9} {'ratio':>6} {'accum/s':>9} {'ratio':>6} "
          f"{'bubble':>7} {'theory':>7} {'bubble-bound/s':>15}")  # fmt: skip
    with connect(STAGES, dashboard=False, log=None) as client:
        for m in args.micro_batches:
            rates, bubbles, plains, accums = [], [], [], []
            for _ in range(args.repeats):
                rate, bubble = ours(client, m, batch, steps, model)
                rates.append(rate)
                bubbles.append(bubble)
                plains.append(plain(batch, steps, model))
                accums.append(plain(batch, steps, model, m) if m > 1 else plains[-1])
            rate, bubble, one, acc = (
                statistics.median(v) for v in (rates, bubbles, plains, accums)
            )
            theory = bubble_theory(STAGES, m)
            bound = STAGES * one * (1 - theory)
            print(f"{m:>3} {rate:>9.1f} {one:>9.1f} {rate / one:>6.2f} {acc:>9.1f} "
                  f"{rate / acc:>6.2f} {bubble:>7.1%} {theory:>7.1%} {bound:>15.1f}")  # fmt: skip
        if args.schedule_micro_batches:
            schedules_table(client, args.schedule_micro_batches, batch, steps, model)
    tensor = Path(__file__).with_name("bench_tensor_parallel.py")
    if tensor.exists() and not args.no_tensor:
        spec = importlib.util.spec_from_file_location("bench_tensor_parallel", tensor)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        print()
        module.main([])


if __name__ == "__main__":
    main()
