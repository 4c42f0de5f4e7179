"""Analysis of results tables: the one home of the numbers that comparisons report.

Everything here reads the tidy metrics table (columns in :mod:`scaledl_lab.metrics`), never a
cluster, so ``reproduce``, plots and notebooks report the same numbers by the same rules: the
best-on-validation worker and the spread of the workers, the time per epoch and the speed-up
(one worker's time per epoch over a run's: the two always agree), traffic per worker and per
server, and the comparison and traffic-sweep tables built from them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pandas as pd

from . import families
from .config import ExperimentConfig
from .metrics import summarise_workers
from .runtime.sim.cost import Stragglers
from .topology import parse

TRAFFIC = "traffic"  # runs named "traffic · METHOD · Nw" belong to a traffic sweep


def _rows(frame: pd.DataFrame, run: str | None) -> pd.DataFrame:
    return frame if run is None else frame[frame["run"] == run]


def _train(frame: pd.DataFrame, run: str | None = None) -> pd.DataFrame:
    rows = _rows(frame, run)
    return rows[rows["kind"] == "train"]


# -- accuracy ----------------------------------------------------------------------------------


def _last_evaluation(rows: pd.DataFrame, kind: str) -> pd.Series:
    """Each rank's accuracy at its last ``kind`` evaluation (NaN kept), indexed by rank."""
    evals = rows[rows["kind"] == kind].sort_values(["rank", "step", "time"], kind="stable")
    return evals.groupby("rank").tail(1).set_index("rank")["accuracy"]


def best_worker(frame: pd.DataFrame, run: str | None = None) -> dict[str, Any]:
    """From a results table: each worker's last val/test accuracy, the best worker on val (its
    test accuracy is the method's result) and the mean and spread across workers.

    The rule is :func:`~scaledl_lab.metrics.summarise_workers` (a NaN validation accuracy, e.g.
    a diverged worker, counts as worst; ties go to the lowest rank); ``best_rank`` is the rank
    itself, also when some ranks are missing (a lost worker). A worker with no test row counts
    as NaN. Methods with one global model log their evaluations from rank 0 only: one worker.
    """
    rows = _rows(frame, run)
    val, test = _last_evaluation(rows, "val"), _last_evaluation(rows, "test")
    if val.empty:
        raise ValueError(
            f"run {run or '(all rows)'} has no validation rows: choosing the best worker on "
            "validation needs val_size > 0"
        )
    ranks = sorted(int(r) for r in val.index)
    summary = summarise_workers(
        [float(val[r]) for r in ranks], [float(test.get(r, math.nan)) for r in ranks]
    )
    summary["best_rank"] = ranks[summary["best_rank"]]
    summary["ranks"] = ranks
    return summary


def final_scores(frame: pd.DataFrame, run: str | None = None) -> dict[str, float]:
    """Test accuracy of the worker best on validation at the last evaluation (``best``, rank
    ``best_rank``), and the ``mean``, ``spread`` (max − min) and ``std`` of the workers' test
    accuracies there. All NaN when the run has no validation split."""
    rows = _rows(frame, run)
    if not (rows["kind"] == "val").any():
        keys = ("best", "best_rank", "mean", "spread", "std", "val", "best_on_test")
        return dict.fromkeys(keys, math.nan)
    s = best_worker(rows)
    return {
        "best": float(s["best_test_accuracy"]),
        "val": float(s["worker_val_accuracy"][s["ranks"].index(s["best_rank"])]),
        "best_on_test": float(s["max_test_accuracy"]),  # FAST's rule: the best worker on test
        "best_rank": float(s["best_rank"]),
        "mean": float(s["mean_test_accuracy"]),
        "spread": float(s["max_test_accuracy"] - s["min_test_accuracy"]),
        "std": float(s["std_test_accuracy"]),
    }


# -- time --------------------------------------------------------------------------------------


