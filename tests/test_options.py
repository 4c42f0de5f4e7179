"""The families' options on the config (scaledl_lab.families.Family.options): keyword
construction, attribute access, flat dictionaries, equality, hashing and pickling; the
optimiser each strategy's family trains with, resolved by the config itself, the same from
Python and from `scaledl-lab run`; the loop's changes handed over by the records."""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path

import pytest
import torch

from scaledl_lab import ConfigError, ExperimentConfig, families
from scaledl_lab.cli import _config_from_args, _parser
from scaledl_lab.config import CORE_FIELDS, DEFAULT_OPTIMISER, field_names
from scaledl_lab.families import OPTIMISER_DEFAULTS, OPTIMISER_FIELDS, Family, register_family
from scaledl_lab.strategies.compression import CompressionOptions
from scaledl_lab.strategies.parameter_server import ParameterServerOptions
from scaledl_lab.training import health
from scaledl_lab.training.reference import one_thread

RESULTS = Path(__file__).resolve().parents[1] / "results"
NNT = dict(optimizer="adagrad", lr=0.01, momentum=0.0, weight_decay=1e-4)  # the paper's


@pytest.fixture(autouse=True)
def _outside_quick_mode(monkeypatch):
    """The CLI applies quick mode (``SCALEDL_QUICK=1``, under which the suite runs); these tests
    compare the configs it builds with Python's, so they run outside it."""
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)


def test_a_family_option_is_a_keyword_and_an_attribute():
    cfg = ExperimentConfig(strategy="ps-async", servers=2, compress="qsgd:4")
    assert (cfg.servers, cfg.compress, cfg.n_push) == (2, "qsgd:4", 1)
    held = {type(o): o for o in cfg.options}
    assert held[ParameterServerOptions].servers == 2
    assert held[CompressionOptions] == CompressionOptions(compress="qsgd:4")
    assert cfg.replace(servers=3).servers == 3 and cfg.replace(servers=3).compress == "qsgd:4"
    assert dataclasses.replace(cfg, servers=4).servers == 4  # the dataclass function too
    assert {"servers", "compress", "lr"} <= set(dir(cfg))  # they tab-complete
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.servers = 5
    with pytest.raises(
        AttributeError, match="'ExperimentConfig' object has no attribute 'serverz'"
    ):
        _ = cfg.serverz


def test_an_unknown_field_names_every_allowed_one():
    with pytest.raises(ConfigError) as err:
        ExperimentConfig(strategy="ps-async", serverz=2)
    assert str(err.value) == (
        f"unknown config field(s) ['serverz']; allowed: {sorted(field_names())}"
    )
    assert {"servers", "nnt_max_lead", "compress", "stages", "accumulate"} <= set(field_names())


def test_the_flat_dictionary_equality_hashing_and_pickling():
    cfg = ExperimentConfig(strategy="nnt", runtime="sim", workers=4, nnt_max_lead=2)
    flat = cfg.to_dict()
    assert list(flat)[: len(CORE_FIELDS)] == [f.name for f in CORE_FIELDS]
    assert set(flat) == set(field_names()) and "options" not in flat
    assert flat["nnt_max_lead"] == 2 and flat["servers"] == 1
    assert json.loads(json.dumps(flat)) == flat  # config.json holds plain values
    again = ExperimentConfig.from_dict(flat)
    assert again == cfg and hash(again) == hash(cfg) and again.options == cfg.options
    shipped = pickle.loads(pickle.dumps(cfg))  # what Dask does with a config
    assert shipped == cfg and shipped.nnt_max_lead == 2 and hash(shipped) == hash(cfg)
    assert cfg != cfg.replace(nnt_max_lead=3) and len({cfg, again, shipped}) == 1
    assert "nnt_max_lead=2" in repr(cfg) and "options=" not in repr(cfg)


