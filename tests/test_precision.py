"""Mixed-precision training (Micikevicius et al. 2018): 16-bit models stepping float32 master
weights, against a hand-written loop doing the same casts and the simulator against Dask, bit
for bit; ZeRO's model-state formulas with 2-byte parameters and gradients; the plan against a
run's ledger; dynamic loss scaling's history; and every error path of precision/loss_scale."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from common import SMALL, layer_sizes, max_diff, zero_formula

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import _config_from_args, _parser, main
from scaledl_lab.data import epoch_batches, shard_indices
from scaledl_lab.models import build_model
from scaledl_lab.runtime.collectives import ring_allreduce_bytes
from scaledl_lab.strategies.memory.plan import plan
from scaledl_lab.training import precision, precision_checks
from scaledl_lab.training.precision import LossScale
from scaledl_lab.training.precision_checks import probe
from scaledl_lab.training.reference import one_thread
from scaledl_lab.training.worker import load_for

MEM = ["mem_params", "mem_grads", "mem_optim", "mem_activations", "mem_buffers"]
STAGES = ("allreduce", "zero1", "zero2", "zero3")
ADAM = {"optimizer": "adam", "lr": 1e-3}


def _cfg(strategy: str = "allreduce", runtime: str = "sim", **changes) -> ExperimentConfig:
    options = {"workers": 2, "model": "mlp", **SMALL, "max_steps": 2,
               "precision": "bfloat16", **changes}  # fmt: skip
    return ExperimentConfig(strategy=strategy, runtime=runtime, **options)


def _train(res, rank: int | None = None):
    train = res.frame.query("kind == 'train'").sort_values(["step", "rank"])
    return train if rank is None else train[train["rank"] == rank]


# -- ZeRO's model states in 16 bits: (2 + 2 + K)Ψ, K = 4 (master) + the optimiser's ------------


# K of the mixed-precision accounting: the float32 master copy (4) and the optimiser's float32
# state, Adam's two moments (8) or SGD's momentum (4). ZeRO's Adam: K = 12.
K16 = {"adam": 4 + 8, "sgd": 4 + 4}


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("workers", [2, 4, 8])
def test_model_states_equal_zeros_mixed_precision_formulas(workers, optimizer):
    extra = ADAM if optimizer == "adam" else {}
    states = {}
    for strategy in STAGES:
        cfg = _cfg(strategy, workers=workers, **extra)
        last = _train(run(cfg, progress=False)).query(f"step == {cfg.max_steps}")
        expected = zero_formula(strategy, layer_sizes(cfg), workers, K16[optimizer], 2)
        for column, value in zip(MEM[:3], expected, strict=True):
            assert last[column].tolist() == [value] * workers, (strategy, column)
        states[strategy] = sum(expected)
    k = K16[optimizer]
    # ZeRO's ratios to data parallelism, (4 + K/N)/(4 + K) and (2 + (2 + K)/N)/(4 + K)
    assert states["zero1"] / states["allreduce"] == pytest.approx(
        (4 + k / workers) / (4 + k), rel=1e-3
    )
    assert states["zero2"] / states["allreduce"] == pytest.approx(
        (2 + (2 + k) / workers) / (4 + k), rel=1e-3
    )
    assert states["zero3"] / states["allreduce"] == pytest.approx(1 / workers, rel=1e-3)


def test_float16_holds_what_bfloat16_holds():
    for strategy in ("allreduce", "zero2"):
        half = _train(run(_cfg(strategy, precision="float16", **ADAM), progress=False))
        brain = _train(run(_cfg(strategy, **ADAM), progress=False))
        assert half[MEM[:3]].equals(brain[MEM[:3]])


def test_16_bit_gradients_halve_the_bytes_sent():
    """Every gradient element travels in 2 bytes: the allreduce sends half of float32's (the
    loss, a float64 scalar, rides in the gradients' dtype with the naive reducer)."""
    for strategy in ("allreduce", "allreduce-naive", "zero1", "zero3"):
        full = _train(run(_cfg(strategy, precision="float32"), progress=False))
        half = _train(run(_cfg(strategy), progress=False))
        if strategy == "allreduce":  # the buckets' gradients, and the loss's 8-byte allreduce
            loss = ring_allreduce_bytes(8, 2)
            assert ((half["bytes_sent"] - loss) * 2 == full["bytes_sent"] - loss).all()
        else:
            assert (half["bytes_sent"] < 0.51 * full["bytes_sent"]).all(), strategy


