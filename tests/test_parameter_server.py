"""Parameter servers: the update formulas by hand, exactness against sequential and synchronous
SGD on both runtimes, staleness, stragglers, and what a dead worker or server does."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import pytest
import torch
from common import SMALL, max_diff, small_for

from scaledl_lab import ExperimentConfig, RunError, run
from scaledl_lab.analysis import time_per_epoch
from scaledl_lab.runtime.base import NOT_READY
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.runtime.dask.driver import worker_addresses
from scaledl_lab.strategies import get_strategy
from scaledl_lab.strategies.parameter_server.server import (
    ParameterServer,
    delay_compensated,
    staleness_aware_lr,
)
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for, steps_per_epoch_of

ASYNC = ("ps-async", "downpour", "staleness-aware", "dc-asgd")
SIM = dict(runtime="sim", model="mlp", **SMALL)


def _cfg(**kw) -> ExperimentConfig:
    return ExperimentConfig(**{"runtime": "sim", "model": "mlp", "momentum": 0.0, **kw})


# -- the server alone: formulas against hand-computed values ---------------------------------


def test_staleness_aware_lr_divides_by_staleness():
    assert staleness_aware_lr(0.1, 0.0) == 0.1
    assert staleness_aware_lr(0.1, 1.0) == 0.1
    assert staleness_aware_lr(0.1, 4.0) == pytest.approx(0.025)
    # Three workers pull version 0 and push in turn: staleness 0, 1, 2.
    ps = ParameterServer(torch.tensor([1.0, 2.0]), _cfg(lr=0.1), mode="staleness-aware", workers=3)
    for r in range(3):
        ps.pull(r)
    g = torch.tensor([1.0, -2.0])
    assert ps.push(0, g, 0) == (0.0, 1)  # w = [0.9, 2.2]
    assert ps.push(1, g, 0) == (1.0, 2)  # lr 0.1 / 1: w = [0.8, 2.4]
    assert ps.push(2, g, 0) == (2.0, 3)  # lr 0.1 / 2: w = [0.75, 2.5]
    torch.testing.assert_close(ps.param.detach(), torch.tensor([0.75, 2.5]))
    assert ps.staleness == [0.0, 1.0, 2.0]


def test_dc_asgd_compensates_with_the_weights_sent_to_that_worker():
    g = torch.tensor([2.0, -1.0])
    out = delay_compensated(g, torch.tensor([1.0, 1.0]), torch.tensor([0.5, 3.0]), 0.1)
    # g + λ g² (w_now - w_stale) = [2 + 0.1·4·0.5, -1 + 0.1·1·(-2)] = [2.2, -1.2]
    torch.testing.assert_close(out, torch.tensor([2.2, -1.2]))

    ps = ParameterServer(
        torch.tensor([1.0, 1.0]), _cfg(strategy="dc-asgd", lr=0.5, dc_lambda=0.1),
        mode="dc-asgd", workers=2,
    )  # fmt: skip
    ps.pull(0)
    ps.pull(1)  # both hold w = [1, 1]
    ps.push(0, torch.tensor([1.0, 2.0]), 0)  # fresh: no correction, w = [0.5, 0]
    torch.testing.assert_close(ps.param.detach(), torch.tensor([0.5, 0.0]))
    staleness, _ = ps.push(1, torch.tensor([2.0, -1.0]), 0)
    # worker 1 saw [1, 1]: g' = [2 + 0.1·4·(-0.5), -1 + 0.1·1·(-1)] = [1.8, -1.1]
    assert staleness == 1.0
    torch.testing.assert_close(ps.param.detach(), torch.tensor([0.5 - 0.9, 0.55]))


def test_adaptive_dc_asgd_scales_lambda_by_the_root_mean_square_gradient():
    ps = ParameterServer(
        torch.tensor([1.0, 1.0], dtype=torch.float64),
        _cfg(strategy="dc-asgd", lr=0.5, dc_lambda=2.0, dc_adaptive=True, precision="float64"),
        mode="dc-asgd", workers=2,
    )  # fmt: skip
    ps.pull(0)
    ps.pull(1)
    ps.push(0, torch.tensor([1.0, 2.0], dtype=torch.float64), 0)  # w = [0.5, 0]
    # MeanSquare after two pushes: 0.05·0.95·g0² + 0.05·g1²
    g0, g1 = torch.tensor([1.0, 2.0]), torch.tensor([2.0, -1.0])
    ms = 0.95 * 0.05 * g0**2 + 0.05 * g1**2
    lam = 2.0 / torch.sqrt(ms.double() + 1e-7)
    expected_g = g1 + lam * g1**2 * (torch.tensor([0.5, 0.0]) - torch.tensor([1.0, 1.0]))
    ps.push(1, g1.double(), 0)
    torch.testing.assert_close(
        ps.param.detach(), torch.tensor([0.5, 0.0], dtype=torch.float64) - 0.5 * expected_g
    )


def test_sync_server_averages_then_releases_the_next_version():
    ps = ParameterServer(torch.tensor([0.0]), _cfg(lr=1.0), mode="sync", workers=2)
    assert ps.pull(0, 1) is NOT_READY
    ps.push(1, torch.tensor([3.0]), 0)
    assert ps.version == 0 and ps.pull(0, 1) is NOT_READY
    assert ps.push(0, torch.tensor([1.0]), 0) == (0.0, 1)
    weights, version, _ = ps.pull(0, 1)
    assert version == 1 and weights.item() == -2.0  # the average of 1 and 3


def test_backup_workers_step_on_the_first_arrivals_and_drop_the_late():
    ps = ParameterServer(torch.tensor([0.0]), _cfg(lr=1.0), mode="sync", workers=3, backup=1)
    ps.push(2, torch.tensor([4.0]), 0)
    ps.push(0, torch.tensor([2.0]), 0)  # N - b = 2 gradients: step
    assert ps.version == 1 and ps.param.item() == -3.0
    staleness, _ = ps.push(1, torch.tensor([100.0]), 0)  # late for version 0: dropped
    assert math.isnan(staleness) and ps.dropped == 1 and ps.param.item() == -3.0


def test_pushes_after_the_limit_are_dropped():
    ps = ParameterServer(torch.tensor([0.0]), _cfg(lr=1.0), mode="async", workers=2, limit=2)
    ps.push(0, torch.tensor([1.0]), 0)
    ps.push(1, torch.tensor([1.0]), 0, 1)
    staleness, progress = ps.push(0, torch.tensor([1.0]), 1)
    assert math.isnan(staleness) and progress == 2 and ps.param.item() == -2.0
    assert ps.pull(0, 99)[1] == 2  # the run is over: pulls never wait


def test_strategies_declare_servers_and_fault_tolerance():
    for name in ASYNC:
        assert get_strategy(name).tolerates_worker_loss
    for name in ("ps-sync", "backup-workers"):
        assert not get_strategy(name).tolerates_worker_loss
    cfg = ExperimentConfig(strategy="ps-async", servers=3, model="mlp")
    assert get_strategy("ps-async").servers.count(cfg) == 3


# -- exactness on the simulator ---------------------------------------------------------------


@pytest.mark.parametrize("strategy", ASYNC)
def test_async_with_one_worker_equals_plain_sgd(strategy):
    cfg = ExperimentConfig(strategy=strategy, workers=1, **SIM)
    res = run(cfg, progress=False)
    reference = train_sequential(cfg, load_for(cfg))
    assert max_diff(res.state_dict(), reference) < 1e-6
    train = res.frame[res.frame.kind == "train"]
    assert len(train) == 20 and (train.staleness == 0).all()


@pytest.mark.parametrize("servers", [1, 3])
def test_sync_ps_equals_allreduce_data_parallelism(servers):
    cfg = ExperimentConfig(strategy="ps-sync", workers=4, servers=servers, **SIM)
    res = run(cfg, progress=False)
    allreduce = run(cfg.replace(strategy="allreduce", servers=1), progress=False)
    assert max_diff(res.state_dict(), allreduce.state_dict()) < 1e-6
    exact = cfg.replace(precision="float64")
    reference = train_sequential(exact, load_for(exact))
    assert max_diff(run(exact, progress=False).state_dict(), reference) < 1e-10
    # Training really moved the weights.
    assert max_diff(
        reference, train_sequential(exact.replace(max_steps=1, lr=1e-12), load_for(cfg))
    )
    # Each worker pushes once per version (one epoch, 18 steps), none dropped, staleness 0.
    train = res.frame[res.frame.kind == "train"]
    assert steps_per_epoch_of(cfg) == 18
    assert (train.groupby("rank").size() == 18).all() and (train.staleness == 0).all()


def test_backup_workers_with_none_equal_sync_ps():
    cfg = ExperimentConfig(strategy="ps-sync", workers=3, **SIM)
    backup = cfg.replace(strategy="backup-workers", backup_workers=0)
    assert (
        max_diff(run(cfg, progress=False).state_dict(), run(backup, progress=False).state_dict())
        == 0
    )


@pytest.mark.parametrize("strategy", ["ps-sync", "staleness-aware", "dc-asgd"])
def test_sharded_servers_equal_one_server(strategy):
    # Sync: any N. Async: one worker, where the order of the pushes is fixed.
    workers = 3 if strategy == "ps-sync" else 1
    cfg = ExperimentConfig(strategy=strategy, workers=workers, **SIM)
    one = run(cfg, progress=False).state_dict()
    four = run(cfg.replace(servers=4), progress=False)
    assert max_diff(one, four.state_dict()) == 0
    servers = four.frame[four.frame.kind == "server"]
    assert sorted(servers["rank"]) == [workers + i for i in range(4)]


def test_async_staleness_is_workers_minus_one_on_homogeneous_sim():
    n = 16
    cfg = ExperimentConfig(
        strategy="ps-async", workers=n, runtime="sim", model="mlp", dataset="fashion-mnist",
        train_subset=n * 40 * 8, val_size=0, test_subset=200, batch_size=8, epochs=1,
        lr=0.01, momentum=0.0,
    )  # fmt: skip
    train = run(cfg, progress=False).frame.query("kind == 'train'")
    applied = train.staleness.dropna()
    assert len(applied) == n * 40  # every applied gradient has its staleness
    assert abs(applied.mean() - (n - 1)) <= 0.05 * (n - 1)


def test_downpour_pushes_accumulated_gradients_every_n_push():
    cfg = ExperimentConfig(strategy="downpour", workers=2, n_fetch=2, n_push=2, **SIM)
    res = run(cfg, progress=False)
    train = res.frame[res.frame.kind == "train"]
    pushes = train[train.bytes_sent > 0]
    assert len(pushes) == len(train) // 2  # every other step talks to the server
    assert train[train.bytes_sent == 0].staleness.isna().all()
    assert train.epoch.max() == pytest.approx(40 / (2 * 37))


def test_every_method_evaluates_its_initial_state_at_time_zero():
    # A parameter server's rank 0 scores the initial weights alone, on whole splits, after the
    # initial pull: its epoch-0 rows were stamped then (0.19 s of virtual time in `reproduce
    # --quick`, where the methods that share the evaluation stamped 0.013 s). They are stamped
    # at the time of the initial state, which every worker holds from the seed.
    base = dict(workers=4, train_subset=4 * 32 * 5, val_size=100, test_subset=100, batch_size=32,
                epochs=2, optimizer="adam", lr=1e-3)  # fmt: skip
    methods = dict(allreduce={}, nnt=dict(topology="ring"), **{"ps-sync": dict(servers=2),
                   "ps-async": dict(servers=2)})  # fmt: skip
    first = {}
    for strategy, extra in methods.items():
        frame = run(_cfg(strategy=strategy, **extra, **base), progress=False).frame
        test = frame[frame.kind == "test"].sort_values("time")
        first[strategy] = test.iloc[0]
        assert first[strategy].epoch == 0.0, strategy
        assert (frame[frame.kind == "train"].time > first[strategy].time).all(), strategy
        if strategy == "ps-async":  # rank 0 evaluates once global progress passes epoch 1
            assert ((test.epoch >= 1) & (test.epoch < 2)).sum() == 1, test.epoch.tolist()
    assert first["ps-sync"].time == first["ps-async"].time == 0.0
    assert max(r.time for r in first.values()) < 0.1  # the shared evaluation's own cost
    # The same initial weights everywhere: one accuracy.
    assert len({r.accuracy for r in first.values()}) == 1


def test_straggler_sync_waits_async_does_not_backup_workers_fix_sync():
    # 8 steps a worker (8 x 128 x 8 samples); the ratios, measured: ps-sync 3.53, ps-async
    # 1.09, backup-workers 1.00 (3.53, 1.11, 1.00 on twice the data).
    base = dict(
        runtime="sim", workers=8, model="mlp", dataset="fashion-mnist", train_subset=8192,
        test_subset=200, val_size=0, batch_size=128, epochs=1, momentum=0.0, network="100g-ib",
    )  # fmt: skip
    ratios = {}
    for strategy in ("ps-sync", "ps-async", "backup-workers"):
        cfg = ExperimentConfig(strategy=strategy, **base)
        even = time_per_epoch(run(cfg, progress=False).frame)
        slow = time_per_epoch(run(cfg.replace(stragglers="slow:3:4"), progress=False).frame)
        ratios[strategy] = slow / even
    assert ratios["ps-sync"] >= 3, ratios
    assert ratios["ps-async"] <= 1.5, ratios
    assert ratios["backup-workers"] <= 1.5, ratios


# -- on real Dask workers ----------------------------------------------------------------------


def test_dask_async_one_worker_equals_plain_sgd(client):
    cfg = ExperimentConfig(strategy="ps-async", workers=1, model="mlp", **small_for(5, workers=1))
    res = run(cfg, client=client, progress=False)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-6


def test_dask_sync_ps_equals_sequential_on_combined_batch(client):
    cfg = ExperimentConfig(
        strategy="ps-sync", workers=2, servers=2, model="mlp", precision="float64", **SMALL
    )
    res = run(cfg, client=client, progress=False)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-10
    assert max_diff(res.state_dict(rank=0), res.state_dict(rank=1)) == 0


def test_dask_async_two_workers_report_staleness_near_one(client):
    cfg = ExperimentConfig(
        strategy="ps-async", workers=2, model="mlp", **{**SMALL, "max_steps": 40}
    )
    frame = run(cfg, client=client, progress=False).frame
    applied = frame[frame.kind == "train"].staleness.dropna()
    assert len(applied) == 2 * steps_per_epoch_of(cfg)  # one epoch: 74 gradients
    assert 0.5 <= applied.mean() <= 1.5
    assert len(frame[frame.kind == "server"]) == 1


# -- failures ---------------------------------------------------------------------------------


def _kill_when_training(client, victim):
    pids = client.run(os.getpid)
    training = threading.Event()

    def on_rows(batch):
        if sum(r["kind"] == "train" for r in batch) > 0:
            training.set()

    def kill():
        if training.wait(120):
            time.sleep(0.5)
            os.kill(pids[victim], signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    return on_rows


LONG = dict(
    model="mlp", train_subset=8000, test_subset=500, val_size=500, batch_size=16, epochs=1,
    momentum=0.0, timeout_s=20,
)  # fmt: skip


def test_dead_worker_does_not_stop_async_training():
    cfg = ExperimentConfig(strategy="ps-async", workers=2, **LONG)
    with connect(2, dashboard=False, log=None) as client:
        victim = worker_addresses(client)[1]
        on_rows = _kill_when_training(client, victim)
        res = run(cfg, client=client, on_rows=on_rows, progress=False)
    frame = res.frame
    lost = frame[frame.kind == "worker-lost"]
    assert list(lost["rank"]) == [1]
    train = frame[frame.kind == "train"]
    # Rank 0 carried the run to its end: the whole epoch's worth of gradients was applied.
    assert train.epoch.max() == pytest.approx(1.0)
    assert len(train[train["rank"] == 0]) > len(train[train["rank"] == 1])
    assert frame[frame.kind == "test"].epoch.max() == pytest.approx(1.0)


def test_dead_server_ends_the_run_with_a_clear_error():
    cfg = ExperimentConfig(strategy="ps-async", workers=2, **LONG)
    with connect(3, dashboard=False, log=None) as client:
        victim = worker_addresses(client)[2]  # ranks use the first two; the server the third
        on_rows = _kill_when_training(client, victim)
        started = time.monotonic()
        # Either the driver's liveness check or a rank calling the dead server names it.
        with pytest.raises(RunError, match=rf"server 0 on worker {victim}|host of server 0"):
            run(cfg, client=client, on_rows=on_rows, progress=False)
        assert time.monotonic() - started < 90