def test_every_committed_config_json_reads_back_to_the_same_flat_keys():
    saved_runs = []
    for path in RESULTS.rglob("config.json"):
        meta = json.loads(path.read_text())  # a results folder's runs, or kernel_drift's cases
        runs = meta.get("runs") or [c for cases in meta.get("cases", {}).values() for c in cases]
        saved_runs += [(path, run) for run in runs]
    folders = {path.parent.relative_to(RESULTS).as_posix() for path, _ in saved_runs}
    assert len(folders) == 7 and "precision" in folders, folders  # every committed study read
    for path, saved in saved_runs:
        flat = ExperimentConfig.from_dict(saved).to_dict()
        assert {k: flat[k] for k in saved} == saved, path  # newer fields: their defaults


def test_python_and_the_cli_give_one_nnt_config():
    argv = ["run", "--strategy", "nnt", "--runtime", "sim", "--workers", "4"]
    from_cli = _config_from_args(_parser().parse_args(argv))
    from_python = ExperimentConfig(strategy="nnt", runtime="sim", workers=4)
    assert from_cli == from_python
    assert {k: getattr(from_python, k) for k in OPTIMISER_FIELDS} == NNT


@pytest.mark.parametrize(
    "strategy,given",
    [
        ("nnt", dict(lr=0.2)),
        ("nnt", dict(optimizer="sgd", lr=0.05, momentum=0.9)),
        ("ps-async", dict(momentum=0.5)),
        ("staleness-aware", dict(optimizer="adam")),
        ("allreduce", dict(lr=0.1)),
        ("dpsgd", dict(weight_decay=1e-3)),
    ],
)
def test_a_partial_setting_resolves_as_the_cli_did(strategy, given):
    # Each optimiser flag left out takes the family's value (health.recommended), the config's
    # default where the family has none; an optimiser other than the family's brings its own.
    family = health.recommended(strategy)
    named = given.get("optimizer", family["optimizer"])
    expected = {**(family if named == family["optimizer"] else OPTIMISER_DEFAULTS[named]), **given}
    cfg = ExperimentConfig(strategy=strategy, runtime="sim", workers=4, **given)
    assert {k: getattr(cfg, k) for k in OPTIMISER_FIELDS} == expected
    flags = [x for k, v in given.items() for x in (f"--{k.replace('_', '-')}", str(v))]
    argv = ["run", "--strategy", strategy, "--runtime", "sim", "--workers", "4", *flags]
    assert _config_from_args(_parser().parse_args(argv)) == cfg
    assert cfg.resolved == frozenset(OPTIMISER_FIELDS) - set(given)


def test_a_new_strategy_refills_only_what_was_not_given():
    base = ExperimentConfig(runtime="sim", workers=4, lr=0.2)  # allreduce: SGD, lr given
    nnt = base.replace(strategy="nnt")
    assert {k: getattr(nnt, k) for k in OPTIMISER_FIELDS} == {**NNT, "lr": 0.2}
    assert nnt == ExperimentConfig(strategy="nnt", runtime="sim", workers=4, lr=0.2)
    back = nnt.replace(strategy="allreduce")
    assert back == base and back.momentum == DEFAULT_OPTIMISER["momentum"]
    explicit = ExperimentConfig(runtime="sim", workers=4, **DEFAULT_OPTIMISER)
    assert explicit.replace(strategy="nnt").optimizer == "sgd"  # given values stay given
    saved = ExperimentConfig.from_dict(base.to_dict())  # a saved config gives every field
    assert saved == base and saved.replace(strategy="nnt").optimizer == "sgd"


def test_a_family_declares_frozen_options_that_no_other_declares():
    @dataclasses.dataclass
    class Loose:
        servers: int = 1

    with pytest.raises(ValueError, match="family 'x': options must be a frozen dataclass"):
        Family(name="x", summary="", strategies={}, options=Loose)

    @dataclasses.dataclass(frozen=True)
    class Shadow:
        servers: int = 1

    before = dict(families.FAMILIES)
    with pytest.raises(
        ValueError, match=r"options \['servers'\] are declared by 'parameter_server' and 'x'"
    ):
        register_family(Family(name="x", summary="", strategies={}, options=Shadow))
    assert families.FAMILIES == before  # nothing registered


