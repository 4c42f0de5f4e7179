"""Inputs the CLI once accepted and then ran wrongly (issue #47, items 6 and 7): each now ends in
one `scaledl-lab: error: ...` line and exit code 1, or runs as typed. Argument checks only:
nothing here trains."""

from __future__ import annotations

import json
import math

import pytest

from scaledl_lab import ConfigError, ExperimentConfig
from scaledl_lab.cli import _config_from_args, _parser, main
from scaledl_lab.config import DEFAULT_OPTIMISER, QUICK_TEST, QUICK_TRAIN
from scaledl_lab.families import OPTIMISER_DEFAULTS, OPTIMISER_FIELDS

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


# -- an optimiser named brings its own rate and decay (item 7) --------------------------------


def test_an_optimiser_other_than_the_familys_brings_its_own_setting(monkeypatch):
    sim = dict(runtime="sim", workers=4, model="mlp")
    diloco = ExperimentConfig(strategy="diloco", optimizer="sgd", **sim)
    assert _setting(diloco) == DEFAULT_OPTIMISER  # not AdamW's 0.001 and decay 0.01
    assert _setting(ExperimentConfig(strategy="diloco", **sim))["optimizer"] == "adamw"
    nnt = ExperimentConfig(strategy="nnt", optimizer="adam", **sim)
    assert _setting(nnt) == OPTIMISER_DEFAULTS["adam"]
    assert _setting(nnt) == dict(optimizer="adam", lr=1e-3, momentum=0.0, weight_decay=0.0)
    adamw = ExperimentConfig(optimizer="adamw", **sim)  # allreduce: the family is SGD's
    assert (adamw.lr, adamw.weight_decay) == (1e-3, 0.01)
    # The family's own optimiser named: the family's setting (NNT's AdaGrad: the paper's decay).
    assert ExperimentConfig(strategy="nnt", optimizer="adagrad", **sim).weight_decay == 1e-4
    # What is given stays given; the rest is the optimiser's.
    given = ExperimentConfig(strategy="diloco", optimizer="sgd", lr=0.1, **sim)
    assert _setting(given) == {**DEFAULT_OPTIMISER, "lr": 0.1}
    assert given.resolved == frozenset({"momentum", "weight_decay"})
    # replace(optimizer=...) refills what this config did not give, as a new strategy does.
    assert _setting(ExperimentConfig().replace(optimizer="adam")) == OPTIMISER_DEFAULTS["adam"]
    assert ExperimentConfig(lr=0.2).replace(optimizer="adam").lr == 0.2
    # The CLI builds the same config.
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)
    argv = ["run", "--strategy", "diloco", "--runtime", "sim", "--workers", "4", "--model", "mlp",
            "--optimizer", "sgd"]  # fmt: skip
    assert _config_from_args(_parser().parse_args(argv)) == diloco


def test_every_optimiser_has_its_own_setting():
    from scaledl_lab.contract import OPTIMIZERS

    assert set(OPTIMISER_DEFAULTS) == set(OPTIMIZERS)
    for name, setting in OPTIMISER_DEFAULTS.items():
        assert setting["optimizer"] == name and set(setting) == set(OPTIMISER_FIELDS)
        assert _setting(ExperimentConfig(runtime="sim", model="mlp", optimizer=name)) == setting


# -- the data folder: one that is not there is refused, not searched past ---------------------


@pytest.mark.parametrize(
    "dataset,model",
    [("fashion-mnist", "mlp"), ("mnist1d", "cnn1d"), ("cifar10", "cnn"), ("licenses", "gpt-tiny")],
)
def test_a_data_dir_that_does_not_exist_is_refused(capsys, tmp_path, dataset, model):
    missing = tmp_path / "nonexistent"
    argv = ["run", "--runtime", "sim", "--dataset", dataset, "--model", model]
    _fails(
        capsys,
        [*argv, "--data-dir", str(missing)],
        f"data_dir={str(missing)!r} is not a folder; give the folder that holds the dataset, "
        "or leave data_dir out to search the usual places (`scaledl-lab data info`)",
    )


# -- quick mode shrinks the defaults, not what was typed --------------------------------------


def test_quick_mode_keeps_the_flags_typed_and_shrinks_the_rest(monkeypatch):
    monkeypatch.setenv("SCALEDL_QUICK", "1")

    def cfg(*flags: str) -> ExperimentConfig:
        return _config_from_args(_parser().parse_args(["run", *SIM, *flags]))

    shrunk = cfg()
    assert (shrunk.epochs, shrunk.val_size) == (1, 2000)
    assert (shrunk.train_subset, shrunk.test_subset) == (QUICK_TRAIN, QUICK_TEST)
    typed = cfg("--epochs", "3", "--val-size", "3000", "--test-subset", "6000")
    assert (typed.epochs, typed.val_size, typed.test_subset) == (3, 3000, 6000)
    assert typed.train_subset == QUICK_TRAIN  # not typed: quick mode's
    assert cfg("--train-subset", "20000").train_subset == 20000
    assert cfg("--quick", "--epochs", "5").epochs == 5


