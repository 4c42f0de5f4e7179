"""Pipeline schedules as pure functions: each stage's ordered list of (phase, micro-batch).

A schedule says in which order one stage runs the forward (``"F"``) and backward (``"B"``) of
each micro-batch; the executor (:mod:`.pipeline`) runs any of them. Dependencies are the same
for all: F(s, m) needs F(s − 1, m); B(s, m) needs F(s, m) and B(s + 1, m).

- :func:`gpipe` (Huang et al. 2019): fill–drain, every forward then every backward, so a stage
  holds the activations of all M micro-batches at its peak;
- :func:`one_f_one_b` (PipeDream-flush, Narayanan et al. 2021): p − s − 1 warm-up forwards,
  then one forward and one backward in turn, then the cool-down backwards; the same gradients as
  GPipe (one flush per mini-batch) with at most p − s micro-batches in flight on stage s.

Both leave every stage idle for (p − 1)/(M + p − 1) of a step when stages cost the same.
"""

from __future__ import annotations

Op = tuple[str, int]  # ("F" | "B", micro-batch)


def gpipe(stages: int, micro_batches: int) -> list[list[Op]]:
    """Fill–drain: F0 … F(M−1), then B(M−1) … B0, on every stage."""
    order = [("F", m) for m in range(micro_batches)]
    order += [("B", m) for m in reversed(range(micro_batches))]
    return [list(order) for _ in range(stages)]


def one_f_one_b(stages: int, micro_batches: int) -> list[list[Op]]:
    """PipeDream-flush: warm-up forwards, steady one-forward-one-backward, cool-down."""
    out = []
    for stage in range(stages):
        warmup = min(stages - stage - 1, micro_batches)
        ops: list[Op] = [("F", m) for m in range(warmup)]  # Warm-up
        for i in range(micro_batches - warmup):  # Steady state
            ops += [("F", warmup + i), ("B", i)]
        ops += [("B", m) for m in range(micro_batches - warmup, micro_batches)]  # Cool-down
        out.append(ops)
    return out


SCHEDULES = {"model-parallel": gpipe, "gpipe": gpipe, "1f1b": one_f_one_b}


def in_flight(ops: list[Op]) -> int:
    """The most micro-batches whose forward has run and backward has not (stashed activations)."""
    live = peak = 0
    for phase, _ in ops:
        live += 1 if phase == "F" else -1
        peak = max(peak, live)
    return peak


def execution_order(schedule: list[list[Op]]) -> list[tuple[int, str, int]]:
    """Run every stage's list in order, each op only once its dependencies have run, and
    return the global order ``(stage, phase, micro-batch)``; a ValueError names the stuck
    stages if the schedule deadlocks (blocking receives, sends that never block)."""
    stages = len(schedule)
    done: set[tuple[int, str, int]] = set()
    position = [0] * stages
    order = []
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            if position[s] == len(schedule[s]):
                continue
            phase, m = schedule[s][position[s]]
            if phase == "F":
                ready = s == 0 or (s - 1, "F", m) in done
            else:
                ready = (s, "F", m) in done and (s == stages - 1 or (s + 1, "B", m) in done)
            if ready:
                done.add((s, phase, m))
                order.append((s, phase, m))
                position[s] += 1
                progress = True
    stuck = [s for s in range(stages) if position[s] < len(schedule[s])]
    if stuck:
        raise ValueError(f"the schedule deadlocks: stages {stuck} wait for each other")
    return order