# -- the plan predicts a 16-bit run's ledger, step and bytes --------------------------------


@pytest.mark.parametrize(
    ("strategy", "model", "prec"),
    [(s, "mlp", "bfloat16") for s in ("allreduce", "allreduce-naive", *STAGES[1:])]
    + [
        pytest.param("zero3", "cnn", "bfloat16", marks=pytest.mark.slow),  # ~35 s
        ("zero2", "mlp", "float16"),
    ],
)
def test_plan_predicts_what_a_16_bit_run_records(strategy, model, prec):
    """Exactly: every ledger column, the simulated seconds of a step and its bytes sent (a
    float16 ZeRO run's loss allreduce carries the overflow verdict too)."""
    cfg = _cfg(strategy, workers=4, model=model, max_steps=3, precision=prec, **ADAM)
    predicted = plan(cfg)
    train = _train(run(cfg, progress=False), rank=0)
    assert train[MEM].iloc[-1].tolist() == list(predicted.memory.columns().values())
    step_s = np.diff(train["time"].to_numpy())[1:]
    assert step_s == pytest.approx([predicted.step_s] * len(step_s), rel=1e-12)
    assert (train["bytes_sent"] == predicted.bytes_per_step).all()


def test_plan_command_shows_the_16_bit_states(capsys):
    args = ["plan", "--strategy", "zero3", "--workers", "8", "--model", "mlp", "--optimizer",
            "adam", "--lr", "0.001", "--precision", "bfloat16"]  # fmt: skip
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    expected = plan(_cfg("zero3", workers=8, batch_size=64, **ADAM))
    psi = sum(layer_sizes(_cfg()))
    assert expected.memory.model_states == pytest.approx(16 * psi / 8, rel=1e-3)
    assert f"model states {expected.memory.model_states / 1e6:.3f} MB" in out
    assert "bfloat16" in out


# -- twins: a hand-written float32-master loop; Dask against the simulator --------------------


@one_thread()
def _hand_written(cfg: ExperimentConfig, scale: float, dynamic: bool):
    """Mixed-precision SGD with momentum written out: the model in ``cfg``'s 16-bit dtype, a
    float32 copy of its weights stepped by the optimiser; each step the logits cast to float32,
    the loss scaled before backward, the gradients cast up and divided by the scale, then
    (dynamic: unless one is inf or NaN, then the scale halves) the step and the cast down."""
    data = load_for(cfg)
    dtype = getattr(torch, cfg.precision)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed).to(dtype)
    params = list(model.parameters())
    masters = [p.detach().float().clone() for p in params]
    optimizer = torch.optim.SGD(masters, lr=cfg.lr, momentum=cfg.momentum, foreach=True)
    shard = shard_indices(data.train.y, 1, 0, scheme=cfg.sharding, seed=cfg.seed)
    batches = list(epoch_batches(shard, cfg.batch_size, seed=cfg.seed, epoch=0, rank=0))
    losses, scales, skipped, good = [], [], [], 0
    for idx in batches[: cfg.max_steps]:
        for p in params:
            p.grad = None
        logits = model(data.train.x[idx].to(dtype)).float()
        loss = F.cross_entropy(logits, data.train.y[idx])
        (loss * scale).backward()
        losses.append(loss.item())
        scales.append(scale)
        grads = [p.grad.float() / scale for p in params]
        overflow = dynamic and not all(bool(torch.isfinite(g).all()) for g in grads)
        skipped.append(float(overflow))
        if overflow:
            scale, good = scale / 2, 0
            continue
        for m, g in zip(masters, grads, strict=True):
            m.grad = g
        optimizer.step()
        with torch.no_grad():
            for p, m in zip(params, masters, strict=True):
                p.copy_(m)
        good += dynamic
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return state, losses, scales, skipped


