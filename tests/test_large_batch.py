"""Large batches: schedules against hand-computed values, the step plan of a batch schedule,
accumulation and schedules against the sequential twin (float64), the rate every row logs."""

from __future__ import annotations

import math

import pytest
from common import SMALL, max_diff

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.strategies.large_batch.recipe import prepare_model
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.schedule import StepPlan, lr_at
from scaledl_lab.training.worker import load_for

# 4 workers × 128 = 512 samples per update, twice the reference batch 256: k = 2.
BASE = dict(strategy="allreduce", runtime="sim", workers=4, batch_size=128, lr=0.1, epochs=10)


def cfg_with(**changes) -> ExperimentConfig:
    return ExperimentConfig(**{**BASE, **changes})


def test_defaults_give_the_configured_rate_itself():
    cfg = cfg_with()
    assert all(lr_at(cfg, step, 10) is cfg.lr for step in (0, 1, 55, 99))


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # linear: 0.1 × 512/256 = 0.2; sqrt: 0.1 × √2.
        (dict(lr_scaling="linear"), {0: 0.2, 99: 0.2}),
        (dict(lr_scaling="sqrt"), {0: 0.1 * math.sqrt(2), 57: 0.1 * math.sqrt(2)}),
        (dict(lr_scaling="linear", reference_batch_size=1024), {3: 0.05}),
        # Goyal's warmup over 2 epochs (20 steps) from η = 0.1 to kη = 0.2, by the end of each
        # step: step 0 ends at epoch 0.1, so 0.1 + 0.1 × 0.1/2; step 9 ends at 1.0: 0.15.
        (dict(lr_scaling="linear", warmup_epochs=2), {0: 0.105, 9: 0.15, 19: 0.2, 20: 0.2}),
        # Fractional warmup: 0.5 epoch = 5 steps; step 1 ends at 0.2 epochs.
        (dict(lr_scaling="linear", warmup_epochs=0.5), {1: 0.1 + 0.1 * 0.4, 4: 0.2, 5: 0.2}),
        # No scaling: the warmup ramps from zero to lr.
        (dict(warmup_epochs=1), {0: 0.01, 4: 0.05, 9: 0.1, 10: 0.1}),
        # Step decay at epochs 4 and 8 by 0.5 (default GAMMA is 0.1).
        (dict(lr_schedule="step:4,8:0.5"), {39: 0.1, 40: 0.05, 79: 0.05, 80: 0.025}),
        (dict(lr_schedule="step:4,8"), {40: 0.1 * 0.1, 80: 0.1 * 0.1 * 0.1}),
        (dict(lr_schedule="step:2.5"), {24: 0.1, 25: 0.01}),
        # Cosine after 2 warmup epochs over the 8 left: at epoch 6 halfway, 0.2 × ½(1 + cos π/2).
        (
            dict(lr_scaling="linear", warmup_epochs=2, lr_schedule="cosine"),
            {20: 0.2, 60: 0.1, 40: 0.2 * 0.5 * (1 + math.cos(math.pi / 4))},
        ),
        (
            dict(lr_schedule="cosine"),
            {0: 0.1, 50: 0.05, 99: 0.1 * 0.5 * (1 + math.cos(0.99 * math.pi))},
        ),
        # Warmup and step decay together (Goyal's ResNet-50 schedule, shrunk).
        (
            dict(lr_scaling="linear", warmup_epochs=1, lr_schedule="step:5"),
            {4: 0.15, 49: 0.2, 50: 0.02},
        ),
    ],
)
def test_rates_at_chosen_steps_equal_hand_computed(changes, expected):
    cfg = cfg_with(**changes)
    for step, rate in expected.items():
        assert lr_at(cfg, step, 10) == pytest.approx(rate, rel=1e-12, abs=1e-15), step


def test_batch_schedule_plan():
    # 1000 samples per worker, batch 10 ×2 at epochs 2 and 4: 100, 100, 50, 50, 25, 25 steps.
    cfg = cfg_with(epochs=6, batch_size=10, batch_schedule="2,4:2")
    plan = StepPlan.build(cfg, 1000)
    assert plan.epoch_steps == (100, 100, 50, 50, 25, 25)
    assert plan.batch_sizes == (10, 10, 20, 20, 40, 40)
    assert plan.total_steps == 350
    assert [plan.progress(s) for s in (0, 100, 200, 225, 300, 325, 350)] == [
        0.0, 1.0, 2.0, 2.5, 4.0, 5.0, 6.0,
    ]  # fmt: skip
    assert [plan.epoch_of(s) for s in (199, 200, 249, 250, 349)] == [1, 2, 2, 3, 5]
    boundaries = [s for s in range(1, 351) if plan.is_boundary(s)]
    assert boundaries == [100, 200, 250, 300, 325, 350]
    assert [plan.effective_batch(s) for s in (0, 200, 300)] == [40, 80, 160]
    # Smith et al.: the batch grows where the rate would have been divided (default ×10).
    assert StepPlan.build(cfg_with(epochs=6, batch_size=10, batch_schedule="3"), 1000).batch_sizes[
        2:4
    ] == (10, 100)


def test_linear_scaling_follows_a_growing_batch():
    cfg = cfg_with(epochs=4, batch_size=10, batch_schedule="2:2", lr_scaling="linear")
    plan = StepPlan.build(cfg, 1000)
    # 4 × 10 = 40 samples → 0.1 × 40/256; from epoch 2, 80 samples.
    assert plan.lr(0) == pytest.approx(0.1 * 40 / 256)
    assert plan.lr(200) == pytest.approx(0.1 * 80 / 256)


