"""Gossip averaging, D-PSGD and AD-PSGD: exact properties on the simulator, and the same
program on real Dask workers. Topology validation for the decentralised strategies."""

from __future__ import annotations

import math

import pytest
import torch
from common import SMALL, max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.models import build_model, count_parameters
from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile, Stragglers
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.decentralised.gossip import gossip_average, simulate_gossip
from scaledl_lab.topology import (
    colouring,
    mixing_matrix,
    neighbours,
    request_schedule,
    second_eigenvalue,
)

MLP_BYTES = 4 * count_parameters(build_model("mlp", (1, 28, 28), 10))


def _world(workers: int) -> SimWorld:
    cost = CostModel(
        ComputeProfile("test", 1e-3, 1e-4), NetworkProfile("test", 1e-5, 1e9), "ring", Stragglers()
    )
    return SimWorld(workers, cost)


def _rounds(spec: str, workers: int, rounds: int) -> list[torch.Tensor]:
    return simulate_gossip(spec, workers, rounds, numel=50, seed=7)


# -- topology validation (the lead's topology.py / config.py) --------------------------------


def test_torus_that_does_not_fit_the_workers_is_rejected():
    with pytest.raises(ConfigError, match=r"'torus:3x3' has 3x3=9 positions but workers=8"):
        ExperimentConfig(strategy="nnt", runtime="sim", workers=8, topology="torus:3x3")


def test_torus_with_a_side_below_three_is_rejected():
    with pytest.raises(ConfigError, match=r"torus needs height and width of at least 3"):
        ExperimentConfig(strategy="nnt", runtime="sim", workers=2, topology="torus:1x2")


def test_unknown_topology_is_rejected():
    with pytest.raises(ConfigError, match=r"topology='star' is unknown; allowed: 'ring'"):
        ExperimentConfig(strategy="dpsgd", runtime="sim", workers=4, topology="star")


# -- gossip averaging: exact properties ------------------------------------------------------


@pytest.mark.parametrize(
    "spec,workers", [("ring", 8), ("ring", 5), ("torus:4x4", 16), ("torus:3x4", 12)]
)
def test_gossip_preserves_the_mean(spec, workers):
    history = _rounds(spec, workers, rounds=10)
    for x in history[1:]:
        assert torch.allclose(x.mean(0), history[0].mean(0), rtol=0, atol=1e-14)
    # ... and it did mix: the workers moved.
    assert (history[-1] - history[0]).abs().max() > 0.1


@pytest.mark.parametrize("workers", [2, 3, 5, 8])
def test_gossip_on_complete_graph_equals_allreduce_average(workers):
    gen = torch.Generator().manual_seed(workers)
    start = torch.randn(workers, 100, generator=gen, dtype=torch.float64)
    out = {}

    async def program(comm):
        mixed = await gossip_average(comm, start[comm.rank].clone(), "complete")
        summed = start[comm.rank].clone()
        await comm.allreduce(summed)
        out[comm.rank] = (mixed, summed / workers)

    _world(workers).run([program] * workers)
    for mixed, averaged in out.values():
        assert torch.allclose(mixed, averaged, rtol=0, atol=1e-14)


@pytest.mark.parametrize(
    "spec,workers", [("ring", 8), ("ring", 12), ("torus:4x4", 16), ("torus:3x5", 15)]
)
def test_consensus_error_decays_at_the_second_eigenvalue(spec, workers):
    lam = second_eigenvalue(mixing_matrix(spec, workers))
    rounds = math.ceil(math.log(1e-8) / math.log(lam))  # far from float64 rounding
    history = _rounds(spec, workers, rounds=rounds)
    errors = [(x - x.mean(0)).norm().item() for x in history]
    # Every round shrinks the disagreement by at most λ2 (W symmetric, doubly stochastic) ...
    for before, after in zip(errors, errors[1:], strict=False):
        assert after <= lam * before * (1 + 1e-9)
    # ... and asymptotically by exactly λ2.
    rate = (errors[-1] / errors[-11]) ** (1 / 10)
    assert rate == pytest.approx(lam, rel=1e-3)


# -- D-PSGD ------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["nnt", "dpsgd"])
def test_bytes_per_worker_per_step_do_not_grow_with_workers(strategy):
    # Three sizes of ring and two of torus (nnt's colouring wants even sides), up to 24 workers:
    # the law is the same at 64, at a third of the work. Two steps read 2 x 8 x 24 = 384 samples.
    tiny = dict(SMALL, train_subset=384, val_size=64, test_subset=64, batch_size=8, max_steps=2)
    seen = {}
    for workers, spec, degree in [
        (4, "ring", 2),
        (8, "ring", 2),
        (16, "ring", 2),
        (16, "torus:4x4", 4),
        (24, "torus:4x6", 4),
    ]:
        cfg = ExperimentConfig(
            strategy=strategy, runtime="sim", workers=workers, topology=spec, model="mlp", **tiny
        )
        train = run(cfg, progress=False).frame.query("kind == 'train'")
        assert len(train) == 2 * workers
        seen[(workers, spec)] = set(train["bytes_sent"])
        assert seen[(workers, spec)] == {degree * MLP_BYTES}