@pytest.mark.parametrize(
    ("strategy", "prec", "loss_scale"),
    [("allreduce", "bfloat16", None), ("allreduce-naive", "bfloat16", None),
     ("allreduce", "float16", "dynamic"), ("allreduce", "float16", 1024.0)],
)  # fmt: skip
def test_one_worker_equals_the_hand_written_mixed_precision_loop(
    strategy, prec, loss_scale, monkeypatch
):
    """Bit for bit: weights, every step's loss and, for float16, its scale and skips. The
    dynamic scale starts at 2**22 here, so that the first steps overflow and are skipped."""
    monkeypatch.setattr(precision, "INIT_SCALE", 2.0**22)
    cfg = _cfg(strategy, workers=1, precision=prec, loss_scale=loss_scale, max_steps=12)
    res = run(cfg, progress=False)
    dynamic = prec == "float16" and loss_scale == "dynamic"
    scale = 2.0**22 if dynamic else (loss_scale or 1.0)
    state, losses, scales, skipped = _hand_written(cfg, scale, dynamic)
    assert max_diff(res.state_dict(), state) == 0.0
    assert all(v.dtype == getattr(torch, prec) for v in res.state_dict().values())
    train = _train(res)
    assert train["loss"].tolist() == losses
    if prec == "float16":
        assert train["loss_scale"].tolist() == scales
        assert train["skipped"].tolist() == skipped
    if dynamic:
        assert 0 < sum(skipped) < len(skipped)  # some steps overflowed, then it trained
    else:
        assert train["loss_scale"].isna().all() if prec == "bfloat16" else not any(skipped)


@pytest.mark.parametrize("strategy", ["allreduce", "zero2"])
def test_two_dask_workers_equal_the_simulator_in_bfloat16(strategy, client):
    """Bit for bit: gloo's bfloat16 a + b is the simulator's (two ranks)."""
    sim = run(_cfg(strategy, max_steps=6), progress=False)
    dask = run(_cfg(strategy, "dask", max_steps=6), client=client, progress=False)
    for rank in (0, 1):
        assert max_diff(dask.state_dict(rank=rank), sim.state_dict(rank=0)) == 0.0
    cols = ["rank", "kind", "step", "loss", "accuracy", "bytes_sent", *MEM[:3]]
    keys = ["kind", "step", "rank"]
    assert (
        dask.frame.sort_values(keys)[cols]
        .reset_index(drop=True)
        .equals(sim.frame.sort_values(keys)[cols].reset_index(drop=True))
    )


def _replay(scales: list[float], skipped: list[float], interval: int) -> bool:
    """Whether a run's loss-scale history follows the dynamic rule: halve after a skipped
    step, double after ``interval`` good steps in a row, else keep."""
    good = 0
    for now, after, skip in zip(scales, scales[1:], skipped, strict=False):
        if skip:
            good, expected = 0, now / 2
        else:
            good += 1
            expected = now * 2 if good == interval else now
            good = 0 if good == interval else good
        if after != expected:
            return False
    return True


