"""Activation recomputation (Chen et al. 2016) on every strategy: the parameters of the run
without it, bit for bit, on both runtimes; the ledger's activations down to the checkpoints and
one segment's; one more forward on the simulator's clock, as ``scaledl-lab plan`` predicts;
plan's activations under recomputation for the lab's models and a transformer; the claim."""

from __future__ import annotations

import sys

import cloudpickle
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from common import SMALL, max_diff

from scaledl_lab import ConfigError, ExperimentConfig, families, run
from scaledl_lab.models import build_model
from scaledl_lab.strategies.memory.plan import plan
from scaledl_lab.strategies.memory.recompute import forward_shares, segments
from scaledl_lab.strategies.memory.transformer import Transformer, plan_transformer
from scaledl_lab.studies.memory.recompute_study import recompute_claim, recompute_table
from scaledl_lab.training.ledger import SavedTensors
from scaledl_lab.training.worker import load_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# One strategy of every family and every program that trains differently; asynchronous ones
# on one worker: with several, the order of their pushes follows the virtual clock, which
# recomputation moves (by one forward per step), and so would their parameters.
CASES = {
    "allreduce": {}, "ps-sync": {}, "ps-async": dict(workers=1), "hogwild": dict(workers=1),
    "nnt": dict(workers=1), "dpsgd": {}, "local-sgd": {}, "easgd": {}, "diloco": {},
    "gpipe": dict(micro_batches=2), "1f1b": dict(micro_batches=2), "tensor-parallel": {},
    "zero1": {}, "zero2": {}, "zero3": {}, "model-parallel": {},
}  # fmt: skip


def _cfg(strategy: str, runtime: str = "sim", **changes) -> ExperimentConfig:
    options = {"workers": 2, "model": "mlp", **SMALL, **changes}
    return ExperimentConfig(strategy=strategy, runtime=runtime, **options)


def _train(res):
    return res.frame.query("kind == 'train'").sort_values(["rank", "step"])


@pytest.mark.parametrize("strategy", list(CASES))
def test_recomputation_changes_no_parameter(strategy):
    """20 steps in float32, bit for bit: every recomputed forward runs the same kernels on the
    same values as the first, and its gradients accumulate as without recomputation. That it
    ran shows on the clock: one more forward per step."""
    cfg = _cfg(strategy, **CASES[strategy])
    plain = run(cfg, progress=False)
    again = run(cfg.replace(recompute=True), progress=False)
    assert max_diff(plain.state_dict(), again.state_dict()) == 0.0
    assert _train(again)["time"].max() > _train(plain)["time"].max()
    assert len(_train(again)) == len(_train(plain)) and _train(plain)["step"].max() == 20


# ResNet-18's cases (~30 s each) run with --runslow; the CNN's carry the same checks in CI.
RESNET = pytest.mark.slow


@pytest.mark.parametrize(
    ("model", "steps"), [("cnn", 5), pytest.param("resnet18", 3, marks=RESNET)]
)
def test_batchnorm_statistics_move_once_per_forward(model, steps):
    """ResNet-18's running statistics (buffers of the state_dict) move once per step: the
    recomputed forward puts them back."""
    cfg = _cfg("allreduce", model=model, batch_size=8, max_steps=steps)
    plain = run(cfg, progress=False).state_dict()
    again = run(cfg.replace(recompute=True), progress=False).state_dict()
    assert max_diff(plain, again) == 0.0
    if model == "resnet18":
        init = build_model("resnet18", (1, 28, 28), 10, seed=cfg.seed).state_dict()
        assert max_diff({"m": plain["bn.running_mean"]}, {"m": init["bn.running_mean"]}) > 0


@pytest.mark.parametrize("strategy", ["allreduce", "tensor-parallel"])
def test_dask_equals_the_simulator_with_recomputation(strategy, client):
    """Two gloo workers, recomputing, end on the simulator's parameters bit for bit."""
    cfg = _cfg(strategy, "dask", recompute=True)
    dask = run(cfg, client=client, progress=False, log=None)
    sim = run(cfg.replace(runtime="sim"), progress=False, log=None)
    for rank in range(2):
        assert max_diff(dask.state_dict(rank=rank), sim.state_dict(rank=rank)) == 0.0


# gpt-tiny reads int64 token ids: its segments' shares are measured on an id sample, and the
# first segment (the embedding) takes the ids, which need no gradient.
TEXT = dict(
    dataset="licenses", model="gpt-tiny", train_subset=128, val_size=32, test_subset=32,
    batch_size=8, max_steps=6, precision="float64", seed=1,
)  # fmt: skip


