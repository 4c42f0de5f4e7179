"""Megatron-LM's Table 1 against `plan` (results/megatron-table1/): the committed published
rows, the calibration, the predictions and the typed verdict, all from the committed files."""

from __future__ import annotations

import pandas as pd
import pytest
from common import benchmark_module

from scaledl_lab.runtime.sim.gpus import profiles_file
from scaledl_lab.studies import megatron_table1 as study

TABLE = study.published()
GPU = study.default_gpu()


def test_the_published_rows_agree_with_themselves():
    """TP × PP is the README's model-parallel size; the sizes give the parameter count the
    table rounds; the percentage of peak is the TFLOP/s over the A100's 312."""
    assert (TABLE.tp * TABLE.pp == TABLE.model_parallel).all()
    for row in TABLE.itertuples():
        assert round(study.model_of(row).parameters / 1e9, 1) == pytest.approx(
            row.parameters_billion, abs=0.051
        )
        assert round(100 * row.tflops_per_gpu / 312) == row.peak_percent


def test_the_calibration_is_the_one_row_fit():
    fitted = study.fit_efficiency(TABLE, GPU)
    held = profiles_file()["calibration"]["matmul_efficiency"]["a100"]
    assert round(fitted, 4) == held["value"] == GPU.matmul_efficiency
    assert study.FIT_ROW in held["source"]


def test_the_committed_predictions_and_verdict_are_the_plans():
    rows = study.side_by_side(TABLE, study.peer(), GPU)
    committed = pd.read_csv(study.FOLDER / "predictions.csv")
    for column in ("predicted", "error", "mfu", "memory_gib", "peer_fitted", "peer_shipped"):
        assert committed[column].to_numpy() == pytest.approx(rows[column].to_numpy(), rel=1e-5)
    claims = {c.key: c for c in study.verdicts(rows)}
    table1 = claims["table1"]
    assert table1.verdict == "supported"
    assert table1.figures["median_error"] <= study.MEDIAN_WITHIN
    assert table1.figures["worst_error"] <= study.WORST_WITHIN
    assert claims["peer-shipped"].verdict == "supported"
    assert claims["peer-fitted"].verdict == "not supported"  # the peer is closer there
    summary = (study.FOLDER / "summary.md").read_text()
    with benchmark_module("megatron_table1") as bench:
        assert bench.summary(rows, list(claims.values()), GPU) == summary


def test_the_peer_ran_the_same_rows_with_the_same_micro_batches():
    peers = study.peer().set_index("model")
    for row in TABLE.itertuples():
        assert peers.loc[row.model, "micro_batch_size"] == study.micro_batch_size(row)


def test_the_readme_quotes_the_committed_verdict():
    rows = study.side_by_side(TABLE, study.peer(), GPU)
    claims = {c.key: c for c in study.verdicts(rows)}
    readme = " ".join((study.FOLDER.parents[1] / "README.md").read_text().split())
    ours, shipped, fitted = claims["table1"], claims["peer-shipped"], claims["peer-fitted"]
    assert (
        f"within {ours.figures['median_error']:.1%} of the published (median) and "
        f"{ours.figures['worst_error']:.1%} (worst)" in readme
    )
    assert (
        f"off by {shipped.figures['peer_median_error']:.1%} as it ships and by "
        f"{fitted.figures['peer_median_error']:.1%} fitted on the same row" in readme
    )
    assert f"fitted on the {study.FIT_ROW} row" in readme
