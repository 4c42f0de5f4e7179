"""The `scaledl-lab` command: list, data info, run end to end, clear errors."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pandas as pd
import pytest

from scaledl_lab import families
from scaledl_lab.cli import _config_from_args, _parser, main
from scaledl_lab.cli.options import flag_of
from scaledl_lab.config import ExperimentConfig, field_names
from scaledl_lab.data import locate, write_cifar10_fixture
from scaledl_lab.experiment import Results
from scaledl_lab.metrics import METRIC_COLUMNS
from scaledl_lab.strategies import get_strategy

# The contract's strategy names (DESIGN.md), all implemented.
IMPLEMENTED = (
    "allreduce", "allreduce-naive", "ps-sync", "ps-async", "downpour", "hogwild",
    "staleness-aware", "dc-asgd", "backup-workers", "nnt", "nnt-lockstep", "nnt-staged",
    "dpsgd", "adpsgd", "local-sgd", "easgd", "model-parallel", "gpipe", "1f1b", "interleaved-1f1b",
    "zb-h1",
    "tensor-parallel", "zero1", "zero2", "zero3", "diloco", "streaming-diloco", "mesh",
)  # fmt: skip


def test_list_names_every_strategy_with_its_description(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("strategies (implemented), by family:")
    listed, family_lines = {}, []
    flags: dict[str, list[str]] = {}
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        if not line.startswith("    "):  # a family, then its strategies, then its options
            family_lines.append(line.split(":", 1)[0].strip())
            continue
        if line.startswith("      "):  # one of the family's options
            flags.setdefault(family_lines[-1], []).append(line.split()[0])
            continue
        if line == "    options:":
            continue
        name, description = line.split(maxsplit=1)
        assert name not in listed, f"{name} listed twice"
        listed[name] = description
    assert sorted(listed) == sorted(IMPLEMENTED)
    for name in IMPLEMENTED:
        assert listed[name] == get_strategy(name).description, name
    assert len(set(listed.values())) == len(listed)  # no two strategies share one line
    assert family_lines == [
        "data_parallel", "parameter_server", "decentralised", "model_parallel", "memory",
        "low_communication", "mesh", "compression", "large_batch", "moe",
    ]  # fmt: skip
    assert "runtimes: dask, sim" in lines
    assert "datasets: fashion-mnist, mnist1d, cifar10, licenses" in lines
    # each family's options, from its record, in its dataclass's order
    for family in families.with_options():
        fields = dataclasses.fields(family.options)
        expected = [flag_of(f) for f in fields]
        assert flags[family.name] == expected
    assert flags["parameter_server"][:2] == ["--servers", "--backup-workers"]
    assert "--nnt-max-lead" in flags["decentralised"]
    assert "--no-error-feedback" in flags["compression"]
    assert "data_parallel" not in flags  # no options of its own
    assert "models: mlp, cnn, cnn1d, resnet18, gpt-tiny, gpt-tiny-moe" in lines


def test_data_info_says_where_each_dataset_is_or_how_to_get_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALEDL_DATA_NO_DEFAULTS", "1")
    monkeypatch.setenv("SCALEDL_DATA_DIR", str(tmp_path))
    folder = write_cifar10_fixture(tmp_path)
    assert main(["data", "info"]) == 0
    out = capsys.readouterr().out
    assert f"cifar10: found in {folder}\n" in out
    assert (
        "fashion-mnist: not found\n  how to get it: sudo apt-get install dataset-fashion-mnist"
        in out
    )
    assert "scaledl-lab data fetch fashion-mnist" in out
    assert "mnist1d: not found\n" in out and "scaledl-lab data fetch mnist1d" in out


def test_data_info_finds_fashion_mnist(capsys):
    assert main(["data", "info"]) == 0
    assert f"fashion-mnist: found in {locate('fashion-mnist')}\n" in capsys.readouterr().out


def test_data_fetch_keeps_what_is_there(capsys):
    assert main(["data", "fetch", "fashion-mnist"]) == 0
    out = capsys.readouterr().out
    assert out == f"fashion-mnist: already present in {locate('fashion-mnist')}\n"


def test_bad_config_exits_with_message(capsys):
    assert main(["run", "--model", "vgg"]) == 1
    err = capsys.readouterr().err
    assert "scaledl-lab: error: model='vgg' is unknown; allowed:" in err


def test_bench_passes_its_options_to_the_named_script(capfd):
    assert main(["bench", "pipeline", "--help"]) == 0
    out = capfd.readouterr().out
    assert "== bench_pipeline ==" in out and "--model {cnn,resnet18}" in out


def test_unknown_benchmark(capsys):
    assert main(["bench", "nope"]) == 2
    assert (
        "unknown benchmark 'nope'; available: async, cluster_start, collectives, compression, "
        "gpu, memory, mesh_scale, nnt_straggler, perf_table, pipeline, ps_sync, sharpness, "
        "sim_cost, sim_fidelity, sync_sgd, tensor_parallel" in (capsys.readouterr().err)
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


@pytest.mark.parametrize(
    "given,lead", [("unbounded", None), ("none", None), ("0", 0), ("4", 4), (None, None)]
)
def test_nnt_max_lead_reads_a_count_or_unbounded(given, lead):
    argv = ["run", "--strategy", "nnt", "--runtime", "sim", "--model", "mlp"]
    args = _parser().parse_args(argv + (["--nnt-max-lead", given] if given else []))
    assert _config_from_args(args).nnt_max_lead == lead


def test_nnt_max_lead_refuses_a_negative_or_a_word(capsys):
    for bad in ("-1", "soon"):
        with pytest.raises(SystemExit):
            main(["run", "--strategy", "nnt", "--runtime", "sim", "--nnt-max-lead", bad])
        err = capsys.readouterr().err
        assert f"argument --nnt-max-lead: {bad!r} is neither a non-negative integer nor " in err
        assert "'unbounded'" in err


def test_run_passes_every_option_to_the_config(tmp_path, capsys):
    out = tmp_path / "res"
    argv = [
        "run", "--strategy", "downpour", "--runtime", "sim", "--workers", "3",
        "--model", "mlp", "--global-batch-size", "48", "--lr", "0.02", "--momentum", "0",
        "--seed", "4", "--n-fetch", "4", "--n-push", "2", "--servers", "2",
        "--network", "10gbe", "--stragglers", "slow:1:2", "--train-subset", "960",
        "--test-subset", "100", "--max-steps", "4", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    cfg = json.loads((out / "config.json").read_text())["runs"][0]
    expected = dict(
        strategy="downpour", runtime="sim", workers=3, model="mlp", batch_size=16,
        global_batch_size=48, lr=0.02, momentum=0.0, seed=4, n_fetch=4, n_push=2, servers=2,
        network="10gbe", stragglers="slow:1:2", train_subset=960, test_subset=100, max_steps=4,
    )  # fmt: skip
    assert {k: cfg[k] for k in expected} == expected
    frame = pd.read_csv(out / "metrics.csv")
    train = frame[frame.kind == "train"]
    assert set(train["samples"]) == {16} and sorted(train["rank"].unique()) == [0, 1, 2]
    assert sorted(frame[frame.kind == "server"]["rank"]) == [3, 4]  # two shards


def _run_actions() -> dict[str, list]:
    """The `run` subcommand's flags by the config field they set."""
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    by_dest: dict[str, list] = {}
    for action in sub.choices["run"]._actions:
        by_dest.setdefault(action.dest, []).append(action)
    return by_dest


