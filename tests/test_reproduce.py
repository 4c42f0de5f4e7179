"""`reproduce`: every method of the paper comparison runs, and the report comes from the table."""

from __future__ import annotations

import math

import pytest

from scaledl_lab import reproduce as rp
from scaledl_lab.models import build_model, count_parameters
from scaledl_lab.worker import load_for


def test_quick_comparison_has_the_papers_runs():
    configs = rp.paper_configs(is_quick=True)
    labels = [c.label for c in configs]
    assert labels[0] == "allreduce · dask · 1w"
    sim = [c for c in configs if c.runtime == "sim"]
    assert {c.workers for c in sim} == {16}
    assert {c.topology for c in sim if c.strategy == "nnt"} == {"ring", "torus:4x4"}
    assert {c.servers for c in sim if c.strategy.startswith("ps-")} == {8}
    assert sum(bool(c.stragglers) for c in configs) == 3
    # One setting for every run: same data, model, epochs, batch and optimiser.
    assert (
        len({(c.dataset, c.model, c.epochs, c.batch_size, c.optimizer, c.lr) for c in configs}) == 1
    )


def test_report_from_a_small_run(client, tmp_path):
    configs = [
        c.replace(train_subset=3200, test_subset=300, val_size=300, epochs=1, batch_size=32)
        for c in rp.paper_configs(is_quick=True)
    ]
    results = rp.reproduce(
        is_quick=True, out=tmp_path, client=client, configs=configs, progress=False
    )
    table = (tmp_path / "comparison.csv").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert "## The paper comparison" in summary and "Claims of the paper" in summary
    for cfg in configs:
        assert cfg.label in table
    cmp = rp.comparison_table(results).set_index("run")
    data = load_for(configs[0])
    model_bytes = 4 * count_parameters(
        build_model("mlp", data.input_shape, data.num_classes, seed=0)
    )
    # NNT sends its whole gradient to each neighbour: 4 on the torus, 2 on a 16-ring.
    assert cmp.loc["nnt-torus · sim · 16w", "bytes_per_worker_step"] == pytest.approx(
        4 * model_bytes
    )
    assert cmp.loc["nnt-ring · sim · 16w", "bytes_per_worker_step"] == pytest.approx(
        2 * model_bytes
    )
    assert cmp.loc["allreduce · dask · 1w", "speedup_vs_1_worker"] == pytest.approx(1.0)
    for run, row in cmp.iterrows():
        assert 0.0 < row["test_acc_best_worker"] <= 1.0, run
        assert row["time_per_epoch_s"] > 0, run
        assert math.isnan(row["straggler_slowdown"]) != ("straggler" in run)


def test_the_embedded_cluster_is_sized_for_the_real_runs_only():
    from scaledl_lab import ExperimentConfig, compare

    small = dict(
        model="mlp", train_subset=640, test_subset=100, val_size=100, batch_size=16, max_steps=2
    )
    messages: list[str] = []
    compare(
        [
            ExperimentConfig(strategy="allreduce", workers=1, **small),
            ExperimentConfig(strategy="allreduce", runtime="sim", workers=16, **small),
        ],
        progress=False,
        log=messages.append,
    )
    assert any("(1 local workers)" in m for m in messages), messages