def test_dpsgd_same_parameters_on_dask_and_sim(client):
    cfg = ExperimentConfig(strategy="dpsgd", workers=2, model="mlp", **SMALL)
    on_dask = run(cfg, client=client, progress=False)
    on_sim = run(cfg.replace(runtime="sim"), progress=False)
    for rank in (0, 1):
        assert max_diff(on_dask.state_dict(rank=rank), on_sim.state_dict(rank=rank)) == 0.0
    assert max_diff(on_dask.state_dict(rank=0), on_dask.state_dict(rank=1)) > 0  # not one model


def test_dpsgd_records_consensus_and_every_workers_evaluation():
    cfg = ExperimentConfig(
        strategy="dpsgd", runtime="sim", workers=4, model="mlp", **{**SMALL, "max_steps": None}
    )
    res = run(cfg, progress=False)
    frame = res.frame
    consensus = frame[frame.kind == "consensus"]
    assert list(consensus["rank"]) == [0] and consensus["value"].iloc[0] > 0
    final = frame[(frame.kind == "test") & (frame.step == frame.step.max())]
    assert sorted(final["rank"]) == [0, 1, 2, 3]
    out = res.outputs[cfg.label][0]
    assert out["worker_test_accuracy"] == list(final.sort_values("rank")["accuracy"])
    assert out["best_test_accuracy"] == out["worker_test_accuracy"][out["best_rank"]]


# -- AD-PSGD -----------------------------------------------------------------------------------


def test_colouring_is_a_two_colouring_or_a_clear_error():
    for spec, workers in [("ring", 6), ("torus:4x4", 16), ("torus:4x6", 24), ("complete", 2)]:
        colours = colouring(spec, workers)
        for r in range(workers):
            assert all(colours[n] != colours[r] for n in neighbours(spec, workers, r))
    for spec, workers in [("ring", 5), ("torus:3x4", 12), ("complete", 3)]:
        with pytest.raises(ConfigError, match="adpsgd needs a bipartite topology"):
            colouring(spec, workers)


def test_request_schedule_is_seeded_and_only_names_neighbours():
    a = request_schedule("torus:4x4", 16, 5, 200, seed=3)
    assert a == request_schedule("torus:4x4", 16, 5, 200, seed=3)
    assert a != request_schedule("torus:4x4", 16, 5, 200, seed=4)
    assert set(a) == set(neighbours("torus:4x4", 16, 5))


@pytest.mark.parametrize("spec,workers", [("ring", 4), ("torus:4x4", 16)])
def test_adpsgd_answers_every_request_once(spec, workers):
    cfg = ExperimentConfig(
        strategy="adpsgd", runtime="sim", workers=workers, topology=spec, model="mlp", **SMALL
    )
    res = run(cfg.replace(train_subset=1600 if workers == 16 else 2400), progress=False)
    train = res.frame.query("kind == 'train'")
    colours = colouring(spec, workers)
    by_rank = train.groupby("rank")["bytes_sent"].sum()
    asked = sum(by_rank[r] for r in range(workers) if colours[r] == 0)
    answered = sum(by_rank[r] for r in range(workers) if colours[r] == 1)
    steps = train.groupby("rank").size().iloc[0]
    assert asked == answered == steps * (workers // 2) * MLP_BYTES
    assert (res.frame.query("kind == 'consensus'")["value"] > 0).all()


def test_adpsgd_rejects_odd_ring_before_training():
    with pytest.raises(ConfigError, match="bipartite"):
        cfg = ExperimentConfig(strategy="adpsgd", runtime="sim", workers=3, model="mlp", **SMALL)
        run(cfg, progress=False)


def test_adpsgd_on_dask_pairs_average(client):
    cfg = ExperimentConfig(strategy="adpsgd", workers=2, model="mlp", **SMALL)
    res = run(cfg, client=client, progress=False)
    train = res.frame.query("kind == 'train'")
    # rank 0 (active) asks rank 1 every step; rank 1 answers each request exactly once.
    assert train.groupby("rank")["bytes_sent"].sum().tolist() == [20 * MLP_BYTES] * 2
    consensus = res.frame.query("kind == 'consensus'")["value"].iloc[-1]
    assert 0 < consensus < 1.0 and math.isfinite(consensus)