def _with_family(monkeypatch, options: type) -> None:
    """A family declaring ``options``, registered for one test (the registry is restored)."""
    family = Family(name="zz_test", summary="a test family", strategies={}, options=options)
    monkeypatch.setitem(families.FAMILIES, family.name, family)


def test_an_option_named_like_a_shared_field_is_refused(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Clash:
        lr: float = 0.1

    _with_family(monkeypatch, Clash)
    with pytest.raises(
        ConfigError, match=r"family 'zz_test' declares fields of the config: \{'lr'\}"
    ):
        field_names()


def test_a_new_family_option_gets_its_flag_and_its_field(monkeypatch):
    @dataclasses.dataclass(frozen=True)
    class Extra:
        push_jitter: float = dataclasses.field(
            default=0.0, metadata=families.option("seconds of jitter per push")
        )
        fast: bool = dataclasses.field(default=False, metadata=families.option("go fast"))

    _with_family(monkeypatch, Extra)
    args = _parser().parse_args(["run", "--push-jitter", "0.5", "--fast"])
    cfg = _config_from_args(args)
    assert (cfg.push_jitter, cfg.fast) == (0.5, True)
    assert cfg == ExperimentConfig(push_jitter=0.5, fast=True)
    assert cfg.to_dict()["push_jitter"] == 0.5


@pytest.mark.parametrize(
    "field,message",
    [
        (
            dataclasses.field(default=1),
            "config field 'bare' has no option(...) metadata: no flag for it",
        ),
        (
            dataclasses.field(default=1, metadata=families.option("either")),
            "config field 'bare': give option(parse=...) to read int | str from text",
        ),
    ],
)
def test_a_field_the_cli_cannot_read_says_what_it_lacks(monkeypatch, field, message):
    Bare = dataclasses.make_dataclass("Bare", [("bare", "int | str", field)], frozen=True)
    _with_family(monkeypatch, Bare)
    with pytest.raises(TypeError) as err:
        _parser()
    assert str(err.value) == message


def test_the_records_hand_the_loop_their_optimiser_changes():
    plain = families.optimiser_changes(ExperimentConfig(runtime="sim", model="mlp"))
    assert plain == families.OptimiserChanges(no_bias_decay=False, trust_coefficient=1.0)
    lars = ExperimentConfig(runtime="sim", model="mlp", optimizer="lars", workers=4)
    assert families.optimiser_changes(lars) == families.OptimiserChanges(
        no_bias_decay=True, trust_coefficient=0.001
    )  # the recipe: LARS switches it on
    dgc = ExperimentConfig(runtime="sim", model="mlp", compress="dgc:0.01", momentum=0.9)
    assert families.optimiser_changes(dgc).momentum == 0.0  # DGC keeps it in the compressor
    nnt = dgc.replace(strategy="nnt", optimizer="sgd")
    assert families.optimiser_changes(nnt).momentum is None  # receivers step with their own


def test_the_checks_of_fields_no_family_owns_are_registered():
    names = {f"{c.__module__}.{c.__name__}" for c in families._CHECKS}
    assert names == {
        "scaledl_lab.runtime.sim.cost_checks.check_config",
        "scaledl_lab.training.faults.check_run",
        "scaledl_lab.training.checkpoint.check_run",
        "scaledl_lab.training.precision_checks.check_precision",
        "scaledl_lab.data.base.check_data_dir",
    }
    with pytest.raises(ConfigError, match=r"faults='kill:9:1'"):
        ExperimentConfig(runtime="sim", faults="kill:9:1")


def test_a_twin_restores_the_thread_count():
    before = torch.get_num_threads()
    with one_thread():
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
