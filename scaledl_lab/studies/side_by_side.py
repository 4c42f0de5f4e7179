"""Many runs sooner: simulated runs in several processes side by side, real runs alone.

A simulated run's numbers do not depend on what else the machine does (its clock is virtual),
so ``compare_side_by_side`` runs them in ``jobs`` processes, costliest first; real
runs (Dask, wall-clock) run first, one at a time, in this process, since their times would.
The result is one table, every run's rows in the order of the configs, as ``compare`` gives.

Memory: a simulated run holds every one of its workers' replicas (model, gradient, optimiser
state, messages) in its process, so what the processes hold together grows with the replicas
running at once. At most ``REPLICAS_AT_ONCE`` of them run side by side (a run that exceeds it
alone still runs, by itself); before the pool starts, this process lets go of the data and the
memory its real runs used.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pandas as pd

from ..experiment import Results, compare
from ..runtime.memory import hand_back_memory
from ..runtime.processes import set_environ, start_method
from ..training import plan
from ..viz.plots import method_of

# Relative cost of one simulated epoch of each method (wall-clock, measured here): NNT applies
# each neighbour's gradient too. Only used to start the costliest runs first.
COST = {"nnt-torus": 2.5, "nnt-ring": 2.5, "dpsgd-torus": 1.6, "easgd": 1.7, "ps-async": 1.3}
# Simulated replicas in memory at once, over all processes: the traffic sweep's 64-worker runs
# beside a 4-worker one at most (each alone is ~1.7 GB above its process's 0.7 GB of libraries
# and data), two of the comparison's 16-worker runs side by side.
REPLICAS_AT_ONCE = 68


def _cost(cfg: Any) -> float:
    """The run's worker-steps, weighted by what its method does per step (``COST``)."""
    straggler = 2.0 if cfg.stragglers else 1.0  # the others run on while it lags
    steps = plan.total_steps(cfg)
    return COST.get(method_of(cfg.name)[0], 1.0) * steps * cfg.workers * straggler


def _run_one(cfg: Any, out: str) -> None:
    import torch

    torch.set_num_threads(1)
    # Only the table goes back (written as a results folder writes it, read back by the
    # parent): figures, summary and weights of one run would be thrown away.
    frame = compare([cfg], progress=False, log=None, weights=False).frame
    Path(out).mkdir(parents=True)
    frame.to_csv(Path(out) / "metrics.csv", index=False)
    _let_go()  # the next run starts from what this process needs, not this run's peak


def _let_go() -> None:
    """What this process freed goes back to the OS (cycles collected first)."""
    gc.collect()
    hand_back_memory()


def _next(waiting: list[int], running: list[Any], configs: list[Any]) -> int | None:
    """The costliest waiting run whose replicas fit beside the running ones (any run, alone)."""
    held = sum(c.workers for c in running)
    for i in waiting:
        if not running or held + configs[i].workers <= REPLICAS_AT_ONCE:
            return i
    return None


def _simulated(configs: list[Any], jobs: int, scratch: Path) -> list[pd.DataFrame]:
    """Each run a task of its own, the costliest first: a process that is done takes the next
    (that fits, :func:`_next`), so a run whose cost ``COST`` misjudges delays nobody for long."""
    costs = [_cost(c) for c in configs]
    plan.forget_data()  # the costs' data: the pool's processes load their own
    _let_go()
    waiting = sorted(range(len(configs)), key=lambda i: -costs[i])
    parts = {i: scratch / str(i) for i in waiting}
    running: dict[Future, int] = {}
    with ProcessPoolExecutor(
        jobs,
        mp_context=get_context(start_method()),
        initializer=set_environ,
        initargs=(dict(os.environ),),
    ) as pool:
        while waiting or running:
            i = None
            if len(running) < jobs:
                i = _next(waiting, [configs[r] for r in running.values()], configs)
            if i is not None:
                waiting.remove(i)
                running[pool.submit(_run_one, configs[i], str(parts[i]))] = i
                continue
            done, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in done:
                del running[future]
                future.result()
    return [pd.read_csv(parts[i] / "metrics.csv") for i in range(len(configs))]


def run_side_by_side(
    configs: list[Any], *, jobs: int = 2, progress: bool = True, **where: Any
) -> pd.DataFrame:
    """The metrics of ``configs``: the real runs first, alone, then the simulated ones in
    ``jobs`` processes side by side; every run's rows in ``configs``' order. ``where``:
    ``compare``'s address, client and security, for real runs."""
    simulated = [c for c in configs if c.runtime == "sim"]
    if jobs <= 1 or len(simulated) <= 1:
        return compare(configs, progress=progress, **where).frame
    real = [c for c in configs if c.runtime != "sim"]
    frames = [compare(real, progress=progress, **where).frame] if real else []
    scratch = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    try:
        frames += _simulated(simulated, jobs, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    order = {c.label: i for i, c in enumerate(configs)}  # each run's rows stay in their order
    frame = pd.concat(frames, ignore_index=True)
    return frame.sort_values("run", key=lambda r: r.map(order), kind="stable", ignore_index=True)


def compare_side_by_side(
    configs: list[Any],
    *,
    out: str | os.PathLike[str],
    jobs: int = 2,
    progress: bool = True,
    **where: Any,
) -> Results:
    """:func:`scaledl_lab.experiment.compare` of ``configs`` through :func:`run_side_by_side`:
    one results folder with every run, in ``configs``' order (saved into ``out`` as it is: a
    study's command owns its folder, which may hold its other parts already)."""
    if jobs <= 1:
        results = compare(configs, progress=progress, **where)
        results.save(out)
        return results
    frame = run_side_by_side(configs, jobs=jobs, progress=progress, **where)
    return saved_apart(frame, configs, Path(out))


def saved_apart(
    frame: pd.DataFrame, configs: list[Any], out: Path, *, figures: bool = True
) -> Results:
    """The runs of ``configs`` cut from ``frame`` (of runs side by side), saved into ``out``
    (with their plots when ``figures``)."""
    labels = {c.label for c in configs}
    part = frame[frame["run"].isin(labels)].reset_index(drop=True)
    results = Results(frame=part, configs=list(configs))
    results.save(out, figures=figures)
    return results
