"""`scaledl-lab plan --strategy mesh --mesh dp=..,tp=..,pp=..,cp=.. ...` (and the strategies
that split gpt-tiny along one dimension): each rank's ledger and simulated step, from a dry run
(:mod:`scaledl_lab.strategies.sim_plan`); ``--json`` prints the same numbers."""

from __future__ import annotations

import argparse
import json
import math

from ..config import ExperimentConfig
from ..strategies.sim_plan import RankPlan, sim_plan

COLUMNS = (("mem_params", "parameters"), ("mem_grads", "gradients"),
           ("mem_optim", "optimiser"), ("mem_activations", "activations"),
           ("mem_buffers", "buffers"))  # fmt: skip


def total(p: RankPlan) -> float:
    """A rank's ledger summed, the columns its run does not record left out."""
    return sum(v for v in p.memory.values() if not math.isnan(v))


def plan_text(
    cfg: ExperimentConfig, args: argparse.Namespace, room_gb: float | None
) -> tuple[str, str, bool | None]:
    """The plan of ``cfg`` as shown (JSON with ``--json``), as ``--out`` writes it (JSON if its
    name ends in .json) and whether every rank fits (None: no ``--device-memory-gb``)."""
    plans = sim_plan(cfg)
    worst = max(total(p) for p in plans)
    fits = None if room_gb is None else worst <= room_gb * 1e9
    shown = _text(cfg, plans, room_gb, fits, worst, args.json)
    as_json = args.out is not None and args.out.endswith(".json")
    written = _text(cfg, plans, room_gb, fits, worst, as_json)
    return shown, written, fits


def _text(cfg: ExperimentConfig, plans: list[RankPlan], room_gb: float | None,
          fits: bool | None, worst: float, as_json: bool) -> str:  # fmt: skip
    if as_json:
        body = dict(strategy=cfg.strategy, mesh=cfg.mesh, workers=cfg.workers, model=cfg.model,
                    dataset=cfg.dataset, batch_size=cfg.batch_size, network=cfg.network,
                    compute_profile=cfg.compute_profile, gpus_per_node=cfg.gpus_per_node,
                    ranks=[dict(rank=p.rank, step_s=p.step_s, bytes_per_step=p.bytes_per_step,
                                bytes={k: None if math.isnan(v) else v
                                       for k, v in p.memory.items()},
                                total_bytes=total(p)) for p in plans],
                    step_s=max(p.step_s for p in plans), device_memory_gb=room_gb,
                    fits=fits)  # fmt: skip
        return json.dumps(body, indent=2)
    mesh = f" {cfg.mesh}" if cfg.mesh else ""
    nodes = "" if cfg.gpus_per_node is None else f", {cfg.gpus_per_node} GPUs per node"
    lines = [f"{cfg.strategy}{mesh}, {cfg.workers} workers, {cfg.model} on {cfg.dataset}, "
             f"batch {cfg.batch_size}, {cfg.optimizer}, {cfg.precision}; "
             f"sim: {cfg.compute_profile}, {cfg.network}{nodes} (a dry run on zeros)",
             "  " + "".join(f"{label:>13s}" for _, label in COLUMNS)
             + f"{'total':>13s}{'step ms':>11s}{'bytes sent':>12s}  ranks"]  # fmt: skip
    alike: dict[str, list[int]] = {}  # the ranks whose numbers read the same, on one line
    for p in plans:
        cells = "".join(
            f"{'-':>13s}" if math.isnan(p.memory[k]) else f"{p.memory[k] / 1e6:10.3f} MB"
            for k, _ in COLUMNS
        )
        line = f"  {cells}{total(p) / 1e6:10.3f} MB{p.step_s * 1e3:11.4f}{p.bytes_per_step:12,d}"
        alike.setdefault(line, []).append(p.rank)
    lines += [f"{line}  {','.join(map(str, ranks))}" for line, ranks in alike.items()]
    if any(math.isnan(v) for p in plans for v in p.memory.values()):
        lines.append(f"  -: the {cfg.strategy} run records no such column")
    if room_gb is not None:
        over = f"does not fit: {(worst - room_gb * 1e9) / 1e6:.3f} MB over on the fullest rank"
        lines.append(f"  in {room_gb:g} GB per worker: {'fits' if fits else over}")
    return "\n".join(lines)
