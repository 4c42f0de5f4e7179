"""Many runs sooner: simulated runs in several processes side by side, real runs alone.

A simulated run's numbers do not depend on what else the machine does (its clock is virtual),
so ``compare_side_by_side`` shares them out between ``jobs`` processes, costliest first; real
runs (Dask, wall-clock) run first, one at a time, in this process, since their times would.
The result is one table, every run's rows in the order of the configs, as ``compare`` gives.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import pandas as pd

from .experiment import Results, compare
from .plots import method_of

# Relative cost of one simulated epoch of each method (wall-clock, measured here): NNT on the
# torus applies five gradients per step. Only used to share the runs out between processes.
COST = {"nnt-torus": 5.0, "nnt-ring": 3.0, "dpsgd-torus": 2.5, "ps-async": 2.0}


def _cost(cfg: Any) -> float:
    return COST.get(method_of(cfg.name)[0], 1.0) * cfg.epochs * cfg.workers


def _share(configs: list[Any], jobs: int) -> list[list[Any]]:
    """``configs`` shared out between ``jobs`` processes, costliest first, each to the least
    loaded (the order within a share is the configs' order)."""
    loads, shares = [0.0] * jobs, [[] for _ in range(jobs)]
    for i in sorted(range(len(configs)), key=lambda i: -_cost(configs[i])):
        k = loads.index(min(loads))
        loads[k] += _cost(configs[i])
        shares[k].append(i)
    return [[configs[i] for i in sorted(share)] for share in shares if share]


def _run_share(configs: list[Any], out: str) -> None:
    import torch

    torch.set_num_threads(1)
    compare(configs, out=out, progress=False, log=None)


def _simulated(configs: list[Any], jobs: int, scratch: Path) -> list[pd.DataFrame]:
    shares = _share(configs, jobs)
    parts = [scratch / str(k) for k in range(len(shares))]
    with ProcessPoolExecutor(len(shares), mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_run_share, s, str(p)) for s, p in zip(shares, parts, strict=True)]
        for future in futures:
            future.result()
    return [pd.read_csv(p / "metrics.csv") for p in parts]


def compare_side_by_side(
    configs: list[Any],
    *,
    out: str | os.PathLike[str],
    jobs: int = 2,
    progress: bool = True,
    **where: Any,
) -> Results:
    """:func:`scaledl_lab.experiment.compare` of ``configs``, the simulated ones in ``jobs``
    processes side by side after the real ones; one results folder with every run, in
    ``configs``' order. ``where``: ``compare``'s address, client and security, for real runs."""
    simulated = [c for c in configs if c.runtime == "sim"]
    if jobs <= 1 or len(simulated) <= 1:
        return compare(configs, out=out, progress=progress, **where)
    real = [c for c in configs if c.runtime != "sim"]
    frames = [compare(real, progress=progress, **where).frame] if real else []
    scratch = Path(tempfile.mkdtemp(prefix="side-by-side-"))
    try:
        frames += _simulated(simulated, jobs, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    order = {c.label: i for i, c in enumerate(configs)}  # each run's rows stay in their order
    frame = pd.concat(frames, ignore_index=True)
    frame = frame.sort_values("run", key=lambda r: r.map(order), kind="stable", ignore_index=True)
    results = Results(frame=frame, configs=list(configs))
    results.save(out)
    return results