def test_every_config_field_has_a_run_flag():
    actions = _run_actions()
    assert set(field_names()) <= set(actions)
    for name in field_names():  # left out, a flag passes nothing: the config's default holds
        assert all(a.default is argparse.SUPPRESS for a in actions[name]), name
    assert len(field_names()) == len(set(field_names()))  # no family shadows another's field


@pytest.mark.parametrize(
    "argv,changes",
    [
        (["--servers", "3", "--strategy", "ps-async"], dict(servers=3, strategy="ps-async")),
        (["--nnt-max-lead", "unbounded"], dict(nnt_max_lead=None)),
        (["--nnt-max-lead", "2"], dict(nnt_max_lead=2)),
        (["--no-error-feedback"], dict(error_feedback=False)),
        (["--dc-adaptive"], dict(dc_adaptive=True)),
        (["--recompute", "--strategy", "gpipe"], dict(recompute=True, strategy="gpipe")),
        (["--recompute", "--strategy", "local-sgd"], dict(recompute=True, strategy="local-sgd")),
        (["--checkpoint-every", "5"], dict(checkpoint_every=5)),
        (["--checkpoint-every", "2epochs"], dict(checkpoint_every="2epochs")),
        (["--zero-init-residual", "--model", "resnet18"],
         dict(zero_init_residual=True, model="resnet18")),
        (["--no-zero-init-residual"], dict(zero_init_residual=False)),
        (["--no-bias-decay"], dict(no_bias_decay=True)),
        (["--bias-decay"], dict(no_bias_decay=False)),
        (["--lr-scaling", "sqrt", "--warmup-epochs", "0.5"],
         dict(lr_scaling="sqrt", warmup_epochs=0.5)),
        (["--elastic-alpha", "0.1", "--strategy", "easgd"],
         dict(elastic_alpha=0.1, strategy="easgd")),
        (["--clip-gradient", "10"], dict(clip_gradient=10.0)),
        (["--oversubscribe"], dict(oversubscribe=True)),
    ],
)  # fmt: skip
def test_a_family_flag_reaches_its_config_field(monkeypatch, argv, changes):
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)
    cfg = _config_from_args(_parser().parse_args(["run", *argv]))
    assert cfg == ExperimentConfig(**changes)
    assert {k: getattr(cfg, k) for k in changes} == changes


