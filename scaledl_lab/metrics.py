"""The tidy metrics table: its columns (each means one thing), its rows, and per-worker summaries.

Every run records one row per worker per step or evaluation. Columns:

- ``run``, ``strategy``, ``runtime``, ``world_size``: which run the row belongs to;
- ``rank``: the worker (hosted servers: ``world_size + index``);
- ``kind``: ``train`` (one local step), ``val``/``test`` (an evaluation of the row's model on a
  whole split), ``consensus`` (decentralised runs: how far the replicas are from their average),
  ``server`` (one per hosted server at the end of a run), ``worker-lost`` (a worker died: an
  injected fault records its last step and, in ``samples``, the size of the shard the run
  loses with it; a Dask worker that vanished is recorded when the driver notices, step -1);
- ``epoch`` (progress in epochs: local for synchronous and decentralised methods, global for
  asynchronous ones), ``step`` (local steps taken; -1 on ``server`` rows and on
  ``worker-lost`` rows that belong to no step), ``time`` (seconds since the start:
  wall-clock on Dask, virtual on the simulator);
- ``loss``, ``accuracy``, ``samples``: of the mini-batch (train) or of the split (val/test);
  where workers share a mini-batch (pipelines) only one of them counts its ``samples``;
- ``bytes_sent``: what this worker (or server) sent for that row; ``bytes_received``: servers;
- ``staleness``: asynchronous methods, the age in updates of what was applied;
- ``lr``: the learning rate of that step;
- ``value``: the kind-specific measure of rows that have one (consensus: the consensus
  distance (1/N) Σ_i ||x_i − x̄||²);
- ``calls``: servers, the calls they answered.
- ``effective_batch_size``: train rows, the samples per update of that step as the config sets
  it (workers × batch × accumulate, for every strategy; grown by a batch schedule).
- ``bytes_uncompressed``: train rows of runs with gradient compression, what the row's messages
  would have sent uncompressed (``bytes_sent`` is what they sent): the compression ratio.
- ``mem_params``, ``mem_grads``, ``mem_optim``, ``mem_activations``, ``mem_buffers``: train
  rows of the strategies that keep the memory ledger (allreduce, allreduce-naive, zero1-3):
  the bytes this worker held in that step for parameters, gradients when the optimiser steps,
  optimiser state, the most activations saved for backward alive at once, and the most
  communication buffers alive at once (:mod:`scaledl_lab.training.ledger`).
- ``loss_scale``, ``skipped``: train rows of float16 runs (``precision="float16"``), the loss
  scale S that step's backward multiplied the gradients by, and 1 where the step's update was
  skipped because a gradient overflowed (dynamic scaling halves S then), else 0
  (:mod:`scaledl_lab.training.precision`); NaN in every other run.
- ``moe_dropped``, ``moe_load_max``, ``moe_aux_loss``: train rows of gpt-tiny-moe runs
  (:mod:`scaledl_lab.moe`), that step's share of the routed token-expert assignments dropped
  over capacity, the busiest expert's routed load over the mean load (mean over the MoE
  layers; 1 is even), and the load-balancing loss E·Σ f·P (mean over the layers).
- ``bytes_all_to_all``: train rows of mesh runs with ``ep`` > 1, the bytes of that step's
  all-to-alls that dispatch tokens to the experts' ranks and combine them back (forward and
  backward), a part of ``bytes_sent``.

Columns a row has no value for are NaN.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd
import torch

METRIC_COLUMNS: tuple[str, ...] = (
    "run", "strategy", "runtime", "world_size", "rank", "kind", "epoch", "step", "time",
    "loss", "accuracy", "samples", "bytes_sent", "staleness", "lr", "bytes_received",
    "value", "calls", "effective_batch_size", "bytes_uncompressed",
    "mem_params", "mem_grads", "mem_optim", "mem_activations", "mem_buffers",
    "loss_scale", "skipped", "moe_dropped", "moe_load_max", "moe_aux_loss", "bytes_all_to_all",
)  # fmt: skip

# The events table (pipelines): one row per forward ("F"), backward ("B") or weight gradient
# ("W", zero bubble) of a micro-batch on a stage (on its model ``chunk``, 0 but where a worker
# holds several), with its start and end time; rows reach the driver marked ``table="events"``.
EVENT_COLUMNS: tuple[str, ...] = (
    "run", "rank", "replica", "stage", "step", "micro_batch", "phase", "start", "end", "chunk",
)  # fmt: skip

NAN = float("nan")


@dataclass
class Row:
    """One line of the metrics table, less the run's identity (see :func:`record`)."""

    kind: str
    epoch: float
    step: int
    time: float
    loss: float = NAN
    accuracy: float = NAN
    samples: int = 0
    bytes_sent: int = 0
    staleness: float = NAN
    lr: float = NAN
    bytes_received: float = NAN
    value: float = NAN
    calls: float = NAN
    effective_batch_size: float = NAN
    bytes_uncompressed: float = NAN
    mem_params: float = NAN
    mem_grads: float = NAN
    mem_optim: float = NAN
    mem_activations: float = NAN
    mem_buffers: float = NAN
    loss_scale: float = NAN
    skipped: float = NAN
    moe_dropped: float = NAN
    moe_load_max: float = NAN
    moe_aux_loss: float = NAN
    bytes_all_to_all: float = NAN


