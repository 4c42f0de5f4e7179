"""The plan of a strategy that splits gpt-tiny (the mesh, and the named strategies that are one
of its dimensions): each rank's memory ledger and the simulator's step, from a dry run.

A dry run (torchtitan's and Megatron-LM's, which build the model and run its first steps
without a dataset) of ``STEPS`` steps on batches of zeros under the simulator: the strategy's
own program on every rank, the cost model the simulator trains under
(:func:`scaledl_lab.runtime.sim.cost.build_cost_model`, the one a run builds), no data file, no
results folder, the weights thrown away. Each rank's step is the last step's length on its
clock (the first one also waits for the evaluation before training); its ledger and bytes sent
are the last step's. Neither depends on what the tokens are: the cost model prices sizes
(samples, bytes), and the ledger counts the bytes of tensors whose shapes the batch's shape
fixes. So the plan of a gpt-tiny mesh is what its run records, to the byte and to the
simulator's clock, without the formulas for a schedule's bubbles and overlaps written twice:
those are the program's.

What a dry run cannot say, it refuses: stragglers' hiccups and faults (one step is not the
next), the loss and accuracy (the data's), float16's loss scale and skipped steps (they depend
on the gradients' values, and so does whether Adam's state exists yet).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..config import ExperimentConfig
from ..contract import TEXT_DATASETS
from ..data import num_classes, sample_shape
from ..data.base import Dataset, DataSplits
from ..errors import ConfigError
from ..models import model_flops
from ..runtime.base import Comm, Launch
from ..runtime.sim.cost import build_cost_model
from ..training.worker import WorkerContext
from .registry import get_strategy

PLANNED = ("mesh", "tensor-parallel", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
STEPS = 3  # the first step waits for the evaluation before it; the last two are alike
LEDGER = ("mem_params", "mem_grads", "mem_optim", "mem_activations", "mem_buffers")


@dataclass(frozen=True)
class RankPlan:
    """One rank's step: its ledger (the run's ``mem_*`` columns), seconds and bytes sent."""

    rank: int
    memory: dict[str, float]
    step_s: float
    bytes_per_step: int


def check_plannable(cfg: ExperimentConfig) -> None:
    """Refuse what a dry run of a few steps cannot predict, before any work."""
    if cfg.strategy not in PLANNED:
        raise ConfigError(f"a dry-run plan is for {', '.join(PLANNED)}; not {cfg.strategy!r}")
    if cfg.stragglers:
        raise ConfigError(
            f"stragglers={cfg.stragglers!r}: the plan predicts a step without stragglers (a "
            "hiccup lands on some steps, not others); leave --stragglers out"
        )
    if cfg.faults:
        raise ConfigError(f"faults={cfg.faults!r}: the plan predicts a step, not a failure")
    if cfg.precision == "float16":
        raise ConfigError(
            "precision='float16': the plan cannot predict dynamic loss scaling (a skipped step "
            "and Adam's state depend on the gradients' values); plan bfloat16, the same bytes"
        )


def _zeros(cfg: ExperimentConfig, samples: int) -> Dataset:
    shape, classes = sample_shape(cfg.dataset), num_classes(cfg.dataset)
    if cfg.dataset in TEXT_DATASETS:  # token ids, and the next token at every position
        x = torch.zeros(samples, *shape, dtype=torch.int64)
        return Dataset(cfg.dataset, x, x.clone(), classes)
    x = torch.zeros(samples, *shape)
    return Dataset(cfg.dataset, x, torch.zeros(samples, dtype=torch.int64), classes)


class _DryRun:
    """What the simulator runs on every rank: the strategy's program on the data of zeros."""

    def __init__(self, cfg: ExperimentConfig, data: DataSplits) -> None:
        self.cfg, self.data = cfg, data
        self.program = get_strategy(cfg.strategy).program

    def prepare(self) -> None:
        """Nothing to load: the data is the zeros."""

    async def __call__(self, comm: Comm, device: torch.device, emit: Any) -> dict[str, Any]:
        ctx = WorkerContext(self.cfg, comm, self.data, device, emit, "plan")
        await self.program(ctx)
        return {}


def sim_plan(cfg: ExperimentConfig) -> list[RankPlan]:
    """Every rank's ledger and step of ``cfg``, rank by rank, from ``STEPS`` steps on zeros."""
    from ..runtime.sim.scheduler import run_sim

    check_plannable(cfg)
    cfg = cfg.replace(epochs=1, max_steps=STEPS, checkpoint_every=None)
    batch = cfg.batch_size * cfg.accumulate
    data = DataSplits(_zeros(cfg, cfg.replicas * batch * STEPS), _zeros(cfg, batch),
                      _zeros(cfg, batch))  # fmt: skip
    cost = build_cost_model(cfg, model_flops(cfg.model, data.input_shape, data.num_classes))
    rows: list[dict[str, Any]] = []
    launch = Launch(program=_DryRun(cfg, data), world_size=cfg.workers, label="plan",
                    timeout_s=cfg.timeout_s)  # fmt: skip
    run_sim(launch, cost, rows.extend)
    train = [r for r in rows if r.get("kind") == "train"]
    plans = []
    for rank in range(cfg.workers):
        mine = {r["step"]: r for r in train if r["rank"] == rank}
        last, before = mine[STEPS], mine[STEPS - 1]
        memory = {k: float(last[k]) for k in LEDGER}
        step_s = last["time"] - before["time"]
        plans.append(RankPlan(rank, memory, step_s, int(last["bytes_sent"])))
    return plans