@pytest.mark.parametrize(
    ("strategy", "options"),
    [("allreduce", {}), ("dpsgd", {}), ("diloco", dict(sync_period=2)),
     ("gpipe", dict(micro_batches=2)), ("zero3", {})],
)  # fmt: skip
def test_gpt_tiny_recomputes_to_the_same_parameters(strategy, options):
    cfg = _cfg(strategy, **{**TEXT, **options})
    plain = run(cfg, progress=False)
    again = run(cfg.replace(recompute=True), progress=False)
    for rank in range(2):
        assert max_diff(plain.state_dict(rank=rank), again.state_dict(rank=rank)) == 0.0
    assert _train(again)["loss"].tolist() == _train(plain)["loss"].tolist()
    assert _train(again)["time"].max() > _train(plain)["time"].max()  # it did recompute


def test_gpt_tiny_recomputes_on_dask(client):
    cfg = _cfg("allreduce", "dask", **TEXT, recompute=True)
    dask = run(cfg, client=client, progress=False, log=None)
    plain = run(cfg.replace(runtime="sim", recompute=False), progress=False, log=None)
    for rank in range(2):
        assert max_diff(dask.state_dict(rank=rank), plain.state_dict(rank=rank)) == 0.0


# -- the ledger: the checkpoints and one segment ----------------------------------------------


def _segment_bound(model: torch.nn.Module, x: torch.Tensor) -> float:
    """Sum of the segments' inputs plus the largest segment's activations, each segment run
    alone with autograd (the loss with the last), as the ledger counts storages."""
    y = torch.zeros(len(x), dtype=torch.long)
    parts = segments(model)
    inputs, largest, h = 0, 0, x
    for i, segment in enumerate(parts):
        inputs += h.untyped_storage().nbytes()
        saved = SavedTensors()
        with saved.counting(model):
            out = segment(h.detach().requires_grad_(i > 0))
            if i == len(parts) - 1:
                out = F.cross_entropy(out, y)
        largest = max(largest, saved.bytes.peak)
        with torch.no_grad():
            h = segment(h)
    return inputs + largest


@pytest.mark.parametrize(
    ("model", "batch"), [("mlp", 32), ("cnn", 32), pytest.param("resnet18", 8, marks=RESNET)]
)
def test_activations_fall_to_the_checkpoints_and_one_segment(model, batch):
    cfg = _cfg("allreduce", model=model, batch_size=batch, max_steps=1)
    plain = _train(run(cfg, progress=False))["mem_activations"].max()
    again = _train(run(cfg.replace(recompute=True), progress=False))["mem_activations"].max()
    data = load_for(cfg)
    net = build_model(model, data.input_shape, data.num_classes, seed=cfg.seed)
    bound = _segment_bound(net, data.train.x[:batch])
    assert again <= bound
    if model == "mlp":
        # Every tensor the MLP saves is a layer's input (ReLU's output is the next Linear's
        # input): per-layer checkpoints are exactly what it kept.
        assert again == plain
    elif model == "cnn":
        assert again < 0.95 * plain  # the second conv block's activations dominate
    else:
        assert again < 0.5 * plain  # eleven segments: 3x less


# -- time: one more forward, as plan says ---------------------------------------------------


def test_the_simulator_charges_one_more_forward_as_plan_predicts():
    """One worker (no communication): a step under recomputation is 4/3 of one without, and
    every step is what ``plan`` predicts, recomputing or not."""
    cfg = _cfg("allreduce", workers=1, max_steps=6)
    steps = {}
    for recompute in (False, True):
        c = cfg.replace(recompute=recompute)
        train = _train(run(c, progress=False))
        step_s = np.diff(train["time"].to_numpy())[1:]
        assert step_s == pytest.approx([plan(c).step_s] * len(step_s), rel=1e-12)
        steps[recompute] = step_s.mean()
    assert steps[True] / steps[False] == pytest.approx(4 / 3, rel=1e-12)


@pytest.mark.parametrize("model", ["mlp", "cnn", "cnn1d", "resnet18"])
def test_segments_share_one_forward(model):
    dataset = "mnist1d" if model == "cnn1d" else "fashion-mnist"
    data = load_for(_cfg("allreduce", model=model, dataset=dataset))
    shares = forward_shares(model, tuple(data.input_shape), data.num_classes)
    assert sum(shares) == pytest.approx(1.0, rel=1e-12) and min(shares) >= 0  # BN: no FLOPs
    net = build_model(model, data.input_shape, data.num_classes, seed=0)
    assert len(shares) == len(segments(net))


