"""Defaults that train, and warnings for runs that do not (scaledl_lab.training.health)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from common import SMALL

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.cli import _config_from_args, _parser, main
from scaledl_lab.training import health


def _summary(cfg, acc, loss):
    return pd.DataFrame([{"run": cfg.label, "test_accuracy": acc, "test_loss": loss}])


def test_each_family_gets_defaults_that_train():
    assert health.recommended("nnt") == dict(
        optimizer="adagrad", lr=0.01, momentum=0.0, weight_decay=1e-4
    )  # the paper's NNT setting
    assert health.recommended("nnt-staged")["optimizer"] == "adagrad"
    assert health.recommended("ps-async") == dict(
        optimizer="sgd", lr=0.01, momentum=0.0, weight_decay=0.0
    )
    assert health.recommended("allreduce") == dict(
        optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.0
    )  # the config's own defaults, unchanged


@pytest.mark.parametrize("strategy", ["nnt", "ps-async", "allreduce"])
def test_the_cli_fills_what_is_not_given_from_the_family(strategy):
    argv = ["run", "--strategy", strategy, "--runtime", "sim", "--workers", "4"]
    cfg = _config_from_args(_parser().parse_args(argv))
    assert {k: getattr(cfg, k) for k in health.OPTIMISER_FIELDS} == health.recommended(strategy)
    given = _config_from_args(_parser().parse_args(argv + ["--lr", "0.2", "--momentum", "0"]))
    assert (given.lr, given.momentum) == (0.2, 0.0)
    assert given.optimizer == health.recommended(strategy)["optimizer"]


def test_nnt_near_chance_names_the_gradients_it_applies_per_step():
    cfg = ExperimentConfig(
        strategy="nnt", runtime="sim", workers=16, topology="torus:4x4", model="mlp",
        optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.0,
    )  # fmt: skip
    [warning] = health.run_warnings(_summary(cfg, 0.15 - 1e-9, 11.0), [cfg])
    assert warning == (
        f"run {cfg.label}: ends near chance (15.0% test accuracy; chance is 10%) and its test "
        "loss exploded (11; a uniform guess scores 2.30); likely cause: NNT applies 1 + 4 "
        "gradients per step with the local optimiser (sgd lr 0.05, momentum 0.9), which "
        "multiplies the step size; the paper's setting trains: --optimizer adagrad --lr 0.01 "
        "--momentum 0 --weight-decay 0.0001"
    )


def test_async_ps_whose_loss_explodes_names_staleness():
    cfg = ExperimentConfig(
        strategy="ps-async", runtime="sim", workers=16, model="mlp", lr=0.05, momentum=0.9
    )
    [warning] = health.run_warnings(_summary(cfg, 0.5, 7e33), [cfg])
    assert warning == (
        f"run {cfg.label}: its test loss exploded (7e+33; a uniform guess scores 2.30); likely "
        "cause: with 16 asynchronous workers gradients arrive up to 15 steps stale, and sgd lr "
        "0.05, momentum 0.9 compounds them; try --optimizer sgd --lr 0.01 --momentum 0 "
        "--weight-decay 0"
    )
    assert health.run_warnings(_summary(cfg, 0.5, math.inf), [cfg])  # inf explodes too


def test_a_run_that_trains_gets_no_warning():
    cfg = ExperimentConfig(strategy="allreduce", runtime="sim", model="mlp")
    assert health.run_warnings(_summary(cfg, 0.16, 6.0), [cfg]) == []
    assert health.run_warnings(_summary(cfg, math.nan, math.nan), [cfg]) == []


def test_warnings_reach_the_summary_and_the_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(health, "NEAR_CHANCE", 10.0)  # every run counts as near chance
    argv = [
        "run", "--strategy", "allreduce", "--runtime", "sim", "--workers", "2", "--model", "mlp",
        "--train-subset", "640", "--test-subset", "100", "--max-steps", "3",
        "--out", str(tmp_path / "res"),
    ]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "warning: run allreduce-sim-2w: ends near chance (" in out
    # 3 steps on the family's own setting: the warning does not send the user back to it
    assert "likely cause: it already uses its family's setting (sgd lr 0.05, momentum 0.9)" in out
    summary = (tmp_path / "res" / "summary.md").read_text()
    assert "\n## Warnings\n\n- run allreduce-sim-2w: ends near chance (" in summary
    res = run(ExperimentConfig(strategy="allreduce", runtime="sim", model="mlp", **SMALL))
    monkeypatch.setattr(health, "NEAR_CHANCE", 1.5)
    assert res.warnings() == []


def test_a_run_already_on_its_family_setting_is_not_told_to_use_it():
    fix = health.recommended("nnt")
    cfg = ExperimentConfig(strategy="nnt", runtime="sim", workers=4, topology="ring", **fix)
    [warning] = health.run_warnings(_summary(cfg, 0.1, 2.3), [cfg])
    assert warning.endswith(
        "likely cause: it already uses its family's setting (adagrad lr 0.01, weight decay "
        "0.0001); too few steps or samples to learn (a tiny or one-epoch run), or a learning "
        "rate too large for this model: try more epochs or data, or a smaller --lr"
    )
    assert "--optimizer" not in warning
