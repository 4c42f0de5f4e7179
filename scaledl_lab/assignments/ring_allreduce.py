"""The ring allreduce assignment's grader (Patarasuk & Yuan 2009, the ring that notebook 01 draws).

Question 1: ``async def ring_allreduce(comm, flat)`` sums a flat tensor over every worker, in
place, from point-to-point messages only: a reduce-scatter of N − 1 rounds, then an
all-gather of N − 1 more, each rank sending one chunk to its successor per round. Question 2:
``async def ring_sgd(ctx)``, synchronous data-parallel SGD whose gradients that ring averages.

Both run for real, on the simulator and on two Dask workers (``scaledl_lab.run(cfg,
strategy=...)``), in float64, and are scored against their sequential twins: the exact sum;
the parameters of single-process SGD on the combined batch and of the lab's own
``allreduce-naive`` (within 1e-10); replicas equal bit for bit; and the traffic of the ring,
2(N − 1)/N × the tensor's bytes sent per worker, read from the run's metrics. A ring that
deadlocks fails by the simulator's deadlock detection and by the Dask run's timeout. Question 1's
visible checks run on 2 and 3 simulated workers (the N = 3 the notebook has students draw); a
hidden check (``collective_report(..., hidden=True)``, what the autograder scores) asks the
same of 4 and 5: chunk indices read off the drawing of N = 3 (−1 written as +2) pass every
visible check and fail it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from typing import Any

import torch

from ..config import ExperimentConfig
from ..experiment import Results, run
from ..models import build_model, count_parameters
from ..training.reference import train_sequential
from ..training.worker import WorkerContext, load_for
from .comm_views import PointToPoint
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

Ring = Callable[[Any, torch.Tensor], Coroutine[Any, Any, Any]]
Train = Callable[[WorkerContext], Coroutine[Any, Any, None]]

SIM_WORKERS = (2, 3)
HIDDEN_WORKERS = (4, 5)  # the hidden check's
HIDDEN_CHECK = ("q1-ring-hidden", 2)
SIZES = (60, 10, 7)  # 60 divides by every N above; 10 and 7 leave uneven chunks
TIMEOUT_S = 30.0  # a Dask rank that waits this long for a message ends the run (a deadlock)
TOLERANCE = 1e-10
# A tiny, fast, fully deterministic run: MNIST-1D, the MLP, float64, 12 steps.
RUN = dict(
    **TINY_RUN,
    strategy="allreduce-naive",
    batch_size=16,
    max_steps=12,
    timeout_s=TIMEOUT_S,
)


def operand(numel: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s float64 tensor for the collective checks (the same on every runtime)."""
    generator = torch.Generator().manual_seed(1000 * numel + rank)
    return torch.randn(numel, dtype=torch.float64, generator=generator)


def ring_bytes(nbytes: int, world_size: int) -> float:
    """What one worker sends in a ring allreduce of ``nbytes``: 2(N − 1)/N × nbytes."""
    return 2 * (world_size - 1) * nbytes / world_size


def padding_slack(world_size: int, itemsize: int) -> int:
    """How far from :func:`ring_bytes` a correct ring may be: one element per round (uneven
    chunks, or chunks padded to equal sizes)."""
    return 2 * (world_size - 1) * itemsize


async def collective_program(ring: Ring, ctx: WorkerContext) -> None:
    """What each rank runs for question 1: the ring on every size of :data:`SIZES`."""
    comm = PointToPoint(ctx.comm)
    cases = []
    for numel in SIZES:
        flat = operand(numel, ctx.rank)
        sent, messages = comm.bytes_sent, comm.messages
        returned = await ring(comm, flat)
        if returned is not None and not isinstance(returned, torch.Tensor):
            raise CheckFailed(f"ring_allreduce returned a {type(returned).__name__}")
        cases.append(
            {
                "numel": numel,
                "result": flat.clone(),
                "returned": None if returned is None else returned.detach().clone(),
                "sent": comm.bytes_sent - sent,
                "messages": comm.messages - messages,
            }
        )
    ctx.result["cases"] = cases


def _collective_run(ring: Ring, runtime: str, workers: int, client: Any) -> Results:
    cfg = ExperimentConfig(runtime=runtime, workers=workers, **RUN, name=f"ring-{workers}w")
    program = functools.partial(collective_program, ring)
    return run(cfg, strategy=program, client=client, progress=False, log=None)


