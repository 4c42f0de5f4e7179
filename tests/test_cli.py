"""The `scaledl-lab` command: list, data info, run end to end, clear errors."""

from __future__ import annotations

import json

import pandas as pd

from scaledl_lab.cli import main
from scaledl_lab.experiment import METRIC_COLUMNS, Results


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "allreduce-naive" in out and "fashion-mnist" in out and "resnet18" in out
    assert "strategies (planned):" in out and "nnt" in out


def test_data_info(capsys):
    assert main(["data", "info"]) == 0
    out = capsys.readouterr().out
    assert "fashion-mnist: found in" in out


def test_data_fetch_keeps_what_is_there(capsys):
    assert main(["data", "fetch", "fashion-mnist"]) == 0
    assert "fashion-mnist: already present in" in capsys.readouterr().out


def test_bad_config_exits_with_message(capsys):
    assert main(["run", "--model", "vgg"]) == 1
    err = capsys.readouterr().err
    assert "scaledl-lab: error: model='vgg' is unknown; allowed:" in err


def test_unknown_benchmark(capsys):
    assert main(["bench", "nope"]) == 2
    assert (
        "unknown benchmark 'nope'; available: async, pipeline, sim_cost, sim_fidelity, "
        "sync_sgd, tensor_parallel" in (capsys.readouterr().err)
    )


def test_run_writes_results_folder(tmp_path, capsys):
    out = tmp_path / "res"
    code = main(
        [
            "run",
            "--strategy",
            "allreduce",
            "--workers",
            "2",
            "--model",
            "mlp",
            "--batch-size",
            "32",
            "--train-subset",
            "1200",
            "--test-subset",
            "300",
            "--max-steps",
            "8",
            "--out",
            str(out),
        ]
    )
    assert code == 0, capsys.readouterr().err
    for name in (
        "metrics.csv",
        "metrics.parquet",
        "config.json",
        "summary.md",
        "accuracy_vs_epoch.png",
        "loss_vs_epoch.png",
        "accuracy_vs_time.png",
        "loss_vs_time.png",
    ):
        assert (out / name).stat().st_size > 0, name
    frame = pd.read_parquet(out / "metrics.parquet")
    assert list(frame.columns) == list(METRIC_COLUMNS)
    assert len(frame[frame.kind == "train"]) == 16
    meta = json.loads((out / "config.json").read_text())
    assert meta["runs"][0]["workers"] == 2 and meta["environment"]["versions"]["torch"]
    assert "| allreduce-dask-2w |" in (out / "summary.md").read_text()
    loaded = Results.load(out)
    assert loaded.configs[0].max_steps == 8 and len(loaded.frame) == len(frame)