def test_max_steps_ends_the_plan_early():
    plan = StepPlan.build(cfg_with(max_steps=30, batch_size=10), 1000)
    assert plan.total_steps == 30 and plan.is_boundary(30) and not plan.is_boundary(29)


def test_zero_init_residual_makes_every_block_the_identity():
    cfg = ExperimentConfig(model="resnet18", strategy="allreduce", lr_scaling="linear")
    model = prepare_model(cfg, build_model("resnet18", (3, 32, 32), 10, seed=0))
    blocks = [m for m in model.modules() if type(m).__name__ == "PreActBasicBlock"]
    assert blocks and all(b.bn2.weight.abs().max() == 0 for b in blocks)
    plain = prepare_model(cfg.replace(lr_scaling="none"), build_model("resnet18", (3, 32, 32), 10))
    assert all(b.bn2.weight.abs().min() > 0 for b in plain.modules() if hasattr(b, "bn2"))


SIM64 = dict(runtime="sim", model="mlp", precision="float64", **SMALL)


@pytest.mark.parametrize("strategy", ["allreduce", "allreduce-naive"])
def test_accumulate_equals_one_worker_at_k_times_the_batch(strategy):
    small = ExperimentConfig(
        strategy=strategy, workers=1, **{**SIM64, "batch_size": 8}, accumulate=4
    )
    large = small.replace(batch_size=32, accumulate=1)
    assert small.effective_batch_size == large.effective_batch_size == 32
    a = run(small, progress=False, log=None)
    b = run(large, progress=False, log=None)
    assert max_diff(a.state_dict(), b.state_dict()) < 1e-10
    train = a.frame[a.frame.kind == "train"]
    assert len(train) == 20 and (train["samples"] == 32).all()
    assert (train["effective_batch_size"] == 32).all()


def test_accumulate_on_two_workers_equals_the_twin():
    cfg = ExperimentConfig(
        strategy="allreduce", workers=2, **{**SIM64, "batch_size": 8}, accumulate=3, bucket_mb=0.5
    )
    res = run(cfg, progress=False, log=None)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-10
    assert (res.frame[res.frame.kind == "train"]["effective_batch_size"] == 48).all()


@pytest.mark.parametrize(
    "changes",
    [
        dict(lr_scaling="linear", warmup_epochs=0.25, lr_schedule="step:0.5:0.3"),
        dict(lr_scaling="sqrt", lr_schedule="cosine"),
        dict(batch_schedule="1:2", lr_schedule="step:1"),
    ],
)
def test_scheduled_runs_equal_the_twin(changes):
    # 640 samples, 2 workers × 16: 20 steps per epoch (10 from epoch 1 with the batch ×2); the
    # warm-up 5 steps, a step decay every 10.
    cfg = ExperimentConfig(
        strategy="allreduce",
        workers=2,
        **{**SIM64, "train_subset": 640, "batch_size": 16, "epochs": 2, "max_steps": None},
        **changes,
    )
    res = run(cfg, progress=False, log=None)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-10
    train = res.frame[(res.frame.kind == "train") & (res.frame["rank"] == 0)]
    plan = StepPlan.build(cfg, 320)
    assert train["lr"].tolist() == [plan.lr(s) for s in range(plan.total_steps)]
    assert train["effective_batch_size"].tolist() == [
        plan.effective_batch(s) for s in range(plan.total_steps)
    ]
    tests = res.frame[res.frame.kind == "test"]
    assert tests["epoch"].tolist() == [0.0, 1.0, 2.0]


def test_parameter_server_follows_the_schedule_as_allreduce_does():
    changes = dict(lr_scaling="linear", warmup_epochs=0.25, lr_schedule="step:0.5", max_steps=40)
    ps = ExperimentConfig(strategy="ps-sync", workers=2, servers=2, **{**SIM64, **changes})
    ar = ps.replace(strategy="allreduce", servers=1)
    a = run(ps, progress=False, log=None)
    b = run(ar, progress=False, log=None)
    assert max_diff(a.state_dict(), b.state_dict()) < 1e-10
    rates = a.frame[(a.frame.kind == "train") & (a.frame["rank"] == 0)]["lr"]
    assert rates.tolist() == pytest.approx(
        b.frame[(b.frame.kind == "train") & (b.frame["rank"] == 0)]["lr"].tolist(), rel=1e-12
    )


@pytest.mark.parametrize(
    "strategy", ["dpsgd", "local-sgd", "hogwild", "ps-async", "gpipe", "tensor-parallel"]
)
def test_every_family_logs_the_scheduled_rate(strategy):
    cfg = ExperimentConfig(
        strategy=strategy,
        workers=2,
        runtime="sim",
        model="mlp",
        **{**SMALL, "max_steps": None, "epochs": 2},
        lr_scaling="linear",
        warmup_epochs=1,
    )
    frame = run(cfg, progress=False, log=None).frame
    rates = frame[(frame.kind == "train") & (frame["rank"] == 0)]["lr"]
    target = 0.05 * cfg.effective_batch_size / 256  # lr 0.05 is the rate for 256 samples
    assert rates.iloc[0] < rates.iloc[len(rates) // 3] <= target + 1e-12
    assert rates.iloc[-1] == pytest.approx(target)
