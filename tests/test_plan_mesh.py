"""`scaledl-lab plan --transformer ... --mesh ... --gpu ...`: the GPU profiles, the analytical
plan's formulas on hand-computed cases, its errors, and the command's text and JSON."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from scaledl_lab.cli import main
from scaledl_lab.errors import ConfigError
from scaledl_lab.runtime.sim.cost import allreduce_time
from scaledl_lab.runtime.sim.gpus import gpu_profile
from scaledl_lab.strategies.memory.mesh_plan import (
    MeshSetup,
    hardware_flops,
    layer_activation_bytes,
    model_flops,
    plan_mesh,
)
from scaledl_lab.strategies.memory.transformer import Transformer

A100 = gpu_profile("a100")
SMALL = Transformer(8, 1024, 16, 512, 1000)  # L, h, a, s, V


# -- formulas on hand-computed cases --------------------------------------------------------


def test_flops_follow_narayanan_et_al():
    m, B = Transformer(2, 64, 4, 32, 100), 4
    assert model_flops(m, B) == pytest.approx(72 * 4 * 32 * 2 * 64**2 * (1 + 32 / 384 + 100 / 1536))
    full = hardware_flops(m, B, "full")
    assert full == pytest.approx(96 * 4 * 32 * 2 * 64**2 * (1 + 32 / 384 + 100 / 2048))
    # full recomputation runs every block's forward again, not the logits': 24BsLh²(1 + s/6h)
    assert full - model_flops(m, B) == pytest.approx(24 * 4 * 32 * 2 * 64**2 * (1 + 32 / 384))
    assert hardware_flops(m, B, "selective") - model_flops(m, B) == 4 * B * 32**2 * 64 * 2
    assert hardware_flops(m, B, "none") == model_flops(m, B)


def test_layer_activations_follow_korthikanti_et_al():
    s, b, h, a = 512, 2, 1024, 16
    sbh = s * b * h
    assert layer_activation_bytes(SMALL, b, 1, False, "none") == sbh * (34 + 5 * a * s / h)
    assert layer_activation_bytes(SMALL, b, 8, False, "none") == pytest.approx(
        sbh * (10 + 24 / 8 + 5 * a * s / (h * 8))
    )
    assert layer_activation_bytes(SMALL, b, 8, True, "none") == sbh * (34 + 5 * a * s / h) / 8
    assert layer_activation_bytes(SMALL, b, 8, True, "selective") == sbh * 34 / 8
    assert layer_activation_bytes(SMALL, b, 8, False, "full") == 2 * sbh
    assert layer_activation_bytes(SMALL, b, 8, True, "full") == 2 * sbh / 8


@pytest.mark.parametrize(
    ("schedule", "v", "expected"),
    [("1f1b", 1, 3 / 8), ("gpipe", 1, 3 / 8), ("interleaved-1f1b", 2, 3 / 16), ("zb-h1", 1, 1 / 8)],
)
def test_the_bubble_is_the_schedules(schedule, v, expected):
    setup = MeshSetup("dp=2,pp=4", 32, micro_batches=8, schedule=schedule, virtual_stages=v)
    p = plan_mesh(SMALL, setup, A100)
    assert p.bubble_s == pytest.approx(expected * (p.compute_s + p.tp_s))


def test_the_pipeline_stash_per_schedule():
    """The first stage holds p micro-batches (1F1B: L layers' worth), all m (GPipe), or
    L(1 + (p − 1)/(pv)) (interleaved)."""
    per_layer = layer_activation_bytes(SMALL, 1, 1, False, "none")
    stash = {}
    for schedule, v in (("1f1b", 1), ("gpipe", 1), ("interleaved-1f1b", 2)):
        setup = MeshSetup("pp=4", 8, micro_batches=8, schedule=schedule, virtual_stages=v)
        stash[schedule] = plan_mesh(SMALL, setup, A100).activations / per_layer
    assert stash == pytest.approx({"1f1b": 8, "gpipe": 16, "interleaved-1f1b": 8 * (1 + 3 / 8)})


def test_tensor_parallel_collectives_inside_a_node_and_across_two():
    setup = MeshSetup("dp=2,tp=8", 16, micro_batches=2)
    p = plan_mesh(SMALL, setup, A100)
    n = 2 * 512 * 4 * 1024  # 16-bit bsh of a micro-batch of 4 sequences
    per = 2 * 7 / 8 * n / 300e9 + 2 * 7 * 3.4e-6  # the ring on NVLink, by hand
    assert p.tp_s == pytest.approx(2 * 8 * 4 * per)  # micro-batches × layers × 4 allreduces
    across = plan_mesh(SMALL, dataclasses.replace(setup, mesh="tp=8,dp=2"), A100)
    per_ib = 2 * 7 / 8 * n / 25e9 + 2 * 7 * 14e-6
    assert across.tp_s == pytest.approx(2 * 8 * 4 * per_ib)
    assert across.step_s > p.step_s


def test_data_parallel_gradients_zero_and_memory():
    dp = 16  # two nodes: the gradients cross InfiniBand
    psi = 8 * (12 * 1024**2 + 7 * 1024 + 6 * 1024) + (1000 + 512) * 1024
    base = MeshSetup(f"dp={dp}", 16)
    p = plan_mesh(SMALL, base, A100)
    assert p.dp_s == pytest.approx(allreduce_time(2 * psi, dp, A100.network.inter))
    assert (p.params, p.grads, p.optim) == (2 * psi, 2 * psi, 12 * psi)
    z1 = plan_mesh(SMALL, dataclasses.replace(base, zero_stage=1), A100)
    z3 = plan_mesh(SMALL, dataclasses.replace(base, zero_stage=3), A100)
    assert (z1.params, z1.grads, z1.optim) == (2 * psi, 2 * psi, 12 * psi / dp)
    assert (z3.params, z3.grads, z3.optim) == (2 * psi / dp, 2 * psi / dp, 12 * psi / dp)
    hidden = plan_mesh(SMALL, dataclasses.replace(base, overlap_grad_reduce=True), A100)
    assert hidden.dp_s == max(0.0, p.dp_s - p.compute_s * 2 / 3)


def test_mfu_and_hfu_state_their_flops():
    setup = MeshSetup("dp=2,pp=2,tp=2", 16, micro_batches=4, recompute="full")
    p = plan_mesh(SMALL, setup, A100)
    assert p.mfu == pytest.approx(model_flops(SMALL, 16) / (p.step_s * 8 * 312e12))
    assert p.hfu == pytest.approx(hardware_flops(SMALL, 16, "full") / (p.step_s * 8 * 312e12))
    assert p.tflops_per_gpu == pytest.approx(p.hfu * 312)
    parts = p.compute_s + p.tp_s + p.bubble_s + p.pp_s + p.dp_s + p.optimizer_s
    assert p.step_s == pytest.approx(parts)
    # compute: the hardware FLOPs spread over the 8 GPUs at the calibrated rate
    assert p.compute_s == pytest.approx(hardware_flops(SMALL, 16, "full") / 8 / A100.achieved_flops)


# -- clear errors before work ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "workers", "message"),
    [
        (MeshSetup("dp=2,tp=2", 8), 8, "its product 4 is not --workers 8"),
        (MeshSetup("tp=3", 3), None, "tp=3 does not divide the 16 attention heads"),
        (MeshSetup("pp=3", 3), None, "pp=3 × virtual stages 1 = 3 does not divide the 8 layers"),
        (MeshSetup("dp=3", 8), None, "global batch 8 is not a positive multiple of dp=3"),
        (MeshSetup("dp=2", 8, micro_batches=0), None, "--micro-batches 0 must be a positive"),
        (MeshSetup("dp=2", 8, micro_batches=3), None, "4 sequences per replica, which "
         "--micro-batches 3 does not divide"),
        (MeshSetup("pp=4", 6, micro_batches=6, schedule="interleaved-1f1b", virtual_stages=2),
         None, "interleaved-1f1b needs the micro-batches \\(6\\) a multiple of pp=4"),
        (MeshSetup("pp=2", 8, virtual_stages=2), None, "above 1 only with interleaved-1f1b"),
        (MeshSetup("dp=2", 8, schedule="dualpipe"), None, "pipeline schedule 'dualpipe'"),
        (MeshSetup("dp=2", 8, recompute="half"), None, "recompute='half'; allowed: none"),
        (MeshSetup("dp=2", 8, zero_stage=4), None, "zero_stage=4; allowed: 0, 1, 2, 3"),
        (MeshSetup("dp=2", 8, gpus_per_node=0), None, "--gpus-per-node 0 must be a positive"),
    ],
)  # fmt: skip
def test_a_setup_that_cannot_run_is_refused(setup, workers, message):
    with pytest.raises(ConfigError, match=message):
        plan_mesh(SMALL, setup, A100, workers)


GPT = ["plan", "--transformer", "8,1024,16,512,1000", "--global-batch-size", "16"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--gpu", "a100", "--mesh", "dp=2", "--global-batch-size", "4"],
         "--gpu plans a transformer given by its sizes: give --transformer"),
        ([*GPT, "--gpu", "a100", "--mesh", "dp=2", "--model", "cnn"],
         "--model cnn is one of the lab's networks, planned without --gpu"),
        (["plan", "--transformer", "8,1024,16,512,1000", "--gpu", "a100"],
         "--gpu needs --mesh and --global-batch-size"),
        ([*GPT, "--recompute", "selective"], "--recompute selective is planned for a "
         "transformer on GPUs"),
        ([*GPT, "--json"], "--json prints a transformer's plan on GPUs"),
        ([*GPT, "--recompute", "full"], "a run of the lab's models recomputes whole layers "
         "(--recompute, no value)"),
    ],
)  # fmt: skip
def test_the_command_refuses_what_it_cannot_plan(argv, message, capsys):
    assert main(argv) == 1
    assert message in " ".join(capsys.readouterr().err.split())


# -- the command ----------------------------------------------------------------------------


def test_the_command_prints_the_plan_and_its_json(capsys, tmp_path):
    argv = [*GPT, "--gpu", "a100", "--mesh", "dp=2,pp=2,tp=2", "--micro-batches", "4",
            "--recompute", "selective", "--sequence-parallel", "--workers", "8"]  # fmt: skip
    setup = MeshSetup("dp=2,pp=2,tp=2", 16, micro_batches=4, recompute="selective",
                      sequence_parallel=True)  # fmt: skip
    p = plan_mesh(SMALL, setup, A100)
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"step {p.step_s:.4f} s" in out
    assert f"MFU {p.mfu:.2%}" in out and f"HFU {p.hfu:.2%}" in out
    assert f"total {p.memory / 1e9:.3f} GB of {80 * 2**30 / 1e9:.3f} GB: fits" in out
    assert main([*argv, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["step_s"] == p.step_s and body["mfu"] == p.mfu and body["fits"] is True
    assert body["setup"]["recompute"] == "selective"
    out = tmp_path / "plan.json"
    assert main([*argv, "--json", "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == body


def test_the_command_says_by_how_much_it_does_not_fit(capsys):
    argv = [*GPT, "--gpu", "h100", "--mesh", "dp=2", "--device-memory-gb", "1"]
    p = plan_mesh(SMALL, MeshSetup("dp=2", 16), gpu_profile("h100"))
    assert main(argv) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"does not fit: {(p.memory - 1e9) / 1e9:.3f} GB over" in out
    assert not math.isnan(p.memory)
