"""Model and hardware FLOP utilisation of a run (MFU: Chowdhery et al. 2022, PaLM, App. B; HFU:
Korthikanti et al. 2022, §6), from its throughput, its model's FLOPs and its device's peak.

MFU = samples/s × 3·F ÷ (workers × peak): F is the model's forward FLOPs per sample, as the
lab counts them everywhere (:func:`scaledl_lab.models.model_flops`, the simulator's cost model
included): 2 × the multiply-accumulates of the Linear and convolution layers and of attention's
QKᵀ and AV. A step is three forwards (the backward two). For gpt-tiny, per sequence of S tokens,
F = 2·N·S + 4·L·S²·h (N: the Linear layers' weights), so 3·F is 6·N + 12·L·h·S per token, the
formula of Kaplan et al. 2020 and PaLM. HFU adds what recomputation runs again: samples/s ×
(3 + r)·F ÷ (workers × peak), r the forwards run again per step (1 with whole layers; the
attention cores' share of a forward with ``recompute='selective'``; 0 without). The mesh and
tensor parallelism recompute their blocks only, the embedding and head not: there r = 1 is an
upper bound.

The peak: on the simulator, the float32 datasheet peak of the device its compute profile is
built on (``a100``: 19.5 TFLOP/s, the simulator computing at 40% of it). The ``cpu-core``
profile and calibration files are measured rates, not peaks: MFU against them would read near
100% and say nothing of the hardware, so it is left out, with the reason. On real workers, a
GPU the lab has a datasheet for (V100, A100, H100; 16-bit runs: the dense 16-bit peak of
:mod:`scaledl_lab.runtime.sim.gpus`), as this process sees it; a CPU has none the lab knows.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..data import num_classes, sample_shape
from ..models import model_flops
from ..runtime.sim.cost import ACHIEVED_FRACTION, PEAK_FP32
from ..runtime.sim.gpus import GPUS, gpu_profile
from ..strategies.memory.recompute import recomputed_forwards

FORMULA = (
    "MFU = samples/s × 3·F ÷ (workers × peak); HFU = samples/s × (3 + r)·F ÷ (workers × peak). "
    "F: the model's forward FLOPs per sample (2 × the multiply-accumulates of its Linear and "
    "convolution layers and of attention's QKᵀ and AV; a transformer's 3·F is 6·N + 12·L·h·S "
    "per token), a step being three forwards; r: the forwards recomputation runs again per "
    "step (1 for whole layers, the attention cores' share for selective, 0 without)."
)
COLUMNS = ["run", "forward_flops", "recomputed", "peak_flops", "peak", "mfu", "hfu"]


@functools.lru_cache(maxsize=64)
def forward_flops(model: str, dataset: str) -> int:
    """F: forward FLOPs per sample of ``model`` on ``dataset``'s samples."""
    return model_flops(model, sample_shape(dataset), num_classes(dataset))


def peak_of(cfg: Any) -> tuple[float, str]:
    """One worker's peak FLOP/s and where it comes from; NaN and the reason when none."""
    if cfg.runtime == "sim":
        device = cfg.compute_profile
        if device in PEAK_FP32:
            return PEAK_FP32[device], (
                f"{device}'s float32 datasheet peak, {PEAK_FP32[device] / 1e12:g} TFLOP/s "
                f"(the simulator computes at {ACHIEVED_FRACTION:.0%} of it)"
            )
        return math.nan, (
            f"compute profile {device!r} is a measured rate, not a device's peak: MFU against "
            "it would read near 100% and say nothing of the hardware (simulate a100, h100 or "
            "v100 for one)"
        )
    import torch

    if cfg.device == "cpu" or not torch.cuda.is_available():
        return math.nan, "a CPU: the lab has no datasheet peak for its cores"
    name = torch.cuda.get_device_name(0)
    for key, peak in PEAK_FP32.items():
        if key in name.lower():
            if cfg.precision != "float32" and key in GPUS:
                peak = gpu_profile(key).peak_flops
                return peak, f"{name}: dense 16-bit datasheet peak, {peak / 1e12:g} TFLOP/s"
            return peak, f"{name}: float32 datasheet peak, {peak / 1e12:g} TFLOP/s"
    return math.nan, f"{name}: no datasheet peak among the lab's GPUs ({', '.join(PEAK_FP32)})"


def utilisation_table(configs: Sequence[Any], samples_per_s: Mapping[str, float]) -> pd.DataFrame:
    """One row per run (its config's label): F, r, the peak and its source, MFU and HFU, from
    the run's throughput (``samples_per_s``, the whole cluster's)."""
    records = []
    for cfg in configs:
        f = forward_flops(cfg.model, cfg.dataset)
        r = recomputed_forwards(cfg, num_classes(cfg.dataset))
        peak, source = peak_of(cfg)
        rate = samples_per_s.get(cfg.label, math.nan) / (cfg.workers * peak)
        records.append([cfg.label, f, r, peak, source, rate * 3 * f, rate * (3 + r) * f])
    return pd.DataFrame(records, columns=COLUMNS)


def utilisation_markdown(table: pd.DataFrame) -> str:
    """The summary's section: the formula, each run's F, r, peak, MFU and HFU."""
    lines = ["\n## FLOP utilisation (MFU, HFU)\n", FORMULA, ""]
    lines += ["| run | F per sample (MFLOP) | r | peak per worker | MFU | HFU |"]
    lines += ["| :--- | ---: | ---: | :--- | ---: | ---: |"]
    for t in table.itertuples(index=False):
        cells = [str(t.run).replace("|", "\\|"), f"{t.forward_flops / 1e6:,.3f}"]
        cells += [f"{t.recomputed:.4f}", t.peak, _percent(t.mfu), _percent(t.hfu)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.2%}"
