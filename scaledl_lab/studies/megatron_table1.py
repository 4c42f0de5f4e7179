"""Megatron-LM's Table 1 (Narayanan et al. 2021, SC'21: GPT models from 1.7B parameters on 32
A100s to 1T on 3072, 137 to 163 TFLOP/s per GPU) held against ``scaledl-lab plan``'s
predictions, with a peer's (llm-analysis) beside them.

The published rows are ``results/megatron-table1/table1.csv`` (the README's table, and the
paper's heads and TP/PP split); the peer's predictions ``llm_analysis.csv`` (made by
``benchmarks/llm_analysis_table1.py`` in a virtual environment of its own). Each row is
planned as Megatron-LM ran it (:func:`setup_of`): full recomputation, 16-bit, tensor
parallelism innermost (inside a node), 1F1B, micro-batches of one sequence where PP > 1 and
the replica's whole batch at once where PP = 1 (the paper does not give them; the same for the
peer). The GPU profile's one fitted constant, the matmul efficiency, is fitted on one row,
:data:`FIT_ROW` (:func:`fit_efficiency`); every other row is a prediction.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import pandas as pd

from ..runtime.sim.gpus import GPU, gpu_profile
from ..strategies.memory.mesh_plan import MeshSetup, plan_mesh
from ..strategies.memory.transformer import Transformer
from .verdict import Claim, mark

FOLDER = Path(__file__).resolve().parents[2] / "results" / "megatron-table1"
SEQUENCE, VOCABULARY, FIT_ROW = 2048, 51200, "1.7B"
MEDIAN_WITHIN, WORST_WITHIN = 0.15, 0.30
SOURCE = (
    "Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU Clusters "
    "Using Megatron-LM (SC'21), Table 1; the Megatron-LM README's table (NVIDIA/Megatron-LM "
    "at 50a4b5f, images/cases_april2021.png)"
)


def published(folder: Path = FOLDER) -> pd.DataFrame:
    return pd.read_csv(folder / "table1.csv")


def peer(folder: Path = FOLDER) -> pd.DataFrame:
    return pd.read_csv(folder / "llm_analysis.csv")


def micro_batch_size(row: pd.Series) -> int:
    """One sequence per micro-batch where there is a pipeline (the smallest bubble), the
    replica's whole batch at once where there is none."""
    dp = int(row.gpus) // (int(row.tp) * int(row.pp))
    return 1 if int(row.pp) > 1 else int(row.batch_size) // dp


def model_of(row: pd.Series) -> Transformer:
    return Transformer(int(row.layers), int(row.hidden), int(row.heads), SEQUENCE, VOCABULARY)


def setup_of(row: pd.Series) -> MeshSetup:
    dp = int(row.gpus) // (int(row.tp) * int(row.pp))
    micro = int(row.batch_size) // (dp * micro_batch_size(row))
    return MeshSetup(
        mesh=f"dp={dp},pp={int(row.pp)},tp={int(row.tp)}", global_batch_size=int(row.batch_size),
        micro_batches=micro, schedule="1f1b", recompute="full",
    )  # fmt: skip


def predict(table: pd.DataFrame, gpu: GPU) -> pd.DataFrame:
    """One row per published row: the published and predicted TFLOP/s per GPU, the relative
    error, the plan's MFU, HFU, memory per GPU and step by part."""
    rows = []
    for row in table.itertuples():
        p = plan_mesh(model_of(row), setup_of(row), gpu, int(row.gpus))
        rows.append(dict(
            model=row.model, tp=row.tp, pp=row.pp, gpus=row.gpus, batch_size=row.batch_size,
            micro_batch_size=micro_batch_size(row), published=float(row.tflops_per_gpu),
            predicted=p.tflops_per_gpu, error=p.tflops_per_gpu / row.tflops_per_gpu - 1,
            mfu=p.mfu, hfu=p.hfu, memory_gib=p.memory / 2**30, step_s=p.step_s,
            compute_s=p.compute_s, tp_s=p.tp_s, bubble_s=p.bubble_s, pp_s=p.pp_s, dp_s=p.dp_s,
            optimizer_s=p.optimizer_s, fitted=row.model == FIT_ROW,
        ))  # fmt: skip
    return pd.DataFrame(rows)


