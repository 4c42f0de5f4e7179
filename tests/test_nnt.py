"""Nearest-neighbour training (the paper's NNT): exact reductions, determinism, bookkeeping."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from common import SMALL, max_diff, small_for

from scaledl_lab import ExperimentConfig, run, topology
from scaledl_lab.analysis import best_worker, step_rates
from scaledl_lab.params import write_grads
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for
from scaledl_lab.viz.timeline import idle_share


@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.05), ("adam", 1e-3), ("adagrad", 0.01)])
@pytest.mark.parametrize("strategy", ["nnt", "nnt-lockstep"])
def test_one_worker_equals_plain_training(strategy, optimizer, lr):
    cfg = ExperimentConfig(
        strategy=strategy,
        runtime="sim",
        workers=1,
        model="mlp",
        optimizer=optimizer,
        **small_for(6, workers=1, lr=lr),
    )
    res = run(cfg, progress=False)
    plain = train_sequential(cfg, load_for(cfg))
    assert max_diff(res.state_dict(), plain) == 0.0


def test_one_worker_on_dask_equals_plain_training(client):
    cfg = ExperimentConfig(
        strategy="nnt", workers=1, model="mlp", optimizer="adam", **small_for(6, workers=1)
    )
    res = run(cfg.replace(lr=1e-3), client=client, progress=False)
    assert max_diff(res.state_dict(), train_sequential(res.configs[0], load_for(cfg))) == 0.0


def test_lockstep_pair_with_plain_sgd_equals_sequential_sgd_at_twice_the_rate():
    """Two workers, lock-step, plain SGD: each applies its own gradient and its neighbour's,
    x ← x − lr·g0 − lr·g1 = x − 2·lr·mean gradient of the combined batch."""
    cfg = ExperimentConfig(
        strategy="nnt-lockstep",
        runtime="sim",
        workers=2,
        model="mlp",
        precision="float64",
        optimizer="sgd",  # not the family's AdaGrad: the twin is plain SGD
        weight_decay=0.0,
        **small_for(6, momentum=0.0),
    )
    res = run(cfg, progress=False)
    twin = train_sequential(cfg.replace(lr=2 * cfg.lr), load_for(cfg))
    for rank in (0, 1):
        assert max_diff(res.state_dict(rank=rank), twin) < 1e-10


def test_lockstep_is_deterministic_and_identical_on_dask(client):
    cfg = ExperimentConfig(
        strategy="nnt-lockstep", runtime="sim", workers=2, model="mlp", **small_for(6)
    )
    a, b = run(cfg, progress=False), run(cfg, progress=False)
    pd.testing.assert_frame_equal(a.frame, b.frame, check_exact=True)
    on_dask = run(cfg.replace(runtime="dask"), client=client, progress=False)
    for rank in (0, 1):
        assert max_diff(a.state_dict(rank=rank), on_dask.state_dict(rank=rank)) == 0.0
    train = a.frame.query("kind == 'train'")
    assert (train["staleness"] == 0).all()  # every neighbour gradient is of the same step


def test_lockstep_on_torus_is_deterministic():
    cfg = ExperimentConfig(
        strategy="nnt-lockstep",
        runtime="sim",
        workers=9,
        topology="torus:3x3",
        model="mlp",
        stragglers="spread:0.3",
        **small_for(6, workers=9),
    )
    a, b = run(cfg, progress=False), run(cfg, progress=False)
    pd.testing.assert_frame_equal(a.frame, b.frame, check_exact=True)
    for rank in range(9):
        assert max_diff(a.state_dict(rank=rank), b.state_dict(rank=rank)) == 0.0


def test_bounded_nnt_applies_every_message_with_bounded_staleness():
    cfg = ExperimentConfig(
        strategy="nnt",
        runtime="sim",
        workers=4,
        model="mlp",
        stragglers="slow:1:4",
        network="100g-ib",
        nnt_max_lead=4,
        **SMALL,
    )
    res = run(cfg, progress=False)
    train = res.frame.query("kind == 'train'")
    steps = train["step"].max()  # 18: 2400 samples / 4 workers / batch 32
    for rank, out in enumerate(res.outputs[cfg.label]):
        left, right = (rank - 1) % 4, (rank + 1) % 4
        assert out["messages_applied"] == {left: steps, right: steps}
    staleness = train["staleness"].dropna()
    assert staleness.max() <= cfg.nnt_max_lead
    # Neighbours of the slow worker 1 apply its gradients late; the others do not wait for it
    # at every step (lock-step would make everyone as slow as rank 1).
    assert train.query("rank in [0, 2]")["staleness"].mean() > 0.5
    lockstep = run(cfg.replace(strategy="nnt-lockstep"), progress=False).frame
    assert (
        train.query("rank == 3")["time"].iloc[9]
        < lockstep.query("kind == 'train' and rank == 3")["time"].iloc[9]
    )


def test_final_model_is_the_best_worker_on_validation():
    cfg = ExperimentConfig(
        strategy="nnt",
        runtime="sim",
        workers=4,
        model="mlp",
        optimizer="adam",
        **{**SMALL, "lr": 1e-3, "max_steps": None},
    )
    res = run(cfg, progress=False)
    outs = res.outputs[cfg.label]
    summary = best_worker(res.frame)
    for out in outs:  # every rank holds the same summary
        assert out["best_rank"] == summary["best_rank"]
        assert out["best_test_accuracy"] == summary["best_test_accuracy"]
    val = [o["val_accuracy"] for o in outs]
    assert val[summary["best_rank"]] == max(val)
    assert summary["best_test_accuracy"] == outs[summary["best_rank"]]["test_accuracy"]
    assert summary["min_test_accuracy"] <= summary["mean_test_accuracy"]
    assert summary["mean_test_accuracy"] <= summary["max_test_accuracy"]
    consensus = res.frame.query("kind == 'consensus'")
    assert list(consensus["rank"]) == [0] and list(consensus["step"]) == [18]


def test_staged_restarts_everyone_from_the_best_worker():
    cfg = ExperimentConfig(
        strategy="nnt-staged",
        runtime="sim",
        workers=4,
        model="mlp",
        optimizer="adam",
        # 768 samples, 4 workers × 32: stages of 6 steps, restarts after steps 6 and 12.
        **{**SMALL, "train_subset": 768, "lr": 1e-3, "max_steps": None, "epochs": 3},
    )
    res = run(cfg, progress=False)
    frame = res.frame
    for boundary, best in zip([6, 12], res.outputs[cfg.label][0]["stage_best_ranks"], strict=True):
        val = frame.query(f"kind == 'val' and step == {boundary}").sort_values("rank")
        assert best == int(val["accuracy"].to_numpy().argmax())
    # A restart makes every worker equal: the stage after it ends closer to consensus.
    consensus = frame.query("kind == 'consensus'").set_index("step")["value"]
    unstaged = run(cfg.replace(strategy="nnt"), progress=False).frame
    plain = unstaged.query("kind == 'consensus'").set_index("step")["value"]
    assert consensus[18] < plain[18]


def test_nnt_on_dask_drains_every_message(client):
    cfg = ExperimentConfig(strategy="nnt", workers=2, model="mlp", **SMALL)
    res = run(cfg, client=client, progress=False)
    assert [o["messages_applied"] for o in res.outputs[cfg.label]] == [{1: 20}, {0: 20}]
    train = res.frame.query("kind == 'train'")
    assert (train["bytes_sent"] == train["bytes_sent"].iloc[0]).all()


# 16 workers on a 4x4 torus, 8 steps per epoch, 2 epochs: seconds on the simulator.
TORUS = dict(
    strategy="nnt", runtime="sim", workers=16, topology="torus:4x4", model="cnn1d",
    dataset="mnist1d", train_subset=16 * 16 * 8, test_subset=160, val_size=160, batch_size=16,
    epochs=2, optimizer="adagrad", lr=0.01, momentum=0.0,
)  # fmt: skip


def test_unbounded_nnt_never_waits_for_a_ten_times_slower_neighbour():
    """FAST's NNT: with rank 5 ten times slower the other 15 keep their step rate (virtual
    time); a lead bound of 4 makes its neighbours wait. Every message is applied exactly once."""
    even_cfg = ExperimentConfig(**TORUS)
    assert even_cfg.nnt_max_lead is None  # the default is FAST's: unbounded
    kept = {}
    for lead in (None, 4):
        even = run(even_cfg.replace(nnt_max_lead=lead), progress=False)
        slow = run(even_cfg.replace(nnt_max_lead=lead, stragglers="slow:5:10"), progress=False)
        ratio = step_rates(slow.frame) / step_rates(even.frame)
        kept[lead] = ratio.drop(5).min()
        if lead is None:
            assert ratio[5] < 0.2  # the straggler itself (its messages still take their time)
        for rank, out in enumerate(slow.outputs[even_cfg.label]):
            neighbours = topology.neighbours("torus:4x4", 16, rank)
            assert out["messages_applied"] == dict.fromkeys(neighbours, 16)
    assert kept[None] >= 0.9
    assert kept[4] < 0.9


def test_unbounded_nnt_measures_consensus_without_synchronising():
    """Epoch boundaries are no synchronisation point: each worker logs its own evaluation at
    its own time; the consensus rows come from the weights kept at each boundary."""
    cfg = ExperimentConfig(**{**TORUS, "stragglers": "slow:5:10"})
    frame = run(cfg, progress=False).frame
    val = frame.query("kind == 'val' and step == 8").set_index("rank")["time"]
    assert val[5] > 2 * val.drop(5).max()  # the others did not wait for rank 5
    consensus = frame.query("kind == 'consensus'")
    assert list(consensus["step"]) == [8, 16] and (consensus["value"] > 0).all()
    assert val[0] <= consensus["time"].iloc[0] < val[5]  # rank 0's own boundary


def test_unbounded_nnt_workers_are_never_idle_before_their_last_step():
    """Not even at the start: each worker scores its part of the common initial weights and
    goes on (the sum is taken at the end), so the fast workers never wait for rank 5, ten
    times slower; the start's rows score every sample, logged first, and equal lock-step's."""
    cfg = ExperimentConfig(**{**TORUS, "stragglers": "slow:5:10"})
    res = run(cfg, progress=False)
    timeline, train = res.timeline(), res.frame.query("kind == 'train'")
    before_last = train.groupby("rank")["time"].apply(lambda t: t.sort_values().iloc[-2])
    idle = timeline.query("kind == 'idle'")
    early = idle[idle["end"] <= idle["rank"].map(before_last)]
    assert early.empty, early  # the last step waits for the messages still owed: that only
    assert (idle_share(timeline, res.frame) == 0).all()
    bounded = run(cfg.replace(nnt_max_lead=4), progress=False)
    waited = idle_share(bounded.timeline(), bounded.frame)
    assert waited[topology.neighbours("torus:4x4", 16, 5)].min() > 0.5  # they wait for rank 5
    start = res.frame.query("kind in ('val', 'test') and step == 0")
    assert list(start["rank"]) == [0, 0] and (start["samples"] == 160).all()
    first = res.frame.query("kind == 'val' and rank == 0")
    assert first["step"].iloc[0] == 0 and first["step"].is_monotonic_increasing
    lockstep = run(cfg.replace(strategy="nnt-lockstep"), progress=False).frame
    same = lockstep.query("kind in ('val', 'test') and step == 0")
    assert list(start["accuracy"]) == list(same["accuracy"])
    assert start["loss"].to_numpy() == pytest.approx(same["loss"].to_numpy(), rel=1e-12)
    assert start["time"].max() < train.query("rank == 5")["time"].min()  # when rank 5 scored


def test_unbounded_nnt_on_dask_with_a_straggler_applies_every_message(client):
    """Two real workers, rank 1 slowed by a sleep per step, 1,000 steps: no deadlock, every
    message taken off the wire by the receiver thread and applied exactly once."""
    cfg = ExperimentConfig(
        strategy="nnt", workers=2, model="cnn1d", dataset="mnist1d", batch_size=8, epochs=2,
        train_subset=8000, test_subset=100, val_size=100, optimizer="adagrad", lr=0.01,
        momentum=0.0, stragglers="slow:1:2",
    )  # fmt: skip
    res = run(cfg, client=client, progress=False)
    train = res.frame.query("kind == 'train'")
    assert train.groupby("rank")["step"].max().tolist() == [1000, 1000]
    outs = res.outputs[cfg.label]
    assert outs[0]["messages_applied"] == {1: 1000} and outs[1]["messages_applied"] == {0: 1000}


@pytest.mark.parametrize("strategy", ["nnt-lockstep", "nnt"])
def test_the_simulator_charges_every_neighbour_gradient_it_applies(tmp_path, strategy):
    """Each application of a neighbour's gradient (its copy out of the receive buffer and the
    optimiser step) costs the profile's apply_per_byte_s × its bytes of virtual time."""
    from scaledl_lab.runtime.sim.cost import NETWORKS, ComputeProfile, save_calibration

    cfg = ExperimentConfig(
        strategy=strategy, runtime="sim", workers=2, model="mlp", nnt_max_lead=0, **SMALL
    )
    ends = {}
    for per_byte in (0.0, 1e-9):
        profile = ComputeProfile("calibrated:mlp", 1e-3, 1e-5, apply_per_byte_s=per_byte)
        path = save_calibration(
            tmp_path / f"{per_byte}.json", {"mlp": profile}, NETWORKS["loopback"], {}
        )
        res = run(cfg.replace(compute_profile=str(path)), progress=False)
        ends[per_byte] = res.frame.query("kind == 'train' and rank == 0")["time"].max()
        applied = sum(res.outputs[cfg.label][0]["messages_applied"].values())
    model_bytes = 4 * (784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10)
    assert applied == 20
    assert ends[1e-9] - ends[0.0] == pytest.approx(20 * model_bytes * 1e-9, rel=1e-6)


def test_a_message_applied_as_shared_gradients_is_never_accumulated_into():
    """NNT applies a mailbox's message as views (no copy); the next zero_grad drops them, so
    the next backward writes new gradients and leaves the message alone."""
    model = torch.nn.Linear(3, 2)
    params = list(model.parameters())
    message = torch.arange(8.0)
    write_grads(params, message, share=True)
    assert [p.grad.data_ptr() for p in params] == [message.data_ptr(), message[6:].data_ptr()]
    optimizer = torch.optim.SGD(params, lr=0.1, foreach=True)
    optimizer.step()
    optimizer.zero_grad()
    model(torch.ones(1, 3)).sum().backward()
    assert torch.equal(message, torch.arange(8.0))
