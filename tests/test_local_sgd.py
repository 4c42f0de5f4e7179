"""Local SGD (periodic model averaging): exact reduction to synchronous SGD, and its traffic."""

from __future__ import annotations

from common import SMALL, max_diff

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.models import build_model, count_parameters
from scaledl_lab.runtime.sim.cost import ring_allreduce_bytes
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for

MLP_BYTES = 4 * count_parameters(build_model("mlp", (1, 28, 28), 10))


def test_averaging_every_step_with_plain_sgd_is_synchronous_sgd(client):
    """avg_i(x − lr·g_i) = x − lr·avg_i g_i: the sequential twin on the combined batch."""
    cfg = ExperimentConfig(
        strategy="local-sgd",
        workers=2,
        model="mlp",
        sync_period=1,
        precision="float64",
        **{**SMALL, "momentum": 0.0},
    )
    twin = train_sequential(cfg, load_for(cfg))
    on_sim = run(cfg.replace(runtime="sim"), progress=False)
    on_dask = run(cfg, client=client, progress=False)
    for rank in (0, 1):
        assert max_diff(on_sim.state_dict(rank=rank), twin) < 1e-10
        assert max_diff(on_dask.state_dict(rank=rank), on_sim.state_dict(rank=rank)) == 0.0


def test_replicas_drift_between_averagings_and_meet_at_the_end():
    cfg = ExperimentConfig(
        strategy="local-sgd", runtime="sim", workers=4, model="mlp", sync_period=5, **SMALL
    )
    res = run(cfg, progress=False)
    train = res.frame.query("kind == 'train'")
    last = train["step"].max()  # 18, not a multiple of 5: the run ends with an averaging
    averaging = (train["step"] % 5 == 0) | (train["step"] == last)
    assert (train[averaging]["bytes_sent"] == ring_allreduce_bytes(MLP_BYTES, 4)).all()
    assert (train[~averaging]["bytes_sent"] == 0).all()
    states = [res.state_dict(rank=r) for r in range(4)]
    assert all(max_diff(states[0], s) == 0.0 for s in states[1:])
    assert res.frame.query("kind == 'consensus'")["value"].tolist() == [0.0]
    # Two epochs: at the first boundary (step 18, not an averaging step) the replicas differ.
    two = run(cfg.replace(epochs=2, max_steps=None), progress=False)
    consensus = two.frame.query("kind == 'consensus'").set_index("step")["value"]
    assert consensus[18] > 0 and consensus[36] == 0.0
