"""The peer's predictions for Megatron-LM's Table 1: llm-analysis (PyPI, Cheng Li's latency and
memory analysis of transformer training for given TP/PP/DP/ZeRO) on each row of
results/megatron-table1/table1.csv, written to results/megatron-table1/llm_analysis.csv, which
the study (scaledl_lab.studies.megatron_table1) loads; the lab does not depend on llm-analysis.

Run it in a virtual environment of its own (llm-analysis is not installed beside the lab):

    python -m venv /tmp/llmvenv && /tmp/llmvenv/bin/pip install llm-analysis
    /tmp/llmvenv/bin/python benchmarks/llm_analysis_table1.py

Each row as Megatron-LM ran it and as the lab's plan reads it: the GPT's sizes (vocabulary
51,200, sequence 2048), A100 SXM 80GB, 16-bit, full recomputation, no flash attention (2021),
TP and PP of the row, DP the rest, micro-batches of one sequence where PP > 1 and the whole
replica's batch at once where PP = 1 (the rule of the study's ``micro_batch_size``). Two
predictions: llm-analysis as it ships (flops_efficiency 1, its default), and with its one
efficiency fitted on the same row the lab's plan is calibrated on (the 1.7B row, 137 TFLOP/s),
by bisection. TFLOP/s per GPU: Narayanan et al.'s 96BsLh²(1 + s/(6h) + V/(16Lh)) over the
latency it gives per iteration and the GPUs, as the table counts.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import tempfile
from importlib.metadata import version
from pathlib import Path

from llm_analysis.analysis import train

HERE = Path(__file__).resolve().parents[1] / "results" / "megatron-table1"
SEQUENCE, VOCABULARY, FIT_ROW = 2048, 51200, "1.7B"


def _flops(row: dict, batch: int) -> float:
    s, h, L, V = SEQUENCE, int(row["hidden"]), int(row["layers"]), VOCABULARY
    return 96 * batch * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))


def _micro_batch_size(row: dict) -> int:
    dp = int(row["gpus"]) // (int(row["tp"]) * int(row["pp"]))
    return 1 if int(row["pp"]) > 1 else int(row["batch_size"]) // dp


def _tflops(row: dict, efficiency: float | None, folder: str) -> tuple[float, float]:
    path = os.path.join(folder, f"{row['model']}.json")
    with open(path, "w") as f:
        json.dump(dict(name=f"megatron-{row['model']}", max_seq_len=SEQUENCE,
                       num_layers=int(row["layers"]), n_head=int(row["heads"]),
                       hidden_dim=int(row["hidden"]), vocab_size=VOCABULARY), f)  # fmt: skip
    out = train(
        model_name=path, gpu_name="a100-sxm-80gb", dtype_name="w16a16e16", log_level="ERROR",
        activation_recomputation=2, tp_size=int(row["tp"]), pp_size=int(row["pp"]),
        total_num_gpus=int(row["gpus"]), global_batch_size=int(row["batch_size"]),
        batch_size_per_gpu=_micro_batch_size(row), seq_len=SEQUENCE, flash_attn=False,
        flops_efficiency=efficiency,
    )  # fmt: skip
    latency = float(out["latency_per_iter"])
    return latency, _flops(row, int(row["batch_size"])) / latency / int(row["gpus"]) / 1e12


def main() -> None:
    logging.disable(logging.WARNING)
    rows = list(csv.DictReader(open(HERE / "table1.csv")))
    fit_row = next(r for r in rows if r["model"] == FIT_ROW)
    with tempfile.TemporaryDirectory() as folder:
        low, high = 0.05, 1.0  # bisection on the efficiency that predicts the row's figure
        for _ in range(60):
            mid = (low + high) / 2
            below = _tflops(fit_row, mid, folder)[1] < float(fit_row["tflops_per_gpu"])
            low, high = (mid, high) if below else (low, mid)
        fitted = (low + high) / 2
        out = []
        for r in rows:
            shipped = _tflops(r, None, folder)
            tuned = _tflops(r, fitted, folder)
            out.append(dict(model=r["model"], micro_batch_size=_micro_batch_size(r),
                            shipped_latency_s=f"{shipped[0]:.6g}",
                            shipped_tflops_per_gpu=f"{shipped[1]:.4g}",
                            fitted_efficiency=f"{fitted:.6g}",
                            fitted_latency_s=f"{tuned[0]:.6g}",
                            fitted_tflops_per_gpu=f"{tuned[1]:.4g}",
                            llm_analysis_version=version("llm-analysis")))  # fmt: skip
    with open(HERE / "llm_analysis.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(out[0]))
        writer.writeheader()
        writer.writerows(out)
    print(f"wrote {HERE / 'llm_analysis.csv'} (fitted efficiency {fitted:.4f})")


if __name__ == "__main__":
    main()
