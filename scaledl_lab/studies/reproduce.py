"""The paper comparison: the runs `scaledl-lab reproduce` executes, and its report.

Viviani et al. (PDP 2019) compare their nearest-neighbour training (NNT, ring and 4×4 torus)
with a parameter server (MXNet, 16 workers and 8 servers, synchronous and asynchronous) on the
same model, data and worker count. We run the same comparison, side by side:

- on real Dask workers (2 here; every worker a process, wall-clock time), with one worker as the
  speed-up baseline;
- on the simulated runtime with 16 workers (the paper's 4×4 torus), gradients computed for real,
  time from the cost model; some of them again with one worker slowed down (``STRAGGLER``).

Each method runs with the paper's optimiser: NNT with AdaGrad lr 0.01, weight decay 1e-4
(FAST's main runs, ``PAPER_NNT``), the synchronous and parameter-server baselines with Adam lr
1e-3 and each gradient element clipped at 10, as MXNet's parameter server (``MXNET``); two
more simulated rows give NNT the baseline's optimiser and allreduce NNT's ("same optimiser").
Quick mode (`--quick`, or SCALEDL_QUICK=1): Fashion-MNIST and an MLP, the decisive simulated
runs (allreduce, NNT torus) with ``QUICK_SEEDS``. Full mode: ResNet-18 on CIFAR-10, batch 128
per worker, as in the paper's main runs; its 16-worker runs go on the Dask cluster given by
``--address`` (one worker per device).
``paper_configs(seeds=..., lr_factors=...)`` repeats the simulated runs over seeds and over a
grid of learning rates (each method's rate × factor, chosen on validation by the report).

A traffic sweep (tiny simulated runs of NNT and a parameter server at N = 4, 16 and 64 workers,
in ``traffic/`` beside the results, tables without figures) measures how each method's traffic
grows with N.

The report (``summary.md``) has the tables, the figures and a verdict on each claim, computed from
the measured tables only (:mod:`scaledl_lab.analysis`): every number in its text comes from them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from .. import analysis
from ..config import ExperimentConfig, quick
from ..data import steps_per_epoch
from ..experiment import Results, compare
from ..models import build_model, count_parameters, model_flops
from ..runtime.sim.cost import build_cost_model
from ..training.worker import load_for
from .claims import markdown_line, verdicts
from .scaling import traffic_configs as sweep_configs
from .side_by_side import compare_side_by_side, run_side_by_side, saved_apart

SIM_WORKERS = 16
TORUS = "torus:4x4"
STRAGGLER = "slow:5:4"  # rank 5 takes four times as long per step
PS_SERVERS = 8  # the paper's baseline: 16 workers and 8 servers
TRAFFIC_METHODS = (
    dict(strategy="allreduce"),  # bounded per worker too, but global: the baseline to compare
    dict(strategy="nnt", topology="ring"),
    dict(strategy="nnt", topology="torus"),  # the square torus of each N (none at 4)
    dict(strategy="ps-sync", servers=1),
)


@dataclass(frozen=True)
class Setting:
    """The model, data and hyper-parameters every run of the comparison shares."""

    dataset: str
    model: str
    epochs: int
    batch_size: int
    optimizer: str
    lr: float
    weight_decay: float
    train_subset: int | None
    real_workers: int
    network: str = "10gbe"


QUICK = Setting("fashion-mnist", "mlp", 2, 64, "adam", 1e-3, 0.0, None, 2)
FULL = Setting("cifar10", "resnet18", 100, 128, "adam", 1e-3, 0.0, None, 16)
PAPER_NNT = dict(optimizer="adagrad", lr=0.01, momentum=0.0, weight_decay=1e-4)
MXNET = dict(clip_gradient=10.0)  # the baseline's clipping (its Adam is the setting's optimiser)
QUICK_SEEDS = (0, 1, 2)  # for the decisive simulated runs: allreduce and NNT on the torus
SEEDED = ("allreduce", "nnt-torus")
LR_GRID = (1 / 3, 1.0, 3.0)  # the same small grid for every method, chosen on validation
# `reproduce --smoke`: the quick comparison's runs on Dask, one epoch of 512 samples each (8 steps
# per worker of two): proves a cluster runs them end to end; its numbers mean nothing.
SMOKE = dict(train_subset=512, test_subset=200, val_size=200, batch_size=32, epochs=1)


def _base(setting: Setting) -> ExperimentConfig:
    return ExperimentConfig(
        dataset=setting.dataset,
        model=setting.model,
        epochs=setting.epochs,
        batch_size=setting.batch_size,
        optimizer=setting.optimizer,
        lr=setting.lr,
        momentum=0.0,
        weight_decay=setting.weight_decay,
        train_subset=setting.train_subset,
        network=setting.network,
        servers=1,
    )


def _methods(workers: int, torus: str | None) -> list[tuple[str, dict]]:
    """(label, config changes) of the methods compared at ``workers`` workers."""
    servers = min(PS_SERVERS, max(1, workers // 2))
    methods: list[tuple[str, dict]] = [
        ("allreduce", dict(strategy="allreduce", **MXNET)),
        ("ps-sync", dict(strategy="ps-sync", servers=servers, **MXNET)),
        ("ps-async", dict(strategy="ps-async", servers=servers, **MXNET)),
        ("nnt-ring", dict(strategy="nnt", topology="ring", **PAPER_NNT)),
    ]
    if torus:
        methods.append(("nnt-torus", dict(strategy="nnt", topology=torus, **PAPER_NNT)))
        methods.append(("dpsgd-torus", dict(strategy="dpsgd", topology=torus)))
    methods.append(("easgd", dict(strategy="easgd")))
    return methods


def _factor(f: float) -> str:
    return {1 / 3: "1/3"}.get(f, f"{f:g}")


def _repeat(
    cfg: ExperimentConfig, seeds: tuple[int, ...], lr_factors: tuple[float, ...]
) -> list[ExperimentConfig]:
    """``cfg`` once per seed and learning-rate factor, named " · lr×F" and " · seed S"."""
    out = []
    for f in lr_factors:
        for seed in seeds:
            name = cfg.name + (f" · lr×{_factor(f)}" if len(lr_factors) > 1 else "")
            name += f" · seed {seed}" if len(seeds) > 1 else ""
            out.append(cfg.replace(lr=cfg.lr * f, seed=seed, name=name))
    return out


def paper_configs(
    is_quick: bool,
    setting: Setting | None = None,
    *,
    seeds: tuple[int, ...] = (0,),
    seeded: tuple[str, ...] | None = SEEDED,
    lr_factors: tuple[float, ...] = (1.0,),
) -> list[ExperimentConfig]:
    """Every run of the comparison, in the order they execute. The simulated runs of the
    methods in ``seeded`` (None: every method) run once per seed of ``seeds`` and per
    learning-rate factor of ``lr_factors``."""
    setting = setting or (QUICK if is_quick else FULL)
    base = _base(setting)
    if is_quick:
        base = quick(base).replace(epochs=setting.epochs, train_subset=setting.train_subset)
    real_n = setting.real_workers
    real = base.replace(runtime="dask", workers=real_n)
    one = real.replace(strategy="allreduce", workers=1, name="allreduce · dask · 1w", **MXNET)
    runs = [one]
    for label, changes in _methods(real_n, TORUS if real_n == 16 else None):
        runs.append(real.replace(name=f"{label} · dask · {real_n}w", **changes))
    sim = base.replace(runtime="sim", workers=SIM_WORKERS)
    for label, changes in _methods(SIM_WORKERS, TORUS):
        cfg = sim.replace(name=f"{label} · sim · {SIM_WORKERS}w", **changes)
        many = seeded is None or label in seeded
        runs += _repeat(cfg, seeds if many else (seeds[0],), lr_factors)
    # The same optimiser for all: NNT with the baseline's, allreduce with NNT's.
    same = f"{SIM_WORKERS}w · same optimiser"
    runs.append(sim.replace(name=f"nnt-torus · sim · {same}", strategy="nnt", topology=TORUS))
    runs.append(sim.replace(name=f"allreduce · sim · {same}", strategy="allreduce", **PAPER_NNT))
    for label, changes in _methods(SIM_WORKERS, TORUS):
        if label in ("allreduce", "ps-async", "nnt-torus"):
            name = f"{label} · sim · {SIM_WORKERS}w · straggler"
            runs.append(sim.replace(name=name, stragglers=STRAGGLER, **changes))
        if label == "nnt-torus":  # FAST never waits; our former flow control did
            name = f"{label} · sim · {SIM_WORKERS}w · straggler · lead 4"
            runs.append(sim.replace(name=name, stragglers=STRAGGLER, nnt_max_lead=4, **changes))
    return runs


def smoke_configs() -> list[ExperimentConfig]:
    """The quick comparison's real (Dask) runs cut to :data:`SMOKE`; no simulated run."""
    return [cfg.replace(**SMOKE) for cfg in paper_configs(is_quick=True) if cfg.runtime == "dask"]


