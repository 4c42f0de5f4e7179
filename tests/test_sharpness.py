"""Sharpness: the top Hessian eigenvalue against a dense Hessian and against an independent
implementation (hessian-eigenthings), ε-sharpness, the loss slice, the CLI on a results folder."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from common import SMALL
from torch import nn
from torch.func import functional_call

from scaledl_lab import ExperimentConfig, Results, run
from scaledl_lab.cli import main
from scaledl_lab.strategies.large_batch.sharpness import (
    epsilon_sharpness,
    loss_slice,
    model_of,
    top_eigenvalue,
)
from scaledl_lab.training.worker import load_for


def _tiny() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x = torch.randn(64, 5, dtype=torch.float64)
    return model, x, torch.randint(0, 3, (64,))


def test_power_iteration_equals_the_dense_hessian():
    model, x, y = _tiny()
    names = [n for n, _ in model.named_parameters()]
    shapes = [p.shape for p in model.parameters()]
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    def loss(vector: torch.Tensor) -> torch.Tensor:
        parts = torch.split(vector, [s.numel() for s in shapes])
        params = {n: t.view(s) for n, t, s in zip(names, parts, shapes, strict=True)}
        return F.cross_entropy(functional_call(model, params, (x,)), y)

    eigenvalues = torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, flat))
    dense = eigenvalues[eigenvalues.abs().argmax()].item()
    ours, _ = top_eigenvalue(model, x, y, iterations=2000, tol=1e-13)
    assert ours == pytest.approx(dense, rel=1e-8)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two MLPs trained 60 steps on 2400 Fashion-MNIST samples: batch 32 and batch 256."""
    base = dict(strategy="allreduce", runtime="sim", model="mlp", **{**SMALL, "max_steps": 60})
    configs = [
        ExperimentConfig(name="b32", workers=1, **base),
        ExperimentConfig(name="b256", workers=8, **base),
    ]
    from scaledl_lab import compare

    out = tmp_path_factory.mktemp("sharp")
    compare(configs, out=out, progress=False, log=None)
    return out


def test_top_eigenvalue_agrees_with_hessian_eigenthings(trained):
    eigenthings = pytest.importorskip("hessian_eigenthings")
    results = Results.load(trained)
    cfg = results.configs[0]
    model = model_of(cfg, results.weights("b32"))
    data = load_for(cfg)
    x, y = data.train.x[:500], data.train.y[:500]
    model.eval()
    operator = eigenthings.HessianOperator(
        model, [(x, y)], eigenthings.supervised_loss(F.cross_entropy)
    )
    reference = eigenthings.lanczos(operator, k=1, max_iter=20, seed=0).eigenvalues[0].item()
    ours, iterations = top_eigenvalue(model, x, y)  # the analysis's defaults
    assert ours == pytest.approx(reference, rel=0.02), (ours, reference, iterations)


def test_epsilon_sharpness_grows_with_epsilon_and_restores_the_model(trained):
    results = Results.load(trained)
    model = model_of(results.configs[0], results.weights("b32"))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    data = load_for(results.configs[0])
    x, y = data.train.x[:500], data.train.y[:500]
    small = epsilon_sharpness(model, x, y, epsilon=1e-4)
    large = epsilon_sharpness(model, x, y, epsilon=1e-3)
    assert 0 < small < large
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_analyse_and_slice_on_a_loaded_results_folder(trained):
    results = Results.load(trained)
    table = results.sharpness(samples=500, train_samples=2000)
    assert table["run"].tolist() == ["b32", "b256"]
    assert table["effective_batch_size"].tolist() == [32, 256]
    assert (table["top_eigenvalue"] > 0).all() and (table["epsilon_sharpness"] > 0).all()
    assert (table["gap"] == 100 * (table["train_accuracy"] - table["test_accuracy"])).all()
    line = loss_slice(results, "b32", "b256", alphas=[0.0, 0.5, 1.0], samples=2000)
    assert line["alpha"].tolist() == [0.0, 0.5, 1.0]
    ends = table.set_index("run")
    assert line["train_accuracy"].iloc[0] == pytest.approx(ends.loc["b32", "train_accuracy"])
    assert line["test_loss"].iloc[-1] == pytest.approx(ends.loc["b256", "test_loss"], rel=1e-6)


def test_cli_analyse_sharpness(trained, capsys):
    assert main(["analyse", "sharpness", str(trained), "--samples", "300"]) == 0
    printed = capsys.readouterr().out
    assert "top_eigenvalue" in printed and "b256" in printed
    for name in ("sharpness.csv", "slice.csv", "sharpness_slice.png"):
        assert (trained / name).exists()


def test_cli_analyse_without_weights_says_what_to_do(tmp_path, capsys):
    cfg = ExperimentConfig(strategy="allreduce", runtime="sim", workers=1, model="mlp", **SMALL)
    run(cfg, out=tmp_path, progress=False, log=None)
    (tmp_path / "weights.pt").unlink()
    assert main(["analyse", "sharpness", str(tmp_path)]) == 1
    assert "weights.pt" in capsys.readouterr().err
