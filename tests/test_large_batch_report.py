"""The large-batch claims decided on tables: each rule on a small hand-made table."""

from __future__ import annotations

import pandas as pd
import pytest

from scaledl_lab import ExperimentConfig
from scaledl_lab.strategies.large_batch.report import schedule_frame, updates, verdicts

ROLES = {r: r for r in ("small", "naive", "scaled", "warmup", "lars", "decay", "grow")}


def _frame(final: dict[str, float], steps: dict[str, int], batch: dict[str, int]) -> pd.DataFrame:
    rows = []
    for run, accuracy in final.items():
        rows += [
            dict(
                run=run,
                kind="train",
                rank=0,
                step=s + 1,
                epoch=0.0,
                effective_batch_size=batch.get(run, 128),
            )
            for s in range(steps.get(run, 10))
        ]
        rows += [dict(run=run, kind="test", rank=0, step=0, epoch=0.0, accuracy=0.1),
                 dict(run=run, kind="test", rank=0, step=steps.get(run, 10), epoch=10.0,
                      accuracy=accuracy)]  # fmt: skip
    return pd.DataFrame(rows)


def _sharp(small: tuple[float, float], large: tuple[float, float]) -> pd.DataFrame:
    return pd.DataFrame({"run": ["small", "naive"], "top_eigenvalue": [small[0], large[0]],
                         "epsilon_sharpness": [small[1], large[1]]})  # fmt: skip


def test_claims_follow_their_rules():
    final = dict(small=0.88, naive=0.80, scaled=0.85, warmup=0.86, lars=0.86, decay=0.89,
                 grow=0.885)  # fmt: skip
    frame = _frame(final, {"decay": 30, "grow": 12}, {"naive": 4096})
    claims = verdicts(frame, _sharp((10, 5), (30, 6)), ROLES, {})
    assert claims["gap"].supported and "8.0 points" in claims["gap"].measured
    assert "batch 4096: 80.0%" in claims["gap"].measured
    assert claims["warmup"].supported and "75% of the gap" in claims["warmup"].measured
    assert claims["smith"].supported and "2.5× fewer updates" in claims["smith"].measured
    assert claims["sharp"].supported and "×3.00" in claims["sharp"].measured
    assert "SUPPORTED" in claims["gap"].title


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        (dict(naive=0.87), "gap"),  # 1 point lost only
        (dict(warmup=0.83), "warmup"),  # 3 of 8 points back
        (dict(grow=0.87), "smith"),  # 2 points behind
    ],
)
def test_each_rule_can_fail(changes, key):
    final = dict(small=0.88, naive=0.80, scaled=0.85, warmup=0.86, lars=0.86, decay=0.89,
                 grow=0.885)  # fmt: skip
    frame = _frame({**final, **changes}, {"decay": 30, "grow": 12}, {})
    claims = verdicts(frame, _sharp((10, 5), (30, 6)), ROLES, {"scaled": "diverged"})
    assert not claims[key].supported
    assert "diverged without warmup" in claims["warmup"].measured


def test_sharper_needs_both_measures():
    frame = _frame(dict.fromkeys(ROLES, 0.8), {}, {})
    assert not verdicts(frame, _sharp((10, 5), (30, 5.1)), ROLES, {})["sharp"].supported
    assert not verdicts(frame, _sharp((10, 5), (10.5, 9)), ROLES, {})["sharp"].supported


def test_updates_and_schedule_frame():
    frame = _frame({"grow": 0.9}, {"grow": 12}, {})
    assert updates(frame, "grow") == 12
    cfg = ExperimentConfig(strategy="allreduce", runtime="sim", workers=1, batch_size=10,
                           epochs=4, batch_schedule="2:2", lr_scaling="linear")  # fmt: skip
    table = schedule_frame(cfg, 100)
    assert len(table) == 10 + 10 + 5 + 5
    assert table["effective_batch_size"].tolist() == [10] * 20 + [20] * 10
    assert table["lr"].iloc[-1] == pytest.approx(2 * table["lr"].iloc[0])