@pytest.mark.parametrize("strategy", ["allreduce", "allreduce-naive", "zero1", "zero3"])
def test_every_worker_takes_the_same_overflow_decision(strategy, monkeypatch):
    """Dynamic scaling from 2**22 with growth after 3 good steps: overflows happen and the
    scale grows again. Data parallelism checks the averaged gradient (the same bits on every
    worker), ZeRO's ranks agree through the loss's allreduce: one history on all workers, the
    rule followed, and the replicas equal; the ZeRO stages equal data parallelism exactly."""
    monkeypatch.setattr(precision, "INIT_SCALE", 2.0**22)
    monkeypatch.setattr(precision, "GROWTH_INTERVAL", 3)
    cfg = _cfg(strategy, precision="float16", max_steps=16)
    res = run(cfg, progress=False)
    ranks = [_train(res, r) for r in (0, 1)]
    for column in ("loss_scale", "skipped"):
        assert ranks[0][column].tolist() == ranks[1][column].tolist()
    scales, skipped = ranks[0]["loss_scale"].tolist(), ranks[0]["skipped"].tolist()
    assert _replay(scales, skipped, interval=3)
    assert sum(skipped) >= 2 and max(np.diff(np.log2(scales))) == 1  # skipped, then grew
    assert max_diff(res.state_dict(rank=0), res.state_dict(rank=1)) == 0.0
    if strategy != "allreduce-naive":
        ref = run(_cfg("allreduce", precision="float16", max_steps=16), progress=False)
        assert max_diff(res.state_dict(), ref.state_dict()) == 0.0
        assert _train(ref, 0)["loss_scale"].tolist() == scales


def test_loss_scale_follows_grad_scalers_rule():
    scale = LossScale.of("dynamic")
    assert (scale.scale, scale.dynamic) == (2.0**16, True)  # torch.amp.GradScaler's default
    scale.update(True)
    assert (scale.used, scale.skipped, scale.scale) == (2.0**16, True, 2.0**15)
    for _ in range(precision.GROWTH_INTERVAL - 1):
        scale.update(False)
    assert scale.scale == 2.0**15
    scale.update(False)
    assert scale.scale == 2.0**16
    static = LossScale.of(128.0)
    static.update(True)
    assert (static.scale, static.dynamic) == (128.0, False)


def test_a_resumed_float16_run_continues_exactly(tmp_path):
    """The checkpoint holds the 16-bit model, the float32 masters, the optimiser's state and
    the loss scale: one epoch resumed to two ends where a two-epoch run does, row for row."""
    from scaledl_lab.resume import resume

    cfg = _cfg(precision="float16", max_steps=None, checkpoint_every="1epochs", train_subset=1280)
    run(cfg, out=tmp_path, progress=False, figures=False)
    resumed = resume(tmp_path, epochs=2, progress=False, log=None)
    straight = run(cfg.replace(epochs=2, checkpoint_every=None), progress=False)
    cols = ["rank", "step", "loss", "accuracy", "loss_scale", "skipped"]
    assert (
        _train(resumed)[cols]
        .reset_index(drop=True)
        .equals(_train(straight)[cols].reset_index(drop=True))
    )
    assert _train(straight)["skipped"].sum() > 0  # the scale moved: its state is in the file
    assert max_diff(resumed.state_dict(), straight.state_dict()) == 0.0


# -- claims on the lab's models (simulator, quick-sized) --------------------------------------


def test_float16_without_loss_scaling_loses_small_gradients():
    """Float16's smallest subnormal is 2**-24: after 400 steps of float32 training the MLP's
    gradients (here the first layer's, on faint pixels) fall below it in numbers, and a float16
    run without scaling (loss_scale=1) would flush them to zero; scaled by 2**16 (dynamic
    scaling's start) they stay representable, and the fraction lost drops at least 10-fold."""
    from scaledl_lab.studies.memory.precision_study import gradient_underflow

    cfg = _cfg(precision="float32", workers=1, train_subset=10_000, max_steps=400)
    trained = run(cfg, progress=False).state_dict()
    table = gradient_underflow(cfg, trained, scales=(1.0, 2.0**16))
    unscaled, scaled = table["fraction"].tolist()
    assert unscaled > 0.02, table
    assert scaled < unscaled / 10, table
    assert (table["overflowed"] == 0).all()
    fresh = gradient_underflow(cfg, None, scales=(1.0,))  # a fresh model loses far less
    assert fresh["fraction"].iloc[0] < unscaled / 10


