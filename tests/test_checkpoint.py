"""Checkpoints and resume: a resumed run continues exactly where the checkpoint left it."""

from __future__ import annotations

import pandas as pd
import pytest
from common import SMALL, partial_of

from scaledl_lab import ConfigError, ExperimentConfig, WorkerLostError, run
from scaledl_lab.cli import main
from scaledl_lab.experiment import total_steps
from scaledl_lab.training.checkpoint import latest_step
from scaledl_lab.training.resume import resume

BASE = dict({k: v for k, v in SMALL.items() if k != "max_steps"}, runtime="sim", model="mlp")
COLUMNS = ["rank", "step", "loss", "accuracy"]


def train_rows(frame: pd.DataFrame) -> pd.DataFrame:
    train = frame[frame.kind == "train"][COLUMNS]
    return train.sort_values(["rank", "step"]).reset_index(drop=True)


@pytest.mark.parametrize("strategy", ["allreduce", "dpsgd", "ps-sync"])
def test_one_epoch_resumed_to_two_equals_a_two_epoch_run(strategy, tmp_path):
    cfg = ExperimentConfig(strategy=strategy, workers=4, checkpoint_every="1epochs", **BASE)
    run(cfg, out=tmp_path, progress=False)
    assert latest_step(tmp_path) == total_steps(cfg)
    resumed = resume(tmp_path, epochs=2, progress=False, log=None)
    straight = run(cfg.replace(epochs=2, checkpoint_every=None), progress=False)
    assert train_rows(resumed.frame).equals(train_rows(straight.frame))
    saved = pd.read_csv(tmp_path / "metrics.csv")  # appended, then the summary drawn again
    assert train_rows(saved).step.max() == total_steps(cfg.replace(epochs=2))
    summary = (tmp_path / "summary.md").read_text()
    assert f"| {strategy}-sim-4w | {strategy} | sim | 4 | 2 |" in summary


def test_a_run_stopped_by_a_dead_worker_says_where_its_checkpoint_is_and_resumes(tmp_path):
    cfg = ExperimentConfig(strategy="allreduce", workers=2, checkpoint_every=4, **BASE)
    with pytest.raises(WorkerLostError, match=r"metrics so far are in .*metrics.csv, the config "
                       r"in config.json, the last checkpoint \(step 8\) in"):  # fmt: skip
        run(cfg.replace(faults="kill:1:10"), out=tmp_path / "r", progress=False)
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
    run(ExperimentConfig(**BASE, max_steps=2), out=tmp_path, progress=False)
    with pytest.raises(ConfigError, match=r"holds no checkpoint .*--checkpoint-every"):
        resume(tmp_path, progress=False)
    assert main(["resume", str(tmp_path / "nowhere")]) == 1
    assert "holds no checkpoint" in capsys.readouterr().err


def test_resume_of_a_finished_run_asks_for_more_epochs(tmp_path):
    cfg = ExperimentConfig(checkpoint_every="1epoch", **BASE, max_steps=3)
    run(cfg, out=tmp_path, progress=False)
    with pytest.raises(ConfigError, match=r"at step 3, the end of a run of 1 epoch\(s\)"):
        resume(tmp_path, progress=False)


def test_a_resumed_dask_run_continues_from_the_checkpoint_step(tmp_path):
    from scaledl_lab.runtime.dask.cluster import connect

    cfg = ExperimentConfig(strategy="allreduce", workers=2, checkpoint_every=5,
                           **{**BASE, "runtime": "dask", "max_steps": 10})  # fmt: skip
    with connect(2, dashboard=False, log=None) as client:
        with pytest.raises(WorkerLostError, match=r"the last checkpoint \(step 5\)"):
            run(cfg.replace(faults="kill:1:7"), client=client, out=tmp_path / "r", progress=False)
    with connect(2, dashboard=False, log=None) as client:
        resumed = resume(partial_of(tmp_path / "r"), client=client, progress=False, log=None)
        straight = run(cfg.replace(checkpoint_every=None), client=client, progress=False)
    train = resumed.frame[resumed.frame.kind == "train"]
    assert train.groupby("rank").step.apply(list).tolist() == [list(range(1, 11))] * 2
    assert train_rows(resumed.frame).equals(train_rows(straight.frame))  # gloo sums like this
