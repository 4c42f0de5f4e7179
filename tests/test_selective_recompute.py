"""Selective recomputation (Korthikanti et al. 2022), ``recompute='selective'`` on gpt-tiny:
the parameters of the run without it, bit for bit, on every strategy that runs gpt-tiny's
attention and on real Dask workers; the ledger's activations down by exactly what attention's
core saved; its FLOPs, and only they, again on the simulator's clock, as ``plan`` predicts;
the clear errors."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
from common import SMALL, max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import _config_from_args, _parser
from scaledl_lab.data import num_classes
from scaledl_lab.gpt import HEADS, HIDDEN, LAYERS
from scaledl_lab.models import model_flops
from scaledl_lab.strategies.memory.plan import plan

cloudpickle.register_pickle_by_value(sys.modules[__name__])

S, B = 32, 8  # the licenses corpus's sequence; sequences per worker
TEXT = dict(
    dataset="licenses", model="gpt-tiny", train_subset=128, val_size=32, test_subset=32,
    batch_size=B, max_steps=20, precision="float32", seed=1,
)  # fmt: skip
# Every program that trains gpt-tiny differently: a replica, a pipeline, ZeRO-3 layer by layer,
# Megatron's blocks over tp (dp×tp, and pp×tp), tensor parallelism alone.
CASES = {
    "allreduce": {},
    "gpipe": dict(micro_batches=2),
    "zero3": {},
    "mesh dp=2,tp=2": dict(strategy="mesh", mesh="dp=2,tp=2", workers=4),
    "mesh pp=2,tp=2": dict(strategy="mesh", mesh="pp=2,tp=2", workers=4, micro_batches=2),
    "tensor-parallel": {},
}
_RUNS: dict[tuple[str, object], object] = {}


def _cfg(case: str, **changes) -> ExperimentConfig:
    options = {"strategy": case.split()[0], "runtime": "sim", "workers": 2, **SMALL, **TEXT}
    return ExperimentConfig(**{**options, **CASES[case], **changes})


def _run(case: str, recompute: object):
    if (case, recompute) not in _RUNS:
        _RUNS[case, recompute] = run(_cfg(case, recompute=recompute), progress=False)
    return _RUNS[case, recompute]


def _train(res):
    return res.frame.query("kind == 'train'").sort_values(["rank", "step"])


@pytest.mark.parametrize("case", list(CASES))
def test_selective_recomputation_changes_no_parameter(case):
    """20 steps in float32, bit for bit; it ran: the clock moved, by less than a forward."""
    plain, again = _run(case, False), _run(case, "selective")
    assert max_diff(plain.model_state_dict(), again.model_state_dict()) == 0.0
    assert _train(again)["loss"].tolist() == _train(plain)["loss"].tolist()
    t_plain, t_again = _train(plain)["time"].max(), _train(again)["time"].max()
    assert t_plain < t_again < t_plain * 4 / 3


def test_dask_equals_the_simulator_with_selective_recomputation(client):
    cfg = _cfg("allreduce", runtime="dask", recompute="selective", max_steps=6)
    dask = run(cfg, client=client, progress=False, log=None)
    sim = run(cfg.replace(runtime="sim"), progress=False, log=None)
    for rank in range(2):
        assert max_diff(dask.state_dict(rank=rank), sim.state_dict(rank=rank)) == 0.0


# -- the ledger: what attention's core saved --------------------------------------------------


def _core_bytes(heads: int) -> int:
    """What one layer's core saves besides its input (float32, batch-first views of the QKV
    output, which stays saved as the checkpoint): the softmax's output, 4·a·s²·b bytes (kept
    by the softmax and by the product with V), and the causal mask, s² booleans."""
    return 4 * heads * S * S * B + S * S


@pytest.mark.parametrize(("case", "tp"), [("allreduce", 1), ("zero3", 1), ("mesh dp=2,tp=2", 2)])
def test_activations_fall_by_what_the_cores_saved(case, tp):
    plain = _train(_run(case, False))["mem_activations"].max()
    again = _train(_run(case, "selective"))["mem_activations"].max()
    assert plain - again == LAYERS * _core_bytes(HEADS // tp)  # 264,192 bytes at tp=1


@pytest.mark.parametrize("strategy", ["allreduce", "zero1", "zero3"])
def test_plan_predicts_the_ledger_and_the_step(strategy):
    """One worker: the ledger to the byte; every step's time to 1e-12, the cores' forward
    again: 1 + c/3 of a step, c = L·4·s²·h over the forward's FLOPs (c < 1: less than a
    whole layer's recomputation)."""
    cfg = _cfg("allreduce", strategy=strategy, workers=1, max_steps=6, recompute="selective")
    steps = {}
    for recompute in (False, "selective"):
        c = cfg.replace(recompute=recompute)
        train = _train(run(c, progress=False))
        p = plan(c)
        assert p.memory.activations == train["mem_activations"].max()
        step_s = np.diff(train["time"].to_numpy())[1:]
        assert step_s == pytest.approx([p.step_s] * len(step_s), rel=1e-12)
        steps[recompute] = step_s.mean()
    forward = model_flops("gpt-tiny", (S,), num_classes("licenses"))  # per sequence
    cores = LAYERS * 4 * S * S * HIDDEN / forward
    assert 0 < cores < 1
    assert steps["selective"] / steps[False] == pytest.approx(1 + cores / 3, rel=1e-12)


