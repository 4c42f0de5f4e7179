"""Where a simulated run's memory goes: its process's resident set, phase by phase.

Runs one simulated config in this process while a thread reads ``/proc/self/statm`` every 2 ms
and files each reading under the phase the run is in: ``setup`` (imports, the data),
``starting`` (the workers' models and optimisers), then as told by the
worker's calls: ``training``
(a train row was just logged: steps, sends, receives), ``evaluation``, ``collective`` (the
simulator carrying out an allreduce, broadcast or barrier: every worker's tensor is held at
once), ``keeping weights`` (each worker's final copy). Beside the peaks: what one worker's
model, gradient and optimiser state cost, and the bytes the simulator holds in messages at the
end of each phase's peak, so that the per-worker growth can be read as so many gradients.

    python benchmarks/memory_phases.py [RUN ...] [--list]

A RUN is a name (or the start of one) of ``scaledl-lab reproduce --quick``'s runs, the traffic
sweep's included (``--list`` prints them). Each run is measured in a fresh process, so one
run's freed memory does not hide the next one's. RSS, not PSS: one process, whose shared
library pages are the same in every run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict

GB = 1e9
PAGE = os.sysconf("SC_PAGE_SIZE")


def _configs() -> list:
    from scaledl_lab.studies.reproduce import QUICK_SEEDS, paper_configs, traffic_configs

    runs = paper_configs(True, seeds=QUICK_SEEDS, lr_factors=(1.0,)) + traffic_configs(True)
    return [c for c in runs if c.runtime == "sim"]


def measure_here(name: str) -> None:
    """Run the config ``name`` in this process; print one line per phase."""
    import torch

    from scaledl_lab import run
    from scaledl_lab.models import build_model
    from scaledl_lab.runtime.sim import scheduler
    from scaledl_lab.training import worker
    from scaledl_lab.training.plan import load_for, make_optimizer

    cfg = next(c for c in _configs() if c.name.startswith(name))
    phase = ["setup"]
    peak: dict[str, int] = defaultdict(int)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            with open("/proc/self/statm") as fh:
                rss = int(fh.read().split()[1]) * PAGE
            peak[phase[0]] = max(peak[phase[0]], rss)
            time.sleep(0.002)

    def marked(method, label: str):
        if getattr(method, "__code__", None) and method.__code__.co_flags & 0x80:  # async

            async def call(*args, **kwargs):
                phase[0] = label
                return await method(*args, **kwargs)
        else:

            def call(*args, **kwargs):
                phase[0] = label
                return method(*args, **kwargs)

        return call

    ctx = worker.WorkerContext
    ctx.log_train = marked(ctx.log_train, "training")
    ctx.evaluate_local = marked(ctx.evaluate_local, "evaluation")
    ctx.evaluate_shared = marked(ctx.evaluate_shared, "evaluation")
    ctx.keep_model = marked(ctx.keep_model, "keeping weights")
    world = scheduler.SimWorld
    world._complete = marked(world._complete, "collective")
    threading.Thread(target=sample, daemon=True).start()
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    gradient = sum(p.numel() * p.element_size() for p in params)
    optimizer = make_optimizer(cfg, params)
    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values()
                for t in s.values() if isinstance(t, torch.Tensor))  # fmt: skip
    del model, params, optimizer
    started = time.perf_counter()
    phase[0] = "starting"
    run(cfg, progress=False, log=None)
    wall = time.perf_counter() - started
    phase[0] = "after"
    time.sleep(0.05)
    done.set()
    base = peak["setup"]
    sizes = f"one gradient {gradient / 1e6:.2f} MB, optimiser state {state / 1e6:.2f} MB"
    print(
        f"{cfg.name}: {cfg.workers} workers, {cfg.strategy}, {cfg.optimizer}; {sizes}; {wall:.1f} s"
    )
    for label, rss in peak.items():
        extra = (rss - base) / cfg.workers / gradient
        print(f"    {label:16s} peak RSS {rss / GB:5.2f} GB  ({extra:+5.1f} gradients per worker)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="run names (or their start)")
    parser.add_argument("--list", action="store_true", help="print the runs and stop")
    parser.add_argument("--here", help=argparse.SUPPRESS)  # one run, in this process
    args = parser.parse_args(argv)
    if args.here:
        measure_here(args.here)
        return 0
    if args.list or not args.runs:
        for cfg in _configs():
            print(cfg.name)
        return 0
    for name in args.runs:
        done = subprocess.run([sys.executable, __file__, "--here", name], check=False)
        if done.returncode:
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
