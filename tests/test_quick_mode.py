"""Quick mode (``SCALEDL_QUICK=1``) runs on every dataset, through the API and the CLI."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.config import quick
from scaledl_lab.data import standard_sizes, write_cifar10_fixture


@pytest.fixture(scope="module")
def cifar_dir(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("cifar10")
    write_cifar10_fixture(root, n_per_batch=40)  # 200 training and 40 test images
    return str(root)


def _dataset_config(dataset: str, cifar_dir: str) -> ExperimentConfig:
    base = dict(strategy="allreduce", runtime="sim", workers=2, epochs=5, batch_size=16)
    if dataset == "fashion-mnist":
        return ExperimentConfig(dataset=dataset, model="mlp", **base)
    if dataset == "mnist1d":
        return ExperimentConfig(dataset=dataset, model="cnn1d", **base)
    # A fixture smaller than the real data set: quick mode keeps the explicit subsets.
    return ExperimentConfig(
        dataset=dataset,
        model="cnn",
        data_dir=cifar_dir,
        train_subset=150,
        test_subset=40,
        val_size=20,
        **base,
    )


@pytest.mark.parametrize("dataset", ["fashion-mnist", "mnist1d", "cifar10"])
def test_quick_config_fits_the_dataset_and_runs(dataset, cifar_dir):
    cfg = quick(_dataset_config(dataset, cifar_dir))
    n_train, n_test = standard_sizes(dataset)
    assert cfg.epochs <= 2
    assert cfg.train_subset + cfg.val_size <= n_train and cfg.test_subset <= n_test
    res = run(cfg.replace(max_steps=3), progress=False)
    frame = res.frame
    assert (frame.query("kind == 'train'").groupby("rank").size() == 3).all()
    test = frame.query("kind == 'test'")
    assert set(test["samples"]) == {cfg.test_subset}


def test_quick_mnist1d_asks_for_no_more_test_samples_than_it_has(cifar_dir):
    # It used to ask for 5000 of MNIST-1D's 4000: "test_subset=5000 must be in [1, 4000]".
    cfg = quick(_dataset_config("mnist1d", cifar_dir))
    assert cfg.test_subset == 4000


def test_quick_keeps_smaller_explicit_subsets(cifar_dir):
    cfg = quick(_dataset_config("cifar10", cifar_dir))
    assert (cfg.train_subset, cfg.test_subset, cfg.val_size) == (150, 40, 20)


def test_cli_run_in_quick_mode_on_mnist1d(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SCALEDL_QUICK", "1")
    out = tmp_path / "res"
    argv = [
        "run", "--dataset", "mnist1d", "--model", "cnn1d", "--runtime", "sim",
        "--workers", "2", "--epochs", "5", "--batch-size", "16", "--max-steps", "3",
        "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    cfg = json.loads((out / "config.json").read_text())["runs"][0]
    # --epochs is run as typed (quick mode shrinks the defaults only): max_steps ends it
    assert cfg["dataset"] == "mnist1d" and cfg["epochs"] == 5 and cfg["test_subset"] == 4000
    frame = pd.read_csv(out / "metrics.csv")
    assert len(frame.query("kind == 'train'")) == 2 * 3
    assert f"results written to {out}" in capsys.readouterr().out
