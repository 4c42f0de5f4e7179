"""The paper's communication argument, measured on the simulator for N = 4 … 64 workers:
a worker's traffic is constant in N on a ring/torus, while a parameter server's grows with N.

The sweep is :func:`scaledl_lab.studies.scaling.traffic_sweep`, the one that ``reproduce`` and
notebook 04 run too."""

from __future__ import annotations

import pytest

from scaledl_lab import ExperimentConfig
from scaledl_lab.studies.scaling import traffic_sweep

BASE = ExperimentConfig(runtime="sim", model="mlp", batch_size=16, val_size=100, test_subset=100)


@pytest.mark.parametrize("strategy", ["ps-sync", "ps-async"])
def test_a_parameter_servers_traffic_grows_linearly_with_the_workers(strategy):
    table = traffic_sweep(BASE, [dict(strategy=strategy)], workers=(4, 16, 64))
    table = table.set_index("workers")
    assert list(table.index) == [4, 16, 64] and (table["servers"] == 1).all()
    worker4, server4 = table.loc[4, ["bytes_per_worker_step", "server_bytes_per_round"]]
    for n in (16, 64):
        # each worker pushes one gradient per step; the server sees all of them
        assert table.loc[n, "bytes_per_worker_step"] == pytest.approx(worker4)
        assert table.loc[n, "server_bytes_per_round"] == pytest.approx(server4 * n / 4, rel=0.05)


@pytest.mark.parametrize("topology", ["ring", "torus"])
def test_nearest_neighbour_traffic_per_worker_is_constant_in_n(topology):
    # Up to 16 and 25 workers: the constant is the same at 64, at twice the CPU of these sweeps.
    sizes = {"ring": (4, 8, 16), "torus": (9, 16, 25)}[topology]
    table = traffic_sweep(BASE, [dict(strategy="nnt", topology=topology)], workers=sizes)
    assert list(table["workers"]) == list(sizes)
    assert set(table["method"]) == {f"nnt {topology}"}
    sent = list(table["bytes_per_worker_step"])
    assert sent[0] > 0
    assert sent == pytest.approx([sent[0]] * len(sizes))
