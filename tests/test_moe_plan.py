"""``scaledl-lab plan`` for gpt-tiny-moe on a mesh of dp and ep (#49): what it predicts is what
a run records (the ledger's model states, the step's seconds and bytes), a rank holds the
non-expert weights and 1/ep of the experts, the bytes are the formulas' (four all-to-alls of
the experts' buffers per block, the gradients' reductions), and the command prints them."""

from __future__ import annotations

import pytest

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.runtime.collectives import all_to_all_bytes, ring_allreduce_bytes
from scaledl_lab.studies.moe.plan import plan_experts

MEM = ["mem_params", "mem_grads", "mem_optim"]
TEXT = dict(
    strategy="mesh", runtime="sim", dataset="licenses", model="gpt-tiny-moe", train_subset=64,
    val_size=8, test_subset=8, batch_size=8, epochs=1, max_steps=2, lr=0.05, momentum=0.9,
    seed=1, micro_batches=1, top_k=2,
)  # fmt: skip
# gpt-tiny-moe: 2 blocks of 4 experts h -> 4h -> h (h = 64), sequences of 32; float32
LAYERS, HIDDEN, S, SIZE = 2, 64, 32, 4
EXPERT = HIDDEN * 4 * HIDDEN + 4 * HIDDEN + 4 * HIDDEN * HIDDEN + HIDDEN


def _cfg(mesh: str, **extra) -> ExperimentConfig:
    sizes = [int(part.partition("=")[2]) for part in mesh.split(",")]
    workers = sizes[0] * (sizes[1] if len(sizes) > 1 else 1)
    return ExperimentConfig(**{**TEXT, **extra}, mesh=mesh, workers=workers)


@pytest.mark.parametrize(("mesh", "extra"), [("ep=2", {}), ("dp=2,ep=2", {"experts": 8})])
def test_plan_predicts_what_a_run_records(mesh, extra):
    cfg = _cfg(mesh, **extra)
    p = plan_experts(cfg)
    train = run(cfg, progress=False, log=None).frame.query("kind == 'train' and rank == 0")
    assert train[MEM].iloc[-1].tolist() == [getattr(p.plan.memory, k[4:]) for k in MEM]
    assert train["mem_params"].iloc[-1] == p.held_parameters * SIZE
    assert (train["bytes_sent"] == p.plan.bytes_per_step).all()
    assert train["time"].diff().iloc[-1] == pytest.approx(p.plan.step_s, rel=1e-9)


def test_the_bytes_and_parameters_are_the_formulas():
    one, two = plan_experts(_cfg("ep=2")), plan_experts(_cfg("dp=2,ep=2"))
    experts = LAYERS * 4 * EXPERT
    assert one.held_parameters == two.held_parameters
    assert plan_experts(_cfg("ep=4", top_k=1)).held_parameters == one.held_parameters - experts // 4
    places = -(-1.25 * 8 * S * 2 // 4)  # ceil(capacity factor × tokens × k / experts)
    buffers = int(4 * places * HIDDEN * SIZE)
    assert one.all_to_all_bytes == 4 * LAYERS * all_to_all_bytes(buffers, 2)
    rest = one.held_parameters - experts // 2
    assert one.gradient_bytes == ring_allreduce_bytes(rest * SIZE, 2)  # no dp: experts' none
    assert two.gradient_bytes == ring_allreduce_bytes(rest * SIZE, 4) + ring_allreduce_bytes(
        experts // 2 * SIZE, 2
    )


def test_the_plan_command_prints_the_ep_split_of_the_bytes(capsys):
    args = ["plan", "--strategy", "mesh", "--mesh", "ep=2", "--workers", "2", "--model",
            "gpt-tiny-moe", "--dataset", "licenses", "--micro-batches", "1", "--top-k", "2",
            "--batch-size", "8"]  # fmt: skip
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    p = plan_experts(_cfg("ep=2"))
    assert f"{p.plan.bytes_per_step:,} bytes sent per worker" in out
    assert f"holding {p.held_parameters:,} parameters (1/ep of the experts)" in out
    assert f"the all-to-alls: {p.all_to_all_bytes:,}, the gradients' reductions:" in out


def test_plan_experts_refuses_another_model():
    cfg = ExperimentConfig(**{**TEXT, "model": "gpt-tiny", "top_k": 1}, mesh="dp=2", workers=2)
    with pytest.raises(ConfigError, match=r"predicts gpt-tiny-moe on an ep mesh; not 'gpt-tiny'"):
        plan_experts(cfg)