def _sums(outputs: dict[int, list[dict[str, Any]]]) -> str:
    for workers, ranks in outputs.items():
        for rank, result in enumerate(ranks):
            for case in result["cases"]:
                n = case["numel"]
                exact = sum(operand(n, r) for r in range(workers))
                for what in ("result", "returned"):
                    got = case[what]
                    if got is None:
                        continue
                    if got.shape != exact.shape:
                        raise CheckFailed(
                            f"{workers} workers, {n} elements: rank {rank}'s {what} has shape "
                            f"{tuple(got.shape)}, not ({n},)"
                        )
                    gap = (got - exact).abs().max().item()
                    if gap > 1e-12:
                        which = "tensor after the call" if what == "result" else "return value"
                        raise CheckFailed(
                            f"{workers} workers, {n} elements: rank {rank}'s {which} is off "
                            f"the sum by up to {gap:.3g} (must be the sum over every worker, "
                            "in place)"
                        )
    return f"the exact sum on every rank for N = {', '.join(map(str, outputs))}"


def _traffic(outputs: dict[int, list[dict[str, Any]]]) -> str:
    for workers, ranks in outputs.items():
        for rank, result in enumerate(ranks):
            for case in result["cases"]:
                expected = ring_bytes(8 * case["numel"], workers)
                if abs(case["sent"] - expected) > padding_slack(workers, 8):
                    raise CheckFailed(
                        f"{workers} workers, {case['numel']} float64 elements: rank {rank} sent "
                        f"{case['sent']} bytes; a ring sends 2(N-1)/N x {8 * case['numel']} = "
                        f"{expected:.0f}"
                    )
    return "2(N-1)/N x the tensor's bytes sent by every rank"


def _rounds(outputs: dict[int, list[dict[str, Any]]]) -> str:
    for workers, ranks in outputs.items():
        for rank, result in enumerate(ranks):
            for case in result["cases"]:
                sent = case["messages"]
                if sent != 2 * (workers - 1):
                    raise CheckFailed(
                        f"{workers} workers: rank {rank} sent {sent} message"
                        f"{'' if sent == 1 else 's'} for "
                        f"one allreduce; a ring sends one chunk per round, 2(N-1) = "
                        f"{2 * (workers - 1)}"
                    )
    return "2(N-1) messages per rank"


def collective_report(
    ring: Ring, dask: bool = True, client: Any = None, *, hidden: bool = False
) -> Report:
    """Question 1's checks for ``ring`` (computed once per function; ``dask=False`` leaves the
    real-worker check out, ``client``: a Dask cluster to run it on, else a fresh local one;
    ``hidden=True`` adds the hidden check)."""
    report = _collective_report(ring, dask, client)
    if hidden:
        report = Report(report.checks + (_hidden_check(ring),))
    return report


def _unseen_sizes(ring: Ring) -> str:
    """The hidden check: the sum, traffic and rounds on :data:`HIDDEN_WORKERS` simulated ranks."""
    outputs: dict[int, list[dict[str, Any]]] = {}
    for workers in HIDDEN_WORKERS:
        try:
            outputs[workers] = _collective_run(ring, "sim", workers, None).outputs[
                f"ring-{workers}w"
            ]
        except Exception as exc:
            raise CheckFailed(f"on {workers} simulated workers: {describe(exc)}") from exc
    _sums(outputs)
    _traffic(outputs)
    _rounds(outputs)
    return f"the exact sum, the ring's traffic and 2(N-1) messages for N = {HIDDEN_WORKERS}"


@functools.cache
def _hidden_check(ring: Ring) -> Check:
    name, points = HIDDEN_CHECK
    return attempt(name, points, lambda: _unseen_sizes(ring))


@functools.cache
def _collective_report(ring: Ring, dask: bool, client: Any) -> Report:
    sim: dict[int, list[dict[str, Any]]] = {}
    try:
        for workers in SIM_WORKERS:
            sim[workers] = _collective_run(ring, "sim", workers, None).outputs[f"ring-{workers}w"]
    except Exception as exc:
        why = f"on {workers} simulated workers: {describe(exc)}"
        checks = [Check(n, p, False, why) for n, p in (("q1-sum-sim", 3), ("q1-traffic-sim", 1))]
        checks.append(Check("q1-rounds-sim", 1, False, why))
    else:
        checks = [
            attempt("q1-sum-sim", 3, lambda: _sums(sim)),
            attempt("q1-traffic-sim", 1, lambda: _traffic(sim)),
            attempt("q1-rounds-sim", 1, lambda: _rounds(sim)),
        ]
    if dask:

        def real() -> str:
            outputs = _collective_run(ring, "dask", 2, client).outputs["ring-2w"]
            _sums({2: outputs})
            _traffic({2: outputs})
            return "the exact sum and the ring's traffic on 2 Dask workers"

        checks.append(attempt("q1-dask", 2, real))
    return Report(tuple(checks))


