"""The mesh's ``cp`` dimension (#49): gpt-tiny's sequence split over the cp ranks, attention by
ring attention (the zig-zag split) or Ulysses, alone and composed with dp and tp, equals
single-process training after 10 steps in float64; a broken composition fails the twin; the
config errors come before any work; 4 real Dask workers (dp=2 × cp=2) equal the simulator."""

from __future__ import annotations

import pytest
from common import assert_same_run, max_diff
from test_mesh import TEXT

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.strategies.mesh import context_block, program, ring
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for


def _config(mesh: str, method: str = "ring", **extra) -> ExperimentConfig:
    sizes = [int(part.partition("=")[2]) for part in mesh.split(",")]
    workers = 1
    for size in sizes:
        workers *= size
    return ExperimentConfig(
        **{**TEXT, **extra}, mesh=mesh, workers=workers, cp_method=method
    )  # fmt: skip


def _twin_diff(cfg: ExperimentConfig) -> float:
    res = run(cfg, progress=False, log=None)
    return max_diff(res.model_state_dict(), train_sequential(cfg, load_for(cfg)))


@pytest.mark.parametrize(
    "mesh, method, extra",
    [
        ("cp=2", "ring", {}),
        ("cp=2", "ulysses", {}),
        ("cp=4", "ring", {}),
        ("dp=2,cp=2", "ring", {"recompute": True}),
        ("tp=2,cp=2", "ulysses", {}),
        ("cp=2,tp=2", "ring", {}),
    ],
)
def test_context_parallel_meshes_equal_the_sequential_twin(mesh, method, extra):
    assert _twin_diff(_config(mesh, method, **extra)) < 1e-10


def test_activations_and_compute_per_rank_fall_as_one_over_c():
    """What the blocks save for backward: every position-wise tensor 1/C; ring attention keeps
    Q, K, V, its output and the log-sum-exp (no S × S scores), Ulysses its H/C heads' scores.
    On a fast network a step takes about 1/C of the unsplit one: every position-wise layer
    1/C of the sequence, ring attention's blocks charged by their unmasked scores as they go
    round (the zig-zag split: the same on every rank), Ulysses' H/C heads."""

    def ledger_and_step_time(mesh, method):
        cfg = _config(mesh, method, max_steps=2, precision="float32", network="h100-node")
        train = run(cfg, progress=False, log=None).frame.query("kind == 'train'")
        last = train[train.step == cfg.max_steps]["mem_activations"].tolist()
        assert len(set(last)) == 1  # every rank alike
        return last[0], train[train["rank"] == 0]["time"].diff().iloc[-1]

    whole, whole_time = ledger_and_step_time("cp=1", "ring")
    for method in ("ring", "ulysses"):
        for c, bound in ((2, 0.55), (4, 0.32)):
            activations, time = ledger_and_step_time(f"cp={c}", method)
            assert 0.85 < activations * c / whole < 1.01, (method, c, activations, whole)
            assert time < bound * whole_time


async def _no_cp_average(self, flat):  # the cp ranks' losses and gradients left unsummed
    return None


async def _no_travelling_grads(*args):
    dq, dk, dv = await ring.ring_backward(*args)
    return dq, 0 * dk, 0 * dv  # the blocks' gradients never come home


@pytest.mark.parametrize(
    "target, name, broken",
    [
        (program.MeshModel, "_average_over_cp", _no_cp_average),
        (context_block, "ring_backward", _no_travelling_grads),
    ],
)
def test_a_broken_composition_fails_the_twin(monkeypatch, target, name, broken):
    monkeypatch.setattr(target, name, broken)
    assert _twin_diff(_config("dp=2,cp=2", max_steps=3)) > 1e-4


@pytest.mark.parametrize(
    "mesh, fields, message",
    [
        ("cp=2,pp=2", {}, r"cp composes with dp and tp .*; pp=2 with cp=2 is not supported"),
        ("cp=2", {"sequence_parallel": True}, r"sequence_parallel=True with cp=2 is not"),
        ("dp=2,cp=2", {"zero_stage": 1}, r"zero_stage=1 with cp=2 is not supported"),
        ("cp=3", {}, r"splits gpt-tiny's sequence of 32 into 6 chunks \(2C, the zig-zag"),
        ("cp=3", {"method": "ulysses"}, r"sequence of 32 into 3 chunks, which do not divide"),
        ("cp=8", {"method": "ulysses"}, r"Ulysses gives each cp rank H/C of its 4 heads"),
        ("tp=2,cp=4", {"method": "ulysses"}, r"over tp=2\): cp=4 does not divide 2"),
        ("cp=2", {"method": "zigzag"}, r"cp_method='zigzag' must be one of 'ring', 'ulysses'"),
    ],
)
def test_config_errors_before_any_work(mesh, fields, message):
    fields = dict(fields)
    method = fields.pop("method", "ring")
    with pytest.raises(ConfigError, match=message):
        _config(mesh, method, **fields)


def test_cp_method_belongs_to_the_mesh():
    with pytest.raises(ConfigError, match=r"cp_method='ulysses' applies only to strategy='mesh'"):
        ExperimentConfig(strategy="allreduce", workers=2, cp_method="ulysses")


def test_four_dask_workers_equal_the_simulator_bit_for_bit(four_workers):
    cfg = _config("dp=2,cp=2", max_steps=3)
    sim = run(cfg, progress=False, log=None)
    real = run(cfg.replace(runtime="dask"), client=four_workers, progress=False, log=None)
    assert_same_run(sim, real)
