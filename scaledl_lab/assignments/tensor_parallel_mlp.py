"""The tensor-parallel MLP assignment's grader (Megatron-LM, Shoeybi et al. 2019, §3).

Question 1: ``column_parallel(linear, rank, tp)`` and ``row_parallel(linear, rank, tp)``, rank
``rank``'s shards of the block's two Linears (the first split by its output features, the second
by its input features, its bias whole). Question 2: Megatron's conjugate operators on a ``Comm``,
``f``/``f_backward`` and ``g``/``g_backward``. Question 3: ``ParallelMLP``, the block
``Linear(h, 4h) → ReLU → Linear(4h, h)`` on one rank, its ``forward`` and ``backward`` written
with them (a ``Comm`` call is awaited, so the operators are called in the program rather than
hidden in autograd functions, as the lab's own :mod:`~scaledl_lab.strategies.model_parallel.
tensor_parallel` does).

Everything runs on the simulator for tp = 2 and 4 (h = 8, a batch of 5), in float64, and is
scored against the unsplit block (within 1e-10): its output, the gradient of its input and of
every weight (rank r's slice, the hidden units r·4h/tp : (r+1)·4h/tp); and its traffic: one
allreduce forward and one backward, each of the activation's bytes. The grader hands the
operators a view of the ``Comm`` that has ``allreduce`` only, and counts its calls. A hidden
check (``block_report(..., hidden=True)``, what the autograder scores) asks question 3's four
properties of a block the notebook does not show: h = 6, a batch of 3, tp = 3 and 8, so a
submission that hard-codes the visible sizes fails it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import ExperimentConfig
from ..experiment import run
from ..training.worker import WorkerContext
from .comm_views import Collectives
from .grading import Check, CheckFailed, Report, attempt, describe, expect, failed_all

Shard = Callable[[nn.Linear, int, int], nn.Linear]
Operator = Callable[[Any, torch.Tensor], Coroutine[Any, Any, torch.Tensor]]

DEGREES = (2, 4)
HIDDEN, BATCH = 8, 5  # the block h → 4h → h on a batch of 5
TOLERANCE = 1e-10


@dataclass(frozen=True)
class Case:
    """One block size the grader runs: its h, its batch, and the tp degrees."""

    hidden: int
    batch: int
    degrees: tuple[int, ...]


SHOWN = Case(HIDDEN, BATCH, DEGREES)  # the visible checks'
UNSEEN = Case(6, 3, (3, 8))  # the hidden check's: 4h = 24, a degree that is not a power of two

# The config a simulated run needs (its data is loaded, never read: the block makes its own).
RUN = dict(
    strategy="tensor-parallel",
    runtime="sim",
    dataset="mnist1d",
    model="mlp",
    precision="float64",
    train_subset=64,
    test_subset=16,
    val_size=16,
    batch_size=8,
    epochs=1,
    max_steps=1,
)
OPERATOR_CHECKS = (("q2-f", 1), ("q2-g", 1))
BLOCK_CHECKS = (
    ("q3-forward", 2),
    ("q3-input-grad", 2),
    ("q3-weight-grads", 2),
    ("q3-communication", 2),
)
HIDDEN_CHECK = ("q3-block-hidden", 2)


def unsplit_block(case: Case = SHOWN) -> tuple[nn.Linear, nn.Linear, torch.Tensor, torch.Tensor]:
    """``Linear(h, 4h) → ReLU → Linear(4h, h)`` in float64, an input and an output gradient
    (the same on every rank: tensor parallelism gives every rank the whole batch)."""
    gen = torch.Generator().manual_seed(0)
    h, batch = case.hidden, case.batch
    first = nn.Linear(h, 4 * h, dtype=torch.float64)
    second = nn.Linear(4 * h, h, dtype=torch.float64)
    with torch.no_grad():
        for p in [*first.parameters(), *second.parameters()]:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    x = torch.randn(batch, h, generator=gen, dtype=torch.float64)
    return first, second, x, torch.randn(batch, h, generator=gen, dtype=torch.float64)


def units(rank: int, tp: int, hidden: int = HIDDEN) -> slice:
    """Rank ``rank``'s hidden units: Megatron's A = [A_1 … A_tp], in order."""
    width = 4 * hidden // tp
    return slice(rank * width, (rank + 1) * width)


def _shards(column_parallel: Shard, row_parallel: Shard) -> str:
    first, second, _, _ = unsplit_block()
    for tp in DEGREES:
        for rank in range(tp):
            mine = units(rank, tp)
            up = column_parallel(first, rank, tp)
            where = f"column_parallel(Linear({HIDDEN}, {4 * HIDDEN}), rank={rank}, tp={tp})"
            expect(f"{where}.weight", up.weight, first.weight[mine].detach())
            expect(f"{where}.bias", up.bias, first.bias[mine].detach())
            down = row_parallel(second, rank, tp)
            where = f"row_parallel(Linear({4 * HIDDEN}, {HIDDEN}), rank={rank}, tp={tp})"
            expect(f"{where}.weight", down.weight, second.weight[:, mine].detach())
            expect(f"{where}.bias", down.bias, second.bias.detach())
    return f"rank r's slices r·4h/tp:(r+1)·4h/tp of both Linears for tp = {DEGREES}"


def shard_report(column_parallel: Shard, row_parallel: Shard) -> Report:
    """Question 1's check (plain functions: no run needed)."""
    return Report((attempt("q1-shards", 2, lambda: _shards(column_parallel, row_parallel)),))


