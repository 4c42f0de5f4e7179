"""Context parallelism's claims (#49, results/context/): the committed study renders from its
CSVs and supports each claim; a recomputation at small size gives the committed rows; each
verdict turns when its rule fails."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from common import assert_recomputed_rows

from scaledl_lab.studies.context import report, study

RESULTS = Path(__file__).resolve().parents[1] / "results" / "context"


@pytest.fixture(scope="module")
def committed() -> dict[str, pd.DataFrame]:
    return report.read(RESULTS)


def test_the_committed_study_renders_from_its_csvs_and_supports_every_claim(committed):
    text = (RESULTS / "summary.md").read_text()
    assert text[text.index("## Verdicts") :] == "\n".join(report.verdict_section(committed)) + "\n"
    claims = report.verdicts(committed)
    keys = ["ring-memory", "ring-overlap", "ring-overlap-backward", "ulysses-volume", "zigzag"]
    assert [c.key for c in claims] == keys
    assert all(c.supported for c in claims), [c.reason for c in claims]
    # where the backward hides its transfers, the last hop of dK/dV home stays exposed
    assert claims[2].figures["worst_exposed_where_hidden"] > 0.005
    overlap = committed["overlap"]
    assert overlap["hidden_by_rule"].any() and not overlap["hidden_by_rule"].all()
    assert list(zip(committed["traffic"]["sequence"], committed["traffic"]["cp"], strict=True)) == [
        p for p in study.POINTS for _ in ("ring", "ulysses")
    ]


def test_a_recomputation_at_small_size_gives_the_committed_rows(committed):
    point = (study.POINTS[0],)
    assert_recomputed_rows(
        study.traffic_table(point), committed["traffic"], ["method", "sequence", "cp"]
    )
    assert_recomputed_rows(study.work_table(point), committed["work"], ["cp", "split", "rank"])
    memory = study.memory_table(cps=(1, 2), methods=("ulysses",))
    assert_recomputed_rows(memory, committed["memory"], ["method", "cp"])
    assert_recomputed_rows(
        study.overlap_table(per_member=(256,)), committed["overlap"], ["per_member", "link"]
    )


def test_the_formulas_follow_the_recorded_bytes_beyond_the_study_s_points():
    table = study.traffic_table(((24, 3),), heads=6, d=4)
    assert (table["bytes_sent"] == table["formula"]).all() and table["ranks_alike"].all()


def test_each_verdict_turns_when_its_rule_fails(committed):
    wide = committed["memory"].copy()
    wide.loc[wide["method"] == "ring", "activations_times_c"] = 1.5  # 1.5/C, not 1/C
    assert report.memory_claim(wide).verdict == "not supported"
    serial = committed["overlap"].assign(measured_s=lambda t: t["serial_s"])  # no overlap
    serial["exposed"] = serial["measured_s"] / serial["free_s"] - 1
    assert report.overlap_claim(serial).verdict == "not supported"
    late = committed["overlap"].assign(backward_beyond_home=0.05)  # a transfer exposed
    assert report.backward_overlap_claim(late).verdict == "not supported"
    hidden = committed["overlap"].assign(backward_beyond_home=0.0)  # even where it cannot be
    assert report.backward_overlap_claim(hidden).verdict == "not supported"
    traffic = committed["traffic"].copy()
    ring = traffic["method"] == "ring"
    traffic.loc[ring, "bytes_sent"] = traffic.loc[ring, "bytes_sent"].iloc[0]  # ring constant
    assert report.traffic_claim(traffic, committed["memory"]).verdict == "not supported"
    assert report.traffic_claim(committed["traffic"], committed["memory"]).supported
    memory = committed["memory"].assign(bytes_sent=lambda t: t["bytes_sent"] + 1)  # a byte off
    assert report.traffic_claim(committed["traffic"], memory).verdict == "not supported"
    work = committed["work"].copy()
    work.loc[work["split"] == "zig-zag", "max_over_min"] = 1.5
    assert report.zigzag_claim(work).verdict == "not supported"


def test_the_summary_is_written_from_the_tables(tmp_path, committed):
    for name, frame in committed.items():
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
    report.main(["--out", str(tmp_path), "--summary"])
    assert (tmp_path / "summary.md").read_text() == (RESULTS / "summary.md").read_text()


@pytest.mark.parametrize("method", ["ring", "ulysses"])
def test_the_members_outputs_in_sequence_order_are_full_attention(method):
    split, full = study.split_against_full(method, sequence=16, members=4)
    assert split.shape == full.shape == (1, 4, 16, 4)
    assert (split - full).abs().max().item() < 1e-12


def test_the_diagrams_draw_the_ring_s_order_and_the_split_s_work():
    from matplotlib.figure import Figure

    from scaledl_lab.strategies.mesh.context import Split
    from scaledl_lab.viz.context import causal_work_diagram, ring_steps_diagram

    ax = ring_steps_diagram(Split(32, 4), ax=Figure().subplots())
    owners = [t.get_text().split("\n")[0] for t in ax.texts if t.get_text()]  # not the arrows
    assert owners == [f"K,V of {(r - t) % 4}" for r in range(4) for t in range(4)]
    plain = causal_work_diagram(Split(32, 4, zigzag=False), ax=Figure().subplots())
    zigzag = causal_work_diagram(Split(32, 4), ax=Figure().subplots())
    assert plain.get_title() == "plain split, C=4: work max/min 6.33"  # 1 + 2(C - 1) x 8/9
    assert zigzag.get_title() == "zig-zag split, C=4: work max/min 1.00"