def _tolerance(table, test_samples: int) -> float:
    """Points of accuracy 16 bits may lose: 0.5, or two binomial standard errors of float32's
    accuracy on ``test_samples`` where that is wider. The 16-bit rounding of a processor's
    kernels moves a few test samples either way (the CNN's 2000: bfloat16 -0.8 points on an AMD
    EPYC, within 0.5 on Intel Xeons), which a test set this small cannot tell from noise."""
    p = float(table.loc["float32", "test_accuracy"])
    return max(0.5, 200 * math.sqrt(p * (1 - p) / test_samples))


# (model, training samples, test samples, per-worker batch, lr): one epoch on the simulator,
# two workers; the CNN's setting is small because its 16-bit kernels are slow on CPU.
CLAIM_SETTINGS = {"mlp": (20_000, 10_000, 64, 0.05), "cnn": (2_000, 2_000, 32, 0.02)}


def _claim_cfg(model: str) -> tuple[ExperimentConfig, int]:
    """The float32 config of ``model``'s claim setting, and its test samples."""
    train, test, batch, lr = CLAIM_SETTINGS[model]
    cfg = _cfg(model=model, precision="float32", max_steps=None, train_subset=train,
               test_subset=test, val_size=0, batch_size=batch, lr=lr)  # fmt: skip
    return cfg, test


@pytest.mark.slow  # a float32 and one or two 16-bit epochs: ~70 s (MLP), ~2 min (CNN)
@pytest.mark.parametrize(
    ("model", "precisions"), [("mlp", ("float32", "bfloat16", "float16")),
                              ("cnn", ("float32", "bfloat16"))],
)  # fmt: skip
def test_16_bits_train_as_accurately_as_float32(model, precisions):
    """After the same epoch, the same batches: bfloat16, and float16 with dynamic loss
    scaling, end no more than 0.5 accuracy points below float32 on the test set (or two standard
    errors of its accuracy, where wider: ``_tolerance``), while each
    worker sends half the bytes per step (the loss's 8-byte allreduce aside)."""
    from scaledl_lab.studies.memory.precision_study import compare_precisions

    cfg, test = _claim_cfg(model)
    table = compare_precisions(cfg, precisions).table.set_index("precision")
    assert table.loc["float32", "test_accuracy"] > 0.6  # it learnt
    for low in precisions[1:]:
        assert table.loc[low, "points_vs_float32"] >= -_tolerance(table, test), table
        loss = ring_allreduce_bytes(8, 2)
        sent = (table.loc[low, "bytes_per_step"] - loss) * 2
        assert sent == table.loc["float32", "bytes_per_step"] - loss
    if "float16" in precisions:
        assert table.loc["float16", "loss_scale"] < 2.0**16  # the scale came down: overflows


@pytest.mark.slow  # CPU float16 convolutions: ~5 min for the three runs
@pytest.mark.timeout(1200)
def test_float16_trains_the_cnn_as_accurately_as_float32_once_its_scale_fits():
    """The CNN's claim setting in float16 with a static scale of 2**10 (no step overflows) ends
    within the claim's bound of float32 (``_tolerance``). With the dynamic scale, steps overflow
    in the middle of the run as its gradients grow, and each is skipped while 2**16 comes down:
    in a run this short (31 steps per worker, still in its unsteady first epoch) the skips send
    it down another path (measured: 3 skipped, -13 points), so this case states its scale. The
    dynamic scale's claim is decided on runs five times as long, over six seeds, in the
    committed study (results/precision/: 2 to 4 of 156 steps skipped, -0.07 points)."""
    from scaledl_lab.studies.memory.precision_study import compare_precisions

    cfg, test = _claim_cfg("cnn")
    static = compare_precisions(cfg, ("float32", "float16"), loss_scale=2.0**10)
    table = static.table.set_index("precision")
    assert table.loc["float16", "skipped_steps"] == 0, table
    assert table.loc["float16", "points_vs_float32"] >= -_tolerance(table, test), table
    dynamic = compare_precisions(cfg, ("float16",)).results.frame.query("kind == 'train'")
    assert dynamic["skipped"].sum() >= 1 and dynamic["loss_scale"].min() < 2.0**16


