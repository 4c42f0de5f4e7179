"""The simulated runtime: deterministic, the same code as Dask, and faithful to the cost model."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from common import SMALL, partial_of, small_for

from scaledl_lab import ConfigError, ExperimentConfig, RunError, run
from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile, Stragglers
from scaledl_lab.runtime.sim.scheduler import SimWorld


def _cost(latency=1e-4, bandwidth=1e9, per_sample=1e-4, stragglers=None, algorithm="ring"):
    return CostModel(
        ComputeProfile("test", 1e-3, per_sample),
        NetworkProfile("test", latency, bandwidth),
        algorithm,
        stragglers or Stragglers(),
    )


def test_same_config_and_seed_give_bit_identical_tables():
    cfg = ExperimentConfig(
        strategy="allreduce",
        runtime="sim",
        workers=8,
        model="mlp",
        stragglers="spread:0.3,hiccup:0.1:0.05",
        **small_for(6, workers=8),
    )
    a = run(cfg, progress=False)
    b = run(cfg, progress=False)
    pd.testing.assert_frame_equal(a.frame, b.frame, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline(), b.timeline(), check_exact=True)
    assert (a.frame["runtime"] == "sim").all() and a.frame["time"].max() > 0


@pytest.mark.parametrize("strategy", ["allreduce", "allreduce-naive"])
def test_sim_and_dask_give_identical_parameters(client, strategy):
    cfg = ExperimentConfig(strategy=strategy, workers=2, model="cnn", **small_for(5))
    on_dask = run(cfg, client=client, progress=False).state_dict()
    on_sim = run(cfg.replace(runtime="sim"), progress=False).state_dict()
    assert all(torch.equal(on_dask[k], on_sim[k]) for k in on_dask)


@pytest.mark.parametrize("p", [2, 3, 4, 7, 8, 16, 31, 64, 128, 256])
def test_ring_allreduce_time_matches_closed_form(p):
    latency, bandwidth, numel = 5e-6, 1.25e9, 2**18  # 1 MiB of float32
    world = SimWorld(p, _cost(latency, bandwidth))

    async def program(comm):
        await comm.allreduce(torch.ones(numel))

    world.run([program] * p)
    n = numel * 4
    closed_form = 2 * (p - 1) / p * n / bandwidth + 2 * (p - 1) * latency
    for comm in world.comms:
        assert comm.now() == pytest.approx(closed_form, rel=0.01)
        assert comm.bytes_sent == math.ceil(2 * (p - 1) * n / p)


def test_allreduce_sums_and_waits_for_the_last_worker():
    world = SimWorld(3, _cost(per_sample=1e-3, stragglers=Stragglers(slow={2: 4.0})))
    out = {}

    async def program(comm):
        async with comm.compute(samples=10):
            t = torch.full((4,), float(comm.rank + 1))
        await comm.allreduce(t)
        out[comm.rank] = (t.clone(), comm.now())

    world.run([program] * 3)
    compute_fast, compute_slow = 1e-3 + 10e-3, (1e-3 + 10e-3) * 4
    for rank in range(3):
        assert torch.equal(out[rank][0], torch.full((4,), 6.0))
        assert out[rank][1] == pytest.approx(compute_slow + world.cost.allreduce_time(16, 3))
    idle = sum(e.end - e.start for e in world.events if e.rank == 0 and e.kind == "idle")
    assert idle == pytest.approx(compute_slow - compute_fast)


def test_send_recv_costs_latency_plus_bytes_over_bandwidth():
    world = SimWorld(2, _cost(latency=1e-3, bandwidth=1e6))
    got = torch.zeros(250)

    async def program(comm):
        if comm.rank == 0:
            await comm.send(torch.arange(250.0), dst=1)
        else:
            await comm.recv(got, src=0)

    world.run([program] * 2)
    assert torch.equal(got, torch.arange(250.0))
    assert world.comms[1].now() == pytest.approx(1e-3 + 1000 / 1e6)


def test_deadlock_is_reported_not_hung():
    world = SimWorld(2, _cost())

    async def program(comm):
        await comm.recv(torch.zeros(1), src=1 - comm.rank)

    with pytest.raises(RunError, match=r"simulated deadlock: ranks \[0, 1\]"):
        world.run([program] * 2)


def test_timeline_accounts_for_all_time():
    cfg = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=4, model="mlp", stragglers="slow:1:3",
        **small_for(6, workers=4),
    )  # fmt: skip
    res = run(cfg, progress=False)
    tl = res.timeline()
    assert set(tl["kind"]) == {"compute", "comm", "idle"}
    for rank in range(4):
        bars = tl[tl["rank"] == rank].sort_values("start")
        # Back to back from 0: every virtual second is compute, communication or waiting.
        assert bars["start"].iloc[0] == 0.0
        assert (bars["start"].iloc[1:].to_numpy() == bars["end"].iloc[:-1].to_numpy()).all()
    # Rank 0 logs the last evaluation, at the end of its timeline.
    assert tl[tl["rank"] == 0]["end"].max() == pytest.approx(res.frame["time"].max())
    idle = tl[tl.kind == "idle"].assign(d=lambda d: d.end - d.start).groupby("rank")["d"].sum()
    assert idle.get(1, 0.0) < idle[0]  # the slow worker is the one the others wait for


def test_straggler_sets_the_pace_of_synchronous_steps():
    from scaledl_lab.studies.scaling import step_time

    base = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=4, model="cnn", network="100g-ib",
        bucket_mb=64, **small_for(6, workers=4),
    )  # fmt: skip  # one bucket, sent after backward: no transfer hides behind a longer backward
    even = run(base, progress=False)
    slow = run(base.replace(stragglers="slow:2:4"), progress=False)
    tl = even.timeline()
    bars = tl[(tl["rank"] == 0) & (tl["kind"] == "compute")]
    step_compute = (bars["end"] - bars["start"]).median()
    # Every step waits for the worker that computes 4x longer; communication is unchanged.
    expected = step_time(even.frame) + 3 * step_compute
    assert step_time(slow.frame) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"compute_profile": "tpu9"}, r"compute_profile='tpu9' is unknown; allowed: 'cpu-core'"),
        ({"network": "carrier-pigeon"}, r"network 'carrier-pigeon' is unknown; allowed: loopback"),
        ({"network": "custom:1e-6:-5"}, r"bandwidth must be positive, got -5.0"),
        ({"network": "custom:fast"}, r"use custom:LATENCY_S:BANDWIDTH_BPS"),
        ({"stragglers": "slow:1"}, r"stragglers='slow:1': cannot read 'slow:1'"),
        (
            {"stragglers": "slow:9:2"},  # the default run has 2 workers
            r"stragglers='slow:9:2': rank 9 is not a worker of this run \(workers=2: ranks 0 to",
        ),
        (
            {"stragglers": "slow:-1:2,slow:2:3,slow:0:2"},
            r"ranks \[-1, 2\] are not workers of this run \(workers=2: ranks 0 to 1\)",
        ),
        ({"stragglers": "slow:1:2,slow:1:4"}, r"stragglers='slow:1:2,slow:1:4': 'slow:1' is given"),
        ({"stragglers": "spread:0.1,spread:0.2"}, r"'spread' is given twice"),
        ({"allreduce_algorithm": "butterfly"}, r"allreduce_algorithm='butterfly' is unknown"),
        ({"compute_profile": "/nowhere/cal.json"}, r"calibration file /nowhere/cal.json does not"),
    ],
)
def test_bad_cost_model_input(changes, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(runtime="sim", **changes)


def test_stragglers_outside_the_run_are_refused_before_any_work(capsys):
    ExperimentConfig(runtime="dask", stragglers="slow:1:2")  # real workers sleep instead
    with pytest.raises(ConfigError, match=r"stragglers='slow:2:2': rank 2 is not a worker"):
        ExperimentConfig(runtime="dask", stragglers="slow:2:2")
    from scaledl_lab.cli import main

    code = main(["run", "--runtime", "sim", "--workers", "2", "--stragglers", "slow:9:2"])
    assert code == 1
    err = capsys.readouterr().err
    assert "error: stragglers='slow:9:2': rank 9 is not a worker of this run (workers=2" in err


def test_more_workers_than_samples():
    cfg = ExperimentConfig(
        runtime="sim",
        workers=256,
        model="mlp",
        train_subset=100,
        val_size=100,
        test_subset=100,
        batch_size=1,
    )
    with pytest.raises(ConfigError, match=r"workers=256 exceeds the 100 training samples"):
        run(cfg, progress=False)


def test_many_virtual_workers():
    cfg = ExperimentConfig(
        strategy="allreduce",
        runtime="sim",
        workers=64,
        model="mlp",
        batch_size=16,
        train_subset=4096,
        test_subset=200,
        val_size=200,
    )
    frame = run(cfg, progress=False).frame
    assert frame["rank"].nunique() == 64
    assert (frame.query("kind == 'train'").groupby("rank").size() == 4).all()


def test_calibration_measures_and_saves_a_usable_profile(client, tmp_path):
    from scaledl_lab.runtime.sim.cost import load_calibration
    from scaledl_lab.studies.calibrate import calibrate

    path = calibrate(("mlp",), tmp_path / "cal.json", client=client, log=None)
    compute, network = load_calibration(path)
    assert compute["mlp"].per_sample_s > 0 and network.bandwidth_Bps > 1e6
    assert 0 <= network.latency_s < 0.1
    cfg = ExperimentConfig(
        strategy="allreduce",
        runtime="sim",
        workers=4,
        model="mlp",
        compute_profile=str(path),
        network=str(path),
        **small_for(4, workers=4),
    )
    frame = run(cfg, progress=False).frame
    step = compute["mlp"].step_time(32)
    first_two = frame.query("kind == 'train' and rank == 0")["time"].iloc[:2].to_numpy()
    assert first_two[1] - first_two[0] > step  # compute plus the allreduce
    with pytest.raises(ConfigError, match=r"has no profile for model 'cnn'"):
        run(cfg.replace(model="cnn"), progress=False)


def test_cli_runs_the_simulator(tmp_path, capsys):
    from scaledl_lab.cli import main

    code = main(
        [
            "run",
            "--runtime",
            "sim",
            "--workers",
            "16",
            "--model",
            "mlp",
            "--batch-size",
            "16",
            "--train-subset",
            "4096",
            "--test-subset",
            "200",
            "--max-steps",
            "3",
            "--network",
            "10gbe",
            "--stragglers",
            "slow:0:2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, capsys.readouterr().err
    frame = pd.read_csv(tmp_path / "metrics.csv")
    assert frame["rank"].nunique() == 16 and set(frame["runtime"]) == {"sim"}


def test_divergence_on_the_simulator_stops_with_reason(tmp_path):
    from scaledl_lab import DivergenceError

    cfg = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=8, model="mlp", **{**SMALL, "lr": 1e6}
    )
    with pytest.raises(
        DivergenceError,
        match=r"training diverged: loss=(nan|inf) at epoch 0.*"
        r"metrics so far are in",
    ):
        run(cfg, progress=False, out=tmp_path / "r")
    assert (partial_of(tmp_path / "r") / "metrics.csv").read_text().count("\n") > 8


def test_label_skewed_shards_train_end_to_end():
    cfg = ExperimentConfig(
        strategy="allreduce",
        runtime="sim",
        workers=4,
        model="mlp",
        sharding="label-skew",
        **{**SMALL, "max_steps": 6},
    )
    res = run(cfg, progress=False)
    train = res.frame.query("kind == 'train'")
    assert (train.groupby("rank").size() == 6).all()
    from scaledl_lab.data import shard_indices
    from scaledl_lab.training.worker import load_for

    labels = load_for(cfg).train.y
    classes = [
        labels[shard_indices(labels, 4, r, scheme="label-skew")].unique().numel() for r in range(4)
    ]
    # 2 label-sorted chunks per worker, each spanning 1-3 of the 10 classes (IID shards see all).
    assert max(classes) <= 6


def test_a_scaling_sweep_too_large_for_its_data_fails_before_any_run():
    from scaledl_lab.studies.scaling import scaling_sweep

    base = ExperimentConfig(strategy="allreduce", runtime="sim", model="mlp", **SMALL)
    # 2,400 samples: 32 workers × batch 32 make two steps an epoch, and the sweep times 4
    with pytest.raises(ValueError) as err:
        scaling_sweep(base, workers=(1, 32), steps=4)
    assert str(err.value) == (
        "scaling sweep: 10gbe/32w takes 2 training step(s) of the 4 asked (one epoch of 2,400 "
        "samples, 32 workers × batch 32 a step); give it at least 4,096 training samples"
    )
    table = scaling_sweep(base, workers=(1, 2), settings={"10gbe": {"network": "10gbe"}}, steps=3)
    assert table.workers.tolist() == [1, 2] and table.speedup.iloc[0] == pytest.approx(1.0)
