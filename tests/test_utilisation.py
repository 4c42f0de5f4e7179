"""MFU and HFU in every run's summary: F counted by hand for the MLP and gpt-tiny, the peak of
the simulated device (none for a measured rate, with the reason), and a small simulated run's
summary.md and summary table, formula included."""

from __future__ import annotations

import math

import pytest
from common import SMALL

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.data import num_classes
from scaledl_lab.gpt import HIDDEN, LAYERS
from scaledl_lab.viz.utilisation import FORMULA, forward_flops, peak_of, utilisation_table

MLP_F = 2 * (784 * 512 + 512 * 512 + 512 * 10)  # Linear(784, 512), (512, 512), (512, 10)


def _cfg(**changes) -> ExperimentConfig:
    options = dict(strategy="allreduce", runtime="sim", workers=2, model="mlp", name="a",
                   compute_profile="a100")  # fmt: skip
    return ExperimentConfig(**{**options, **changes})


def _gpt_f() -> int:
    """2·N·S + 4·L·S²·h: N the Linear weights, L·12h² in the blocks and h·V in the head."""
    s, h, v = 32, HIDDEN, num_classes("licenses")
    return 2 * (LAYERS * 12 * h * h + h * v) * s + 4 * LAYERS * s * s * h


def test_forward_flops_are_counted_by_hand():
    assert forward_flops("mlp", "fashion-mnist") == MLP_F == 1_337_344
    assert forward_flops("gpt-tiny", "licenses") == _gpt_f()


@pytest.mark.parametrize(
    ("changes", "again"),
    [({}, 0.0), (dict(recompute=True), 1.0),
     (dict(model="gpt-tiny", dataset="licenses", recompute="selective"), None)],
)  # fmt: skip
def test_mfu_and_hfu_hand_computed(changes, again):
    """1,000 samples/s on two simulated A100s (19.5 TFLOP/s each in float32)."""
    cfg = _cfg(**changes)
    row = utilisation_table([cfg], {"a": 1000.0}).iloc[0]
    f = MLP_F if cfg.model == "mlp" else _gpt_f()
    if again is None:  # selective: the two cores' QKᵀ and AV, 4·S²·h each, per forward
        again = LAYERS * 4 * 32 * 32 * HIDDEN / f
    assert row["forward_flops"] == f and row["recomputed"] == pytest.approx(again, rel=1e-12)
    assert row["peak_flops"] == 19.5e12
    assert row["mfu"] == pytest.approx(1000 * 3 * f / (2 * 19.5e12), rel=1e-12)
    assert row["hfu"] == pytest.approx(1000 * (3 + again) * f / (2 * 19.5e12), rel=1e-12)


def test_no_mfu_against_a_measured_rate_and_the_reason():
    peak, reason = peak_of(_cfg(compute_profile="cpu-core"))
    assert math.isnan(peak)
    assert "compute profile 'cpu-core' is a measured rate, not a device's peak" in reason
    peak, reason = peak_of(_cfg(runtime="dask", device="cpu"))
    assert math.isnan(peak) and reason == "a CPU: the lab has no datasheet peak for its cores"
    row = utilisation_table([_cfg(compute_profile="cpu-core")], {"a": 1000.0}).iloc[0]
    assert math.isnan(row["mfu"]) and math.isnan(row["hfu"])


def test_a_simulated_run_reports_both_with_the_formula(tmp_path):
    text_run = dict(dataset="licenses", model="gpt-tiny", train_subset=64, val_size=16,
                    test_subset=16, batch_size=8, max_steps=4)  # fmt: skip
    cfg = _cfg(**{**SMALL, **text_run}, recompute="selective", name="tiny")
    res = run(cfg, progress=False)
    summary = res.summary().iloc[0]
    f, again = _gpt_f(), LAYERS * 4 * 32 * 32 * HIDDEN / _gpt_f()
    expected = summary["samples_per_s"] * 3 * f / (2 * 19.5e12)
    assert summary["mfu"] == pytest.approx(expected, rel=1e-12)
    assert summary["hfu"] == pytest.approx(expected * (3 + again) / 3, rel=1e-12)
    text = (res.save(tmp_path, figures=False) / "summary.md").read_text()
    assert "| MFU | HFU |" in text and FORMULA in text
    assert f"| {summary['mfu']:.2%} | {summary['hfu']:.2%} |" in text
    assert "a100's float32 datasheet peak, 19.5 TFLOP/s" in text


@pytest.mark.parametrize(
    ("name", "precision", "peak"),
    [("NVIDIA H100 80GB HBM3", "bfloat16", 989e12), ("NVIDIA H100 80GB HBM3", "float32", 67e12),
     ("NVIDIA A100-SXM4-80GB", "float16", 312e12), ("Tesla V100-SXM2-16GB", "bfloat16", 15.7e12),
     ("NVIDIA GeForce RTX 4090", "float32", math.nan)],
)  # fmt: skip
def test_a_real_gpu_is_read_by_its_name(monkeypatch, name, precision, peak):
    """Real workers on a GPU: its datasheet peak in the run's precision (16 bits where the GPU
    profiles have it; V100's float32 one otherwise), none for a GPU the lab has no sheet for."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: name)
    got, source = peak_of(_cfg(runtime="dask", precision=precision))
    if math.isnan(peak):
        assert math.isnan(got)
        assert source == f"{name}: no datasheet peak among the lab's GPUs (v100, a100, h100)"
    else:
        assert got == peak and source.startswith(f"{name}: ")
