"""`scaledl-lab plan ...`: a run's memory per worker and simulated step, without training
(the options of `scaledl-lab run`; :mod:`scaledl_lab.strategies.memory.plan`)."""

from __future__ import annotations

import argparse
import math

from ..config import ExperimentConfig


def add_plan(sub: argparse._SubParsersAction, run: argparse.ArgumentParser) -> None:
    plan = sub.add_parser(
        "plan", help="memory per worker and simulated step time of a run, without training"
    )
    for action in run._actions:  # the very options of `run` (one spelling, one meaning)
        if action.dest != "help":
            plan._add_action(action)
    plan.add_argument(
        "--device-memory-gb", type=float, default=None, help="does it fit in this much per worker"
    )
    plan.add_argument(
        "--transformer",
        default=None,
        metavar="L,H,A,S,V",
        help="plan a GPT-style transformer of L layers, hidden H, A heads, sequence S and "
        "vocabulary V instead of --model (--batch-size: sequences per worker)",
    )


def cmd_plan(args: argparse.Namespace, cfg: ExperimentConfig) -> int:
    """Print the plan of ``cfg`` (built from ``args`` as `run` builds its config)."""
    from ..strategies.memory.plan import plan

    if args.transformer is not None:
        from ..strategies.memory.transformer import Transformer, plan_transformer

        model = Transformer.parse(args.transformer)
        p = plan_transformer(cfg, model)
        what = f"a transformer of {model.parameters:,} parameters ({args.transformer})"
    else:
        p = plan(cfg)
        what = f"{cfg.model} on {cfg.dataset}"
    m = p.memory
    print(f"{cfg.strategy}, {cfg.workers} workers, {what}, "
          f"batch {cfg.batch_size} per worker, {cfg.optimizer}, {cfg.precision}")  # fmt: skip
    rows = [("parameters", m.params), ("gradients", m.grads), ("optimiser state", m.optim),
            ("model states", m.model_states), ("activations", m.activations),
            ("communication buffers", m.buffers)]  # fmt: skip
    for label, value in rows:
        print(
            f"  {label:22s} {'not predicted' if math.isnan(value) else f'{value / 1e6:12.3f} MB'}"
        )
    total = sum(v for _, v in rows[3:] if not math.isnan(v))
    print(f"  {'total per worker':22s} {total / 1e6:12.3f} MB")
    print(f"  step (sim: {cfg.compute_profile}, {cfg.network}): {p.step_s * 1e3:.3f} ms, "
          f"{p.bytes_per_step:,} bytes sent per worker")  # fmt: skip
    if args.device_memory_gb is not None:
        room = args.device_memory_gb * 1e9
        verdict = "fits" if total <= room else f"does not fit: {(total - room) / 1e9:.3f} GB over"
        print(f"  in {args.device_memory_gb:g} GB per worker: {verdict}")
        return 0 if total <= room else 1
    return 0
