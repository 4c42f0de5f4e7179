"""Measure this machine for the simulator: compute time per step, and gloo's α and β.

Compute: real 2-worker synchronous runs of each model at two batch sizes; their step time less
the modelled allreduces gives ``per_step_s + per_sample_s · batch`` (``calibrate_from_runs``).
``calibrate_compute`` times bare training steps instead, in this process or on every worker at
once, for models or settings no run covers.
Network: allreduces of several sizes between two real Dask workers over gloo; for two workers
the ring costs n/β + 2α, so a least-squares line through (n, time) gives α and β.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..models import build_model
from ..runtime.memory import freed_memory_kept
from ..runtime.sim.cost import (
    ComputeProfile,
    NetworkProfile,
    default_profile_path,
    save_calibration,
)

SHAPES = {
    "mlp": ((1, 28, 28), 10),
    "cnn": ((1, 28, 28), 10),
    "cnn1d": ((1, 40), 10),
    "resnet18": ((3, 32, 32), 10),
}
SIZES = (2**12, 2**16, 2**20, 2**22, 2**24)


def time_steps(model_name: str, batch: int, *, steps: int = 20, warmup: int = 3) -> float:
    """Median seconds of one SGD training step of ``model_name`` at ``batch``, one thread."""
    shape, classes = SHAPES[model_name]
    model = build_model(model_name, shape, classes, seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(batch, *shape), torch.randint(0, classes, (batch,))
    times = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with freed_memory_kept():  # as every worker runs
        try:
            for i in range(warmup + steps):
                start = time.perf_counter()
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()
                if i >= warmup:
                    times.append(time.perf_counter() - start)
        finally:
            torch.set_num_threads(threads)
    return statistics.median(times)


def time_apply(model_name: str, *, repeats: int = 20, warmup: int = 3) -> float:
    """Median seconds per parameter byte of applying a received gradient, one thread: its copy
    out of a flat receive buffer into the gradients, then an AdaGrad step (one state tensor)."""
    from ..params import param_vector, write_grads

    shape, classes = SHAPES[model_name]
    params = list(build_model(model_name, shape, classes, seed=0).parameters())
    optimizer = torch.optim.Adagrad(params, lr=0.01)
    flat = torch.randn_like(param_vector(params))
    times = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for i in range(warmup + repeats):
            start = time.perf_counter()
            write_grads(params, flat)
            optimizer.step()
            if i >= warmup:
                times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times) / (flat.numel() * flat.element_size())


def _time_on_workers(client: Any, model_name: str, batch: int) -> float:
    """Mean step time with every worker of ``client`` timing at once, as they will train:
    concurrent workers share memory bandwidth and caches, which a lone process does not see."""
    from ..runtime.dask.driver import worker_addresses

    futures = [
        client.submit(time_steps, model_name, batch, workers=[addr], pure=False)
        for addr in worker_addresses(client)
    ]
    return statistics.mean(client.gather(futures))


def calibrate_compute(
    model_name: str, batches: tuple[int, int] = (32, 128), *, client: Any = None
) -> ComputeProfile:
    """Fit ``a + b·batch`` through the step times at two batch sizes (on the workers if given)."""
    small, large = batches
    if client is None:
        t_small, t_large = time_steps(model_name, small), time_steps(model_name, large)
    else:
        t_small = _time_on_workers(client, model_name, small)
        t_large = _time_on_workers(client, model_name, large)
    per_sample = max((t_large - t_small) / (large - small), 1e-9)
    per_step = max(t_small - per_sample * small, 0.0)
    return ComputeProfile(f"calibrated:{model_name}", per_step, per_sample, time_apply(model_name))


def calibrate_from_runs(
    client: Any,
    model_name: str,
    network: NetworkProfile,
    batches: tuple[int, int] = (32, 128),
    steps: int = 60,
    repeats: int = 3,
) -> ComputeProfile:
    """Fit ``a + b·batch`` to real 2-worker runs, less their modelled communication.

    Everything a real step spends besides the allreduces (compute, optimiser, hooks, metrics,
    two workers sharing the memory bus) lands in the compute profile, so the simulator
    reproduces the real step time at the calibration points and interpolates between them.

    Each batch size is run ``repeats`` times, alternating with the other, and its median step
    time kept: a line through two points multiplies their error by 2.3 at batch 256, and one
    30-step run per point put the MLP's predicted batch-256 step anywhere from 9.7 to 20.9 ms
    in three calibrations on this machine.
    """
    from ..config import ExperimentConfig
    from ..metrics import to_frame
    from ..models import count_parameters
    from ..runtime.sim.cost import allreduce_time
    from ..strategies.launch import execute
    from .scaling import step_time

    shape, classes = SHAPES[model_name]
    grad_bytes = 4 * count_parameters(build_model(model_name, shape, classes))
    comm = allreduce_time(grad_bytes + 4, 2, network)  # the naive reducer: one flat allreduce
    configs = {
        batch: ExperimentConfig(
            strategy="allreduce-naive",
            workers=2,
            model=model_name,
            batch_size=batch,
            max_steps=steps,
            train_subset=2 * batch * steps,
            val_size=100,
            test_subset=100,
        )
        for batch in batches
    }
    runs: dict[int, list[float]] = {batch: [] for batch in batches}
    for _ in range(repeats):
        for batch, cfg in configs.items():
            rows: list[dict[str, Any]] = []
            execute(cfg, f"calibrate-{model_name}-{batch}", rows.extend, client=client)
            runs[batch].append(step_time(to_frame(rows)))
    (small, large) = batches
    t_small, t_large = (max(statistics.median(runs[b]) - comm, 1e-6) for b in batches)
    per_sample = max((t_large - t_small) / (large - small), 1e-9)
    return ComputeProfile(
        f"calibrated:{model_name}",
        max(t_small - per_sample * small, 0.0),
        per_sample,
        time_apply(model_name),
    )


async def _allreduce_timings(ctx: Any) -> None:
    for nbytes in SIZES:
        tensor = torch.ones(nbytes // 4)
        samples = []
        for _ in range(15):
            await ctx.comm.barrier()
            start = time.perf_counter()
            await ctx.comm.allreduce(tensor)
            samples.append(time.perf_counter() - start)
        ctx.result[nbytes] = statistics.median(samples)


def calibrate_network(client: Any) -> NetworkProfile:
    """α and β of gloo between the first two workers of ``client``'s cluster."""
    from ..config import ExperimentConfig
    from ..strategies.launch import execute

    cfg = ExperimentConfig(workers=2, model="mlp", train_subset=1000, test_subset=100, val_size=100)
    outcome = execute(
        cfg, "calibrate-network", lambda rows: None, client=client, program=_allreduce_timings
    )
    timings = outcome.results[0]
    n = np.array(SIZES, dtype=float)
    t = np.array([timings[s] for s in SIZES])
    slope, intercept = np.polyfit(n, t, 1)  # t = n/β + 2α for two workers
    return NetworkProfile("calibrated", max(intercept / 2, 0.0), 1.0 / max(slope, 1e-15))


def calibrate(
    models: tuple[str, ...] = ("mlp", "cnn"),
    out: str | os.PathLike[str] | None = None,
    *,
    client: Any = None,
    log: Any = print,
) -> Path:
    """Measure compute for ``models`` and the network, and save the profile JSON."""
    from ..runtime.dask.cluster import connect

    with contextlib.ExitStack() as stack:
        if client is None:
            client = stack.enter_context(connect(2, dashboard=False, log=None))
        network = calibrate_network(client)
        compute = {}
        for name in models:
            compute[name] = calibrate_from_runs(client, name, network)
            if log:
                p = compute[name]
                log(
                    f"{name}: {p.per_step_s * 1e3:.2f} ms/step + "
                    f"{p.per_sample_s * 1e3:.3f} ms/sample"
                )
    if log:
        log(
            f"network: latency {network.latency_s * 1e6:.0f} us, "
            f"bandwidth {network.bandwidth_Bps / 1e9:.2f} GB/s"
        )
    meta = {
        "measured": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "threads_per_worker": 1,
    }
    path = save_calibration(out or default_profile_path(), compute, network, meta)
    if log:
        log(f"saved {path}; use it with --compute-profile {path} --network {path}")
    return path