# -- the option and its errors -----------------------------------------------------------------


def test_the_flag_takes_selective_or_stands_alone():
    def parsed(*flags: str):
        return _config_from_args(_parser().parse_args(["run", "--model", "gpt-tiny",
                                 "--dataset", "licenses", *flags])).recompute  # fmt: skip

    assert parsed() is False and parsed("--recompute") is True
    assert parsed("--recompute", "selective") == "selective"
    cfg = _cfg("allreduce", recompute="selective")
    assert ExperimentConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (dict(model="mlp", dataset="fashion-mnist"),
         "recompute='selective' runs attention's core again (softmax(QKᵀ)·V), but model='mlp' "
         "has no attention; use recompute=True (whole layers) or model='gpt-tiny'"),
        (dict(strategy="mesh", mesh="dp=1,cp=2"),
         "recompute='selective' with mesh='dp=1,cp=2': context parallelism's attention (ring "
         "or Ulysses) is not recomputed selectively so far; use recompute=True"),
        (dict(strategy="zb-h1"),
         "recompute='selective' is not supported by strategy='zb-h1': its weight gradient W "
         "runs after B on the graph B keeps"),
    ],
)  # fmt: skip
def test_selective_recomputation_refuses_what_it_cannot_do(changes, message):
    with pytest.raises(ConfigError) as error:
        _cfg("allreduce", recompute="selective", **changes)
    assert message in str(error.value)


def test_an_unknown_recomputation_is_named():
    with pytest.raises(ConfigError, match="recompute='full' must be True, False or 'selective'"):
        _cfg("allreduce", recompute="full")


def test_a_transformer_planned_without_gpus_refuses_selective():
    """plan --transformer without --gpu sizes whole-layer recomputation only (the command
    refuses the flag first, test_plan_mesh.py; the function says it again)."""
    from scaledl_lab.strategies.memory.transformer import Transformer, plan_transformer

    cfg = ExperimentConfig(strategy="allreduce", runtime="sim", workers=2,
                           compute_profile="a100", recompute="selective",
                           model="gpt-tiny", dataset="licenses")  # fmt: skip
    with pytest.raises(ConfigError) as error:
        plan_transformer(cfg, Transformer(2, 64, 4, 32, 96))
    assert str(error.value) == (
        "recompute='selective': a transformer plan without --gpu recomputes whole layers or "
        "nothing; selective recomputation is planned on GPUs (--gpu)"
    )


def test_plan_command_takes_selective_for_gpt_tiny(capsys):
    from scaledl_lab.cli import main

    argv = ["plan", "--strategy", "allreduce", "--model", "gpt-tiny", "--dataset", "licenses",
            "--batch-size", str(B), "--workers", "1"]  # fmt: skip
    assert main([*argv, "--recompute", "selective"]) == 0
    mb = plan(_cfg("allreduce", workers=1, recompute="selective")).memory.activations / 1e6
    assert f"activations {mb:.3f} MB" in " ".join(capsys.readouterr().out.split())
