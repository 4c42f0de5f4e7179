"""The ZeRO-1 assignment's grader (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward
Training Trillion Parameter Models", §5.1: P_os, optimiser state partitioning).

One question: ``async def zero1_train(ctx)``, synchronous data-parallel SGD in which each rank
keeps the optimiser state of its shard only: the flattened gradients are reduce-scattered
(``comm.reduce_scatter``, padded with zeros to N equal shards), the rank steps its shard, and
the updated shards are all-gathered back into every replica (``comm.all_gather_into``).

It runs on the simulator in float64 and is scored against the lab's own ``zero1`` on the same
config: the parameters on 2 workers, within 1e-10, replicas equal bit for bit; the optimiser state
each rank logs (the memory ledger's ``mem_optim``), 1/N of the unsharded one that the lab's
``allreduce`` logs; and the traffic, a reduce-scatter and an all-gather, 2(N − 1)/N × the
parameters' bytes (both on 3 workers). A hidden check (``report(..., hidden=True)``, what the
autograder scores) asks for the parameters on 3 workers too, whose shards need padding (the MLP's
288,778 parameters do not divide by 3): shards cut as if N divided the parameters pass every
visible check and fail it. A program that deadlocks fails every check by the simulator's
detection.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

from ..config import ExperimentConfig
from ..experiment import Results, run
from ..models import build_model, count_parameters
from ..runtime.base import ring_allreduce_bytes
from ..training.worker import WorkerContext, load_for
from .grading import (
    TINY_RUN,
    Check,
    CheckFailed,
    Report,
    attempt,
    describe,
    require_step_bytes,
    state_gap,
    train_rows,
)

Train = Callable[[WorkerContext], Coroutine[Any, Any, None]]

TOLERANCE = 1e-10
EVEN, PADDED = 2, 3  # worker counts: the MLP's parameters divide by 2, not by 3
# MNIST-1D, the MLP, float64, 4 steps of 16 samples a worker, SGD with momentum (its state:
# one tensor the size of what it steps).
RUN = dict(
    **TINY_RUN,
    strategy="zero1",
    batch_size=16,
    max_steps=4,
)
CHECKS = (
    ("q1-twin-sim", 3),
    ("q1-memory-sim", 2),
    ("q1-traffic-sim", 1),
)
HIDDEN_CHECKS = (("q1-padding-hidden", 2),)


def config(workers: int, name: str, **changes: Any) -> ExperimentConfig:
    return ExperimentConfig(runtime="sim", workers=workers, **{**RUN, **changes}, name=name)


def _twin(mine: Results, lab: Results, workers: int) -> str:
    states = [out.get("state_dict") for out in mine.outputs[mine.configs[0].label]]
    if any(s is None for s in states):
        raise CheckFailed("a rank kept no model: end zero1_train with ctx.keep_model(model)")
    gap = state_gap(states[0], lab.state_dict())
    if gap > TOLERANCE:
        padded = "" if workers == EVEN else " (a shard of the padded flat tensor on each rank?)"
        raise CheckFailed(
            f"{workers} workers: the parameters differ from the lab's zero1 by up to {gap:.3g} "
            f"(float64 allows {TOLERANCE:g}): is each shard's gradient the average (the "
            "reduce-scatter's sum / N), the shard stepped, and every shard all-gathered back "
            f"into the parameters{padded}?"
        )
    drift = max(state_gap(states[0], s) for s in states[1:])
    if drift != 0.0:
        raise CheckFailed(
            f"{workers} workers: the replicas drifted apart (up to {drift:.3g}): every rank "
            "must end the step with every shard's update"
        )
    return f"{workers} workers: within {gap:.1e} of the lab's zero1; replicas equal"


def _memory(mine: Results, lab: Results, full: Results, workers: int) -> str:
    train = train_rows(mine)
    if "mem_optim" not in train or train["mem_optim"].isna().any():
        raise CheckFailed(
            "no optimiser state logged: pass memory=StepMemory(optim=optimizer_state_bytes("
            "optimizer)).columns() to ctx.log_train"
        )
    unsharded = float(train_rows(full)["mem_optim"].max())
    sharded = float(train_rows(lab)["mem_optim"].max())
    held = float(train["mem_optim"].max())
    slack = 8 * (workers - 1) * len(full.state_dict())  # padding, up to a shard per tensor
    if abs(held - unsharded / workers) > slack:
        raise CheckFailed(
            f"{workers} workers: a rank holds {held:.0f} bytes of optimiser state; sharded "
            f"over {workers} ranks it is 1/{workers} of the unsharded {unsharded:.0f} = "
            f"{unsharded / workers:.0f} (the lab's zero1 holds {sharded:.0f}): give the "
            "optimiser this rank's shard only"
        )
    return (
        f"{workers} workers: {held:.0f} bytes of optimiser state a rank, 1/{workers} of the "
        f"unsharded {unsharded:.0f} (the lab's zero1: {sharded:.0f})"
    )


def _traffic(mine: Results, workers: int) -> str:
    cfg = mine.configs[0]
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    tensors = sum(1 for _ in model.parameters())
    psi = 8 * count_parameters(model)
    expected = ring_allreduce_bytes(psi, workers)  # a reduce-scatter and an all-gather
    slack = 2 * 8 * (workers - 1) * tensors + 2  # padding, up to a shard per tensor
    require_step_bytes(
        mine, expected, slack,
        f"a reduce-scatter and an all-gather of the {psi} parameter bytes send (N-1)/N x {psi} "
        f"each, {expected} in all (log sent=comm.bytes_sent minus its value before the step)",
        where=f"{workers} workers: ",
    )  # fmt: skip
    return f"{workers} workers: {expected} bytes per step, 2 x (N-1)/N x the {psi} parameter bytes"


def _run(train: Train, workers: int) -> Results:
    return run(config(workers, f"zero1-{workers}w"), strategy=train, progress=False, log=None)


@functools.cache
def _lab(workers: int, strategy: str = "zero1") -> Results:
    cfg = config(workers, f"{strategy}-{workers}w", strategy=strategy)
    return run(cfg, progress=False, log=None)


def report(train: Train, *, hidden: bool = False) -> Report:
    """Every visible check of ``train``, and the hidden one if ``hidden`` (computed once per
    function)."""
    whole = _report(train)
    if hidden:
        return whole
    return Report(tuple(c for c in whole.checks if c.name not in dict(HIDDEN_CHECKS)))


@functools.cache
def _report(train: Train) -> Report:
    runs: dict[int, Results] = {}
    for workers in (EVEN, PADDED):
        try:
            runs[workers] = _run(train, workers)
        except Exception as exc:
            runs[workers] = exc  # type: ignore[assignment]
    checks: list[Check] = []
    for name, points in CHECKS + HIDDEN_CHECKS:
        workers = EVEN if name == "q1-twin-sim" else PADDED
        mine = runs[workers]
        if isinstance(mine, BaseException):
            why = f"on {workers} simulated workers: {describe(mine)}"
            checks.append(Check(name, points, False, why))
            continue
        body: Callable[[], str]
        if name in ("q1-twin-sim", "q1-padding-hidden"):
            body = functools.partial(_twin, mine, _lab(workers), workers)
        elif name == "q1-memory-sim":
            full = _lab(workers, "allreduce")
            body = functools.partial(_memory, mine, _lab(workers), full, workers)
        else:
            body = functools.partial(_traffic, mine, workers)
        checks.append(attempt(name, points, body))
    return Report(tuple(checks))


def grade(train: Train, *, hidden: bool = False) -> Report:
    """Every check, in order: what ``otter run`` totals, with ``hidden=True``."""
    return report(train, hidden=hidden)
