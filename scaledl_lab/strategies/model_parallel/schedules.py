"""Pipeline schedules as pure functions: each stage's ordered list of operations.

An operation is ``(phase, micro-batch)``, or ``(phase, micro-batch, chunk)`` where a worker
holds several model chunks. The phases are the forward ``"F"``, the backward ``"B"`` and, where
the backward is split (zero-bubble schedules), ``"B"`` for the input gradient only and ``"W"``
for the weight gradient. With p workers of V chunks each the model is cut into p·V virtual
stages and chunk c of worker s is virtual stage v = c·p + s (Megatron-LM's interleaving). The
executor (:mod:`.executor`) runs any of them. Dependencies are the same for all: F(v, m) needs
F(v − 1, m); B(v, m) needs F(v, m) and B(v + 1, m); W(v, m) needs B(v, m).

- :func:`gpipe` (Huang et al. 2019): fill–drain, every forward then every backward, so a stage
  holds the activations of all M micro-batches at its peak;
- :func:`one_f_one_b` (PipeDream-flush, Narayanan et al. 2021): p − s − 1 warm-up forwards,
  then one forward and one backward in turn, then the cool-down backwards; the same gradients as
  GPipe (one flush per mini-batch) with at most p − s micro-batches in flight on stage s;
- :func:`interleaved_1f1b` (Narayanan et al. 2021, Megatron-LM): 1F1B over V chunks per
  worker, which shrinks the bubble V times at V times the messages;
- :func:`zb_h1` (Qi et al. 2023, zero bubble H1): 1F1B's warm-up and order of F and B, with the
  weight gradients W deferred on the later stages into the cool-down, where 1F1B idles.

GPipe and 1F1B leave every stage idle for (p − 1)/(M + p − 1) of a step when stages cost the
same; interleaving for (p − 1)/(V·M + p − 1); ZB-H1 for (p − 1)/(3M + p − 1) when F, B and W
cost the same (its bubble (p − 1)(t_F + t_B − t_W) is a third of 1F1B's (p − 1)(t_F + t_B + t_W)).
"""

from __future__ import annotations

from collections.abc import Callable

Op = tuple[str, int] | tuple[str, int, int]  # (phase, micro-batch[, chunk])


def gpipe(stages: int, micro_batches: int) -> list[list[Op]]:
    """Fill–drain: F0 … F(M−1), then B(M−1) … B0, on every stage."""
    order: list[Op] = [("F", m) for m in range(micro_batches)]
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


def interleaved_1f1b(stages: int, micro_batches: int, virtual_stages: int) -> list[list[Op]]:
    """Megatron-LM's interleaved 1F1B: worker s holds chunks s, s + p, …, s + (V − 1)·p.

    The k-th forward of a worker is chunk (k mod p·V) // p of micro-batch (k // p·V)·p + k mod p
    (groups of p micro-batches go through chunk 0, then chunk 1, ...); the k-th backward takes
    the chunks in reverse. Warm-up: (p − s − 1)·2 + (V − 1)·p forwards (at most all of them),
    then one forward and one backward in turn, then the cool-down backwards. With V > 1 the
    micro-batches must be a multiple of p; with V = 1 it is :func:`one_f_one_b`, chunk 0.
    """
    p, m, v = stages, micro_batches, virtual_stages
    if v < 1:
        raise ValueError(f"virtual_stages={v} must be at least 1")
    if v == 1:
        return [[(ph, mb, 0) for ph, mb, *_ in ops] for ops in one_f_one_b(p, m)]
    if m % p:
        raise ValueError(f"interleaving needs micro_batches={m} to be a multiple of stages={p}")
    total = m * v

    def forward(k: int) -> tuple[int, int]:  # (chunk, micro-batch)
        return (k % (p * v)) // p, (k // (p * v)) * p + k % p

    def backward(k: int) -> tuple[int, int]:
        chunk, mb = forward(k)
        return v - 1 - chunk, mb

    out = []
    for s in range(p):
        warmup = min((p - s - 1) * 2 + (v - 1) * p, total)
        ops: list[Op] = [("F", mb, c) for c, mb in map(forward, range(warmup))]  # Warm-up
        for i in range(total - warmup):  # Steady state
            (fc, fm), (bc, bm) = forward(warmup + i), backward(i)
            ops += [("F", fm, fc), ("B", bm, bc)]
        ops += [("B", mb, c) for c, mb in map(backward, range(total - warmup, total))]  # Cool-down
        out.append(ops)
    return out


def zb_h1(stages: int, micro_batches: int) -> list[list[Op]]:
    """Zero bubble H1 (Qi et al. 2023): 1F1B's F and B, B now the input gradient only; stage s
    defers its weight gradients by s micro-batches, W(i − s) right after B(i), and runs the
    last s of them after its last B, in the cool-down where 1F1B's stage s idles. The first
    stage defers none, the last p − 1: the backwards cross the pipeline at the pace of B alone.
    At most p − s micro-batches wait between F and B on stage s, as in 1F1B."""
    out = []
    for s, ops in enumerate(one_f_one_b(stages, micro_batches)):
        mine: list[Op] = []
        for phase, m, *_ in ops:
            mine.append((phase, m))
            if phase == "B" and m >= s:
                mine.append(("W", m - s))
        mine += [("W", m) for m in range(max(0, micro_batches - s), micro_batches)]
        out.append(mine)
    return out


SCHEDULES: dict[str, Callable[..., list[list[Op]]]] = {
    "model-parallel": gpipe,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved-1f1b": interleaved_1f1b,
    "zb-h1": zb_h1,
}