def _strategy_run(train: Train, runtime: str, workers: int, client: Any) -> Results:
    cfg = ExperimentConfig(runtime=runtime, workers=workers, **RUN, name=f"ring-sgd-{workers}w")
    return run(cfg, strategy=train, client=client, progress=False, log=None)


def _twin(res: Results, workers: int) -> str:
    cfg = res.configs[0]
    states = [out.get("state_dict") for out in res.outputs[cfg.label]]
    if any(s is None for s in states):
        raise CheckFailed("a rank kept no model: end ring_sgd with ctx.keep_model(model)")
    gap = state_gap(states[0], train_sequential(cfg, load_for(cfg)))
    if gap > TOLERANCE:
        raise CheckFailed(
            f"{workers} workers: the parameters differ from single-process SGD on the combined "
            f"batch by up to {gap:.3g} (float64 allows {TOLERANCE:g}): is the gradient the "
            "average over the workers (the sum divided by N)?"
        )
    return f"{workers} workers: within {gap:.1e} of single-process SGD on the combined batch"


def _replicas(res: Results) -> str:
    states = [out["state_dict"] for out in res.outputs[res.configs[0].label]]
    gaps = [state_gap(states[0], s) for s in states[1:]]
    if any(g != 0.0 for g in gaps):
        raise CheckFailed(
            f"the replicas drifted apart (up to {max(gaps):.3g}): every rank must end the "
            "allreduce with the same bits (the all-gather copies each finished chunk)"
        )
    return f"all {len(states)} replicas equal bit for bit"


def _naive(res: Results, workers: int) -> str:
    cfg = res.configs[0]
    plain = run(cfg.replace(runtime="sim", name=None), progress=False, log=None).state_dict()
    gap = state_gap(res.state_dict(), plain)
    if gap > TOLERANCE:
        raise CheckFailed(
            f"{workers} workers: the parameters differ from the lab's allreduce-naive run by up "
            f"to {gap:.3g} (float64 allows {TOLERANCE:g})"
        )
    return f"{workers} workers: within {gap:.1e} of the lab's allreduce-naive"


def _step_traffic(res: Results, workers: int) -> str:
    train_rows(res)  # before the model is built: a program that logged nothing is told so
    cfg = res.configs[0]
    data = load_for(cfg)
    gradient = 8 * count_parameters(build_model(cfg.model, data.input_shape, data.num_classes))
    expected = ring_bytes(gradient, workers)
    require_step_bytes(
        res, expected, padding_slack(workers, 8),
        f"the ring sends 2(N-1)/N x {gradient} gradient bytes = {expected:.0f} per step (log "
        "sent=comm.bytes_sent minus its value before the step)",
        where=f"{workers} workers: ",
    )  # fmt: skip
    return f"{workers} workers: {expected:.0f} bytes per step, 2(N-1)/N x the gradient's {gradient}"


def strategy_report(train: Train, dask: bool = True, client: Any = None) -> Report:
    """Question 2's checks for ``train`` (computed once per function; see collective_report)."""
    return _strategy_report(train, dask, client)


@functools.cache
def _strategy_report(train: Train, dask: bool, client: Any) -> Report:
    workers = 3
    try:
        sim = _strategy_run(train, "sim", workers, None)
    except Exception as exc:
        why = f"on {workers} simulated workers: {describe(exc)}"
        names = (("q2-twin-sim", 2), ("q2-allreduce-sim", 1), ("q2-replicas-sim", 1))
        checks = [Check(n, p, False, why) for n, p in names + (("q2-traffic-sim", 1),)]
    else:
        checks = [
            attempt("q2-twin-sim", 2, lambda: _twin(sim, workers)),
            attempt("q2-allreduce-sim", 1, lambda: _naive(sim, workers)),
            attempt("q2-replicas-sim", 1, lambda: _replicas(sim)),
            attempt("q2-traffic-sim", 1, lambda: _step_traffic(sim, workers)),
        ]
    if dask:
        real: list[Results] = []

        def twin() -> str:
            real.append(_strategy_run(train, "dask", 2, client))
            return _twin(real[0], 2) + "; " + _replicas(real[0])

        checks.append(attempt("q2-twin-dask", 2, twin))
        if real:
            checks.append(attempt("q2-traffic-dask", 1, lambda: _step_traffic(real[0], 2)))
        else:
            checks.append(Check("q2-traffic-dask", 1, False, "the Dask run did not finish"))
    return Report(tuple(checks))


def grade(
    ring: Ring, train: Train, *, dask: bool = True, client: Any = None, hidden: bool = False
) -> Report:
    """Both questions' checks, in order: what ``otter run`` totals, with ``hidden=True``."""
    first = collective_report(ring, dask, client, hidden=hidden)
    return Report(first.checks + strategy_report(train, dask, client).checks)