def has_global_progress(frame: pd.DataFrame, run: str | None = None) -> bool:
    """Whether a run's train rows carry *global* progress in ``epoch`` (asynchronous methods:
    the servers' count of applied gradients) rather than each rank's own (``step`` / steps per
    epoch, so that ``epoch`` is proportional to ``step`` on every rank)."""
    train = _train(frame, run)
    train = train[train["step"] > 0]
    for _, rows in train.groupby("rank"):
        ratio = rows["epoch"] / rows["step"]
        if ratio.max() - ratio.min() > 1e-9 * ratio.abs().max():
            return True
    return False


def _window(rows: pd.DataFrame, end: float, done: float) -> float:
    """Seconds per epoch from the first of ``rows`` to progress ``end`` at time ``done``."""
    first = rows.sort_values("time", kind="stable").iloc[0]
    progress = end - float(first["epoch"])
    return (done - float(first["time"])) / progress if progress > 0 else math.nan


def time_per_epoch(frame: pd.DataFrame, run: str | None = None) -> float:
    """Steady-state seconds per epoch: from the first training row to the moment the final
    progress was made, divided by the progress made in between.

    Why this definition, and not "time of the last row / epochs" or "first time the final epoch
    is logged / epochs":

    - *steady state*, not end to end: the clock starts at different points for different methods
      (on 2 Dask workers here, an allreduce run spends about a second of its clock before its
      first step, with one worker as with two; NNT and EASGD runs a few milliseconds; on the
      simulator parameter-server runs start after the first pulls). Counting from time 0
      compares start-up costs, not training speed (EASGD on 2 Dask workers then shows half the
      time per epoch of one worker while its samples per second are 1.14 times one worker's).
      Everything after the first step counts: steps, communication, the evaluations at epoch
      boundaries.
    - *the end of progress*: synchronous and decentralised methods log local progress, so each
      rank's window runs from its first to its last train row, and the run's time per epoch is
      its slowest rank's (the run has done its epochs when its last rank has; a straggler the
      run waits for counts). Asynchronous methods log global progress, capped at the end: one
      window over all ranks, up to the first time the final epoch is logged; pushes still in
      flight then are dropped, and their rows (logged later, with the final epoch) do not count.
      :func:`has_global_progress` tells the two apart from the table.

    NaN without two train rows in a window. Wall-clock on Dask, virtual on the simulator.
    """
    train = _train(frame, run)
    if train.empty:
        return math.nan
    if has_global_progress(train):
        end = float(train["epoch"].max())
        return _window(train, end, float(train.loc[train["epoch"] >= end - 1e-9, "time"].min()))
    ranks = [
        _window(rows, float(rows["epoch"].max()), float(rows["time"].max()))
        for _, rows in train.groupby("rank")
    ]
    return max((t for t in ranks if not math.isnan(t)), default=math.nan)


def step_rates(frame: pd.DataFrame, run: str | None = None) -> pd.Series:
    """Each worker's training steps per second (by rank), from its first train row to its
    second-to-last: the last step of a decentralised run includes waiting for every message
    still owed to it, which is the end of the run, not its pace."""
    rates = {}
    for rank, rows in _train(frame, run).groupby("rank"):
        times = rows.sort_values("step")["time"].to_numpy()[:-1]
        span = times[-1] - times[0] if len(times) > 1 else 0.0
        rates[int(rank)] = (len(times) - 1) / span if span > 0 else math.nan
    return pd.Series(rates, name="steps_per_s", dtype=float)


def speedup(frame: pd.DataFrame, one_worker_time_per_epoch: float, run: str | None = None) -> float:
    """One worker's time per epoch over this run's (both steady state, see
    :func:`time_per_epoch`): an epoch is one pass over the training set, so this is also the
    ratio of samples per second. >1: the run gets through its data faster than one worker."""
    return one_worker_time_per_epoch / time_per_epoch(frame, run)


# -- traffic -----------------------------------------------------------------------------------


def bytes_per_worker_step(frame: pd.DataFrame, run: str | None = None) -> float:
    """Mean bytes a worker sent per training step."""
    return float(_train(frame, run)["bytes_sent"].mean())


