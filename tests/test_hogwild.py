"""Hogwild!: one worker is plain SGD; several share one parameter vector without locks."""

from __future__ import annotations

import pytest
import torch
from common import SMALL, max_diff

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.strategies import get_strategy
from scaledl_lab.strategies.parameter_server.hogwild import share_parameters
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for, steps_per_epoch_of


def test_parameters_become_views_of_the_shared_vector():
    model = build_model("mlp", (1, 28, 28), 10, seed=0)
    before = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    flat = before.clone()
    share_parameters(model, flat)
    assert torch.equal(torch.nn.utils.parameters_to_vector(model.parameters()), before)
    flat.zero_()  # another worker's write is seen by this model at once
    assert all((p == 0).all() for p in model.parameters())
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # and this model's writes land in the vector
    assert flat[0] == 1.0 and flat.sum() == next(model.parameters()).numel()
    with pytest.raises(ValueError, match="shared vector has 3 elements"):
        share_parameters(model, torch.zeros(3))


def test_hogwild_tolerates_worker_loss():
    assert get_strategy("hogwild").tolerates_worker_loss
    assert get_strategy("hogwild").servers is None


def test_one_worker_equals_plain_sgd_on_sim():
    cfg = ExperimentConfig(strategy="hogwild", runtime="sim", workers=1, model="mlp", **SMALL)
    res = run(cfg, progress=False)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-6


def test_many_workers_share_one_vector_on_sim():
    n = 8
    # Evaluation is made negligible (rank 0 evaluates alone and would lag the others).
    small = {**SMALL, "momentum": 0.0, "train_subset": n * 640, "val_size": 0, "test_subset": 32}
    cfg = ExperimentConfig(strategy="hogwild", runtime="sim", workers=n, model="mlp", **small)
    res = run(cfg, progress=False)
    train = res.frame[res.frame.kind == "train"]
    target = n * min(steps_per_epoch_of(cfg), 20)
    # Exactly the run's worth of updates, all recorded with their staleness.
    assert len(train) == target and train.staleness.notna().all()
    assert sum(res.outputs[cfg.label][0]["updates"]) == target
    # Homogeneous workers: after the first round, each sees the n - 1 others' updates.
    assert abs(train.staleness.mean() - (n - 1)) <= 0.05 * (n - 1)
    assert set(train.sort_values("time").staleness.iloc[n:]) == {n - 1}
    # Every worker ends with the same (shared) parameters, and training moved them.
    assert max_diff(res.state_dict(rank=0), res.state_dict(rank=n - 1)) == 0
    assert train.loss.iloc[-n:].mean() < train.loss.iloc[:n].mean()


def test_one_worker_equals_plain_sgd_on_dask(client):
    cfg = ExperimentConfig(strategy="hogwild", workers=1, model="mlp", **SMALL)
    res = run(cfg, client=client, progress=False)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-6


def test_two_processes_share_memory_on_dask(client):
    cfg = ExperimentConfig(
        strategy="hogwild",
        workers=2,
        model="mlp",
        **{**SMALL, "train_subset": 20000, "max_steps": 300, "momentum": 0.0},
    )
    res = run(cfg, client=client, progress=False)
    frame = res.frame
    train = frame[frame.kind == "train"]
    target = 2 * 300
    updates = res.outputs[cfg.label][0]["updates"]
    # Both processes wrote into one vector: their counters add up to the run's updates (a
    # fresh worker process warms up for a while, so the run is long enough for both to join).
    assert sum(updates) == pytest.approx(target, abs=1) and min(updates) > 0
    assert train.staleness.notna().all() and train.staleness.mean() > 0
    test = frame[frame.kind == "test"]
    assert test.accuracy.iloc[-1] > test.accuracy.iloc[0] + 0.2