# -- plan ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("strategy", "model"), [("allreduce", "mlp"), ("allreduce", "cnn"),
                                                 ("zero1", "cnn"), ("zero3", "cnn")])  # fmt: skip
def test_plan_predicts_the_ledger_under_recomputation(strategy, model):
    """Within 10% (the issue's bound) of what a recomputing run records."""
    cfg = _cfg(strategy, model=model, max_steps=2, recompute=True)
    predicted = plan(cfg).memory.activations
    recorded = _train(run(cfg, progress=False))["mem_activations"].max()
    assert predicted == pytest.approx(recorded, rel=0.10)
    assert predicted < plan(cfg.replace(recompute=False)).memory.activations or model == "mlp"


def test_transformer_plan_keeps_one_input_per_layer_under_recomputation():
    """Each more layer costs its input, 4sbh, instead of its activations, 64sbh + 4as²b; the
    rest is one layer's activations besides its input (60sbh + 4as²b)."""
    s, b, h, a, v = 1024, 4, 1024, 16, 8192  # log-softmax's 4sbV under one layer's activations
    cfg = ExperimentConfig(strategy="zero3", runtime="sim", workers=8, batch_size=b,
                           compute_profile="a100", recompute=True)  # fmt: skip
    plain = cfg.replace(recompute=False)
    model = {n: Transformer(n, h, a, s, v) for n in (24, 25)}
    kept = {n: plan_transformer(cfg, m).memory.activations for n, m in model.items()}
    full = {n: plan_transformer(plain, m).memory.activations for n, m in model.items()}
    assert kept[25] - kept[24] == 4 * s * b * h
    assert full[25] - full[24] == 64 * s * b * h + 4 * a * s * s * b
    assert kept[24] == 24 * 4 * s * b * h + 60 * s * b * h + 4 * a * s * s * b
    assert kept[24] < full[24] / 10
    compute = {c.recompute: plan_transformer(c, model[24]).step_s for c in (cfg, plain)}
    assert compute[True] > compute[False]


# -- the option, and the claim ---------------------------------------------------------------


def test_every_strategy_takes_recompute():
    """No strategy refuses it but ZB-H1 (pipelines and ZeRO's stages 2 and 3 recompute in their
    own programs, the others through the model); the config reads back from its dict."""
    taken = 0
    for strategy in families.strategies():
        try:
            plain = ExperimentConfig(strategy=strategy, runtime="sim", workers=4)
        except ConfigError:
            continue  # needs options of its own (a topology, ...): not recompute's business
        if strategy == "zb-h1":  # W runs on the graph B keeps: recomputation would free it
            with pytest.raises(ConfigError, match="not supported by strategy='zb-h1'"):
                plain.replace(recompute=True)
            continue
        again = plain.replace(recompute=True)
        assert again.recompute is True and not plain.recompute
        assert ExperimentConfig.from_dict(again.to_dict()) == again
        taken += 1
    assert taken >= len(CASES)


def test_recompute_must_be_a_boolean():
    with pytest.raises(ConfigError, match="recompute='yes' must be True, False or 'selective'"):
        _cfg("allreduce", recompute="yes")


def test_the_claim_is_decided_on_measured_figures():
    table = recompute_table(batch_size=8)
    claim = recompute_claim(table)
    assert claim.verdict == "supported", claim.reason
    assert table["holds"].all()
    assert table["extra_forwards"].to_numpy() == pytest.approx([1.0] * 3, abs=1e-9)
    assert table.loc["resnet18", "saving"] >= 2 and table.loc["mlp", "saving"] == 1.0
    assert (table["recompute_activations_mb"] <= table["bound_mb"]).all()
    assert claim.figures["saving_resnet18"] == table.loc["resnet18", "saving"]


def test_two_steps_give_the_table_of_four():
    """The notebook's quick mode measures the claim on two steps per run: on one worker every
    step keeps the same activations and takes the same simulated time."""
    import pandas as pd

    two = recompute_table(models=("mlp", "cnn"), batch_size=8, steps=2)
    pd.testing.assert_frame_equal(two, recompute_table(models=("mlp", "cnn"), batch_size=8))
    with pytest.raises(ValueError, match="steps=1: the step time needs at least 2 steps"):
        recompute_table(models=("mlp",), steps=1)
