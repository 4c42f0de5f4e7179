"""Bad large-batch input: each a clear error naming the field, before any worker starts."""

from __future__ import annotations

import pytest
from common import SMALL

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import main

OK = dict(strategy="allreduce", runtime="sim", workers=4, model="mlp", epochs=4)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        (dict(warmup_epochs=5), ["warmup_epochs=5", "longer than the run", "epochs=4"]),
        (dict(warmup_epochs=-1), ["warmup_epochs=-1", "non-negative"]),
        (dict(lr_schedule="step:3,2"), ["lr_schedule='step:3,2'", "must increase"]),
        (dict(lr_schedule="step:1,1"), ["lr_schedule='step:1,1'", "must increase"]),
        (dict(lr_schedule="step:2,4"), ["lr_schedule='step:2,4'", "epoch 4", "outside the run"]),
        (dict(lr_schedule="step:0"), ["epoch 0", "outside the run"]),
        (dict(lr_schedule="step:a,b"), ["lr_schedule='step:a,b'", "not a list of epochs"]),
        (dict(lr_schedule="exponential"), ["lr_schedule='exponential'", "'cosine'"]),
        (dict(lr_schedule="step:1:-2"), ["GAMMA=-2.0", "positive"]),
        (dict(lr_scaling="cubic"), ["lr_scaling='cubic'", "linear", "sqrt"]),
        (dict(reference_batch_size=0), ["reference_batch_size=0", "positive integer"]),
        (dict(batch_schedule="3,1"), ["batch_schedule='3,1'", "must increase"]),
        (dict(batch_schedule="1,6"), ["batch_schedule='1,6'", "epoch 6", "outside the run"]),
        (dict(batch_schedule="1.5"), ["batch_schedule='1.5'", "whole epochs"]),
        # 4 workers × 10 = 40 samples × 1.5 = 60 → 15 per worker; × 1.5 again = 90: 22.5 each.
        (
            dict(batch_size=10, batch_schedule="1,2:1.5"),
            ["batch_schedule='1,2:1.5'", "epoch 2", "effective batch 90", "4 replicas"],
        ),
        # 60000 − 5000 validation = 55000 samples: 13750 per worker; 64 × 10³ exceeds it.
        (
            dict(batch_size=64, batch_schedule="1,2,3"),
            ["batch_schedule='1,2,3'", "epoch 3", "64000", "shard of 13750"],
        ),
        (dict(strategy="ps-sync", batch_schedule="1:2"), ["batch_schedule=", "'ps-sync'"]),
        (dict(accumulate=0), ["accumulate=0", "positive integer"]),
        (dict(strategy="nnt", accumulate=2), ["accumulate=2", "allreduce", "'nnt'"]),
        (dict(optimizer="lars", trust_coefficient=-0.1), ["trust_coefficient=-0.1", "'lars'"]),
        (dict(optimizer="lamb", trust_coefficient=-1.0), ["trust_coefficient=-1.0", "'lamb'"]),
        (dict(optimizer="sgd", trust_coefficient=0.01), ["trust_coefficient=0.01", "'lars'"]),
        (dict(optimizer="lion"), ["optimizer='lion'", "lars", "lamb"]),
        (dict(strategy="ps-async", optimizer="lars"), ["optimizer='lars'", "flat shards"]),
        (dict(strategy="tensor-parallel", optimizer="lamb"), ["optimizer='lamb'", "slices"]),
        (dict(zero_init_residual=True), ["zero_init_residual=True", "resnet18"]),
        (dict(strategy="ps-sync", no_bias_decay=True), ["no_bias_decay=True", "'ps-sync'"]),
    ],
)
def test_bad_input_is_refused_with_the_field_named(changes, words):
    with pytest.raises(ConfigError) as err:
        ExperimentConfig(**{**OK, **changes})
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        # 2400 samples over 2 workers × 32: 37 steps an epoch; 10 steps are 0.27 epochs.
        (dict(max_steps=10, warmup_epochs=0.5), ["warmup_epochs=0.5", "max_steps=10"]),
        (dict(max_steps=10, epochs=2, lr_schedule="step:1"), ["lr_schedule='step:1'", "outside"]),
        # A real subset smaller than the published data: 1200 per worker, 32 × 8² = 2048.
        (dict(epochs=3, batch_schedule="1,2:8"), ["batch_schedule='1,2:8'", "shard of 1200"]),
    ],
)
def test_errors_that_need_the_data_come_before_any_cluster(changes, words):
    fields = {**SMALL, "max_steps": None, "workers": 2, "model": "mlp", **changes}
    with pytest.raises(ConfigError) as err:
        cfg = ExperimentConfig(strategy="allreduce", runtime="dask", **fields)
        run(cfg, address="tcp://127.0.0.1:9", progress=False, log=None)  # the address: never used
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_cli_reports_the_error_and_exits_1(capsys):
    code = main(["run", "--runtime", "sim", "--accumulate", "0", "--epochs", "1"])
    assert code == 1
    assert "accumulate=0" in capsys.readouterr().err