def server_bytes_per_round(frame: pd.DataFrame, run: str | None = None) -> float:
    """Bytes through the busiest server (sent + received) per round (one step of every worker);
    NaN for runs without servers."""
    rows = _rows(frame, run)
    servers = rows[rows["kind"] == "server"]
    train = rows[rows["kind"] == "train"]
    if servers.empty or train.empty:
        return math.nan
    per_server = servers["bytes_sent"].fillna(0) + servers["bytes_received"].fillna(0)
    rounds = len(train) / float(train["world_size"].iloc[0])
    return float(per_server.max() / rounds)


def servers_of(frame: pd.DataFrame, run: str | None = None) -> int:
    """How many servers a run hosted (its ``kind="server"`` rows)."""
    rows = _rows(frame, run)
    return int(rows.loc[rows["kind"] == "server", "rank"].nunique())


# -- tables ------------------------------------------------------------------------------------


def is_traffic_run(label: str) -> bool:
    return label.startswith(f"{TRAFFIC} · ")


def topology_of(cfg: ExperimentConfig) -> str | None:
    """The topology a run's workers talk along (None for methods without one)."""
    return cfg.resolved_topology if families.has(cfg.strategy, "takes_topology") else None


def method_label(cfg: ExperimentConfig) -> str:
    """``strategy`` plus the topology's kind where it has one: "nnt ring", "ps-sync"."""
    spec = topology_of(cfg)
    return f"{cfg.strategy} {parse(spec, cfg.workers)[0]}" if spec else cfg.strategy


def _run_record(frame: pd.DataFrame, cfg: ExperimentConfig, model_bytes: float) -> dict:
    rows = frame[frame["run"] == cfg.label]
    return {
        "run": cfg.label,
        "strategy": cfg.strategy,
        "runtime": cfg.runtime,
        "workers": cfg.workers,
        "topology": topology_of(cfg),
        "servers": servers_of(rows),
        "bytes_per_worker_step": bytes_per_worker_step(rows),
        "server_bytes_per_round": server_bytes_per_round(rows),
        "model_bytes": model_bytes,
    }


Baseline = Callable[[ExperimentConfig], float]


def comparison_table(
    results: Any,
    *,
    one_worker_time: Baseline | None = None,
    model_bytes: Baseline | None = None,
) -> pd.DataFrame:
    """One row per run of ``results`` (a :class:`~scaledl_lab.experiment.Results`; traffic-sweep
    runs left out): accuracy (best-on-val worker, mean, spread), steady-state time per epoch,
    speed-up over one worker, bytes per worker per step, server traffic, staleness and straggler
    slowdown (time per epoch with the straggler over the same run without).

    The speed-up's one-worker time per epoch is measured where the table has a one-worker run
    of the same runtime (the real runs), else ``one_worker_time(cfg)`` (the simulator's, from its
    cost model), else NaN. ``model_bytes(cfg)`` (the size of one gradient) fills ``model_bytes``.
    """
    frame = results.frame
    configs = [c for c in results.configs if not is_traffic_run(c.label)]
    records = []
    for cfg in configs:
        rows = frame[frame["run"] == cfg.label]
        scores = final_scores(rows)
        record = _run_record(frame, cfg, model_bytes(cfg) if model_bytes else math.nan)
        record.update(
            straggler=bool(cfg.stragglers),
            stragglers=cfg.stragglers,
            optimizer=cfg.optimizer,
            lr=cfg.lr,
            seed=cfg.seed,
            val_acc_best_worker=scores["val"],
            test_acc_best_worker=scores["best"],
            test_acc_best_on_test=scores["best_on_test"],
            test_acc_mean=scores["mean"],
            test_acc_spread=scores["spread"],
            test_acc_std=scores["std"],
            best_rank=scores["best_rank"],
            time_per_epoch_s=time_per_epoch(rows),
            staleness=float(_train(rows)["staleness"].astype(float).mean()),
        )
        records.append(record)
    table = pd.DataFrame(records)
    if table.empty:
        return table
    table["speedup_vs_1_worker"] = [
        speedup(frame, _one_worker_time(table, cfg, one_worker_time), run=cfg.label)
        for cfg in configs
    ]
    table["straggler_slowdown"] = [_slowdown(table, r) for r in records]
    table["others_rate_kept"] = [_rate_kept(frame, table, r) for r in records]
    return table


