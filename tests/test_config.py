"""Invalid configs are rejected before any cluster starts, with messages naming the field."""

from __future__ import annotations

import pytest

from scaledl_lab import ConfigError, ExperimentConfig
from scaledl_lab.config import check_resources, quick


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model": "vgg"}, r"model='vgg' is unknown; allowed: 'mlp', 'cnn', 'cnn1d', 'resnet18'"),
        ({"dataset": "imagenet"}, r"dataset='imagenet' is unknown; allowed: 'fashion-mnist'"),
        ({"strategy": "magic"}, r"strategy='magic' is unknown; allowed: 'allreduce'"),
        ({"runtime": "mpi"}, r"runtime='mpi' is unknown; allowed: 'dask', 'sim'"),
        ({"workers": 0}, r"workers=0 must be a positive integer"),
        ({"batch_size": -4}, r"batch_size=-4 must be a positive integer"),
        ({"epochs": 0}, r"epochs=0 must be a positive integer"),
        ({"lr": 0.0}, r"lr=0.0 must be a positive number"),
        ({"momentum": 1.5}, r"momentum=1.5 must be below 1"),
        (
            {"global_batch_size": 129, "workers": 2},
            r"global_batch_size=129 is not divisible by the 2 replicas \(workers=2\)",
        ),
        ({"model": "cnn1d"}, r"model='cnn1d' does not fit dataset='fashion-mnist'"),
        ({"optimizer": "rmsprop"}, r"optimizer='rmsprop' is unknown; allowed: 'sgd'"),
        ({"sharding": "zipf"}, r"sharding='zipf' is unknown; allowed: 'iid', 'label-skew'"),
        ({"topology": "ring"}, r"topology='ring' does not apply to strategy='allreduce'"),
        ({"train_subset": 0}, r"train_subset=0 must be a positive integer or None"),
        # model parallelism: one line naming the field, before any cluster starts
        ({"strategy": "gpipe", "workers": 1}, r"strategy='gpipe' splits the model .* workers=1"),
        ({"strategy": "tensor-parallel", "workers": 1}, r"'tensor-parallel' splits .* workers=1"),
        (
            {"strategy": "gpipe", "model": "mlp", "workers": 8, "runtime": "sim"},
            r"stages=8 exceeds the model's 6 layers",
        ),
        (
            {"strategy": "gpipe", "model": "mlp", "workers": 2, "balance": "2,3"},
            r"balance='2,3' must give 2 positive layer counts .* summing to the model's 6 layers",
        ),
        (
            {"strategy": "1f1b", "model": "mlp", "workers": 3, "balance": "0,3,3"},
            r"balance='0,3,3' must give 3 positive layer counts",
        ),
        (
            {"strategy": "gpipe", "workers": 2, "balance": "fast"},
            r"balance='fast' is unknown; allowed: 'params', 'time'",
        ),
        (
            {"strategy": "gpipe", "workers": 2, "micro_batches": 5},
            r"micro_batches=5 does not divide the per-replica batch_size=64",
        ),
        (
            {"strategy": "gpipe", "workers": 4, "stages": 3, "runtime": "sim"},
            r"workers=4 is not divisible by stages=3",
        ),
        (
            {"strategy": "tensor-parallel", "workers": 3, "model": "mlp"},
            r"tensor-parallel degree workers=3 does not divide the MLP's hidden width 512",
        ),
        ({"strategy": "tensor-parallel", "workers": 2}, r"model='cnn' is not supported"),
        ({"stages": 2}, r"stages=2 applies only to the pipeline strategies"),
        (
            {"strategy": "model-parallel", "workers": 2, "micro_batches": 2},
            r"micro_batches=2 does not apply to the naive split",
        ),
    ],
)
def test_invalid_configs_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**changes)


def test_replace_validates_again():
    with pytest.raises(ConfigError, match="workers=-1"):
        ExperimentConfig().replace(workers=-1)


def test_more_workers_than_cores_needs_an_override():
    cfg = ExperimentConfig(workers=8)
    with pytest.raises(ConfigError, match=r"workers=8 exceeds the 2 CPU cores .* oversubscribe"):
        check_resources(cfg, cores=2)
    check_resources(cfg.replace(oversubscribe=True), cores=2)


