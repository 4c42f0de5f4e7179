"""The sequential twin of an asynchronous parameter server: the order in which the server
applied the workers' pushes, rebuilt from a run's metrics table (``server_push_order``), and
the server's parameters recomputed push by push in one process (``replay_async_server``)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...config import ExperimentConfig
from ...data import DataSplits
from ...training.reference import Gradients, check_plain_sgd, one_thread, worker_batches
from .workers import VARIANTS


def server_push_order(train: Any, *, n_fetch: int = 1, n_push: int = 1) -> list[int]:
    """The order in which one asynchronous parameter server applied the workers' pushes,
    rebuilt from a run's ``kind="train"`` rows (columns rank, step, staleness).

    A worker pulls version 0 first. Its push at local step k (k a multiple of ``n_push``) was
    applied as the server's update number s = v + τ, where τ is the row's staleness and v the
    version the worker last fetched; a push that also fetches (k a multiple of ``n_fetch``)
    gets back version s + 1. A dropped push (after the run's end) has τ = NaN. Returns the
    pushing rank of update 0, 1, 2, ...; raises AssertionError if the rows do not describe one
    sequence of updates (two pushes claiming one slot, or a gap).

    Only when every fetch is also a push (``n_push`` divides ``n_fetch``) is v known: a pull on
    its own returns a version that the table does not record.
    """
    if n_fetch % n_push:
        raise ValueError(
            f"n_fetch={n_fetch} is not a multiple of n_push={n_push}: the version a pull-only "
            "step fetched is not in the metrics table, so the order cannot be rebuilt"
        )
    slots: dict[int, int] = {}
    for rank, rows in train.sort_values("step").groupby("rank"):
        version = 0
        for step, staleness in zip(rows["step"], rows["staleness"], strict=True):
            if step % n_push or math.isnan(staleness):
                continue
            assert staleness == int(staleness) >= 0, (rank, step, staleness)
            slot = version + int(staleness)
            assert slot not in slots, f"update {slot} claimed by ranks {slots[slot]} and {rank}"
            slots[slot] = int(rank)
            if step % n_fetch == 0:
                version = slot + 1
    assert sorted(slots) == list(range(len(slots))), "the updates do not form one sequence"
    return [slots[s] for s in range(len(slots))]


@one_thread()
def replay_async_server(
    cfg: ExperimentConfig, data: DataSplits, order: list[int]
) -> dict[str, Any]:
    """One parameter server applying the pushes of ``order`` (ranks, in the order applied),
    recomputed in one process; returns the server's final weights as a state_dict.

    Worker r starts from the initial weights w_0 and draws its own batches epoch after epoch.
    For each push it takes ``n_push`` local steps (Downpour: each gradient also steps its
    replica, w ← w − lr·g) and pushes their sum; the server's update number s applies it with
    SGD (momentum μ: m ← μ·m + g + wd·w; w ← w − lr_s·m) where lr_s = lr, or for
    ``staleness-aware`` lr / max(1, τ) with τ = s − (version r last fetched). A push at a step
    that is a multiple of ``n_fetch`` fetches the weights w_{s+1} into r's replica.
    """
    check_plain_sgd(cfg, "parameter-server")
    if cfg.servers != 1:
        raise ValueError("the replay models one server (the shards' updates are elementwise)")
    grad = Gradients(cfg, data)
    variant = VARIANTS.get(cfg.strategy)
    downpour = variant is not None and variant.exchange == "downpour"
    n_fetch, n_push = (cfg.n_fetch, cfg.n_push) if downpour else (1, 1)
    scaled = variant is not None and variant.rule == "staleness-aware"
    local = n_fetch > 1 or n_push > 1
    w = grad.initial()
    m: torch.Tensor | None = None
    replica = [w.clone() for _ in range(cfg.workers)]
    fetched = [0] * cfg.workers
    steps = [0] * cfg.workers
    streams = [worker_batches(cfg, data, r) for r in range(cfg.workers)]
    for slot, r in enumerate(order):
        pushed = torch.zeros_like(w)
        for _ in range(n_push):
            g = grad(replica[r], next(streams[r]))
            pushed = pushed + g
            if local:
                replica[r] = replica[r] - cfg.lr * g
            steps[r] += 1
        staleness = slot - fetched[r]
        lr = cfg.lr / max(1, staleness) if scaled else cfg.lr
        d = pushed + cfg.weight_decay * w
        m = d if m is None else cfg.momentum * m + d
        w = w - lr * (m if cfg.momentum else d)
        if steps[r] % n_fetch == 0:
            replica[r], fetched[r] = w.clone(), slot + 1
    return grad.state_dict(w)
