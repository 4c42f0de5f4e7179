"""benchmarks/bench_perf_table.py's table: targets judged at their bounds, markdown and CSV rows.

Pure formatting only; nothing here times anything (the script itself is run by hand).
"""

from __future__ import annotations

import csv

import pytest
from common import benchmark_module


@pytest.fixture(scope="module")
def table():
    with benchmark_module("bench_perf_table") as module:
        yield module


def test_targets_are_inclusive_at_their_bounds(table):
    at_least, at_most = table.Target(low=0.9), table.Target(high=1.5)
    within = table.Target(0.9, 1.1, "error within ±10%")
    assert at_least.is_met(0.9) and not at_least.is_met(0.899)
    assert at_most.is_met(1.5) and not at_most.is_met(1.501)
    assert within.is_met(0.9) and within.is_met(1.1) and not within.is_met(1.11)
    assert not within.is_met(0.89)
    assert at_least.text() == "≥ 0.90"
    assert at_most.text() == "≤ 1.50"
    assert within.text() == "0.90 to 1.10 (error within ±10%)"


def test_markdown_has_one_row_per_figure_with_its_verdict(table):
    figures = [
        table.Figure("allreduce 1 MB", 4.47, 1.61, "ms", 1.61 / 4.47, table.Target(low=0.9)),
        table.Figure("ps-sync, MLP", 6676.0, 11030.0, "samples/s", 0.8, table.Target(low=0.6)),
    ]
    assert table.markdown(figures).splitlines() == [
        "| what | ours | reference | ratio | target | met? |",
        "|---|---|---|---|---|---|",
        "| allreduce 1 MB | 4.47 ms | 1.61 ms | ×0.36 | ≥ 0.90 | **no** |",
        "| ps-sync, MLP | 6,676 samples/s | 11,030 samples/s | ×0.80 | ≥ 0.60 | yes |",
    ]


def test_csv_keeps_the_numbers_unrounded(table, tmp_path):
    figure = table.Figure("sim, MLP, N = 16", 2.345678, 1.0, "s", 2.345678, table.Target(high=1.5))
    table.write_csv([figure], tmp_path / "t.csv")
    with open(tmp_path / "t.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows == [
        {
            "what": "sim, MLP, N = 16",
            "ours": "2.345678",
            "reference": "1.0",
            "unit": "s",
            "ratio": "2.345678",
            "target": "≤ 1.50",
            "met": "False",
        }
    ]
