"""`reproduce`: every method of the paper comparison runs, and the report comes from the table."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scaledl_lab.models import build_model, count_parameters
from scaledl_lab.studies import claims
from scaledl_lab.studies import reproduce as rp
from scaledl_lab.training.worker import load_for


def test_quick_comparison_has_the_papers_runs():
    configs = rp.paper_configs(is_quick=True)
    labels = [c.label for c in configs]
    assert labels[0] == "allreduce · dask · 1w"
    sim = [c for c in configs if c.runtime == "sim"]
    assert {c.workers for c in sim} == {16}
    assert {c.topology for c in sim if c.strategy == "nnt"} == {"ring", "torus:4x4"}
    assert {c.servers for c in sim if c.strategy.startswith("ps-")} == {8}
    assert sum(bool(c.stragglers) for c in configs) == 4
    # The paper's optimisers: NNT with AdaGrad 0.01 / 1e-4, the baselines with Adam 1e-3.
    paper = [c for c in configs if "same optimiser" not in c.label]
    settings = {c.strategy: (c.optimizer, c.lr, c.weight_decay) for c in paper}
    assert settings["nnt"] == ("adagrad", 0.01, 1e-4)
    assert {v for k, v in settings.items() if k != "nnt"} == {("adam", 1e-3, 0.0)}
    # Same data, model, epochs and batch for every run.
    assert len({(c.dataset, c.model, c.epochs, c.batch_size) for c in configs}) == 1
    same = {c.label: (c.strategy, c.optimizer) for c in configs if "same optimiser" in c.label}
    assert same == {
        "nnt-torus · sim · 16w · same optimiser": ("nnt", "adam"),
        "allreduce · sim · 16w · same optimiser": ("allreduce", "adagrad"),
    }
    # Both NNT variants with the straggler: FAST's (unbounded) and a lead bound of 4.
    leads = {c.nnt_max_lead for c in configs if c.stragglers and c.strategy == "nnt"}
    assert leads == {None, 4}


def test_seeds_and_the_learning_rate_grid_repeat_the_chosen_simulated_runs():
    configs = rp.paper_configs(is_quick=True, seeds=(0, 1, 2), lr_factors=rp.LR_GRID)
    torus = [c for c in configs if c.label.startswith("nnt-torus · sim · 16w · lr")]
    assert [c.label for c in torus[:4]] == [
        "nnt-torus · sim · 16w · lr×1/3 · seed 0",
        "nnt-torus · sim · 16w · lr×1/3 · seed 1",
        "nnt-torus · sim · 16w · lr×1/3 · seed 2",
        "nnt-torus · sim · 16w · lr×1 · seed 0",
    ]
    assert sorted({(c.lr, c.seed) for c in torus}) == [
        (0.01 * f, s) for f in rp.LR_GRID for s in (0, 1, 2)
    ]
    assert rp.LR_GRID == (1 / 3, 1.0, 3.0)
    ring = [c for c in configs if c.label.startswith("nnt-ring · sim")]
    assert {c.seed for c in ring} == {0} and len(ring) == 3  # one seed, three rates
    quick = rp.paper_configs(is_quick=True, seeds=rp.QUICK_SEEDS)
    assert len(quick) == len(rp.paper_configs(is_quick=True)) + 2 * 2  # 2 methods × 2 seeds


def test_the_traffic_sweep_runs_nnt_and_a_server_at_growing_n_for_two_steps():
    sweep = rp.traffic_configs(is_quick=True)
    assert [c.label for c in sweep] == [
        "traffic · allreduce · 4w",
        "traffic · allreduce · 16w",
        "traffic · allreduce · 64w",
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
    # One epoch of batches of 16: 8 steps of two Dask workers (16 of one) on 256 samples; 3 steps
    # of 16 simulated workers on 768, the fewest that give each worker a step rate beside its
    # time per epoch (a rate leaves the last step out), so the straggler claims are decided too.
    small = dict(test_subset=128, val_size=128, epochs=1, batch_size=16)
    configs = [
        c.replace(train_subset=256 if c.runtime == "dask" else 768, **small)
        for c in rp.paper_configs(is_quick=True)
    ]
    # Two processes, as the command's default: the real runs first, then the simulated ones and
    # the sweep in one pool, cut apart into the two folders.
    results = rp.reproduce(
        is_quick=True, out=tmp_path, client=client, configs=configs, progress=False, jobs=2
    )
    table = (tmp_path / "comparison.csv").read_text()
    summary = (tmp_path / "summary.md").read_text()
    assert "## The paper comparison" in summary and "Claims of the paper" in summary
    for cfg in configs:
        assert cfg.label in table
    assert (tmp_path / "traffic" / "metrics.csv").is_file()
    assert "traffic ·" not in (tmp_path / "metrics.csv").read_text()
    # The sweep decides the traffic claim: NNT's bytes per worker are constant in N exactly.
    decided = claims.verdicts(
        pd.read_csv(tmp_path / "comparison.csv"), pd.read_csv(tmp_path / "traffic.csv")
    )
    traffic = {c.key: c for c in decided}["traffic"]
    assert traffic.verdict == "supported"
    torus = [traffic.figures[f"nnt torus bytes_per_worker_step @{n}w"] for n in (16, 64)]
    assert torus[0] == torus[1] and torus[0] / 2**20 == pytest.approx(10.22, abs=0.005)
    assert claims.markdown_line(traffic) in summary.splitlines()  # rendered from the Claim
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
