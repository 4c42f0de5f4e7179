"""The bucketed data-parallel assignment's grader (Li et al. 2020, "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", §3.2: gradient bucketing, overlapping
communication with computation).

One question: ``async def ddp_train(ctx)``, synchronous data-parallel SGD whose gradients are
averaged in buckets of ``ctx.config.bucket_mb`` filled in reverse parameter order from
gradient hooks (``register_post_accumulate_grad_hook``), each bucket's allreduce started
(``comm.allreduce_background``) as soon as it is full and waited for after backward.

It runs on the simulator (3 workers, float64, virtual time) and is scored against the lab's
own ``allreduce`` on the same config: the parameters (within 1e-10) and replicas equal bit for
bit; the traffic, one pass of the gradient through a ring, read from the run's metrics; the
allreduces each step starts, one per bucket of the lab's rule; and the overlap, read from the
simulator's timeline: some transfer runs behind backward in every step and the communication
left exposed is below one flat allreduce after backward (``allreduce-naive``). A hidden check
(``report(..., hidden=True)``, what the autograder scores) runs one step with two bucket sizes
the notebook does not show, one bucket per parameter and a single bucket, and asks for the
lab's buckets and parameters there: a bucket rule that only matches the visible 1 MB (sized
as if gradients were float32, or with the limit written in) fails it. A program that
deadlocks fails every check by the simulator's deadlock detection.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

import torch

from ..config import ExperimentConfig
from ..experiment import Results, run
from ..models import build_model
from ..runtime.base import Comm, Pending, ring_allreduce_bytes
from ..strategies.data_parallel.sync_sgd import bucket_params
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

WORKERS = 3
TOLERANCE = 1e-10
# MNIST-1D, the MLP (2.3 MB of float64 gradients, most of it one layer), float64, 3 steps of
# 128 samples a worker on 10 GbE: backward is long enough for a bucket's transfer to hide in.
RUN = dict(
    **TINY_RUN,
    strategy="allreduce",
    batch_size=128,
    max_steps=3,
    bucket_mb=1.0,
    network="10gbe",
)
CHECKS = (("q1-twin-sim", 3), ("q1-traffic-sim", 1), ("q1-buckets-sim", 2), ("q1-overlap-sim", 2))
HIDDEN_CHECK = ("q1-buckets-hidden", 2)
# The hidden check's bucket sizes (MB): 0.03 puts each of the MLP's six float64 tensors in a
# bucket of its own (10 elements, 5,120, ... : none fits beside the next in 31 kB), 4 all of
# them in one; one step of 16 samples a worker is enough to count them.
UNSEEN_BUCKET_MB = (0.03, 4.0)
UNSEEN_RUN = dict(max_steps=1, batch_size=16)


class Counting:
    """The worker's Comm, counting the allreduces the program starts (``steps``: their sizes
    in elements, one list per training step) outside the lab's evaluations."""

    def __init__(self, comm: Comm) -> None:
        self._comm = comm
        self.calls: list[int] = []
        self.steps: list[list[int]] = []
        self.paused = False

    def _count(self, tensor: torch.Tensor) -> None:
        if not self.paused:
            self.calls.append(tensor.numel())

    def allreduce_start(self, tensor: torch.Tensor, group: Any = None) -> Pending:
        self._count(tensor)
        return self._comm.allreduce_start(tensor, group)

    def allreduce_background(self, tensor: torch.Tensor, group: Any = None) -> Pending:
        self._count(tensor)
        return self._comm.allreduce_background(tensor, group)

    async def allreduce(self, tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
        self._count(tensor)
        return await self._comm.allreduce(tensor, group)

    def end_step(self) -> None:
        self.steps.append(self.calls)
        self.calls = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)