def test_global_batch_sets_per_worker_batch():
    cfg = ExperimentConfig(workers=4, global_batch_size=256)
    assert cfg.batch_size == 64 and cfg.effective_batch_size == 256
    assert cfg.replace(workers=2).batch_size == 128
    assert cfg.replace(batch_size=8).global_batch_size is None


def test_round_trip_and_quick():
    cfg = ExperimentConfig(model="mlp", epochs=10)
    assert ExperimentConfig.from_dict(cfg.to_dict()) == cfg
    q = quick(cfg)
    assert q.epochs == 2 and q.train_subset == 10_000 and q.model == "mlp"
    with pytest.raises(ConfigError, match=r"unknown config field\(s\) \['colour'\]"):
        ExperimentConfig.from_dict({"colour": "red"})


def test_label():
    assert ExperimentConfig(workers=2).label == "allreduce-dask-2w"
    assert ExperimentConfig(name="mine").label == "mine"


def test_the_families_records_hold_exactly_the_contracts_strategies():
    from scaledl_lab import families
    from scaledl_lab.config import CONTRACT_STRATEGIES
    from scaledl_lab.strategies import STRATEGIES

    held = [name for family in families.families() for name in family.strategies]
    assert sorted(held) == sorted(CONTRACT_STRATEGIES)  # none missing, none extra
    assert len(held) == len(set(held))  # each in one family
    assert families.strategies() == CONTRACT_STRATEGIES
    assert sorted(STRATEGIES) == sorted(CONTRACT_STRATEGIES)  # every one has a program
    for family in families.families():
        for name, description in family.strategies.items():
            assert STRATEGIES[name].description == description, name
            assert families.family_of(name) is family
    assert all(s.description for s in STRATEGIES.values())


def test_capabilities_are_asked_of_the_records():
    from scaledl_lab import families

    assert families.with_capability("takes_topology") == (
        "nnt", "nnt-lockstep", "nnt-staged", "dpsgd", "adpsgd",
    )  # fmt: skip
    assert families.with_capability("hosts_servers") == (
        "ps-sync", "ps-async", "downpour", "staleness-aware", "dc-asgd", "backup-workers",
    )  # fmt: skip
    assert families.with_capability("pipeline") == (
        "model-parallel", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
    )  # fmt: skip
    assert families.with_capability("interleaves") == ("interleaved-1f1b",)
    assert families.with_capability("splits_model")[-1] == "tensor-parallel"
    assert families.with_capability("accumulates") == ("allreduce", "allreduce-naive")
    assert families.with_capability("checkpointable") == (
        "allreduce", "allreduce-naive", "ps-sync", "dpsgd", "diloco",
    )  # fmt: skip
    assert "hogwild" not in families.with_capability("compressible")
    assert families.has("nnt", "takes_topology") and not families.has("allreduce", "pipeline")
    with pytest.raises(KeyError, match="unknown capability"):
        families.has("nnt", "flies")


def test_strategy_options_are_typed_fields():
    assert ExperimentConfig(strategy="nnt", runtime="sim", nnt_max_lead=0).nnt_max_lead == 0
    assert ExperimentConfig(strategy="nnt").nnt_max_lead is None  # unbounded, as FAST
    message = r"must be a non-negative integer, or None for unbounded \(FAST's never-waiting NNT\)"
    for bad in (-1, 2.5, True, "4"):
        with pytest.raises(ConfigError, match=rf"nnt_max_lead={bad!r} {message}"):
            ExperimentConfig(strategy="nnt", nnt_max_lead=bad)
    # Results saved while options travelled in an untyped dict still load.
    legacy = {**ExperimentConfig(model="mlp").to_dict(), "extra": {}}
    assert ExperimentConfig.from_dict(legacy) == ExperimentConfig(model="mlp")
    with pytest.raises(ConfigError, match=r"unknown config field\(s\) \['extra'\]"):
        ExperimentConfig.from_dict({**legacy, "extra": {"nnt_max_lead": 2}})
