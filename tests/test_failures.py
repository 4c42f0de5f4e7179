"""Failures end runs cleanly: a dead worker, a missing dataset, too few workers."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from common import partial_of

from scaledl_lab import ConfigError, ExperimentConfig, WorkerLostError, run
from scaledl_lab.data import DatasetNotFoundError
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.runtime.dask.driver import worker_addresses


def test_killed_worker_ends_run_with_clear_error_and_partial_metrics(tmp_path):
    cfg = ExperimentConfig(
        strategy="allreduce",
        workers=2,
        model="mlp",
        train_subset=20000,
        test_subset=500,
        val_size=500,
        batch_size=16,
        epochs=5,
        timeout_s=20,
    )
    with connect(2, dashboard=False, log=None) as client:
        pids = client.run(os.getpid)
        victim = worker_addresses(client)[1]
        training = threading.Event()

        def on_rows(batch):
            if any(r["kind"] == "train" for r in batch):
                training.set()

        def kill_when_training():
            if training.wait(120):
                os.kill(pids[victim], signal.SIGKILL)

        threading.Thread(target=kill_when_training, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(
            WorkerLostError,
            match=rf"worker {victim} \(rank 1\) died during run "
            r"'allreduce-dask-2w'.*metrics so far are in",
        ):
            run(cfg, client=client, out=tmp_path / "r", on_rows=on_rows, progress=False)
        assert time.monotonic() - started < 90
    lines = (partial_of(tmp_path / "r") / "metrics.csv").read_text().splitlines()
    assert lines[0].startswith("run,strategy,runtime")
    assert len(lines) > 2


def test_missing_dataset_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEDL_DATA_DIR", str(tmp_path))
    cfg = ExperimentConfig(dataset="cifar10", model="mlp", data_dir=str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match=r"scaledl-lab data fetch cifar10"):
        run(cfg, progress=False)


def test_cluster_with_too_few_workers(client):
    cfg = ExperimentConfig(workers=3, model="mlp", oversubscribe=True, train_subset=600)
    with pytest.raises(ConfigError, match=r"workers=3 but the cluster has only 2 worker\(s\)"):
        run(cfg, client=client, progress=False)
