"""``scaledl-lab plan`` for a mesh of dp and cp (#49): what it predicts is what a run records
(the ledger, the step's seconds and bytes), the bytes are the formulas' (ring attention's blocks
or Ulysses' all-to-alls, the gradients' average), the activations per rank fall as about 1/C,
and a mesh it cannot plan is refused with a message."""

from __future__ import annotations

import pytest

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.runtime.collectives import ring_allreduce_bytes
from scaledl_lab.studies.context.plan import STATS, plan_context
from scaledl_lab.studies.context.study import ring_bytes, ulysses_bytes

MEM = ["mem_params", "mem_grads", "mem_optim", "mem_activations", "mem_buffers"]
TEXT = dict(
    strategy="mesh", runtime="sim", dataset="licenses", model="gpt-tiny", train_subset=64,
    val_size=8, test_subset=8, batch_size=8, epochs=1, max_steps=3, lr=0.05, momentum=0.9, seed=1,
)  # fmt: skip
# gpt-tiny: 2 blocks of 4 heads of 16, sequences of 32; float32 (4 bytes); 458,112 weight bytes
LAYERS, HEADS, D, S, SIZE, WEIGHTS = 2, 4, 16, 32, 4, 458_112


def _cfg(mesh: str, method: str, **extra) -> ExperimentConfig:
    sizes = [int(part.partition("=")[2]) for part in mesh.split(",")]
    workers = sizes[0] * (sizes[1] if len(sizes) > 1 else 1)
    return ExperimentConfig(**{**TEXT, **extra}, mesh=mesh, workers=workers, cp_method=method)


@pytest.mark.parametrize(
    ("mesh", "method", "extra"),
    [("cp=2", "ulysses", {}), ("dp=2,cp=2", "ring", {"micro_batches": 2}), ("cp=4", "ring", {})],
)
def test_plan_predicts_what_a_run_records(mesh, method, extra):
    """Exactly: every ledger column and the bytes of every step; the seconds of a step."""
    cfg = _cfg(mesh, method, **extra)
    predicted = plan_context(cfg).plan
    train = run(cfg, progress=False, log=None).frame.query("kind == 'train' and rank == 0")
    assert train[MEM].iloc[-1].tolist() == list(predicted.memory.columns().values())
    assert (train["bytes_sent"] == predicted.bytes_per_step).all()
    assert train["time"].diff().iloc[-1] == pytest.approx(predicted.step_s, rel=1e-9)


@pytest.mark.parametrize(("method", "formula"), [("ring", ring_bytes), ("ulysses", ulysses_bytes)])
def test_the_bytes_are_the_formulas_and_the_activations_fall_as_one_over_c(method, formula):
    whole = plan_context(_cfg("dp=2,cp=1", method)).plan.memory.activations
    for c in (2, 4):
        p = plan_context(_cfg(f"dp=2,cp={c}", method))
        block = 2 * TEXT["batch_size"] * HEADS * (S // c) * D * SIZE  # a key/value block
        per_layer = {"ring": (3 * c - 2) * block, "ulysses": 4 * block * (c - 1) // c}[method]
        assert p.attention_bytes == LAYERS * per_layer
        assert p.attention_bytes == LAYERS * formula(TEXT["batch_size"], HEADS, S, c, D, SIZE)
        average = ring_allreduce_bytes(WEIGHTS, c) + ring_allreduce_bytes(WEIGHTS, 2)
        assert p.gradient_bytes == average
        assert p.plan.bytes_per_step == average + p.attention_bytes + ring_allreduce_bytes(STATS, c)
        assert 0.85 < p.plan.memory.activations * c / whole < 1.02, (c, method)


def test_the_plan_command_prints_the_cp_split_of_the_bytes(capsys):
    args = ["plan", "--strategy", "mesh", "--mesh", "cp=2", "--workers", "2", "--model",
            "gpt-tiny", "--dataset", "licenses", "--cp-method", "ring",
            "--batch-size", "8"]  # fmt: skip
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    p = plan_context(_cfg("cp=2", "ring"))
    assert f"activations {p.plan.memory.activations / 1e6:.3f} MB" in out
    assert f"{p.plan.bytes_per_step:,} bytes sent per worker" in out
    assert f"of which cp's attention (ring): {p.attention_bytes:,}," in out


def test_plan_refuses_a_mesh_it_cannot_predict():
    with pytest.raises(ConfigError, match=r"plan predicts a mesh of dp and cp .*; not tp=2$"):
        plan_context(_cfg("tp=2,cp=2", "ring"))
