"""`reproduce --long`: its runs, time to a target accuracy, seed bands (on a tiny config)."""

from __future__ import annotations

import math

import pandas as pd

from scaledl_lab import long_run
from scaledl_lab.reproduce import Setting


def test_the_long_comparison_is_simulated_full_data_twenty_epochs_seeds_and_a_grid():
    configs = long_run.long_configs()
    assert {c.runtime for c in configs} == {"sim"} and {c.workers for c in configs} == {16}
    assert {c.epochs for c in configs} == {20} and {c.train_subset for c in configs} == {None}
    assert {c.seed for c in configs} == {0, 1, 2}
    assert len(configs) == len(long_run.LONG_METHODS) * 3 * 3  # methods × rates × seeds
    torus = [c for c in configs if c.strategy == "nnt" and c.topology == "torus:4x4"]
    assert {c.optimizer for c in torus} == {"adagrad"}


def test_time_to_target_is_the_first_evaluation_that_reaches_it():
    frame = pd.DataFrame(
        [
            dict(run="a", kind="test", rank=r, epoch=e, time=t + r, accuracy=acc)
            for e, t, accs in ((1, 1.0, (0.5, 0.7)), (2, 2.0, (0.8, 0.9)), (3, 3.0, (0.9, 0.9)))
            for r, acc in enumerate(accs)
        ]
    )
    assert long_run.time_to_target(frame, "a", 0.6) == 2.0  # mean 0.6 at epoch 1, rank 1's time
    assert long_run.time_to_target(frame, "a", 0.85) == 3.0
    assert math.isnan(long_run.time_to_target(frame, "a", 0.95))


def test_a_tiny_long_run_writes_its_table_bands_and_verdicts(tmp_path):
    tiny = Setting("fashion-mnist", "mlp", 2, 32, "adam", 1e-3, 0.0, 1600, 0)
    configs = [
        c.replace(test_subset=200, val_size=200, workers=9, topology=c.topology and "torus:3x3")
        for c in long_run.long_configs(tiny, seeds=(0, 1), lr_factors=(1.0,))
        if c.strategy == "allreduce" or c.topology == "torus:4x4"
    ]
    long_run.reproduce_long(out=tmp_path, configs=configs, progress=False)
    table = pd.read_csv(tmp_path / "comparison.csv")
    assert "time_to_target_s" in table and len(table) == len(configs)
    assert (tmp_path / "seed_bands_vs_epoch.png").is_file()
    assert (tmp_path / "seed_bands_vs_time.png").is_file()
    summary = (tmp_path / "summary.md").read_text()
    assert "## The long comparison (simulated, seeds and learning-rate grid)" in summary
    assert "NNT reaches the accuracy of synchronous SGD" in summary
