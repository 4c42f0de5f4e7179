"""Synchronous data parallelism on real Dask workers equals its sequential twin."""

from __future__ import annotations

import pytest
import torch
from common import SMALL, max_diff

from scaledl_lab import DivergenceError, ExperimentConfig, run
from scaledl_lab.cost import ring_allreduce_bytes
from scaledl_lab.models import build_model, count_parameters
from scaledl_lab.reference import train_sequential
from scaledl_lab.worker import load_for


@pytest.mark.parametrize("model", ["mlp", "cnn"])
@pytest.mark.parametrize("strategy", ["allreduce", "allreduce-naive"])
def test_two_workers_equal_sequential_on_combined_batch(client, model, strategy):
    # float64 removes float32 rounding, so what is left is the algorithm: they must agree.
    cfg = ExperimentConfig(strategy=strategy, workers=2, model=model, precision="float64", **SMALL)
    res = run(cfg, client=client, progress=False)
    reference = train_sequential(cfg, load_for(cfg))
    assert max_diff(res.state_dict(rank=0), reference) < 1e-10
    # The replicas never drift apart: both ranks hold bit-identical parameters.
    assert max_diff(res.state_dict(rank=0), res.state_dict(rank=1)) == 0.0
    # ... and training really moved them.
    init = train_sequential(cfg.replace(max_steps=1, lr=1e-12), load_for(cfg))
    assert max_diff(reference, init) > 1e-3


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_two_workers_equal_sequential_in_float32(client, model):
    """In float32 the two sum gradients in different orders: agree to 1e-5 or to rounding.

    The rounding noise of a run is measured, not assumed: it is how far the float32 sequential
    run itself lies from the exact (float64) one.
    """
    cfg = ExperimentConfig(strategy="allreduce", workers=2, model=model, **SMALL)
    res = run(cfg, client=client, progress=False)
    reference = train_sequential(cfg, load_for(cfg))
    exact = train_sequential(cfg.replace(precision="float64"), load_for(cfg))
    noise = max_diff(reference, exact)
    assert max_diff(res.state_dict(), reference) < max(1e-5, noise)


def test_naive_and_bucketed_agree(client):
    cfg = ExperimentConfig(strategy="allreduce", workers=2, model="cnn", bucket_mb=0.5, **SMALL)
    bucketed = run(cfg, client=client, progress=False).state_dict()
    naive = run(cfg.replace(strategy="allreduce-naive"), client=client, progress=False).state_dict()
    assert max_diff(bucketed, naive) < 1e-6


def test_one_worker_equals_plain_training(client):
    cfg = ExperimentConfig(strategy="allreduce", workers=1, model="mlp", **SMALL)
    res = run(cfg, client=client, progress=False)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-6


def test_metrics_table(client):
    cfg = ExperimentConfig(strategy="allreduce-naive", workers=2, model="mlp", **SMALL)
    frame = run(cfg, client=client, progress=False).frame
    train = frame[frame.kind == "train"]
    assert sorted(train["rank"].unique()) == [0, 1]
    assert (train.groupby("rank").size() == 20).all()
    assert (train["samples"] == 32).all()
    assert (
        train["time"].is_monotonic_increasing
        or (train.groupby("rank")["time"].apply(lambda t: t.is_monotonic_increasing)).all()
    )
    # One flat allreduce per step: every gradient float32 plus the loss, ring cost 2(p-1)/p·n.
    n = count_parameters(build_model("mlp", (1, 28, 28), 10)) + 1
    assert (train["bytes_sent"] == ring_allreduce_bytes(4 * n, 2)).all()
    evals = frame[frame.kind.isin(["val", "test"])]
    assert set(evals["rank"]) == {0}
    assert sorted(evals[evals.kind == "test"]["epoch"]) == [0.0, 20 / 37]
    assert evals[evals.kind == "test"]["samples"].iloc[0] == 400
    assert train["loss"].iloc[-10:].mean() < train["loss"].iloc[:10].mean()


def test_divergence_stops_with_reason(client, tmp_path):
    cfg = ExperimentConfig(strategy="allreduce", workers=2, model="mlp", **{**SMALL, "lr": 1e6})
    with pytest.raises(DivergenceError, match=r"training diverged: loss=(nan|inf)"):
        run(cfg, client=client, progress=False, out=tmp_path)
    assert (tmp_path / "metrics.csv").read_text().count("\n") > 1  # the steps before it


def test_state_dict_is_cpu_tensors(client):
    cfg = ExperimentConfig(
        strategy="allreduce", workers=2, model="mlp", **{**SMALL, "max_steps": 2}
    )
    state = run(cfg, client=client, progress=False).state_dict()
    assert all(isinstance(v, torch.Tensor) and v.device.type == "cpu" for v in state.values())