# -- the results folder and TLS: nothing written outside results/, nothing ignored ------------


@pytest.mark.parametrize("name", ["../../x", "a/b", "..", ".", "a\\b"])
def test_a_name_that_would_leave_results_is_refused(capsys, name):
    _fails(
        capsys,
        ["run", *SIM, "--name", name],
        f"name={name!r} names the results folder results/<name>: it may not hold '/' or '\\' "
        "nor be '.' or '..'; choose a plain name, or the folder itself with --out DIR",
    )


def test_a_name_with_a_slash_is_a_label_where_out_names_the_folder(monkeypatch):
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)
    argv = ["run", *SIM, "--name", "sweep/4w", "--out", "elsewhere"]
    assert _config_from_args(_parser().parse_args(argv)).label == "sweep/4w"


@pytest.mark.parametrize("command", [["run", *SIM], ["reproduce"]])
def test_tls_files_without_an_address_are_refused(capsys, tmp_path, command):
    _fails(
        capsys,
        [*command, "--tls-ca-file", "ca.pem", "--tls-cert", "cert.pem", "--out", str(tmp_path)],
        "--tls-ca-file, --tls-cert secure the connection to an existing cluster's tls:// "
        "scheduler: give its --address, or drop them (the embedded cluster listens on "
        "127.0.0.1 only)",
    )
    _fails(
        capsys,
        [*command, "--tls-key", "key.pem", "--out", str(tmp_path)],
        "--tls-key secures the connection to an existing cluster's tls:// scheduler: give its "
        "--address, or drop it (the embedded cluster listens on 127.0.0.1 only)",
    )
    assert not any(tmp_path.iterdir())  # refused before anything ran


# -- plan: --out writes the plan; --transformer speaks of the model it plans ------------------


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf"])
def test_plan_refuses_a_device_memory_that_is_not_positive_and_finite(capsys, value):
    shown = f"{float(value):g}"
    _fails(
        capsys,
        ["plan", *SIM, "--device-memory-gb", value],
        f"--device-memory-gb {shown} must be a positive, finite number",
    )


def test_plan_writes_its_text_or_json_to_out(tmp_path, capsys):
    argv = ["plan", *SIM, "--batch-size", "32", "--device-memory-gb", "1"]
    text = tmp_path / "plan.txt"
    assert main([*argv, "--out", str(text)]) == 0
    shown = capsys.readouterr().out
    assert shown == text.read_text() + f"plan written to {text}\n"
    assert "in 1 GB per worker: fits" in text.read_text()
    as_json = tmp_path / "plan.json"
    assert main([*argv, "--out", str(as_json)]) == 0
    saved = json.loads(as_json.read_text())
    assert (saved["strategy"], saved["workers"], saved["fits"]) == ("allreduce", 2, True)
    assert saved["bytes"]["model states"] > 0 and saved["bytes"]["communication buffers"] >= 0
    assert f"{saved['total_bytes'] / 1e6:12.3f} MB" in shown
    _fails(
        capsys,
        [*argv, "--out", str(tmp_path / "missing" / "plan.txt")],
        f"cannot write the plan to {tmp_path / 'missing' / 'plan.txt'}: No such file or directory",
    )


def test_plan_transformer_refuses_a_model_or_non_text_data_beside_it(capsys):
    argv = ["plan", "--workers", "2", "--transformer", "2,64,2,16,100", "--batch-size", "2"]
    _fails(
        capsys,
        [*argv, "--model", "cnn"],
        "--transformer 2,64,2,16,100 is the model planned; --model cnn plans one of the lab's "
        "networks instead: give one of them, not both",
    )
    _fails(
        capsys,
        [*argv, "--dataset", "mnist1d"],
        "--transformer plans a language model on token sequences; --dataset mnist1d is not "
        "text (leave --dataset out, or give licenses)",
    )
    assert main([*argv, "--dataset", "licenses", "--compute-profile", "a100"]) == 0
    assert "a transformer of" in capsys.readouterr().out


# -- float16's static loss scale --------------------------------------------------------------


@pytest.mark.parametrize("scale", ["1e-30", "0.5"])
def test_a_static_loss_scale_below_one_is_refused(capsys, scale):
    _fails(
        capsys,
        ["run", *SIM, "--precision", "float16", "--loss-scale", scale],
        f"loss_scale={float(scale)!r} is below 1: a static scale multiplies the gradients so "
        "that small ones stay above float16's smallest subnormal (2**-24, about 6e-8); below 1 "
        "it shrinks them and more underflow to zero than unscaled (at 1e-30 every one does): "
        "give a scale of at least 1, or 'dynamic'",
    )


def test_a_static_loss_scale_of_one_or_more_is_kept(monkeypatch):
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)
    for text in ("1", "1024"):
        argv = ["run", *SIM, "--precision", "float16", "--loss-scale", text]
        assert _config_from_args(_parser().parse_args(argv)).loss_scale == float(text)