def fit_efficiency(table: pd.DataFrame, gpu: GPU, model: str = FIT_ROW) -> float:
    """The matmul efficiency that makes the plan predict ``model``'s published figure (60
    bisections between 0.05 and 1)."""
    row = table[table.model == model].iloc[[0]]
    low, high = 0.05, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        tried = predict(row, dataclasses.replace(gpu, matmul_efficiency=mid)).iloc[0]
        low, high = (mid, high) if tried.predicted < tried.published else (low, mid)
    return (low + high) / 2


def side_by_side(table: pd.DataFrame, peers: pd.DataFrame, gpu: GPU) -> pd.DataFrame:
    """The plan's rows with the peer's two predictions and their errors beside them."""
    ours = predict(table, gpu)
    theirs = peers.set_index("model").loc[ours.model]
    for kind in ("shipped", "fitted"):
        tflops = theirs[f"{kind}_tflops_per_gpu"].to_numpy(dtype=float)
        ours[f"peer_{kind}"] = tflops
        ours[f"peer_{kind}_error"] = tflops / ours.published.to_numpy() - 1
    return ours


def _spread(errors: pd.Series) -> tuple[float, float]:
    magnitudes = errors.abs().tolist()
    return statistics.median(magnitudes), max(magnitudes)


def verdicts(rows: pd.DataFrame) -> list[Claim]:
    """The acceptance (median and worst error over the rows not fitted on) and the comparison
    with the peer, as shipped and fitted on the same row."""
    predicted = rows[~rows.fitted]
    median, worst = _spread(predicted.error)
    claims = [Claim(
        key="table1", source=SOURCE, in_our_words=True,
        claim="the plan predicts the TFLOP/s per GPU of Megatron-LM's Table 1",
        test=f"median |error| ≤ {MEDIAN_WITHIN:.0%} and worst ≤ {WORST_WITHIN:.0%} over the "
        f"{len(predicted)} rows not fitted on",
        verdict=mark(median <= MEDIAN_WITHIN and worst <= WORST_WITHIN),
        reason=f"median |error| {median:.1%}, worst {worst:.1%}",
        figures={"median_error": median, "worst_error": worst, "rows": len(predicted)},
    )]  # fmt: skip
    for kind in ("shipped", "fitted"):
        peer_median, peer_worst = _spread(predicted[f"peer_{kind}_error"])
        claims.append(Claim(
            key=f"peer-{kind}", source="llm-analysis (PyPI), results/megatron-table1/"
            "llm_analysis.csv", in_our_words=True,
            claim=f"the plan is closer to Table 1 than llm-analysis {kind_words(kind)}",
            test="a smaller median |error| over the rows not fitted on",
            verdict=mark(median < peer_median),
            reason=f"median |error| {median:.1%} (plan) against {peer_median:.1%} (peer), "
            f"worst {worst:.1%} against {peer_worst:.1%}",
            figures={"median_error": median, "peer_median_error": peer_median,
                     "worst_error": worst, "peer_worst_error": peer_worst},
        ))  # fmt: skip
    return claims


def kind_words(kind: str) -> str:
    return {
        "shipped": "as it ships (flops_efficiency 1)",
        "fitted": f"with its one efficiency fitted on the same row ({FIT_ROW})",
    }[kind]


def markdown(rows: pd.DataFrame) -> str:
    """The side-by-side table, TFLOP/s per GPU and errors, as summary.md shows it."""
    lines = [
        "| model | TP | PP | GPUs | batch | micro-batch | published | plan | error | "
        "llm-analysis shipped | error | llm-analysis fitted | error | plan MFU | plan memory |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows.itertuples():
        fitted = " (fitted)" if r.fitted else ""
        lines.append(
            f"| {r.model}{fitted} | {r.tp} | {r.pp} | {r.gpus} | {r.batch_size} | "
            f"{r.micro_batch_size} | {r.published:.0f} | {r.predicted:.1f} | {r.error:+.1%} | "
            f"{r.peer_shipped:.1f} | {r.peer_shipped_error:+.1%} | {r.peer_fitted:.1f} | "
            f"{r.peer_fitted_error:+.1%} | {r.mfu:.1%} | {r.memory_gib:.1f} GiB |"
        )
    return "\n".join(lines)


def default_gpu() -> GPU:
    return gpu_profile("a100")
