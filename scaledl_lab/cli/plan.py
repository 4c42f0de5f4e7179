"""`scaledl-lab plan ...`: a run's memory per worker and simulated step, without training
(the options of `scaledl-lab run`; :mod:`scaledl_lab.strategies.memory.plan`)."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..contract import TEXT_DATASETS
from ..errors import ConfigError
from . import options


def add_plan(sub: argparse._SubParsersAction, run: argparse.ArgumentParser) -> None:
    plan = sub.add_parser(
        "plan", help="memory per worker and simulated step time of a run, without training"
    )
    for action in run._actions:  # the very options of `run` (one spelling, one meaning)
        if action.dest not in ("help", "out", "recompute"):
            plan._add_action(action)
    from .plan_mesh import add_gpu_options

    add_gpu_options(plan)
    plan.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="also write the plan to FILE: JSON if its name ends in .json, else the text shown",
    )
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


def _config(
    args: argparse.Namespace, config_of: Callable[[argparse.Namespace], ExperimentConfig]
) -> ExperimentConfig:
    """The run's config; a transformer plan's model is the one given by its sizes, so --model
    is refused beside it and the config holds the lab's language model on text data (no
    check then speaks of a network the plan does not use)."""
    if args.transformer is None:
        return config_of(args)
    given = options.given_config(args)
    if "model" in given:
        raise ConfigError(
            f"--transformer {args.transformer} is the model planned; --model {given['model']} "
            "plans one of the lab's networks instead: give one of them, not both"
        )
    dataset = given.get("dataset", TEXT_DATASETS[0])
    if dataset not in TEXT_DATASETS:
        raise ConfigError(
            f"--transformer plans a language model on token sequences; --dataset {dataset} is "
            f"not text (leave --dataset out, or give {', '.join(TEXT_DATASETS)})"
        )
    return config_of(argparse.Namespace(**{**vars(args), "model": "gpt-tiny", "dataset": dataset}))


def cmd_plan(
    args: argparse.Namespace, config_of: Callable[[argparse.Namespace], ExperimentConfig]
) -> int:
    """Print the plan of the config `run` would build from ``args`` (``config_of``); with
    ``--out FILE``, write it there too."""
    from ..strategies.memory.plan import plan

    room_gb = args.device_memory_gb
    if room_gb is not None and not (math.isfinite(room_gb) and room_gb > 0):
        raise ConfigError(f"--device-memory-gb {room_gb:g} must be a positive, finite number")
    if args.gpu is not None:  # a transformer on a mesh of GPUs, analytically
        from .plan_mesh import plan_text

        text, fits = plan_text(args, room_gb)
        print(text)
        if args.out is not None:
            _write(Path(args.out), text + "\n")
        return 0 if fits else 1
    if isinstance(getattr(args, "recompute", None), str) and args.transformer is not None:
        raise ConfigError(
            f"--recompute {args.recompute}: --recompute selective is planned for a transformer "
            "on GPUs (--transformer with --gpu); a run of the lab's models recomputes whole "
            "layers (--recompute, no value)"
        )
    from ..strategies.sim_plan import PLANNED as DRY_RUN

    # gpt-tiny-moe routes by the tokens' values: planned from steps on its data, not zeros.
    experts = getattr(args, "model", None) == "gpt-tiny-moe"
    dry_run = args.transformer is None and getattr(args, "strategy", None) in DRY_RUN
    dry_run = dry_run and not experts
    if args.json and not dry_run:
        raise ConfigError(
            "--json prints a transformer's plan on GPUs (--transformer, --gpu) or a dry run's "
            f"({', '.join(DRY_RUN)})"
        )
    cfg = _config(args, config_of)
    if dry_run:  # gpt-tiny split over ranks: each rank's ledger and step, from a dry run
        from .plan_sim import plan_text as dry_run_text

        text, written, dry_fits = dry_run_text(cfg, args, room_gb)
        if not args.json:
            text += _cp_split(cfg)
        print(text)
        if args.out is not None:
            _write(Path(args.out), written + "\n")
        return 1 if dry_fits is False else 0
    if args.transformer is not None:
        from ..strategies.memory.transformer import Transformer, plan_transformer

        model = Transformer.parse(args.transformer)
        p = plan_transformer(cfg, model)
        what = f"a transformer of {model.parameters:,} parameters ({args.transformer})"
    elif experts and cfg.strategy == "mesh":
        p, extra = _plan_experts(cfg)
        what = f"{cfg.model} on {cfg.dataset}, mesh {cfg.mesh}"
    else:
        p = plan(cfg)
        what = f"{cfg.model} on {cfg.dataset}"
    m = p.memory
    lines = [f"{cfg.strategy}, {cfg.workers} workers, {what}, "
             f"batch {cfg.batch_size} per worker, {cfg.optimizer}, {cfg.precision}"]  # fmt: skip
    rows = [("parameters", m.params), ("gradients", m.grads), ("optimiser state", m.optim),
            ("model states", m.model_states), ("activations", m.activations),
            ("communication buffers", m.buffers)]  # fmt: skip
    for label, value in rows:
        shown = "not predicted" if math.isnan(value) else f"{value / 1e6:12.3f} MB"
        lines.append(f"  {label:22s} {shown}")
    total = sum(v for _, v in rows[3:] if not math.isnan(v))
    lines.append(f"  {'total per worker':22s} {total / 1e6:12.3f} MB")
    nodes = "" if cfg.gpus_per_node is None else f", {cfg.gpus_per_node} GPUs per node"
    step = f"{p.step_s * 1e3:.3f} ms, {p.bytes_per_step:,} bytes sent per worker"
    lines.append(f"  step (sim: {cfg.compute_profile}, {cfg.network}{nodes}): {step}")
    if experts and cfg.strategy == "mesh" and args.transformer is None:
        lines += extra
    fits = None if room_gb is None else total <= room_gb * 1e9
    if room_gb is not None:
        over = f"does not fit: {(total - room_gb * 1e9) / 1e9:.3f} GB over"
        lines.append(f"  in {room_gb:g} GB per worker: {'fits' if fits else over}")
    print("\n".join(lines))
    if args.out is not None:
        summary = dict(
            strategy=cfg.strategy, workers=cfg.workers, model=what, batch_size=cfg.batch_size,
            optimizer=cfg.optimizer, precision=cfg.precision,
            bytes={label: None if math.isnan(v) else v for label, v in rows},
            total_bytes=total, step_s=p.step_s, bytes_per_step=p.bytes_per_step,
            device_memory_gb=room_gb, fits=fits,
        )  # fmt: skip
        text = json.dumps(summary, indent=2) if args.out.endswith(".json") else "\n".join(lines)
        _write(Path(args.out), text + "\n")
        print(f"plan written to {args.out}")
    return 1 if fits is False else 0


def _cp_split(cfg: ExperimentConfig) -> str:
    """For a mesh of dp and cp: the line that splits a rank's bytes into the attention's, the
    gradients' average's and the loss's (:mod:`scaledl_lab.studies.context.plan`); else ""."""
    from ..strategies.mesh.grid import Mesh
    from ..studies.context.plan import plan_context

    mesh = Mesh.parse(cfg.mesh)
    if mesh.size("cp") == 1 or mesh.size("tp") > 1 or mesh.size("pp") > 1 or cfg.zero_stage:
        return ""
    p = plan_context(cfg)
    loss = p.plan.bytes_per_step - p.attention_bytes - p.gradient_bytes
    return (
        f"\n  of which cp's attention ({cfg.cp_method}): {p.attention_bytes:,}, the gradients' "
        f"average over cp and dp: {p.gradient_bytes:,}, the loss's over cp: {loss:,}"
    )


def _plan_experts(cfg: ExperimentConfig) -> tuple[Any, list[str]]:
    """gpt-tiny-moe on dp and ep (:mod:`scaledl_lab.studies.moe.plan`): its plan, and the line
    with the parameters a rank holds and the bytes of the all-to-alls and of the gradients."""
    from ..studies.moe.plan import plan_experts

    e = plan_experts(cfg)
    return e.plan, [
        f"    holding {e.held_parameters:,} parameters (1/ep of the experts); of which the "
        f"all-to-alls: {e.all_to_all_bytes:,}, the gradients' reductions: {e.gradient_bytes:,}"
    ]


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise ConfigError(f"cannot write the plan to {path}: {exc.strerror or exc}") from None
