"""Every dataset and model trains on real Dask workers (MNIST-1D generated, CIFAR-10 fixture)."""

from __future__ import annotations

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.data import write_cifar10_fixture


def test_cifar10_fixture_with_resnet18(client, tmp_path):
    write_cifar10_fixture(tmp_path, n_per_batch=40)
    cfg = ExperimentConfig(
        strategy="allreduce",
        workers=2,
        dataset="cifar10",
        model="resnet18",
        data_dir=str(tmp_path),
        val_size=40,
        batch_size=8,
        max_steps=3,
        lr=0.01,
    )
    frame = run(cfg, client=client, progress=False).frame
    assert (frame[frame.kind == "train"].groupby("rank").size() == 3).all()
    assert frame[frame.kind == "test"]["samples"].iloc[0] == 40


def test_mnist1d_with_cnn1d(client):
    cfg = ExperimentConfig(
        strategy="allreduce-naive",
        workers=2,
        dataset="mnist1d",
        model="cnn1d",
        batch_size=64,
        epochs=2,
        lr=0.05,
        val_size=1000,
    )
    frame = run(cfg, client=client, progress=False).frame
    test = frame[frame.kind == "test"].sort_values("epoch")
    assert test["accuracy"].iloc[-1] > test["accuracy"].iloc[0] + 0.1
