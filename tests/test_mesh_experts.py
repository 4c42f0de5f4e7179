"""The mesh's ``ep`` dimension (#49): gpt-tiny-moe's experts over the ep ranks, which are data
ranks too. ep ∈ {2, 4} equals the unsplit mixture trained data-parallel over the same ranks
(each routing its own batch: the same capacity, the same tokens dropped) after 10 steps in
float64; dp=2 × ep=2 equals single-process training where neither capacity nor the aux loss
depends on how the batch is split; the all-to-all bytes equal the formula; a broken
composition fails the twin; the config errors come before any work; 2 real Dask workers (ep=2)
equal the simulator bit for bit."""

from __future__ import annotations

import pytest
from common import assert_same_run, max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.data import num_classes
from scaledl_lab.models import build_model
from scaledl_lab.moe import capacity
from scaledl_lab.runtime.collectives import all_to_all_bytes
from scaledl_lab.strategies.mesh import experts
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for

TEXT = dict(
    runtime="sim", dataset="licenses", model="gpt-tiny-moe", train_subset=320, val_size=8,
    test_subset=8, batch_size=8, epochs=1, max_steps=10, lr=0.05, momentum=0.9,
    precision="float64", seed=1,
)  # fmt: skip
TIGHT = dict(top_k=2, capacity_factor=1.0)  # from a tenth to a half of the tokens dropped
ROOMY = dict(top_k=2, capacity_factor=2.0)  # room for every token: nothing dropped


def _mesh(mesh: str, **fields) -> ExperimentConfig:
    workers = 1
    for part in mesh.split(","):
        workers *= int(part.partition("=")[2])
    return ExperimentConfig(
        **{**TEXT, "micro_batches": 1, **fields}, strategy="mesh", mesh=mesh, workers=workers
    )


def _data_parallel_twin(cfg: ExperimentConfig) -> ExperimentConfig:
    return ExperimentConfig(**{**TEXT, **{k: getattr(cfg, k) for k in ("top_k",
                            "capacity_factor", "aux_loss_weight", "experts")}},
                            strategy="allreduce", workers=cfg.workers)  # fmt: skip


def _train(res):
    return res.frame.query("kind == 'train'")


@pytest.mark.parametrize(
    "mesh, fields, drops",
    [("ep=2", ROOMY, False), ("ep=2", TIGHT, True), ("ep=4", ROOMY, False),
     ("ep=4", dict(TIGHT, top_k=1, experts=8), True), ("dp=2,ep=2", TIGHT, True),
     ("dp=2", TIGHT, True)],
)  # fmt: skip
def test_expert_parallel_equals_the_unsplit_mixture_trained_data_parallel(mesh, fields, drops):
    cfg = _mesh(mesh, **fields)
    split, twin = (
        run(cfg, progress=False, log=None),
        run(_data_parallel_twin(cfg), progress=False, log=None),
    )
    assert max_diff(split.model_state_dict(), twin.model_state_dict()) < 1e-10
    dropped = [_train(r).sort_values(["rank", "step"])["moe_dropped"] for r in (split, twin)]
    assert bool(dropped[0].max() > 0.05) == drops and bool(dropped[0].max() == 0) != drops
    assert dropped[0].tolist() == dropped[1].tolist()  # the same tokens' share, step by step