def traffic_configs(is_quick: bool, setting: Setting | None = None) -> list[ExperimentConfig]:
    """The traffic sweep: allreduce, NNT (ring, torus) and a one-server PS at each of
    ``scaling.TRAFFIC_WORKERS`` worker counts, two steps each.

    Bytes per step depend on the model's size, not on its accuracy; the sweep uses the MLP on the
    comparison's data, so that 64 simulated replicas stay small in full mode too, and plain SGD,
    whose replicas keep no optimiser state (64 replicas' Adam moments: 0.34 GB that no byte
    count depends on)."""
    base = _base(setting or (QUICK if is_quick else FULL))
    base = base.replace(model="mlp", optimizer="sgd", momentum=0.0)
    return sweep_configs(base, TRAFFIC_METHODS)


# -- the report ------------------------------------------------------------------------------


def _one_worker_time(cfg: ExperimentConfig) -> float:
    """The simulator's time per epoch of one worker of ``cfg``: it only computes, a full batch
    per step over the whole training set (the cost model's compute time, no stragglers)."""
    data = load_for(cfg)
    cost = build_cost_model(cfg, model_flops(cfg.model, data.input_shape, data.num_classes))
    steps = steps_per_epoch(len(data.train), cfg.batch_size)
    return steps * cost.compute.step_time(cfg.batch_size)


