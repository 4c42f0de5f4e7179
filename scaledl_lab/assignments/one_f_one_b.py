"""The 1F1B schedule assignment's grader (PipeDream-flush, Narayanan et al. 2021; the order the
lab's pipelines run, :mod:`~scaledl_lab.strategies.model_parallel.schedules`).

Question 1: ``one_f_one_b(stages, micro_batches)``, a pure function that gives each stage s its
ordered list of operations, ``("F", m)`` or ``("B", m)``, the forward or backward of micro-batch
m. It is scored by the lab's own schedule machinery, on several (P, M) with M >= P: every
forward and backward on every stage exactly once; accepted by the lab's
dependency checker (a stage runs its list in order, a forward needing the previous stage's, a
backward its own forward and the next stage's backward: a list that waits on itself deadlocks);
at most P − s micro-batches' activations held on stage s (1F1B's memory bound, where GPipe holds
all M); and the idle fraction of the schedule replayed with the simulator's costs (F a third of a
stage's step, B two thirds, messages free) equal to the formula (P − 1)/(M + P − 1). A hidden
check (``grade(..., hidden=True)``, what the autograder scores) asks the same four of the edge
cases the visible ones do not show, M = 1, M < P and P = 1: a warm-up that forgets there may
be fewer micro-batches than stages passes every visible check and fails it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from ..strategies.model_parallel import schedules
from .grading import CheckFailed, Report, attempt, describe, failed_all

Schedule = list[list[tuple[str, int]]]
Generator = Callable[[int, int], Schedule]

# (P, M) of the visible checks: M = P, M > P, and a P that is not a power of two.
CASES = ((4, 4), (3, 5), (4, 8), (2, 6))
# Those of the hidden one: M = 1, M < P, P = 1.
EDGE_CASES = ((2, 1), (4, 1), (4, 2), (8, 3), (1, 1), (1, 4))
TOLERANCE = 1e-12


def _complete(schedule: Schedule, stages: int, micro_batches: int) -> None:
    """A CheckFailed unless every stage runs F(m) and B(m) for every m exactly once."""
    case = f"P={stages}, M={micro_batches}"
    if not isinstance(schedule, list) or len(schedule) != stages:
        got = len(schedule) if isinstance(schedule, list) else type(schedule).__name__
        raise CheckFailed(f"{case}: one list per stage is {stages} lists, got {got}")
    want = Counter((phase, m) for phase in "FB" for m in range(micro_batches))
    for s, ops in enumerate(schedule):
        got = Counter(tuple(op) for op in ops)
        for op, count in (got - want).items():
            raise CheckFailed(
                f"{case}: stage {s} runs {op} {count} time{'' if count == 1 else 's'} too many "
                f"(each of ('F', m) and ('B', m), m = 0 … {micro_batches - 1}, once)"
            )
        for (phase, m), _ in (want - got).items():
            what = "forward" if phase == "F" else "backward"
            raise CheckFailed(f"{case}: stage {s} never runs the {what} of micro-batch {m}")


def _generated(
    one_f_one_b: Generator, cases: tuple[tuple[int, int], ...] = CASES
) -> dict[tuple[int, int], Schedule]:
    return {(p, m): one_f_one_b(p, m) for p, m in cases}


def _all_complete(made: dict[tuple[int, int], Schedule]) -> str:
    for (p, m), schedule in made.items():
        _complete(schedule, p, m)
    return f"every F and B once per stage for (P, M) in {list(made)}"


def _order(schedule: Schedule, p: int, m: int) -> None:
    try:
        schedules.execution_order(schedule)
    except ValueError as exc:
        raise CheckFailed(
            f"P={p}, M={m}: {exc} (each stage runs its list in order; F(s, m) needs F(s - 1, m), "
            "B(s, m) needs F(s, m) and B(s + 1, m))"
        ) from exc


def _deadlock_free(made: dict[tuple[int, int], Schedule]) -> str:
    for (p, m), schedule in made.items():
        _order(schedule, p, m)
    return "accepted by the lab's dependency checker for every (P, M)"


def _memory(made: dict[tuple[int, int], Schedule]) -> str:
    for (p, m), schedule in made.items():
        for s, ops in enumerate(schedule):
            peak = schedules.in_flight(ops)
            if peak > p - s:
                raise CheckFailed(
                    f"P={p}, M={m}: stage {s} holds {peak} micro-batches' activations at its "
                    f"peak (forwards run whose backward has not); 1F1B holds at most P - s = "
                    f"{p - s}"
                )
    return "at most P - s micro-batches in flight on stage s for every (P, M)"


def _bubble(made: dict[tuple[int, int], Schedule]) -> str:
    for (p, m), schedule in made.items():
        _complete(schedule, p, m)  # a schedule with ops missing idles less: not comparable
        _order(schedule, p, m)
        costs = [{"F": 1 / (3 * p), "B": 2 / (3 * p)}] * p  # the simulator's split, equal stages
        idle = schedules.replay(schedule, costs)
        mean, formula = sum(idle) / p, schedules.bubble("1f1b", p, m)
        if abs(mean - formula) > TOLERANCE:
            raise CheckFailed(
                f"P={p}, M={m}: the stages idle {mean:.4f} of the step on average; the "
                f"paper's bubble is {formula:.4f}: does each stage start a backward as soon as "
                "it can?"
            )
    return "the idle fraction (P - 1)/(M + P - 1) for every (P, M)"


def _edges(one_f_one_b: Generator) -> str:
    """The hidden check: the four properties above on :data:`EDGE_CASES`."""
    made = _generated(one_f_one_b, EDGE_CASES)
    for check in (_all_complete, _deadlock_free, _memory, _bubble):
        check(made)
    return f"complete, deadlock-free, within P - s in flight, the bubble, for {list(made)}"


def grade(one_f_one_b: Generator, *, hidden: bool = False) -> Report:
    """The question's checks, in order: what ``otter run`` totals, with ``hidden=True`` (plain
    functions, no run)."""
    made: dict[tuple[int, int], Schedule] = {}
    try:
        made.update(_generated(one_f_one_b))
    except Exception as exc:
        names = (("q1-complete", 2), ("q1-deadlock-free", 2), ("q1-memory", 2), ("q1-bubble", 2))
        checks = failed_all(names, f"one_f_one_b raised {describe(exc)}")
    else:
        checks = [
            attempt("q1-complete", 2, lambda: _all_complete(made)),
            attempt("q1-deadlock-free", 2, lambda: _deadlock_free(made)),
            attempt("q1-memory", 2, lambda: _memory(made)),
            attempt("q1-bubble", 2, lambda: _bubble(made)),
        ]
    if hidden:
        checks.append(attempt("q1-edge-hidden", 2, lambda: _edges(one_f_one_b)))
    return Report(tuple(checks))
