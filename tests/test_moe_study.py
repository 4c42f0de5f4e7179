"""Expert parallelism's claims (#49, results/moe/): the committed study renders from its CSVs
and decides each claim as committed; a recomputation at small size gives the committed rows;
each verdict turns when its evidence changes; the README's row reads the committed figures."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from common import assert_recomputed_rows

from scaledl_lab.studies.moe import report, study

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results" / "moe"


@pytest.fixture(scope="module")
def committed() -> dict[str, pd.DataFrame]:
    return report.read(RESULTS)


def test_the_committed_study_renders_from_its_csvs_and_decides_every_claim(committed):
    text = (RESULTS / "summary.md").read_text()
    assert text[text.index("## Verdicts") :] == "\n".join(report.verdict_section(committed)) + "\n"
    claims = {c.key: c for c in report.verdicts(committed)}
    keys = ["capacity-trade", "aux-balance", "aux-weight", "all-to-all-across-nodes"]
    assert list(claims) == keys
    assert claims["capacity-trade"].supported and claims["all-to-all-across-nodes"].supported
    # Switch's α evened the load on some seeds, not all: smaller than a seed's spread here
    balance = claims["aux-balance"]
    assert balance.verdict == "inconclusive" and 0 < balance.figures["seeds_evened"] < 3
    assert claims["aux-weight"].verdict == "not supported"  # α = 1 collapses the router
    assert list(committed["capacity"]["capacity_factor"]) == list(study.FACTORS)
    assert sorted(set(committed["balance"]["aux_loss_weight"])) == list(study.WEIGHTS)


def test_a_recomputation_at_small_size_gives_the_committed_rows(committed):
    assert_recomputed_rows(
        study.capacity_table(factors=(1.0,)), committed["capacity"], ["capacity_factor"]
    )
    assert_recomputed_rows(
        study.network_table(placements=(2,)), committed["network"], ["gpus_per_node"]
    )
    balance = study.balance_table(weights=(report.SWITCH_ALPHA,), seeds=(3,))  # 80 steps
    assert_recomputed_rows(balance, committed["balance"], ["aux_loss_weight", "seed", "step"])


def test_the_formulas_follow_the_counts_beyond_the_study_s_points():
    cfg = study.config("ep=4", 1, capacity_factor=0.75, top_k=2, experts=8)
    got, formula = study.counted(cfg), study.formulas(cfg)
    assert got["buffer_elements"] == formula["buffer_formula"]
    assert got["expert_flops"] == formula["flops_formula"]


def test_each_verdict_turns_when_its_evidence_changes(committed):
    capacity = committed["capacity"].copy()
    capacity.loc[capacity.index[-1], "dropped"] = 0.9  # more dropped at the largest factor
    assert report.capacity_claim(capacity).verdict == "not supported"
    off = committed["capacity"].assign(bytes_all_to_all=lambda t: t["bytes_all_to_all"] + 1)
    assert report.capacity_claim(off).verdict == "not supported"
    balance = committed["balance"].copy()
    switch = balance["aux_loss_weight"] == report.SWITCH_ALPHA
    balance.loc[switch, "moe_load_max"] = 4.0  # α = 0.01 on one expert, every seed
    assert report.balance_claim(balance).verdict == "not supported"
    balance.loc[switch, ["moe_load_max", "moe_dropped"]] = (1.0, 0.0)  # even, every seed
    assert report.balance_claim(balance).supported
    even = committed["balance"].copy()
    even["moe_load_max"] = 4.0 / (1 + even["aux_loss_weight"])  # more weight, more even
    assert report.weight_claim(even).supported
    network = committed["network"].copy()
    across = network["ep_link"].str.endswith(":inter")
    network.loc[across, "step_s"] += 1e-4  # the step grew by more than the all-to-alls
    assert report.network_claim(network).verdict == "not supported"
    cheap = committed["network"].copy()
    cheap.loc[across, "all_to_all_s"] = cheap.loc[~across, "all_to_all_s"].iloc[0] * 1.5
    assert report.network_claim(cheap).verdict == "not supported"


def test_the_summary_is_written_from_the_tables(tmp_path, committed):
    for name, frame in committed.items():
        frame.to_csv(tmp_path / f"{name}.csv", index=False)
    report.main(["--out", str(tmp_path), "--summary"])
    assert (tmp_path / "summary.md").read_text() == (RESULTS / "summary.md").read_text()


def test_the_readme_row_reads_the_committed_figures(committed):
    readme = " ".join((ROOT / "README.md").read_text().split())
    claims = {c.key: c for c in report.verdicts(committed)}
    cap = claims["capacity-trade"].figures
    assert f"dropped share {cap['dropped_first']:.3f} at f = 0.5 to {cap['dropped_last']:.3f}" in (
        readme
    )
    bal = claims["aux-balance"].figures
    assert f"{bal['load_max_free']:.2f} at α = 0 against {bal['load_max_switch']:.2f}" in readme
    net = claims["all-to-all-across-nodes"].figures
    assert f"×{net['ratio']:.1f} across nodes" in readme
    assert f"{net['share_inside']:.0%} of the step inside a node, {net['share_across']:.0%}" in (
        readme
    )
