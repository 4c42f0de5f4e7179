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


def test_the_traffic_sweep_runs_nnt_and_a_server_at_growing_n_for_two_steps():
    sweep = rp.traffic_configs(is_quick=True)
    assert [c.label for c in sweep] == [
        "traffic · nnt ring · 4w",
        "traffic · nnt ring · 16w",
        "traffic · nnt ring · 64w",
        "traffic · nnt torus · 16w",
        "traffic · nnt torus · 64w",
        "traffic · ps-sync · 4w",
        "traffic · ps-sync · 16w",
        "traffic · ps-sync · 64w",
    ]
    assert {c.topology for c in sweep if c.workers == 64} == {"ring", "torus:8x8", None}
    assert all(c.runtime == "sim" and c.max_steps == 2 for c in sweep)


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
    assert (tmp_path / "traffic" / "metrics.csv").is_file()
    assert "traffic ·" not in (tmp_path / "metrics.csv").read_text()
    # The sweep decides the traffic claim: NNT's bytes per worker are constant in N exactly.
    claim = "stays constant as the workers grow (within 5%), while a parameter server's grows"
    assert f"{claim} with them: **supported**" in summary
    assert "nnt torus 10.22, 10.22 MiB at N = 16, 64 (4 gradients, one per neighbour)" in summary
    cmp = rp.paper_table(results).set_index("run")
    data = load_for(configs[0])
    model_bytes = 4 * count_parameters(
        build_model("mlp", data.input_shape, data.num_classes, seed=0)
    )
    assert (cmp["model_bytes"] == model_bytes).all()
    # NNT sends its whole gradient to each neighbour: 4 on the torus, 2 on a 16-ring.
    assert cmp.loc["nnt-torus · sim · 16w", "bytes_per_worker_step"] == pytest.approx(
        4 * model_bytes
    )
    assert cmp.loc["nnt-ring · sim · 16w", "bytes_per_worker_step"] == pytest.approx(
        2 * model_bytes
    )
    assert cmp.loc["allreduce · dask · 1w", "speedup_vs_1_worker"] == pytest.approx(1.0)
    # Speed-up and time per epoch agree: one worker's time per epoch over the run's.
    one = cmp.loc["allreduce · dask · 1w", "time_per_epoch_s"]
    dask = cmp[cmp["runtime"] == "dask"]
    assert (dask["speedup_vs_1_worker"] * dask["time_per_epoch_s"]).to_list() == pytest.approx(
        [one] * len(dask)
    )
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
