"""`plan --gpu` with context parallelism (cp: ring attention or Ulysses) and expert parallelism
(ep, a transformer given its experts): memory and step time on hand-computed cases, each
refusal's message, the command's text, JSON and search."""

from __future__ import annotations

import dataclasses
import json

import pytest

from scaledl_lab.cli import main
from scaledl_lab.errors import ConfigError
from scaledl_lab.runtime.sim.cost import all_to_all_time, allreduce_time
from scaledl_lab.runtime.sim.gpus import gpu_profile
from scaledl_lab.strategies.memory.mesh_parts import ring_bytes, ulysses_bytes
from scaledl_lab.strategies.memory.mesh_plan import (
    MeshSetup,
    fits,
    hardware_flops,
    model_flops,
    plan_mesh,
)
from scaledl_lab.strategies.memory.mesh_search import search
from scaledl_lab.strategies.memory.transformer import Transformer
from scaledl_lab.studies.context import study

A100 = gpu_profile("a100")
SMALL = Transformer(8, 1024, 16, 512, 1000)  # L, h, a, s, V
NVLINK = A100.network  # one node: every group below crosses NVLink (α 3.4 µs, β 300 GB/s)
ALPHA, BETA = NVLINK.latency_s, NVLINK.bandwidth_Bps


def test_the_context_studys_formulas_are_the_plans():
    """One definition: the context study reads the bytes from the planner's module."""
    assert study.ring_bytes is ring_bytes and study.ulysses_bytes is ulysses_bytes
    # b = 1, 16 heads of 64, s = 512 over C = 2, 16-bit: a block is 2·1·16·256·64·2 bytes
    assert ring_bytes(1, 16, 512, 2, 64, 2) == (1 + 3) * 2**20
    assert ulysses_bytes(1, 16, 512, 2, 64, 2) == 8 * 2**19 // 2


def test_cp_divides_the_activations_and_not_the_model_states():
    one = plan_mesh(SMALL, MeshSetup("dp=2", 8), A100)
    for c in (2, 4):
        p = plan_mesh(SMALL, MeshSetup(f"dp=2,cp={c}", 8), A100)
        assert p.activations == pytest.approx(one.activations / c)
        assert (p.params, p.grads, p.optim) == (one.params, one.grads, one.optim)
        # the same FLOPs over c times the GPUs
        assert p.compute_s == pytest.approx(one.compute_s / c)


def test_ring_attention_adds_only_what_the_attention_does_not_hide():
    """8 layers, micro-batches of b = 2 on C = 2 (one node), the ring's 4 blocks per layer
    against the attention core's 12·b·s²·h/C FLOPs: the difference, where positive."""
    setup = MeshSetup("cp=2", 4, micro_batches=2)
    p = plan_mesh(SMALL, setup, A100)
    transfer = ring_bytes(2, 16, 512, 2, 64, 2) / BETA + 4 * ALPHA
    attention = 12 * 2 * 512**2 * 1024 / 2 / A100.achieved_flops
    assert p.cp_s == pytest.approx(2 * 8 * max(0.0, transfer - attention))
    # the transfer (a 4 MiB · 2 = 8 MiB) takes longer than the attention core here
    assert transfer > attention and p.cp_s > 0
    # a slow enough GPU hides it all
    slow = dataclasses.replace(A100, matmul_efficiency=A100.matmul_efficiency / 100)
    assert plan_mesh(SMALL, setup, slow).cp_s == 0.0
    # full recomputation sends the forward's C − 1 = 1 block again: 5 blocks a layer
    full = plan_mesh(SMALL, dataclasses.replace(setup, recompute="full"), A100)
    block = ring_bytes(2, 16, 512, 2, 64, 2) // 4
    assert full.cp_s == pytest.approx(2 * 8 * max(0.0, 5 * block / BETA + 5 * ALPHA - attention))


def test_ulysses_runs_eight_all_to_alls_a_layer_not_overlapped():
    p = plan_mesh(SMALL, MeshSetup("cp=2,tp=2", 4, cp_method="ulysses"), A100)
    # each tp rank's 8 heads of 64, 256 positions, 16-bit: b = 4 sequences
    mine = 4 * 8 * 256 * 64 * 2
    assert p.cp_s == pytest.approx(8 * 8 * all_to_all_time(mine, 2, NVLINK))
    # the tp collectives carry the member's S/C positions
    assert p.tp_s == pytest.approx(8 * 4 * allreduce_time(2 * 256 * 4 * 1024, 2, NVLINK))