# -- the committed study (results/precision/): three seeds, runs long enough to settle ---------

PRECISION_RESULTS = Path(__file__).resolve().parents[1] / "results" / "precision"


def _study_runs(**accuracies: list[float]) -> pd.DataFrame:
    """A study table of the MLP with the given per-seed accuracies by precision."""
    rows = [
        {"model": "mlp", "precision": p, "seed": s, "test_accuracy": a, "steps": 10,
         "skipped_steps": 1 if p == "float16" else 0, "lowest_scale": 2.0**15,
         "last_scale": 2.0**15, "bytes_per_step": 1.0}
        for p, values in accuracies.items()
        for s, a in enumerate(values)
    ]  # fmt: skip
    return pd.DataFrame(rows)


def test_study_verdicts_follow_the_bound_and_the_noise():
    """Supported at a mean paired difference of -0.5 points or better; not supported when even
    two standard errors above the mean stay below -0.5; inconclusive between."""
    from scaledl_lab.studies.memory.precision_study import study_verdicts

    f32 = [0.80, 0.82, 0.84]
    behind = [a - d for a, d in zip(f32, (0.03, 0.031, 0.029), strict=True)]
    runs = _study_runs(float32=f32, bfloat16=[a - 0.004 for a in f32], float16=behind)
    claims = {c.key: c for c in study_verdicts(runs)}
    assert claims["mlp-bfloat16"].verdict == "supported"
    assert claims["mlp-bfloat16"].figures["points"] == pytest.approx(-0.4)
    assert claims["mlp-float16"].verdict == "not supported"
    noisy = _study_runs(float32=f32, bfloat16=f32, float16=[f32[0] - 0.03, f32[1] + 0.01, f32[2]])
    assert {c.key: c for c in study_verdicts(noisy)}["mlp-float16"].verdict == "inconclusive"


def test_the_study_runs_end_to_end(tmp_path):
    """A few steps of the study's MLP runs: one row per run, named by model, precision and
    seed, float16's scale recorded step by step."""
    from scaledl_lab.studies.memory import precision_study as study

    configs = [c.replace(max_steps=3) for c in study.study_configs(is_quick=True, seeds=(0, 1))]
    configs = [c for c in configs if c.model == "mlp"]
    frame = study.run_study(tmp_path, configs=configs).frame
    runs = study.study_table(frame)
    assert runs[["precision", "seed"]].values.tolist() == [
        [p, s] for p in study.STUDY_PRECISIONS for s in (0, 1)
    ]
    assert (runs["steps"] == 3).all()
    scales = study.scale_history(frame)
    assert set(scales["run"]) == {"mlp float16 · seed 0", "mlp float16 · seed 1"}
    assert (scales["loss_scale"] == precision.INIT_SCALE).all()  # too few steps to overflow
    text = study.write_study_summary(tmp_path, runs).read_text()
    assert "**mlp-float16**" in text and "| mlp | bfloat16 |" in text


def test_the_committed_precision_study_renders_from_its_runs():
    """results/precision/: every run of the study, its summary rendered from them, the loss
    scale's history following the dynamic rule and matching the table."""
    from scaledl_lab.studies.memory import precision_study as study

    runs = pd.read_csv(PRECISION_RESULTS / "runs.csv")
    assert len(runs) == len(study.study_configs())
    assert sorted(runs["seed"].unique()) == list(study.STUDY_SEEDS)
    text = (PRECISION_RESULTS / "summary.md").read_text()
    assert text[text.index("## Verdicts") :] == "\n".join(study.study_verdict_section(runs)) + "\n"
    claims = study.study_verdicts(runs)
    assert [c.key for c in claims] == ["mlp-bfloat16", "mlp-float16", "cnn-bfloat16", "cnn-float16"]
    assert all(c.supported for c in claims), [c.reason for c in claims]  # the claim
    scales = pd.read_csv(PRECISION_RESULTS / "scales.csv")
    for name, history in scales.groupby("run"):
        model, rest = name.split(" ", 1)
        of = runs[(runs["model"] == model) & (runs["precision"] == "float16")]
        row = of[of["seed"] == int(rest.rpartition(" · seed ")[2])].iloc[0]
        assert history["loss_scale"].iloc[0] == precision.INIT_SCALE
        assert _replay(history["loss_scale"].tolist(), history["skipped"].tolist(),
                       interval=precision.GROWTH_INTERVAL)  # fmt: skip
        assert history["skipped"].sum() == row["skipped_steps"]
        assert history["loss_scale"].min() == row["lowest_scale"]


