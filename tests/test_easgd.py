"""Elastic averaging SGD: the elastic update's invariant, sync/async agreement, both runtimes."""

from __future__ import annotations

import pytest
import torch
from common import SMALL, max_diff

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile, Stragglers
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.decentralised.easgd import elastic_sync, moving_rate


@pytest.mark.parametrize("workers", [2, 5, 8])
def test_elastic_update_keeps_replicas_plus_centre_and_pulls_together(workers):
    cost = CostModel(
        ComputeProfile("t", 1e-3, 1e-4), NetworkProfile("t", 1e-5, 1e9), "ring", Stragglers()
    )
    gen = torch.Generator().manual_seed(workers)
    start = torch.randn(workers, 40, generator=gen, dtype=torch.float64)
    alpha = 0.9 / workers
    out = {}

    async def program(comm):
        x, centre = start[comm.rank].clone(), torch.zeros(40, dtype=torch.float64)
        for _ in range(3):
            await elastic_sync(comm, x, centre, alpha)
        out[comm.rank] = (x, centre)

    SimWorld(workers, cost).run([program] * workers)
    xs = torch.stack([out[r][0] for r in range(workers)])
    centre = out[0][1]
    assert all(torch.equal(out[r][1], centre) for r in range(workers))  # one centre everywhere
    # Σ_i x_i + x̃ is invariant (the elastic forces are equal and opposite).
    assert torch.allclose(xs.sum(0) + centre, start.sum(0), rtol=0, atol=1e-12)
    assert (xs - centre).norm() < start.norm()  # the centre started at 0


def test_default_moving_rate_is_beta_over_workers():
    cfg = ExperimentConfig(strategy="easgd", runtime="sim", workers=6, **SMALL)
    assert moving_rate(cfg) == pytest.approx(0.15)
    assert moving_rate(cfg.replace(elastic_alpha=0.3)) == 0.3


def test_async_centre_with_one_worker_equals_synchronous():
    cfg = ExperimentConfig(strategy="easgd", runtime="sim", workers=1, model="mlp", **SMALL)
    sync = run(cfg, progress=False)
    asynchronous = run(cfg.replace(elastic_async=True), progress=False)
    assert max_diff(sync.state_dict(), asynchronous.state_dict()) == 0.0
    out = asynchronous.outputs[asynchronous.configs[0].label][0]
    assert max_diff(out["local_state_dict"], sync.outputs[cfg.label][0]["local_state_dict"]) == 0
    server = asynchronous.frame.query("kind == 'server'")
    assert server["calls"].iloc[0] == 20 // 4 + 2  # 5 elastic calls + init + final fetch


def test_sync_easgd_same_on_dask_and_sim(client):
    cfg = ExperimentConfig(strategy="easgd", workers=2, model="mlp", **SMALL)
    on_dask = run(cfg, client=client, progress=False)
    on_sim = run(cfg.replace(runtime="sim"), progress=False)
    assert max_diff(on_dask.state_dict(), on_sim.state_dict()) == 0.0
    test = on_sim.frame.query("kind == 'test'")
    assert list(test["step"]) == [0, 20] and (test["rank"] == 0).all()


def test_async_easgd_on_dask_uses_the_centre_server(client):
    cfg = ExperimentConfig(
        strategy="easgd", workers=2, model="mlp", elastic_async=True, sync_period=2, **SMALL
    )
    res = run(cfg, client=client, progress=False)
    server = res.frame.query("kind == 'server'")
    # 10 elastic calls per worker, rank 0's init, and one final fetch per worker.
    assert server["calls"].tolist() == [2 * 10 + 1 + 2]
    assert max_diff(res.state_dict(rank=0), res.state_dict(rank=1)) == 0.0  # the centre
    final = res.frame.query("kind == 'test'")["accuracy"].iloc[-1]
    assert final > 0.5
