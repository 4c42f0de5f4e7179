"""Checkpoints from a worker's side: what a rank sends at its checkpoint steps, and how a resumed
rank takes it back (:mod:`scaledl_lab.training.checkpoint` writes and reads the files).

A rank's state is its model, its optimiser, the step it has taken and the RNG states; the first
living rank adds every hosted server's state, taken between two barriers so that no worker has
started the next step. Strategies call :func:`start_or_resume` instead of ``ctx.start()`` and
:func:`save_if_due` after each step's rows.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import ExperimentConfig
from ..params import state_dict_cpu
from .checkpoint import every_steps
from .worker import WorkerContext


@dataclass(frozen=True)
class Closing:
    """Where a rank stood before the work that closes a run and that a longer run does not do
    (DiLoCo's closing round, which only yields the run's one model; a parameter server's
    closing pull): its clock, and the bytes its last step had sent before (None: the work came
    after the checkpoint). A run resumed from that step goes on from there: its train row is
    given this time and these bytes, and the step's evaluation is done again."""

    clock: dict[str, float] | None = None
    bytes_sent: int | None = None


def saved_config(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as ``config.json`` holds it (JSON's types)."""
    return json.loads(json.dumps(cfg.to_dict(), default=str))


def is_due(ctx: WorkerContext, step: int) -> bool:
    """Whether local step ``step`` ends with a checkpoint (every N, and the run's last)."""
    every = every_steps(ctx.config.checkpoint_every, ctx.steps_per_epoch)
    return every is not None and (step % every == 0 or step == ctx.total_steps)


async def start_or_resume(ctx: WorkerContext) -> tuple[nn.Module, torch.optim.Optimizer, int]:
    """``ctx.start()`` for a new run; for a resumed one, the model and optimiser of this rank's
    checkpoint (no new evaluation). Returns them and the steps already taken."""
    if ctx.resume is None:
        model, optimizer = await ctx.start()
        return model, optimizer, 0
    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    restore(ctx, model, optimizer)
    return model, optimizer, int(ctx.resume["step"])


def restore(ctx: WorkerContext, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    state = ctx.resume
    assert state is not None
    model.load_state_dict(state["model"])
    if optimizer is not None:
        optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])


async def save_if_due(
    ctx: WorkerContext,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    *,
    extra: dict[str, Any] | None = None,
    closing: Closing | None = None,
) -> None:
    """At a checkpoint step, send this rank's state to the driver (with its rows); workers of
    a parameter server have no optimiser of their own (the servers' state holds it).

    The state records the run's config (``resume`` checks it against ``config.json``) and the
    rank's clock; ``closing``: the step ended the run with work a longer run does not do, and
    the state is the one from before it (:class:`Closing`)."""
    if not is_due(ctx, step):
        return
    comm = ctx.comm
    state: dict[str, Any] = {
        "step": step,
        "config": saved_config(ctx.config),
        "model": state_dict_cpu(model),
        "optimizer": copy.deepcopy(optimizer.state_dict()) if optimizer else None,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate()},
        "extra": extra or {},
    }
    if closing is not None:
        time = closing.clock["time"] if closing.clock is not None else None
        state["closing"] = {"time": time, "bytes_sent": closing.bytes_sent}
    if comm.num_servers:
        await comm.barrier()  # every worker's step is on the servers; none has begun the next
        if ctx.rank == comm.survivors()[0]:
            state["servers"] = [await comm.call(i, "checkpoint") for i in range(comm.num_servers)]
        await comm.barrier()
    # A resumed rank goes on from the clock after this save (a longer run waits at the same
    # barriers), or from before the closing work.
    before = closing.clock if closing is not None else None
    state["clock"] = before if before is not None else comm.clock_state()
    ctx.emit({"table": "checkpoint", "run": ctx.run_label, "rank": ctx.rank, "step": step,
              "state": state})  # fmt: skip
