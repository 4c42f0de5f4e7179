"""The compression study's tables and verdicts, and a run that diverges inside a study."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from common import SMALL

from scaledl_lab import ExperimentConfig
from scaledl_lab.experiment import Results
from scaledl_lab.studies.compression import report, study

SIM = dict(SMALL, runtime="sim", workers=2, model="mlp", max_steps=None, train_subset=1200)


def test_a_diverged_run_is_recorded_and_the_study_goes_on(tmp_path):
    good = ExperimentConfig(**SIM, compress="topk:0.05", name=study.label("topk:0.05", True))
    bad = ExperimentConfig(**dict(SIM, lr=1e4), compress="onebit", name="diverges")
    results = study.run_study(tmp_path / "s", configs=[bad, good, ExperimentConfig(**SIM)])
    table = report.accuracy_table(results).set_index("run")
    assert math.isnan(table.loc["diverges", "test_accuracy"])
    assert table.loc["diverges", "diverged_after_epoch"] == 0.0
    assert table.loc["topk:0.05 · EF", "test_accuracy"] > 0.3
    ratio = table.loc["topk:0.05 · EF", "compression_ratio"]
    assert ratio == pytest.approx(10, rel=0.01)  # 5% of the entries, 8 bytes each
    assert table.loc["allreduce-sim-2w", "points_vs_none"] == 0.0
    assert "Accuracy after equal epochs" in report.write_report(tmp_path / "s")
    for name in ("metrics.csv", "config.json", "summary.md", "compression_accuracy.png"):
        assert (tmp_path / "s" / name).stat().st_size > 0


def _table(rows):
    columns = ["compress", "error_feedback", "test_accuracy", "compression_ratio"]
    table = pd.DataFrame(rows, columns=columns)
    table["diverged_after_epoch"] = [math.nan if a == a else 2.0 for a in table.test_accuracy]
    table["points_vs_none"] = 100 * (table.test_accuracy - table.test_accuracy.iloc[0])
    return table


def test_verdicts_follow_their_rules():
    table = _table(
        [
            ("none", True, 0.88, 1.0),
            ("topk:0.004", True, 0.875, 125.0),
            ("topk:0.004", False, 0.84, 125.0),
            ("onebit", True, 0.86, 29.0),
            ("onebit", False, math.nan, 29.0),
        ]
    )
    claims = {c.key: c for c in report.verdicts(table)}
    assert {k: c.verdict for k, c in claims.items()} == {
        "topk:0.004 · EF": "supported",
        "topk:0.004 · no EF": "supported",
        "onebit · EF": "not supported",
        "onebit · no EF": "supported",
    }
    assert claims["topk:0.004 · EF"].figures["points_vs_none"] == pytest.approx(-0.5)
    assert claims["topk:0.004 · EF"].figures["compression_ratio"] == 125.0
    assert claims["topk:0.004 · no EF"].figures["points_below_ef"] == pytest.approx(3.5)
    assert claims["onebit · EF"].figures["points_vs_none"] == pytest.approx(-2.0)
    assert math.isnan(claims["onebit · no EF"].figures["points_below_ef"])
    assert claims["onebit · no EF"].figures["diverged_after_epoch"] == 2.0
    assert claims["onebit · EF"].source == "Seide et al. 2014"
    assert all(c.in_our_words for c in claims.values())
    # The summary's sentences, rendered from the claims.
    assert [report.sentence(c) for c in claims.values()] == [
        "top-k at ×125 with error feedback: -0.50 points against uncompressed — within 1 point.",
        "top-k without error feedback: 3.50 points below the same compressor with it — "
        "measurably worse.",
        "1-bit at ×29 with error feedback: -2.00 points against uncompressed — not within 1 point.",
        "1-bit without error feedback diverged after epoch 2 — measurably worse.",
    ]


def test_a_diverged_run_with_error_feedback_is_not_within_the_point():
    table = _table([("none", True, 0.88, 1.0), ("dgc:0.001", True, math.nan, 100.0)])
    (claim,) = report.verdicts(table)
    assert claim.verdict == "not supported" and claim.figures["diverged_after_epoch"] == 2.0
    assert report.sentence(claim) == (
        "DGC with error feedback diverged after epoch 2 — not within 1 point."
    )


def test_bytes_at_evaluations_accumulate_rank_zeros_sends():
    frame = pd.DataFrame(
        [
            dict(run="r", kind="test", rank=0, step=0, epoch=0.0, accuracy=0.1, bytes_sent=0),
            dict(run="r", kind="train", rank=0, step=1, epoch=0.5, accuracy=0.2, bytes_sent=10),
            dict(run="r", kind="train", rank=1, step=1, epoch=0.5, accuracy=0.2, bytes_sent=99),
            dict(run="r", kind="train", rank=0, step=2, epoch=1.0, accuracy=0.2, bytes_sent=30),
            dict(run="r", kind="test", rank=0, step=2, epoch=1.0, accuracy=0.5, bytes_sent=8),
        ]
    )
    points = report.bytes_at_evaluations(frame)
    assert points[["epoch", "accuracy", "bytes_sent"]].values.tolist() == [
        [0.0, 0.1, 0.0],
        [1.0, 0.5, 40.0],
    ]


def test_study_configs_share_everything_but_the_compression():
    configs = study.study_configs(is_quick=True)
    assert [c.label for c in configs][:3] == ["none", "topk:0.004 · EF", "topk:0.004 · no EF"]
    assert len({c.replace(compress="none", error_feedback=True, name=None) for c in configs}) == 1
    assert isinstance(Results, type)


def test_powersgd_and_qsgd_get_verdicts_too():
    table = _table(
        [
            ("none", True, 0.88, 1.0),
            ("powersgd:2", True, 0.875, 100.0),
            ("qsgd:4", True, 0.76, 7.9),
            ("qsgd:4", False, 0.86, 7.9),
        ]
    )
    claims = {c.key: c for c in report.verdicts(table)}
    assert {k: c.verdict for k, c in claims.items()} == {
        "powersgd:2 · EF": "supported",
        "qsgd:4 · unbiased": "not supported",  # 2 points below uncompressed
    }
    assert claims["powersgd:2 · EF"].source == "Vogels et al. 2019"
    assert claims["qsgd:4 · unbiased"].source == "Alistarh et al. 2017"
    assert claims["qsgd:4 · unbiased"].figures["points_vs_none"] == pytest.approx(-2.0)
    assert report.sentence(claims["qsgd:4 · unbiased"]) == (
        "QSGD with 4 levels (unbiased) at ×8 without error feedback: -2.00 points against "
        "uncompressed — not within 1 point."
    )
    better = _table([("none", True, 0.88, 1.0), ("qsgd:4", False, 0.875, 7.9)])
    assert [(c.key, c.verdict) for c in report.verdicts(better)] == [
        ("qsgd:4 · unbiased", "supported")
    ]