def schedule(
    strategy: str, stages: int, micro_batches: int, virtual_stages: int = 1
) -> list[list[Op]]:
    """The schedule of a pipeline strategy (``virtual_stages``: chunks per worker)."""
    if strategy == "interleaved-1f1b":
        return interleaved_1f1b(stages, micro_batches, virtual_stages)
    return SCHEDULES[strategy](stages, micro_batches)


def chunks(schedule: list[list[Op]]) -> int:
    """V, the model chunks per worker of ``schedule`` (1 where its ops name none)."""
    return 1 + max((op[2] for ops in schedule for op in ops if len(op) > 2), default=0)


def in_flight(ops: list[Op], until: str = "B") -> int:
    """The most (chunk, micro-batch) pairs whose forward has run and whose ``until`` phase has
    not: ``"B"`` counts the full activation stashes, ``"W"`` also those whose input gradient
    is done but whose weight gradient waits (a schedule without W frees all at B)."""
    has_w = any(op[0] == "W" for op in ops)
    release = until if has_w else "B"
    live = peak = 0
    for phase, *_ in ops:
        if phase == "F":
            live += 1
        elif phase == release:
            live -= 1
        peak = max(peak, live)
    return peak


def execution_order(schedule: list[list[Op]]) -> list[tuple]:
    """Run every stage's list in order, each op only once its dependencies have run, and
    return the global order ``(stage, phase, micro-batch[, chunk])``; a ValueError names the
    stuck stages if the schedule deadlocks (blocking receives, sends that never block)."""
    stages = len(schedule)
    last = stages * chunks(schedule) - 1  # the last virtual stage

    def key(s: int, op: Op) -> tuple[int, str, int]:  # (virtual stage, phase, micro-batch)
        return (op[2] if len(op) > 2 else 0) * stages + s, op[0], op[1]

    done: set[tuple[int, str, int]] = set()
    position = [0] * stages
    order = []
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            if position[s] == len(schedule[s]):
                continue
            op = schedule[s][position[s]]
            v, phase, m = key(s, op)
            if phase == "F":
                ready = v == 0 or (v - 1, "F", m) in done
            elif phase == "B":
                ready = (v, "F", m) in done and (v == last or (v + 1, "B", m) in done)
            else:
                ready = (v, "B", m) in done
            if ready:
                done.add((v, phase, m))
                order.append((s, *op))
                position[s] += 1
                progress = True
    stuck = [s for s in range(stages) if position[s] < len(schedule[s])]
    if stuck:
        raise ValueError(f"the schedule deadlocks: stages {stuck} wait for each other")
    return order


def bubble(strategy: str, stages: int, micro_batches: int, virtual_stages: int = 1) -> float:
    """The idle fraction of a step with equal stage costs and free messages, the simulator's
    split of a chunk's step being F = 1/3, B = 2/3 (B = W = 1/3 where the backward is split).

    GPipe and 1F1B: (p − 1)/(M + p − 1); interleaved: (p − 1)/(V·M + p − 1), the ideal time
    M·(t_F + t_B) with a V times shorter fill and drain. ZB-H1, with t = t_F = t_B = t_W: every
    stage works 3M·t, and the step lasts (3M + p − 1)·t, the paper's bubble (p − 1)(t_F + t_B −
    t_W), when M ≥ p; with fewer micro-batches the last B leaves the last stage at (p + 2M − 1)·t
    (there F and B alternate, each B waiting for its F), crosses the other p − 1 stages, and the
    first stage ends with its W: (2M + 2p − 1)·t."""
    p, m = stages, micro_batches
    if strategy == "zb-h1":
        return 1 - 3 * m / max(3 * m + p - 1, 2 * m + 2 * p - 1)
    v = virtual_stages if strategy == "interleaved-1f1b" else 1
    return (p - 1) / (v * m + p - 1)


def replay(schedule: list[list[Op]], costs: list[dict[str, float]]) -> list[float]:
    """Each stage's idle fraction of one step when the ops run in ``schedule``'s order, each as
    soon as its dependencies and its stage are free, messages free: ``costs[v]`` are the
    durations of F, B (and W) on virtual stage v. With equal costs it gives :func:`bubble`."""
    stages = len(schedule)
    last = stages * chunks(schedule) - 1
    end: dict[tuple[int, str, int], float] = {}
    clock, busy = [0.0] * stages, [0.0] * stages
    for s, phase, m, *rest in execution_order(schedule):
        v = (rest[0] if rest else 0) * stages + s
        if phase == "F":
            needs = [(v - 1, "F", m)] if v else []
        elif phase == "B":
            needs = [(v, "F", m)] + ([(v + 1, "B", m)] if v < last else [])
        else:
            needs = [(v, "B", m)]
        start = max([clock[s], *(end[n] for n in needs)])
        clock[s] = end[(v, phase, m)] = start + costs[v][phase]
        busy[s] += costs[v][phase]
    span = max(clock)
    return [1 - b / span for b in busy]


def predicted_bubble(
    strategy: str,
    stages: int,
    micro_batches: int,
    virtual_stages: int = 1,
    shares: list[float] | None = None,
) -> float:
    """The mean idle fraction the simulator's cost model predicts with free messages: the
    schedule replayed with each virtual stage's share of a step (equal shares by default),
    F = share/3 and B = 2·share/3, or F = B = W = share/3 where the backward is split."""
    ops = schedule(strategy, stages, micro_batches, virtual_stages)
    count = stages * chunks(ops)
    shares = shares if shares is not None else [1.0 / count] * count
    if len(shares) != count:
        raise ValueError(f"shares needs one share per virtual stage ({count}), not {len(shares)}")
    split = any(op[0] == "W" for o in ops for op in o)
    costs = [
        {"F": s / 3, "B": s / 3, "W": s / 3} if split else {"F": s / 3, "B": 2 * s / 3}
        for s in shares
    ]
    idle = replay(ops, costs)
    return sum(idle) / len(idle)
