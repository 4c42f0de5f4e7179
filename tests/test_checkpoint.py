"""Checkpoints and resume: a resumed run continues exactly where the checkpoint left it."""

from __future__ import annotations

import json
import re
import shutil

import pandas as pd
import pytest
from common import SMALL, partial_of

from scaledl_lab import ConfigError, ExperimentConfig, WorkerLostError, run
from scaledl_lab.cli import main
from scaledl_lab.experiment import total_steps
from scaledl_lab.resume import resume
from scaledl_lab.training.checkpoint import latest_step

BASE = dict({k: v for k, v in SMALL.items() if k != "max_steps"}, runtime="sim", model="mlp")
COLUMNS = ["rank", "step", "loss", "accuracy"]


def train_rows(frame: pd.DataFrame) -> pd.DataFrame:
    train = frame[frame.kind == "train"][COLUMNS]
    return train.sort_values(["rank", "step"]).reset_index(drop=True)


# Every strategy that checkpoints. DiLoCo's period does not divide the 18 steps of an epoch,
# so the first run ends with a closing round (its one model) that the longer run does not make.
RESUMABLE = {
    "allreduce": {}, "dpsgd": {}, "ps-sync": {},
    "diloco": dict(sync_period=4, optimizer="adamw", lr=1e-3),
}  # fmt: skip