def record(
    row: Row, *, run: str, strategy: str, runtime: str, world_size: int, rank: int
) -> dict[str, Any]:
    """The table record of ``row`` for worker ``rank`` of a run."""
    out: dict[str, Any] = {
        "run": run,
        "strategy": strategy,
        "runtime": runtime,
        "world_size": world_size,
        "rank": rank,
    }
    out.update(asdict(row))
    return out


def to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The tidy table, columns in the documented order, rows as logged except that each run's,
    rank's and split's evaluations are in step order (:func:`evaluations_in_step_order`)."""
    return evaluations_in_step_order(pd.DataFrame(list(rows), columns=list(METRIC_COLUMNS)))


def evaluations_in_step_order(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with the val and test rows of each (run, rank, split) in step order, in the
    places those rows held: an evaluation summed only at the end of a run (unbounded NNT's score
    of the start) is logged last, and "the last row is the final score" must still hold."""
    evals = frame[frame["kind"].isin(("val", "test"))]
    keys = [evals["run"], evals["rank"], evals["kind"]]
    if evals.empty or (evals.groupby(keys, sort=False)["step"].diff().dropna() >= 0).all():
        return frame
    group = ["run", "rank", "kind"]
    places = evals.assign(_at=evals.index).sort_values([*group, "_at"], kind="stable")["_at"]
    ordered = evals.sort_values([*group, "step"], kind="stable")
    frame = frame.copy()
    for column in frame.columns:  # column by column: each keeps its dtype
        frame.loc[places.to_numpy(), column] = ordered[column].to_numpy()
    return frame


def is_event(row: dict[str, Any]) -> bool:
    return row.get("table") == "events"


def events_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The events table, columns in the documented order."""
    return pd.DataFrame(list(rows), columns=list(EVENT_COLUMNS))


def compression_ratio(train: pd.DataFrame) -> float:
    """Bytes a run's train rows would have sent uncompressed over what they sent: 1.0 without
    compression (rows without ``bytes_uncompressed`` count as sent), NaN when nothing was sent."""
    sent = float(train["bytes_sent"].sum())
    if sent == 0:
        return NAN
    if "bytes_uncompressed" not in train.columns:
        return 1.0
    return float(train["bytes_uncompressed"].fillna(train["bytes_sent"]).sum()) / sent


def summarise_workers(val: list[float], test: list[float]) -> dict[str, Any]:
    """Best worker on validation (NaN counts as worst; lowest rank on ties), its test accuracy,
    and the mean and spread of the workers' test accuracies. The one best-on-validation rule:
    decentralised workers apply it at the end of a run, the analysis applies it to tables."""
    ranked = [v if not math.isnan(v) else -math.inf for v in val]
    best = max(range(len(val)), key=lambda r: (ranked[r], -r))
    t = torch.tensor(test, dtype=torch.float64)
    if t.isnan().any() and not t.isnan().all():  # workers that died report NaN
        t = t[~t.isnan()]
    return {
        "worker_val_accuracy": list(val),
        "worker_test_accuracy": list(test),
        "best_rank": best,
        "best_test_accuracy": test[best],
        "mean_test_accuracy": float(t.mean()),
        "std_test_accuracy": float(t.std(unbiased=False)),
        "min_test_accuracy": float(t.min()),
        "max_test_accuracy": float(t.max()),
    }