def test_dp_by_ep_equals_single_process_training():
    """With room for every token and no aux loss, a token's MoE output depends on itself alone,
    so the four ranks' batches train as the combined batch does in one process."""
    cfg = _mesh("dp=2,ep=2", **ROOMY, aux_loss_weight=0.0)
    res = run(cfg, progress=False, log=None)
    assert max_diff(res.model_state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-10


def test_all_to_all_bytes_equal_the_formula():
    """Per MoE layer and step, four all-to-alls of the experts' buffers (E, C, h) in float64:
    dispatch and combine forward, their backwards; each sends (ep − 1)/ep of it."""
    cfg = _mesh("ep=4", **TIGHT, max_steps=2)
    train = _train(run(cfg, progress=False, log=None))
    places = capacity(cfg.batch_size * 32, cfg.top_k, cfg.experts, cfg.capacity_factor)
    buffers = cfg.experts * places * 64 * 8
    expected = 2 * 4 * all_to_all_bytes(buffers, 4)  # 2 layers
    assert set(train["bytes_all_to_all"]) == {expected}
    assert (train["bytes_sent"] > train["bytes_all_to_all"]).all()  # the gradients' allreduces


@pytest.mark.parametrize("ep", [2, 4])
def test_each_rank_holds_its_share_of_the_experts(ep):
    """The ledger's parameters per rank (float64) = the count a plan makes: the non-expert
    weights whole, 1/ep of every block's experts."""
    cfg = _mesh(f"ep={ep}", max_steps=1)
    held = _train(run(cfg, progress=False, log=None))["mem_params"]
    model = build_model("gpt-tiny-moe", (32,), num_classes("licenses"), seed=0)
    assert set(held) == {8 * experts.held_parameters(model, ep)}
    expert = 2 * (64 * 256 + 256 + 256 * 64 + 64)  # h -> 4h -> h, in each of 2 blocks
    assert experts.held_parameters(model, 1) - experts.held_parameters(model, ep) == (
        expert * 4 * (ep - 1) // ep
    )


async def _no_combine(self, out):  # each rank keeps its experts' outputs of others' tokens
    return out.reshape(-1, *out.shape[2:])


async def _no_expert_reduction(self, flat):  # the dp replicas of an expert drift apart
    return None


@pytest.mark.parametrize(
    "name, broken", [("combine", _no_combine), ("_sum_over_replicas", _no_expert_reduction)]
)
def test_a_broken_composition_fails_the_twin(monkeypatch, name, broken):
    target = experts.Exchange if name == "combine" else experts.ExpertModel
    monkeypatch.setattr(target, name, broken)
    cfg = _mesh("dp=2,ep=2", **ROOMY, aux_loss_weight=0.0, max_steps=3)
    split = run(cfg, progress=False, log=None)
    twin = train_sequential(cfg, load_for(cfg))  # as test_dp_by_ep_equals_single_process_training
    assert max_diff(split.model_state_dict(), twin) > 1e-4


@pytest.mark.parametrize(
    "mesh, fields, message",
    [
        ("ep=2", dict(experts=3), r"ep=2 does not divide experts=3; every ep rank holds as many"),
        ("ep=2", dict(model="gpt-tiny"), r"ep=2 spreads the experts of model='gpt-tiny-moe'; "
         r"model='gpt-tiny' has none"),
        ("tp=2,ep=2", {}, r"composes ep with dp .* so far; tp=2 is not supported"),
        ("pp=2,ep=2", {}, r"so far; pp=2 is not supported"),
        ("cp=2,ep=2", {}, r"so far; cp=2 is not supported"),
        ("dp=2,ep=2", dict(zero_stage=1), r"so far; zero_stage=1 is not supported"),
        ("ep=2", dict(micro_batches=2), r"so far; micro_batches=2 is not supported"),
        ("ep=2", dict(sequence_parallel=True), r"so far; sequence_parallel=True is not supported"),
        ("ep=2", dict(model="mlp", dataset="fashion-mnist"), r"model='mlp' has none"),
    ],
)  # fmt: skip
def test_config_errors_before_any_work(mesh, fields, message):
    with pytest.raises(ConfigError, match=message):
        _mesh(mesh, **fields)


def test_two_dask_workers_equal_the_simulator_bit_for_bit(client):
    cfg = _mesh("ep=2", **TIGHT, max_steps=3)
    sim = run(cfg, progress=False, log=None)
    real = run(cfg.replace(runtime="dask"), client=client, progress=False, log=None)
    assert_same_run(sim, real)
    columns = ["rank", "step", "bytes_all_to_all", "moe_dropped", "moe_load_max"]
    frames = [_train(r)[columns].sort_values(["rank", "step"], ignore_index=True)
              for r in (sim, real)]  # fmt: skip
    assert frames[0].equals(frames[1])