def table(path) -> pd.DataFrame:
    """A saved metrics table in a fixed row order (a resumed run appends in arrival order),
    without the servers' summary rows."""
    frame = pd.read_csv(path).query("kind != 'server'")
    keys = ["run", "kind", "rank", "step", "epoch"]
    return frame.sort_values(keys, kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("strategy", list(RESUMABLE))
def test_one_epoch_resumed_to_two_equals_a_two_epoch_run(strategy, tmp_path):
    """Column by column, times, bytes and evaluations included (the simulator's clocks go on
    from the checkpoint's), against the same run with its checkpoints (a parameter server's
    take time: barriers and a call), uninterrupted. Not the servers' summary rows: each run
    reports the calls its servers answered."""
    options = {**BASE, **RESUMABLE[strategy]}
    # Every 6 steps: DiLoCo's checkpoints fall both inside its period (steps 6, 18) and at its
    # end (12); each straight epoch takes three.
    cfg = ExperimentConfig(strategy=strategy, workers=4, checkpoint_every=6, **options)
    run(cfg, out=tmp_path / "resumed", progress=False, figures=False)
    assert latest_step(tmp_path / "resumed") == total_steps(cfg) == 18
    resumed = resume(tmp_path / "resumed", epochs=2, progress=False, log=None)
    straight = run(cfg.replace(epochs=2), out=tmp_path / "straight", progress=False, figures=False)
    assert train_rows(resumed.frame).equals(train_rows(straight.frame))
    saved, whole = (table(tmp_path / d / "metrics.csv") for d in ("resumed", "straight"))
    pd.testing.assert_frame_equal(saved, whole, check_exact=True)  # bit for bit
    assert train_rows(saved).step.max() == total_steps(cfg.replace(epochs=2))
    summary = (tmp_path / "resumed" / "summary.md").read_text()
    assert f"| {strategy}-sim-4w | {strategy} | sim | 4 | 2 |" in summary


def test_a_run_stopped_by_a_dead_worker_says_where_its_checkpoint_is_and_resumes(tmp_path):
    cfg = ExperimentConfig(strategy="allreduce", workers=2, checkpoint_every=4, **BASE)
    with pytest.raises(WorkerLostError, match=r"metrics so far are in .*metrics.csv, the config "
                       r"in config.json, the last checkpoint \(step 8\) in"):  # fmt: skip
        run(cfg.replace(faults="kill:1:10"), out=tmp_path / "r", progress=False, figures=False)
    partial = partial_of(tmp_path / "r")  # beside where a finished run would be
    assert (partial / "config.json").exists()
    assert sorted(p.name for p in (partial / "checkpoint").iterdir()) == ["latest.json", "step8"]
    resumed = resume(partial, progress=False, log=None)  # the resumed run injects no fault
    straight = run(cfg.replace(checkpoint_every=None), progress=False)
    assert train_rows(resumed.frame).equals(train_rows(straight.frame))
    assert not list(tmp_path.rglob("*.tmp"))  # every file landed whole


@pytest.mark.parametrize("every", [0, -3, "0epochs", "2 weeks", True])
def test_bad_checkpoint_every_is_refused(every):
    with pytest.raises(ConfigError, match=r"checkpoint_every=.* must be a positive number"):
        ExperimentConfig(checkpoint_every=every, **BASE)


def test_checkpoints_need_a_strategy_with_a_quiet_point_and_a_folder():
    with pytest.raises(ConfigError, match=r"does not apply to strategy='nnt'"):
        ExperimentConfig(strategy="nnt", checkpoint_every=5, **BASE)
    with pytest.raises(ConfigError, match=r"needs one run and a results folder"):
        run(ExperimentConfig(checkpoint_every=5, **BASE), progress=False)


def test_resume_without_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    run(ExperimentConfig(**BASE, max_steps=2), out=tmp_path, progress=False, figures=False)
    with pytest.raises(ConfigError, match=r"holds no checkpoint .*--checkpoint-every"):
        resume(tmp_path, progress=False)
    assert main(["resume", str(tmp_path / "nowhere")]) == 1
    assert "holds no checkpoint" in capsys.readouterr().err


def test_resume_of_a_finished_run_asks_for_more_epochs(tmp_path):
    cfg = ExperimentConfig(checkpoint_every="1epoch", **BASE, max_steps=3)
    run(cfg, out=tmp_path, progress=False, figures=False)
    with pytest.raises(ConfigError, match=r"at step 3, the end of a run of 1 epoch\(s\)"):
        resume(tmp_path, progress=False)


def test_a_resumed_dask_run_continues_from_the_checkpoint_step(tmp_path):
    from scaledl_lab.runtime.dask.cluster import connect

    cfg = ExperimentConfig(strategy="allreduce", workers=2, checkpoint_every=5,
                           **{**BASE, "runtime": "dask", "max_steps": 10})  # fmt: skip
    with connect(2, dashboard=False, log=None) as client:
        with pytest.raises(WorkerLostError, match=r"the last checkpoint \(step 5\)"):
            run(
                cfg.replace(faults="kill:1:7"),
                client=client,
                out=tmp_path / "r",
                progress=False,
                figures=False,
            )
    with connect(2, dashboard=False, log=None) as client:
        resumed = resume(partial_of(tmp_path / "r"), client=client, progress=False, log=None)
        straight = run(cfg.replace(checkpoint_every=None), client=client, progress=False)
    train = resumed.frame[resumed.frame.kind == "train"]
    assert train.groupby("rank").step.apply(list).tolist() == [list(range(1, 11))] * 2
    assert train_rows(resumed.frame).equals(train_rows(straight.frame))  # gloo sums like this


# -- resume reads nothing damaged: every file checked, the damaged one named ------------------


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """A finished 1-epoch run (4 steps per worker) with its checkpoint of step 4."""
    out = tmp_path_factory.mktemp("saved") / "run"
    small = dict(BASE, train_subset=256, val_size=64, test_subset=64)
    cfg = ExperimentConfig(strategy="allreduce", workers=2, checkpoint_every=2, **small)
    run(cfg, out=out, progress=False, figures=False)
    assert latest_step(out) == total_steps(cfg) == 4
    return out


@pytest.fixture
def copy_of(saved_run, tmp_path):
    return shutil.copytree(saved_run, tmp_path / "run")


def refused(folder, capsys) -> str:
    """``resume FOLDER --epochs 2``'s one-line error (exit code 1), before any work."""
    assert main(["resume", str(folder), "--epochs", "2"]) == 1
    out, err = capsys.readouterr()
    assert err.startswith("scaledl-lab: error: ") and err.count("\n") == 1, err
    assert "resuming" not in out
    return err


def test_the_damage_tests_start_from_a_folder_that_resumes(copy_of):
    resumed = resume(copy_of, epochs=2, progress=False, log=None)
    assert train_rows(resumed.frame).step.max() == 8


@pytest.mark.parametrize("cut", ["rows", "mid-row"])
def test_a_truncated_metrics_table_is_refused(copy_of, capsys, cut):
    path = copy_of / "metrics.csv"
    lines = path.read_bytes().splitlines(keepends=True)
    frame = pd.read_csv(path)
    if cut == "rows":  # the last rows gone, at a row's end: the step-4 rows among them
        first = int((frame.step == 4).to_numpy().nonzero()[0][0]) + 1  # the header is line 0
        path.write_bytes(b"".join(lines[:first]))
        message = r"has 3 train rows up to step 3 for rank \d, but the checkpoint is at step 4"
    else:
        path.write_bytes(b"".join(lines)[:-7])
        message = "ends in the middle of a row: the file is truncated"
    err = refused(copy_of, capsys)
    assert f"{path} " in err and re.search(message, err), err


def test_a_metrics_table_with_other_columns_is_refused(copy_of, capsys):
    path = copy_of / "metrics.csv"
    pd.read_csv(path).rename(columns={"time": "seconds"}).to_csv(path, index=False)
    err = refused(copy_of, capsys)
    assert (
        f"{path} has other columns than a run writes (missing: ['time']; unknown: ['seconds'])"
        in err
    )


@pytest.mark.parametrize("damage", ["truncated", "not a checkpoint"])
def test_a_damaged_checkpoint_file_is_refused(copy_of, capsys, damage):
    path = copy_of / "checkpoint" / "step4" / "rank0.pt"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"\x00" * 64)
    err = refused(copy_of, capsys)
    assert f"{path} does not load (" in err and "the file is damaged" in err


@pytest.mark.parametrize("name", ["config.json", "checkpoint/latest.json"])
def test_bad_json_is_refused_with_its_file(copy_of, capsys, name):
    path = copy_of / name
    path.write_text(path.read_text()[:-5])
    err = refused(copy_of, capsys)
    assert f"{path} is not valid JSON (" in err


def test_a_checkpoint_of_another_config_is_refused(copy_of, capsys):
    """As when another run wrote config.json over the folder after the checkpoint."""
    path = copy_of / "config.json"
    saved = json.loads(path.read_text())
    saved["runs"][0]["model"] = "cnn"
    path.write_text(json.dumps(saved))
    err = refused(copy_of, capsys)
    rank0 = copy_of / "checkpoint" / "step4" / "rank0.pt"
    other = f"{rank0} was written by another run than {path} describes: "
    assert other + "model='mlp' there, 'cnn' in config.json" in err
