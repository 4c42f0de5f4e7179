"""Inputs the CLI once accepted and then ran wrongly (issue #47, items 6 and 7): each now ends in
one `scaledl-lab: error: ...` line and exit code 1, or runs as typed. Argument checks only:
nothing here trains."""

from __future__ import annotations

import math

import pytest

from scaledl_lab import ConfigError, ExperimentConfig
from scaledl_lab.cli import main
from scaledl_lab.families import OPTIMISER_FIELDS

SIM = ["--runtime", "sim", "--workers", "2", "--model", "mlp"]


def _fails(capsys, argv: list[str], message: str) -> None:
    assert main(argv) == 1
    assert capsys.readouterr().err == f"scaledl-lab: error: {message}\n"


def _setting(cfg: ExperimentConfig) -> dict:
    return {k: getattr(cfg, k) for k in OPTIMISER_FIELDS}


# -- numbers: inf and NaN pass no comparison, so each is refused by name ----------------------


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--lr", "inf"], "lr=inf must be a finite number"),
        (["--lr", "nan"], "lr=nan must be a finite number"),
        (["--momentum", "nan"], "momentum=nan must be a finite number"),
        (["--weight-decay", "inf"], "weight_decay=inf must be a finite number"),
        (["--bucket-mb", "inf"], "bucket_mb=inf must be a finite number"),
        (["--timeout-s", "inf"], "timeout_s=inf must be a finite number"),
        (["--clip-gradient", "nan"], "clip_gradient=nan must be a finite number"),
        (["--strategy", "diloco", "--outer-lr", "inf"], "outer_lr=inf must be a finite number"),
        (["--warmup-epochs", "inf"], "warmup_epochs=inf must be a finite number"),
        (["--strategy", "dc-asgd", "--dc-lambda", "nan"], "dc_lambda=nan must be a finite number"),
    ],
)
def test_a_number_that_is_not_finite_is_refused(capsys, argv, message):
    _fails(capsys, ["run", *SIM, *argv], message)


def test_python_refuses_them_too():
    with pytest.raises(ConfigError, match=r"^lr=inf must be a finite number$"):
        ExperimentConfig(runtime="sim", lr=math.inf)
    with pytest.raises(ConfigError, match=r"^outer_lr=nan must be a finite number$"):
        ExperimentConfig(strategy="diloco", runtime="sim", model="mlp", outer_lr=math.nan)