def test_omitted_flags_keep_the_config_defaults(monkeypatch):
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)
    cfg = _config_from_args(_parser().parse_args(["run"]))
    assert cfg == ExperimentConfig()  # allreduce's family defaults are the config's own
    assert (cfg.val_size, cfg.bucket_mb, cfg.timeout_s) == (5000, 4.0, 60.0)
    assert (cfg.device, cfg.precision, cfg.name) == ("auto", "float32", None)


@pytest.mark.parametrize(
    "flag,given,field,value",
    [
        ("--device", "cpu", "device", "cpu"),
        ("--device", "cuda", "device", "cuda"),
        ("--precision", "float64", "precision", "float64"),
        ("--bucket-mb", "0.5", "bucket_mb", 0.5),
        ("--val-size", "0", "val_size", 0),
        ("--val-size", "1000", "val_size", 1000),
        ("--timeout-s", "5", "timeout_s", 5.0),
        ("--name", "mine", "name", "mine"),
    ],
)
def test_run_flag_reaches_its_config_field(monkeypatch, flag, given, field, value):
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)
    cfg = _config_from_args(_parser().parse_args(["run", flag, given]))
    assert getattr(cfg, field) == value
    assert cfg == ExperimentConfig().replace(**{field: value})  # nothing else changes


def test_run_name_is_the_label():
    assert _config_from_args(_parser().parse_args(["run", "--name", "mine"])).label == "mine"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--device", "tpu"], "device='tpu' is unknown; allowed: 'auto', 'cpu', 'cuda'"),
        (
            ["--precision", "float8"],
            "precision='float8' is unknown; allowed: 'float32', 'float64', 'bfloat16', 'float16'",
        ),
        (["--val-size", "-1"], "val_size=-1 must be a non-negative integer"),
        (["--bucket-mb", "0"], "bucket_mb=0.0 must be a positive number"),
        (["--timeout-s", "-5"], "timeout_s=-5.0 must be a positive number"),
    ],
)
def test_run_flag_bad_value_fails_with_the_config_message(capsys, argv, message):
    assert main(["run", *argv]) == 1
    assert capsys.readouterr().err == f"scaledl-lab: error: {message}\n"


def test_reproduce_long_runs_the_long_comparison(tmp_path, monkeypatch, capsys):
    from scaledl_lab.studies import long_run

    calls = []

    def fake(*, out, jobs):  # it writes into a partial folder, moved to --out at the end
        calls.append((out.name.startswith(f"{tmp_path.name}.partial-"), jobs))
        (out / "summary.md").write_text("# long\n")

    monkeypatch.setattr(long_run, "reproduce_long", fake)
    assert main(["reproduce", "--long", "--out", str(tmp_path), "--jobs", "3"]) == 0
    assert calls == [(True, 3)] and "# long" in capsys.readouterr().out
    assert (tmp_path / "summary.md").read_text() == "# long\n"