def test_probe_runs_the_lab_s_ops_here():
    """This CPU build runs every op of the lab's models in both 16-bit dtypes."""
    assert probe(torch.bfloat16) is None
    assert probe(torch.float16) is None


# -- errors, before any work -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("prec", "tail"),
    [("bfloat16", "has float32's exponent range and needs no loss scaling"),
     ("float32", "keeps its gradients in range without it"),
     ("float64", "keeps its gradients in range without it")],
)  # fmt: skip
def test_loss_scale_needs_float16(prec, tail):
    with pytest.raises(ConfigError) as err:
        _cfg(precision=prec, loss_scale=128.0)
    assert str(err.value) == (
        f"loss_scale=128.0 applies to precision='float16' only; precision={prec!r} {tail}: "
        "drop loss_scale (--loss-scale) or set precision='float16'"
    )


@pytest.mark.parametrize("value", ["auto", 0.0, -4.0, math.inf, math.nan, True])
def test_loss_scale_must_be_dynamic_or_positive(value):
    with pytest.raises(ConfigError) as err:
        _cfg(precision="float16", loss_scale=value)
    assert str(err.value) == (
        f"loss_scale={value!r} must be 'dynamic' or a positive number (a static scale)"
    )


@pytest.mark.parametrize("prec", ["bfloat16", "float16"])
@pytest.mark.parametrize("strategy", ["ps-async", "local-sgd", "gpipe", "diloco"])
def test_16_bits_name_the_strategies_they_apply_to(strategy, prec):
    with pytest.raises(ConfigError) as err:
        ExperimentConfig(strategy=strategy, runtime="sim", workers=2, precision=prec)
    assert str(err.value) == (
        f"precision {prec} applies to 'allreduce', 'allreduce-naive', 'zero1', 'zero2', "
        "'zero3', 'mesh' (their workers step float32 master weights of a 16-bit model); "
        f"strategy={strategy!r} trains in float32 or float64 only"
    )


def test_16_bits_refuse_compression():
    with pytest.raises(ConfigError) as err:
        _cfg(compress="topk:0.1")
    assert str(err.value) == (
        "precision bfloat16 sends 16-bit gradients already; compress='topk:0.1' is not "
        "combined with it: set compress='none' or precision='float32'"
    )


def test_a_cpu_that_cannot_run_float16_is_named(monkeypatch):
    monkeypatch.setattr(precision_checks, "probe", lambda dtype: "conv2d + max_pool2d (not built)")
    with pytest.raises(ConfigError) as err:
        _cfg(precision="float16", device="cpu")
    assert str(err.value) == (
        f"precision float16: this CPU build of torch {torch.__version__} cannot run "
        "conv2d + max_pool2d (not built); use precision='float32' (or a GPU: device='cuda')"
    )


def test_the_cli_reads_precision_and_loss_scale():
    base = ["run", "--strategy", "allreduce", "--runtime", "sim", "--precision", "float16"]
    for text, value in (("dynamic", "dynamic"), ("512", 512.0)):
        cfg = _config_from_args(_parser().parse_args([*base, "--loss-scale", text]))
        assert (cfg.precision, cfg.loss_scale) == ("float16", value)