def _operand(rank: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(BATCH, HIDDEN, generator=gen, dtype=torch.float64)


async def _operator_program(ops: tuple[Operator, ...], ctx: WorkerContext) -> None:
    """Every rank: each operator once on its own tensor, under its own phase name."""
    comm = Collectives(ctx.comm)
    outputs = {}
    for name, op in zip(("f", "f_backward", "g", "g_backward"), ops, strict=True):
        comm.phase = name
        got = await op(comm, _operand(ctx.rank))
        outputs[name] = got.detach().clone() if isinstance(got, torch.Tensor) else got
    ctx.result.update(outputs=outputs, calls=comm.calls)


def _sim(program: Callable[[WorkerContext], Coroutine[Any, Any, None]], tp: int) -> list[dict]:
    # The config only sets up tp simulated ranks: the lab's tensor-parallel check of its own MLP
    # (tp divides its width, 512) does not concern this block, whose degrees may not divide it.
    strategy = RUN["strategy"] if 512 % tp == 0 else "allreduce-naive"
    cfg = ExperimentConfig(workers=tp, **{**RUN, "strategy": strategy}, name=f"tp-{tp}")
    return run(cfg, strategy=program, progress=False, log=None).outputs[f"tp-{tp}"]


def _operator(runs: dict[int, list[dict]], forward: str, backward: str, sums: str) -> str:
    """Check f (``sums`` = its backward) or g (``sums`` = its forward) on every run."""
    for tp, ranks in runs.items():
        total = sum(_operand(r) for r in range(tp))
        for rank, result in enumerate(ranks):
            for name in (forward, backward):
                want = total if name == sums else _operand(rank)
                what = "the sum over the ranks" if name == sums else "its input, unchanged"
                expect(
                    f"{name}(comm, x)",
                    result["outputs"][name],
                    want,
                    where=f"tp={tp}, rank {rank}: ",
                    then=f"; it must return {what}",
                )
                calls = sum(1 for phase, *_ in result["calls"] if phase == name)
                need = 1 if name == sums else 0
                if calls != need:
                    raise CheckFailed(
                        f"tp={tp}, rank {rank}: {name} called comm.allreduce {calls} time"
                        f"{'' if calls == 1 else 's'}; it needs {need}"
                    )
    identity = backward if sums == forward else forward
    return f"{sums} one allreduce (the sum), {identity} the identity, for tp = {DEGREES}"


def operator_report(f: Operator, f_backward: Operator, g: Operator, g_backward: Operator) -> Report:
    """Question 2's checks (computed once per set of functions)."""
    return _operator_report(f, f_backward, g, g_backward)


@functools.cache
def _operator_report(*ops: Operator) -> Report:
    program = functools.partial(_operator_program, ops)
    try:
        runs = {tp: _sim(program, tp) for tp in DEGREES}
    except Exception as exc:
        return Report(tuple(failed_all(OPERATOR_CHECKS, f"on the simulator: {describe(exc)}")))
    return Report(
        (
            attempt("q2-f", 1, lambda: _operator(runs, "f", "f_backward", "f_backward")),
            attempt("q2-g", 1, lambda: _operator(runs, "g", "g_backward", "g")),
        )
    )


async def _block_program(block_class: type, case: Case, ctx: WorkerContext) -> None:
    """Every rank: its shards of the block, forward then backward on the whole batch."""
    comm = Collectives(ctx.comm)
    first, second, x, grad_out = unsplit_block(case)
    block = block_class(first, second, ctx.rank, ctx.world_size)
    comm.phase = "forward"
    out = await block.forward(comm, x.clone())
    comm.phase = "backward"
    grad_in = await block.backward(comm, grad_out.clone())
    ctx.result.update(
        out=out.detach().clone() if isinstance(out, torch.Tensor) else out,
        grad_in=grad_in.detach().clone() if isinstance(grad_in, torch.Tensor) else grad_in,
        grads={
            f"{layer}.{name}": getattr(getattr(block, layer), name).grad
            for layer in ("first", "second")
            for name in ("weight", "bias")
        },
        calls=comm.calls,
    )


def _twin(case: Case) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """The unsplit block's output, input gradient and weight gradients."""
    first, second, x, grad_out = unsplit_block(case)
    x.requires_grad_()
    out = second(torch.relu(first(x)))
    out.backward(grad_out)
    grads = {f"first.{n}": p.grad for n, p in first.named_parameters()}
    grads |= {f"second.{n}": p.grad for n, p in second.named_parameters()}
    return out.detach(), x.grad, grads


def _compare(runs: dict[int, list[dict]], key: str, hint: str, case: Case = SHOWN) -> str:
    out, grad_in, _ = _twin(case)
    want = out if key == "out" else grad_in
    what = "the block's output" if key == "out" else "the gradient of x that backward returns"
    for tp, ranks in runs.items():
        for rank, result in enumerate(ranks):
            where = f"tp={tp}, rank {rank}: "
            expect(what, result[key], want, where=where, then=f" against the unsplit block{hint}")
    return f"every rank within {TOLERANCE:g} of the unsplit block for tp = {case.degrees}"


def _weight_grads(runs: dict[int, list[dict]], case: Case = SHOWN) -> str:
    _, _, full = _twin(case)
    for tp, ranks in runs.items():
        for rank, result in enumerate(ranks):
            mine = units(rank, tp, case.hidden)
            slices = {
                "first.weight": full["first.weight"][mine],
                "first.bias": full["first.bias"][mine],
                "second.weight": full["second.weight"][:, mine],
                "second.bias": full["second.bias"],
            }
            for name, want in slices.items():
                got = result["grads"][name]
                if got is None:
                    raise CheckFailed(
                        f"tp={tp}, rank {rank}: {name} has no gradient after backward"
                    )
                expect(
                    f"the gradient of {name}",
                    got,
                    want,
                    where=f"tp={tp}, rank {rank}: ",
                    then=" against its slice of the unsplit block's",
                )
    return f"every shard's gradient = its slice of the unsplit block's for tp = {case.degrees}"


def _communication(runs: dict[int, list[dict]], case: Case = SHOWN) -> str:
    activation = case.batch * case.hidden * 8
    for tp, ranks in runs.items():
        for rank, result in enumerate(ranks):
            for phase in ("forward", "backward"):
                sent = [nbytes for p, _, nbytes in result["calls"] if p == phase]
                if sent != [activation]:
                    raise CheckFailed(
                        f"tp={tp}, rank {rank}: the {phase} called comm.allreduce "
                        f"{len(sent)} time{'' if len(sent) == 1 else 's'} (bytes: {sent}); "
                        f"Megatron's block calls it once, on the activation's {case.batch} x "
                        f"{case.hidden} float64 = {activation} bytes"
                    )
    return f"one allreduce of {activation} bytes forward, one backward, per rank"


def block_report(block_class: type, *, hidden: bool = False) -> Report:
    """Question 3's checks (computed once per class), the hidden one too if ``hidden``."""
    report = _block_report(block_class)
    if hidden:
        report = Report(report.checks + (_hidden_block_check(block_class),))
    return report


def _block_runs(block_class: type, case: Case) -> dict[int, list[dict]]:
    program = functools.partial(_block_program, block_class, case)
    return {tp: _sim(program, tp) for tp in case.degrees}


@functools.cache
def _block_report(block_class: type) -> Report:
    try:
        runs = _block_runs(block_class, SHOWN)
    except Exception as exc:
        return Report(tuple(failed_all(BLOCK_CHECKS, f"on the simulator: {describe(exc)}")))
    hint = ": are the ranks' parts combined, and the second bias added once?"
    return Report(
        (
            attempt("q3-forward", 2, lambda: _compare(runs, "out", hint)),
            attempt("q3-input-grad", 2, lambda: _compare(runs, "grad_in", "")),
            attempt("q3-weight-grads", 2, lambda: _weight_grads(runs)),
            attempt("q3-communication", 2, lambda: _communication(runs)),
        )
    )


def _unseen_block(block_class: type) -> str:
    """Question 3's four checks on :data:`UNSEEN`, the first failure prefixed with its size."""
    case = UNSEEN
    try:
        runs = _block_runs(block_class, case)
        _compare(runs, "out", "", case)
        _compare(runs, "grad_in", "", case)
        _weight_grads(runs, case)
        _communication(runs, case)
    except Exception as exc:
        raise CheckFailed(f"h={case.hidden}, a batch of {case.batch}, {describe(exc)}") from exc
    return (
        f"h={case.hidden}, a batch of {case.batch}, tp = {case.degrees}: the output and every "
        "gradient of the unsplit block, one allreduce each way"
    )


@functools.cache
def _hidden_block_check(block_class: type) -> Check:
    name, points = HIDDEN_CHECK
    return attempt(name, points, lambda: _unseen_block(block_class))


def grade(
    column_parallel: Shard,
    row_parallel: Shard,
    operators: tuple[Operator, Operator, Operator, Operator],
    block_class: type,
    *,
    hidden: bool = False,
) -> Report:
    """Every question's checks, in order (``operators``: f, f_backward, g, g_backward): what
    ``otter run`` totals, with ``hidden=True``."""
    checks = shard_report(column_parallel, row_parallel).checks
    checks += operator_report(*operators).checks
    return Report(checks + block_report(block_class, hidden=hidden).checks)
