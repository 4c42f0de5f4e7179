"""Where a real 2-stage pipeline's step goes, against one plain process: GPipe of the CNN (or
ResNet-18) on 2 Dask workers (one thread each), from its events table, beside the raw cost of
one hand-over.

The measured step (median over the steps after the first) is taken apart into:

* **plain**: one single-thread process training the same model on the whole batch;
* **compute**: the sum, over both stages, of every forward and backward the pipeline ran (its
  micro-batches of batch/M samples each cost more per sample than one batch does);
* **replayed**: the schedule replayed with each stage's measured mean F and B and free messages
  (the split's imbalance and the bubble, nothing else): the best step this split allows;
* **hand-overs**: the rest, the measured step beyond the replay.

Then the hand-over itself: how long the receiving stage waited from the sender's op ending to
its own op starting, where it had nothing else to do (each step's first forward on stage 1, its
first backward on stage 0), beside a gloo ping-pong of the same activation between two fresh
processes (one-way: half the round trip), the transport alone.

    python benchmarks/pipeline_profile.py [--model cnn] [--micro-batches 8] [--batch 64]
        [--steps 30]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import time
from datetime import timedelta
from pathlib import Path

import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.strategies.model_parallel.partition import boundary_shapes, layers
from scaledl_lab.strategies.model_parallel.schedules import replay, schedule
from scaledl_lab.training.worker import load_for

MS = 1e3


def _bench_pipeline():
    """``bench_pipeline.py``, whose configs and plain loop this profile shares."""
    spec = importlib.util.spec_from_file_location(
        "bench_pipeline", Path(__file__).with_name("bench_pipeline.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


BENCH = _bench_pipeline()
STAGES = BENCH.STAGES


def config(micro_batches: int, batch: int, steps: int, model: str = "cnn") -> ExperimentConfig:
    """``bench_pipeline.py``'s GPipe of the model (balance by time)."""
    return BENCH._config(micro_batches, batch, steps, model=model)


def plain_step(batch: int, steps: int, model: str = "cnn") -> float:
    """Seconds of one plain single-thread training step on the whole batch: the loop of
    ``bench_pipeline.py``, which times the same model on the same batches."""
    return batch / BENCH.plain(batch, steps, model)


def decompose(events: pd.DataFrame, micro_batches: int) -> dict[str, float]:
    """The step's parts from the events table (seconds, medians over the steps after the
    first), and the waits of the hand-overs a stage had nothing else to do during."""
    ev = events[events.step > 0].assign(d=lambda e: e.end - e.start)
    spans = ev.groupby("step").agg(s=("start", "min"), e=("end", "max"))
    mean = ev.groupby(["stage", "phase"]).d.mean()
    costs = [{"F": mean[(s, "F")], "B": mean[(s, "B")]} for s in range(STAGES)]
    ops = schedule("gpipe", STAGES, micro_batches, 1)
    compute = ev.groupby("step").d.sum().median()
    busy = ev.groupby(["step", "stage"]).d.sum().groupby("stage").median()
    idle = replay(ops, costs)  # each stage's idle share of the replayed step, whose span is
    replayed = micro_batches * (costs[0]["F"] + costs[0]["B"]) / (1 - idle[0])  # stage 0's busy
    first = ev[ev.micro_batch == 0].set_index(["step", "stage", "phase"])
    last = ev[ev.micro_batch == micro_batches - 1].set_index(["step", "stage", "phase"])
    forward = first.xs((1, "F"), level=(1, 2)).start - first.xs((0, "F"), level=(1, 2)).end
    backward = last.xs((0, "B"), level=(1, 2)).start - last.xs((1, "B"), level=(1, 2)).end
    return {
        "step": float((spans.e - spans.s).median()),
        "compute": float(compute),
        "busy_0": float(busy[0]),
        "busy_1": float(busy[1]),
        "replayed": replayed,
        "wait_forward": float(forward.median()),
        "wait_backward": float(backward.median()),
    }


def _pingpong(rank: int, port: int, shape: tuple[int, ...], rounds: int, out) -> None:
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
    x = torch.randn(shape)
    times = []
    for _ in range(rounds):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(x, 1)
            dist.recv(x, 1)
        else:
            dist.recv(x, 0)
            dist.send(x, 0)
        times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(statistics.median(times[2:]) / 2)
    dist.destroy_process_group()


def transport(shape: tuple[int, ...], rounds: int = 50) -> float:
    """One-way seconds of a gloo send of a tensor of ``shape`` between two processes."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = 29_500 + os.getpid() % 1000
    procs = [ctx.Process(target=_pingpong, args=(r, port, shape, rounds, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    value = out.get(timeout=120)
    for p in procs:
        p.join()
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(BENCH.MODELS), default="cnn")
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args(argv)
    m, batch, model = args.micro_batches, args.batch, args.model
    cfg = config(m, batch, args.steps, model)
    with connect(STAGES, dashboard=False, log=None) as client:
        res = run(cfg, client=client, progress=False)
    parts = decompose(res.events, m)
    plain = plain_step(batch, args.steps, model)
    first_layers = next(o["layers"] for o in res.outputs[cfg.label] if o["stage"] == 0)
    data = load_for(cfg)
    net = build_model(model, data.input_shape, data.num_classes, seed=0)
    sample = torch.zeros(batch // m, *data.input_shape)
    shape = tuple(boundary_shapes(layers(net), sample)[first_layers - 1])
    one_way = transport(shape)
    hand = parts["step"] - parts["replayed"]
    print(f"GPipe, {BENCH.MODELS[model]} in {STAGES} stages (balance by time, stage 0: "
          f"{first_layers} layers), batch {batch}, M = {m}, on {STAGES} Dask workers x 1 "
          f"thread; medians over {args.steps - 1} steps")  # fmt: skip
    rows = [
        ("plain process, whole batch", plain),
        ("pipeline step, measured", parts["step"]),
        ("  compute, both stages", parts["compute"]),
        (f"    stage 0 / stage 1 busy: {parts['busy_0'] * MS:.1f} / {parts['busy_1'] * MS:.1f} "
         "ms", None),
        ("  replayed: measured ops, free messages", parts["replayed"]),
        ("  hand-overs: the rest", hand),
    ]  # fmt: skip
    for name, value in rows:
        print(f"{name:<44}" + (f"{value * MS:8.2f} ms" if value is not None else ""))
    print(f"ratio pipeline / plain samples/s: {plain / parts['step']:.2f} "
          f"(replayed, free messages: {plain / parts['replayed']:.2f}; micro-batching alone "
          f"{parts['compute'] / plain:.2f}x the plain compute)")  # fmt: skip
    kb = torch.Size(shape).numel() * 4 / 1e3
    print(
        f"one hand-over, activation {list(shape)} ({kb:.0f} kB): stage 1 waited "
        f"{parts['wait_forward'] * MS:.2f} ms for its first forward, stage 0 "
        f"{parts['wait_backward'] * MS:.2f} ms for its first backward; a gloo send of it "
        f"between two plain processes {one_way * MS:.2f} ms one way; "
        f"{2 * m} hand-overs a step cost {hand / (2 * m) * MS:.2f} ms each beyond the replay"
    )


if __name__ == "__main__":
    main()