def test_experts_split_over_ep_with_their_flops_and_all_to_alls():
    """8 experts, k = 2, on dp=2 × ep=2: a GPU holds 4 experts; the batch of 16 is split over
    the 4 data ranks (b = 4)."""
    h, L, V, s = 1024, 8, 1000, 512
    setup = MeshSetup("dp=2,ep=2", 16, experts=8, top_k=2)
    p = plan_mesh(SMALL, setup, A100)
    block = 4 * h * h + 3 * h + 5 * h + 8 * h + 4 * (8 * h * h + 4 * h + h)
    psi = L * block + V * h + s * h
    assert (p.params, p.grads, p.optim) == (2 * psi, 2 * psi, 12 * psi)
    # FLOPs: Narayanan's h² term (1 + 2k)/3 = 5/3 of the dense model's
    assert model_flops(SMALL, 16, 2) == pytest.approx(
        72 * 16 * s * L * h * h * (5 / 3 + s / (6 * h) + V / (12 * L * h))
    )
    assert p.hardware_flops == hardware_flops(SMALL, 16, "none", 2) == p.model_flops
    # four all-to-alls a layer of b·s·k tokens of h 16-bit values
    assert p.ep_s == pytest.approx(8 * 4 * all_to_all_time(4 * s * 2 * h * 2, 2, NVLINK))
    # gradients: the non-expert weights' over the 4 data ranks, the experts' over dp's 2
    experts = L * 4 * (8 * h * h + 4 * h + h)
    grads = allreduce_time(2 * (psi - experts), 4, NVLINK) + allreduce_time(2 * experts, 2, NVLINK)
    assert p.dp_s == pytest.approx(grads)
    # activations: the experts' inner 16sbh k times (no tp: 34 + 5as/h, + 16 once more)
    dense = plan_mesh(SMALL, MeshSetup("dp=4", 16), A100)
    assert p.activations - dense.activations == pytest.approx(L * 16 * s * 4 * h)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (MeshSetup("cp=2", 8, cp_method="zigzag"), "--cp-method 'zigzag'; allowed: ring, ulysses"),
        (MeshSetup("cp=3", 3), "cp=3 does not divide the sequence of 512"),
        (MeshSetup("cp=4,tp=8", 8, cp_method="ulysses"),
         "Ulysses splits the heads over cp: cp=4 does not divide the 2 heads"),
        (MeshSetup("dp=2", 8, experts=4, top_k=5), "--experts 4 --top-k 5: experts ≥ 1"),
        (MeshSetup("dp=2", 8, experts=-1), "--experts -1 --top-k 1"),
        (MeshSetup("ep=2", 8), "ep=2 splits the experts: give --experts N"),
        (MeshSetup("ep=4", 8, experts=6), "ep=4 does not divide the 6 experts"),
        (MeshSetup("dp=2,cp=2", 8, zero_stage=3), "ZeRO-3 with cp or ep is not modelled"),
        (MeshSetup("dp=2,ep=2", 6, experts=4), "global batch 6 is not a positive multiple of "
         "dp × ep = 4"),
        (MeshSetup("ep=2", 8, micro_batches=3, experts=2), "over dp × ep = 2 is 4 sequences per "
         "replica, which --micro-batches 3 does not divide"),
    ],
)  # fmt: skip
def test_a_cp_or_ep_setup_that_cannot_run_is_refused(setup, message):
    with pytest.raises(ConfigError, match=message):
        plan_mesh(SMALL, setup, A100)


GPT = ["plan", "--transformer", "8,1024,16,512,1000", "--gpu", "a100"]


def test_the_command_prints_cp_and_ep_and_their_json(capsys):
    argv = GPT + ["--mesh", "dp=2,ep=2,cp=2", "--global-batch-size", "16", "--experts", "8",
                  "--top-k", "2", "--cp-method", "ulysses"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    setup = MeshSetup("dp=2,ep=2,cp=2", 16, cp_method="ulysses", experts=8, top_k=2)
    p = plan_mesh(SMALL, setup, A100)
    assert "each MLP 8 experts, 2 per token" in out
    assert f"{'cp ulysses all-to-alls (not overlapped)':42s} {p.cp_s:12.4f} s" in out
    assert f"{'ep all-to-alls (not overlapped)':42s} {p.ep_s:12.4f} s" in out
    assert main(argv + ["--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert (body["cp_s"], body["ep_s"], body["step_s"]) == (p.cp_s, p.ep_s, p.step_s)
    assert body["setup"]["experts"] == 8 and body["setup"]["cp_method"] == "ulysses"


def test_search_tries_cp_and_ep_when_the_model_has_experts(capsys):
    found = search(SMALL, 8, 16, A100, experts=4, top_k=1)
    dims = {c.dims for c in found}
    assert (1, 1, 1, 2, 4) in dims and (2, 1, 1, 4, 1) in dims and (1, 2, 1, 1, 4) in dims
    assert {c.setup.cp_method for c in found if c.dims[3] > 1} == {"ring", "ulysses"}
    assert not any(c.setup.zero_stage == 3 and c.dims[3] * c.dims[4] > 1 for c in found)
    assert all(c.plan == plan_mesh(SMALL, c.setup, A100, 8) for c in found[:50])
    # a dense model: no ep
    assert {c.dims[4] for c in search(SMALL, 8, 16, A100)} == {1}
    argv = ["plan", "--search", "--workers", "8", "--global-batch-size", "16", "--transformer",
            "8,1024,16,512,1000", "--gpu", "a100", "--experts", "4", "--top", "3"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "cp  ep   cp by" in out


def test_a_sequence_one_node_cannot_hold_fits_with_cp():
    """Llama 3 8B's shape (32 layers of 4096, 32 heads, a 128,256-token vocabulary) at 131,072
    tokens, one sequence a step on H100s, TP 8 with sequence parallelism and selective
    recomputation: one node's eight GPUs cannot hold its activations, two nodes' with cp = 2
    can; what cp divides is the activations, by C, never the model states."""
    h100 = gpu_profile("h100")
    llama = Transformer(32, 4096, 32, 131_072, 128_256)

    def planned(mesh: str):
        return plan_mesh(llama, MeshSetup(mesh, 1, recompute="selective",
                                          sequence_parallel=True), h100)  # fmt: skip

    alone, two, sixteen = planned("tp=8"), planned("tp=8,cp=2"), planned("tp=8,cp=16")
    assert not fits(alone, h100) and alone.memory > h100.memory_bytes
    assert fits(two, h100) and fits(sixteen, h100)
    assert two.activations == pytest.approx(alone.activations / 2)
    assert sixteen.activations == pytest.approx(alone.activations / 16)
    assert (sixteen.params, sixteen.grads, sixteen.optim) == (
        alone.params,
        alone.grads,
        alone.optim,
    )