async def counted_program(train: Train, ctx: WorkerContext) -> None:
    """What each rank runs: the submission, its allreduces counted step by step."""
    counting = Counting(ctx.comm)
    ctx.comm = counting  # type: ignore[assignment]
    evaluate, log_train = ctx.evaluate_shared, ctx.log_train

    async def evaluate_shared(*args: Any, **kwargs: Any) -> None:
        counting.paused = True  # the lab's evaluation sums its counts: not the step's
        try:
            await evaluate(*args, **kwargs)
        finally:
            counting.paused = False

    def logged(*args: Any, **kwargs: Any) -> None:
        counting.end_step()
        log_train(*args, **kwargs)

    ctx.evaluate_shared = evaluate_shared  # type: ignore[method-assign]
    ctx.log_train = logged  # type: ignore[method-assign]
    await train(ctx)
    ctx.result["allreduces"] = counting.steps


def config(name: str, **changes: Any) -> ExperimentConfig:
    return ExperimentConfig(runtime="sim", workers=WORKERS, **{**RUN, **changes}, name=name)


def expected_buckets(cfg: ExperimentConfig) -> list[int]:
    """The elements of each bucket the lab's rule makes for ``cfg``'s model, in the order
    backward fills them (:func:`~scaledl_lab.strategies.data_parallel.sync_sgd.bucket_params`)."""
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(cfg.dtype)
    params = [p for p in model.parameters() if p.requires_grad][::-1]
    buckets = bucket_params(params, int(cfg.bucket_mb * 2**20))
    return [sum(p.numel() for p in bucket) for bucket in buckets]


def _twin(mine: Results, lab: Results) -> str:
    states = [out.get("state_dict") for out in mine.outputs[mine.configs[0].label]]
    if any(s is None for s in states):
        raise CheckFailed("a rank kept no model: end ddp_train with ctx.keep_model(model)")
    gap = state_gap(states[0], lab.state_dict())
    if gap > TOLERANCE:
        raise CheckFailed(
            f"{WORKERS} workers: the parameters differ from the lab's allreduce by up to "
            f"{gap:.3g} (float64 allows {TOLERANCE:g}): is every gradient averaged (the sum "
            "divided by N) and written back into its .grad before the optimiser steps?"
        )
    drift = max(state_gap(states[0], s) for s in states[1:])
    if drift != 0.0:
        raise CheckFailed(f"the replicas drifted apart (up to {drift:.3g})")
    return f"{WORKERS} workers: within {gap:.1e} of the lab's allreduce; replicas equal"


def _traffic(mine: Results, buckets: list[int]) -> str:
    gradient = 8 * sum(buckets)
    expected = ring_allreduce_bytes(gradient, WORKERS)
    slack = len(buckets) * 2  # each allreduce rounds its bytes up
    require_step_bytes(
        mine, expected, slack,
        f"one pass of the {gradient} gradient bytes through the ring is 2(N-1)/N x {gradient} = "
        f"{expected} (each gradient once, nothing else; log sent=comm.bytes_sent minus its value "
        "before the step)",
    )  # fmt: skip
    return f"{expected} bytes per step: 2(N-1)/N x the gradient's {gradient}"


def _buckets(mine: Results, buckets: list[int]) -> str:
    limit = mine.configs[0].bucket_mb
    for rank, out in enumerate(mine.outputs[mine.configs[0].label]):
        for step, calls in enumerate(out["allreduces"], start=1):
            if calls != buckets:
                raise CheckFailed(
                    f"rank {rank}, step {step}: {len(calls)} allreduce"
                    f"{'' if len(calls) == 1 else 's'} of {calls} elements; buckets of at most "
                    f"{limit:g} MB filled from the last parameter to the first make "
                    f"{len(buckets)}, of {buckets} elements (a bucket closes when the next "
                    "gradient would take it past the limit)"
                )
    return f"{len(buckets)} allreduces a step, buckets of {buckets} elements"


