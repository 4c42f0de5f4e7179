"""The paper's communication argument, measured on the simulator for N = 4 … 64 workers:
a worker's traffic is constant in N on a ring/torus, while a parameter server's grows with N."""

from __future__ import annotations

import pytest

from scaledl_lab import ExperimentConfig, run

TINY = dict(
    runtime="sim", model="mlp", test_subset=100, val_size=100, batch_size=16, epochs=1, max_steps=2
)


def _traffic(strategy: str, n: int, **changes) -> tuple[float, float]:
    cfg = ExperimentConfig(strategy=strategy, workers=n, train_subset=32 * n, **TINY, **changes)
    frame = run(cfg, progress=False).frame
    train = frame[frame["kind"] == "train"]
    servers = frame[frame["kind"] == "server"]
    per_worker = float(train["bytes_sent"].mean())
    rounds = len(train) / n  # one step of every worker
    per_server = (servers["bytes_sent"] + servers["bytes_received"]).max() / rounds
    return per_worker, float(per_server) if len(servers) else 0.0


@pytest.mark.parametrize("strategy", ["ps-sync", "ps-async"])
def test_a_parameter_servers_traffic_grows_linearly_with_the_workers(strategy):
    worker4, server4 = _traffic(strategy, 4)
    for n in (16, 64):
        worker, server = _traffic(strategy, n)
        assert worker == pytest.approx(worker4)  # each worker pushes one gradient per step
        assert server == pytest.approx(server4 * n / 4, rel=0.05)


@pytest.mark.parametrize("topology", ["ring", "torus"])
def test_nearest_neighbour_traffic_per_worker_is_constant_in_n(topology):
    sizes = {"ring": (4, 16, 64), "torus": (9, 16, 64)}[topology]
    shapes = {9: "torus:3x3", 16: "torus:4x4", 64: "torus:8x8"}
    sent = [
        _traffic("nnt", n, topology="ring" if topology == "ring" else shapes[n])[0] for n in sizes
    ]
    assert sent[0] > 0
    assert sent == pytest.approx([sent[0]] * len(sizes))