def _model_bytes(cfg: ExperimentConfig) -> float:
    """Bytes of one gradient (= of the model's parameters) of ``cfg``."""
    data = load_for(cfg)
    params = count_parameters(build_model(cfg.model, data.input_shape, data.num_classes, seed=0))
    return float(params * torch.empty((), dtype=cfg.dtype).element_size())


def paper_table(results: Results) -> pd.DataFrame:
    """:func:`scaledl_lab.analysis.comparison_table` of the comparison's runs, with the
    simulator's one-worker time per epoch and the model's size filled in."""
    return analysis.comparison_table(
        results, one_worker_time=_one_worker_time, model_bytes=_model_bytes
    )


def traffic_summary(traffic: Results) -> pd.DataFrame:
    """:func:`scaledl_lab.analysis.traffic_table` of the traffic sweep, with the model's size."""
    return analysis.traffic_table(traffic, model_bytes=_model_bytes)


def report_markdown(table: pd.DataFrame) -> str:
    cols = [
        ("run", "run", str),
        ("optimizer", "optimiser", str),
        ("lr", "lr", "{:g}".format),
        ("test_acc_best_worker", "test acc (best-on-val worker)", "{:.2%}".format),
        ("test_acc_best_on_test", "test acc (best-on-test worker, FAST's rule)", "{:.2%}".format),
        ("test_acc_mean", "test acc (mean of workers)", "{:.2%}".format),
        ("test_acc_spread", "test acc spread (max − min)", lambda v: f"{100 * v:.1f} pt"),
        ("time_per_epoch_s", "time/epoch (s)", "{:.2f}".format),
        ("speedup_vs_1_worker", "speed-up vs 1", "{:.2f}".format),
        ("bytes_per_worker_step", "sent/worker/step", lambda v: f"{v / 2**20:.2f} MiB"),
        ("staleness", "staleness", "{:.2f}".format),
        ("straggler_slowdown", "straggler slowdown", "×{:.2f}".format),
    ]
    lines = ["| " + " | ".join(c[1] for c in cols) + " |"]
    lines.append("| :--- | " + " | ".join("---:" for _ in cols[1:]) + " |")
    for r in table.to_dict("records"):
        cells = [
            "n/a" if isinstance(r[k], float) and math.isnan(r[k]) else fmt(r[k])
            for k, _, fmt in cols
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def traffic_markdown(traffic: pd.DataFrame) -> str:
    """The traffic sweep as a markdown table: MiB per worker per step (and per round at the
    busiest server), one column per worker count."""
    sent = traffic.pivot(index="method", columns="workers", values="bytes_per_worker_step")
    server = traffic[traffic["servers"] > 0]
    server = server.pivot(index="method", columns="workers", values="server_bytes_per_round")
    rows = [(m, "sent/worker/step", r) for m, r in sent.iterrows()]
    rows += [(m, "busiest server/round", r) for m, r in server.iterrows()]
    ns = list(sent.columns)
    lines = ["| method | MiB | " + " | ".join(f"N = {n}" for n in ns) + " |"]
    lines.append("| :--- | :--- | " + " | ".join("---:" for _ in ns) + " |")
    for method, what, r in rows:
        cells = ["n/a" if math.isnan(r.get(n, math.nan)) else f"{r[n] / 2**20:.2f}" for n in ns]
        lines.append(f"| {method} | {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def reproduce(
    *,
    is_quick: bool,
    out: str | os.PathLike[str],
    address: str | None = None,
    client: Any = None,
    progress: bool = True,
    configs: list[ExperimentConfig] | None = None,
    traffic: list[ExperimentConfig] | None = None,
    security: Any = None,
    jobs: int = 1,
) -> Results:
    """Run the comparison and the traffic sweep (simulated, into ``out/traffic``; none when
    ``traffic`` is empty) and write the results folder (tables, config, plots, summary.md).

    ``jobs`` > 1: the real runs first, one at a time (their clocks must not share the machine),
    then the simulated runs in ``jobs`` processes side by side; the same table, sooner."""
    grid = dict(seeds=QUICK_SEEDS, lr_factors=(1.0,) if is_quick else LR_GRID)
    configs = configs or paper_configs(is_quick, **grid)
    traffic = traffic if traffic is not None else traffic_configs(is_quick)
    where = dict(address=address, client=client, security=security)
    if traffic and jobs > 1:  # one pool: the sweep's small runs fill the others' tail
        frame = run_side_by_side(configs + traffic, jobs=jobs, progress=progress, **where)
        results = saved_apart(frame, configs, Path(out))
        sweep = saved_apart(frame, traffic, Path(out) / "traffic", figures=False)  # its table
    else:
        results = compare_side_by_side(configs, out=out, jobs=jobs, progress=progress, **where)
        sweep = None
        if traffic:
            sweep = compare(traffic, progress=False, log=None)
            sweep.save(Path(out) / "traffic", figures=False)  # what matters is its table
    write_report(results, Path(out), sweep)
    return results


def write_report(results: Results, out: Path, traffic: Results | None = None) -> pd.DataFrame:
    """Add the comparison table, the traffic sweep and the verdicts to summary.md (and
    comparison.csv, traffic.csv); returns the comparison table."""
    table = paper_table(results)
    table.to_csv(out / "comparison.csv", index=False)
    sweep = traffic_summary(traffic) if traffic is not None else None
    lines = [
        "",
        "## The paper comparison",
        "",
        "Accuracy is that of the worker best on the validation split (never the test split), "
        "with the mean and spread over workers; time is wall-clock on Dask and virtual on the "
        "simulator (cost model: compute profile and network of each run's config.json), per "
        "epoch in the steady state (from the first step on), and the speed-up is one worker's "
        "time per epoch over the run's.",
        "",
        report_markdown(table),
    ]
    if sweep is not None and not sweep.empty:
        sweep.to_csv(out / "traffic.csv", index=False)
        lines += [
            "## Traffic as the workers grow (simulated sweep)",
            "",
            "Two steps per run; a server's bytes per round include each worker's first and last "
            "pull, spread over the two rounds.",
            "",
            traffic_markdown(sweep),
        ]
    claims = [markdown_line(c) for c in verdicts(table, sweep)] or [
        "None decided: the simulated runs that decide them were not part of this comparison."
    ]
    lines += ["## Claims of the paper, checked against these figures", "", *claims]
    with (out / "summary.md").open("a") as f:
        f.write("\n".join([*lines, ""]))
    return table