def exposed(res: Results) -> tuple[float, float]:
    """Rank 0's mean, over its steps after the first, of the seconds it spent communicating
    or waiting, and of those a transfer ran behind its computation (the simulator's
    ``overlapped`` bars)."""
    train = train_rows(res)
    times = train[train["rank"] == 0]["time"].sort_values().to_numpy()
    tl = res.timeline()
    tl = tl[(tl["rank"] == 0) & (tl["start"] >= times[0]) & (tl["end"] <= times[-1])]
    spent = (tl["end"] - tl["start"]).groupby(tl["kind"]).sum() / (len(times) - 1)
    return spent.get("comm", 0.0) + spent.get("idle", 0.0), spent.get("overlapped", 0.0)


def _overlap(mine: Results, naive: Results) -> str:
    shown, hidden = exposed(mine)
    flat, _ = exposed(naive)
    if hidden <= 0.0:
        raise CheckFailed(
            f"no allreduce ran during backward ({shown * 1e3:.3f} ms of communication after it "
            "each step): start each bucket's allreduce from the gradient hook with "
            "comm.allreduce_background as soon as the bucket is full, and wait for them only "
            "after backward"
        )
    if shown >= flat:
        raise CheckFailed(
            f"{shown * 1e3:.3f} ms a step of communication left after backward, not below the "
            f"{flat * 1e3:.3f} ms of one allreduce of every gradient after backward "
            "(allreduce-naive): too many buckets, or buckets started late?"
        )
    return (
        f"{hidden * 1e3:.3f} ms a step hidden behind backward; {shown * 1e3:.3f} ms left "
        f"after it against {flat * 1e3:.3f} ms for one allreduce after backward"
    )


@functools.cache
def _lab(strategy: str) -> Results:
    return run(config(strategy, strategy=strategy), progress=False, log=None)


def report(train: Train, *, hidden: bool = False) -> Report:
    """Every visible check of ``train``, and the hidden one if ``hidden`` (computed once per
    function)."""
    visible = _report(train)
    if hidden:
        return Report(visible.checks + (_hidden_check(train),))
    return visible


def _unseen_buckets(train: Train) -> str:
    """The hidden check: for each of :data:`UNSEEN_BUCKET_MB`, one step whose allreduces are
    the lab's buckets and whose parameters are the lab's ``allreduce``'s."""
    found = []
    for mb in UNSEEN_BUCKET_MB:
        cfg = config(f"bucketed-ddp-{mb:g}mb", bucket_mb=mb, **UNSEEN_RUN)
        try:
            mine = run(
                cfg, strategy=functools.partial(counted_program, train), log=None, progress=False
            )
            lab = run(cfg.replace(strategy="allreduce", name=None), progress=False, log=None)
            _buckets(mine, expected_buckets(cfg))
            _twin(mine, lab)
        except Exception as exc:
            raise CheckFailed(f"bucket_mb={mb:g}: {describe(exc)}") from exc
        found.append(f"{len(expected_buckets(cfg))} at {mb:g} MB")
    return f"the lab's buckets ({', '.join(found)}) and its parameters"


@functools.cache
def _hidden_check(train: Train) -> Check:
    name, points = HIDDEN_CHECK
    return attempt(name, points, lambda: _unseen_buckets(train))


@functools.cache
def _report(train: Train) -> Report:
    cfg = config("bucketed-ddp")
    try:
        program = functools.partial(counted_program, train)
        mine = run(cfg, strategy=program, progress=False, log=None)
    except Exception as exc:
        why = f"on {WORKERS} simulated workers: {describe(exc)}"
        return Report(tuple(Check(name, points, False, why) for name, points in CHECKS))
    lab, naive = _lab("allreduce"), _lab("allreduce-naive")
    buckets = expected_buckets(cfg)
    bodies = {
        "q1-twin-sim": lambda: _twin(mine, lab),
        "q1-traffic-sim": lambda: _traffic(mine, buckets),
        "q1-buckets-sim": lambda: _buckets(mine, buckets),
        "q1-overlap-sim": lambda: _overlap(mine, naive),
    }
    return Report(tuple(attempt(name, points, bodies[name]) for name, points in CHECKS))


def grade(train: Train, *, hidden: bool = False) -> Report:
    """Every check, in order: what ``otter run`` totals, with ``hidden=True``."""
    return report(train, hidden=hidden)