def _same_setting(table: pd.DataFrame, r: dict) -> pd.Series:
    return (
        (table["strategy"] == r["strategy"])
        & (table["runtime"] == r["runtime"])
        & (table["workers"] == r["workers"])
        & (table["topology"].fillna("") == (r["topology"] or ""))
    )


def _one_worker_time(table: pd.DataFrame, cfg: ExperimentConfig, model: Baseline | None) -> float:
    ones = table[(table["runtime"] == cfg.runtime) & (table["workers"] == 1) & ~table["straggler"]]
    if not ones.empty:
        return float(ones["time_per_epoch_s"].iloc[0])
    return model(cfg) if model is not None and cfg.runtime == "sim" else math.nan


def _slowdown(table: pd.DataFrame, r: dict) -> float:
    if not r["straggler"]:
        return math.nan
    even = table.loc[_same_setting(table, r) & ~table["straggler"], "time_per_epoch_s"]
    return r["time_per_epoch_s"] / float(even.iloc[0]) if len(even) else math.nan


def _rate_kept(frame: pd.DataFrame, table: pd.DataFrame, r: dict) -> float:
    """With a straggler: the lowest, over the workers that are not slowed, of their step rate
    (:func:`step_rates`) over their rate in the same run without it (1: not held back)."""
    if not r["straggler"]:
        return math.nan
    even = table.loc[_same_setting(table, r) & ~table["straggler"], "run"]
    if even.empty:
        return math.nan
    slow = set(Stragglers.parse(r["stragglers"]).slow)
    with_, without = step_rates(frame, r["run"]), step_rates(frame, even.iloc[0])
    ranks = [k for k in with_.index if k not in slow and k in without.index]
    return float((with_[ranks] / without[ranks]).min()) if ranks else math.nan


def traffic_table(results: Any, *, model_bytes: Baseline | None = None) -> pd.DataFrame:
    """One row per traffic-sweep run (see :func:`scaledl_lab.studies.scaling.traffic_configs`):
    method, workers, bytes a worker sends per step, bytes through the busiest server per round."""
    configs = [c for c in results.configs if is_traffic_run(c.label)]
    records = []
    for cfg in configs:
        record = _run_record(results.frame, cfg, model_bytes(cfg) if model_bytes else math.nan)
        records.append({"method": method_label(cfg), **record})
    columns = ["method", "run", "strategy", "runtime", "workers", "topology", "servers"]
    columns += ["bytes_per_worker_step", "server_bytes_per_round", "model_bytes"]
    return pd.DataFrame(records, columns=columns)


# -- the same run on another processor -------------------------------------------------------


def drift_band(drift: pd.DataFrame, case: str, run: str, metric: str = "test_acc") -> tuple:
    """Where a run's ``metric`` lands on any processor, from the drift study's ``drift.csv``
    (``benchmarks/kernel_drift.py``): the mean of its draws (each seed on each CPU kernel set)
    ± four of their standard deviations. A run on another processor is one more draw, and the
    band is as wide as the distribution: narrow for a synchronous run, wide for a chaotic one.
    Four sd hold every draw (of 15, none lies past √14 ≈ 3.7 sd) and miss 1 in 16,000 normal ones.
    """
    rows = drift[(drift["case"] == case) & (drift["run"] == run) & (drift["metric"] == metric)]
    if len(rows) != 1:
        raise KeyError(f"the drift study has no {metric!r} for run {run!r} of case {case!r}")
    r = rows.iloc[0]
    return float(r["mean"]) - 4 * float(r["sd"]), float(r["mean"]) + 4 * float(r["sd"])
