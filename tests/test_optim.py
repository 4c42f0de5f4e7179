"""LARS and LAMB against SGD and Adam, and their trust ratios by hand (float64)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from scaledl_lab import ExperimentConfig
from scaledl_lab.training.optim import LAMB, LARS, param_groups
from scaledl_lab.training.plan import make_optimizer


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.BatchNorm1d(5), nn.Linear(5, 3)).double()


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int = 5) -> nn.Module:
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 6, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 3, (16,), generator=gen)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    return model


def _grad(model: nn.Module) -> None:
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(16, model[0].in_features, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 3, (16,), generator=gen)
    F.cross_entropy(model(x), y).backward()


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    return max(
        (p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_lars_with_trust_ratio_one_is_sgd():
    # adapt=False everywhere: the trust ratio is 1, and LARS is SGD with momentum and decay.
    a, b = _model(), _model()
    groups = [{"params": list(a.parameters()), "adapt": False}]
    _steps(a, LARS(groups, lr=0.1, momentum=0.9, weight_decay=1e-3))
    _steps(b, torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3))
    assert _max_diff(a, b) == 0.0


def test_lars_trust_ratio_of_one_from_the_coefficient_is_one_sgd_step():
    layer = nn.Linear(4, 3, bias=False).double()
    _grad(nn.Sequential(layer, nn.Linear(3, 3).double()))
    w, g, decay = layer.weight.detach().clone(), layer.weight.grad.clone(), 0.01
    # η = (||g|| + β||w||)/||w|| makes the ratio η||w||/(||g|| + β||w||) exactly 1.
    eta = ((g.norm() + decay * w.norm()) / w.norm()).item()
    LARS([layer.weight], lr=0.5, momentum=0.9, weight_decay=decay, trust_coefficient=eta).step()
    assert torch.allclose(layer.weight, w - 0.5 * (g + decay * w), rtol=0, atol=1e-14)


def test_lars_step_by_hand():
    layer = nn.Linear(4, 3, bias=False).double()
    _grad(nn.Sequential(layer, nn.Linear(3, 3).double()))
    w, g = layer.weight.detach().clone(), layer.weight.grad.clone()
    lr, decay, eta = 2.0, 5e-4, 0.001
    LARS([layer.weight], lr=lr, momentum=0.0, weight_decay=decay, trust_coefficient=eta).step()
    local = eta * w.norm() / (g.norm() + decay * w.norm())  # You et al. 2017, eq. (6)
    assert torch.allclose(layer.weight, w - lr * local * (g + decay * w), rtol=0, atol=1e-15)


@pytest.mark.parametrize("decay", [0.0, 0.01])
def test_one_lamb_step_is_an_adam_step_scaled_by_its_trust_ratio(decay):
    layer = nn.Linear(4, 3, bias=False).double()
    _grad(nn.Sequential(layer, nn.Linear(3, 3).double()))
    w, g = layer.weight.detach().clone(), layer.weight.grad.clone()
    lr, eps = 0.01, 1e-6
    LAMB([layer.weight], lr=lr, eps=eps, weight_decay=decay).step()
    # Adam's first step by hand: m̂ = g, v̂ = g², so its direction is g / (|g| + ε).
    adam = g / (g.abs() + eps)
    update = adam + decay * w
    ratio = w.norm() / update.norm()
    assert torch.allclose(layer.weight, w - lr * ratio * update, rtol=0, atol=1e-15)
    if decay == 0:  # ... and the same through torch.optim.Adam's own step
        twin = nn.Parameter(w.clone())
        twin.grad = g.clone()
        torch.optim.Adam([twin], lr=lr, eps=eps).step()
        adam_step = twin.detach() - w
        scaled = w + adam_step * (w.norm() / (adam_step / lr).norm())
        assert torch.allclose(layer.weight, scaled, rtol=0, atol=1e-14)


def test_excluded_parameters_skip_the_ratio_and_the_decay():
    model = _model()
    groups = param_groups(model.parameters(), weight_decay=0.1)
    assert [p.ndim for p in groups[0]["params"]] == [2, 2]
    assert all(p.ndim == 1 for p in groups[1]["params"])  # biases and BatchNorm γ, β
    assert groups[1]["weight_decay"] == 0.0 and groups[1]["adapt"] is False
    # On the excluded group a LAMB step is an Adam step (no decay, no ratio).
    a, b = _model(), _model()
    _steps(a, LAMB(param_groups(a.parameters(), 0.1), lr=0.01), steps=1)
    _steps(b, torch.optim.Adam([p for p in b.parameters() if p.ndim == 1], lr=0.01, eps=1e-6), 1)
    bias_a = [p for p in a.parameters() if p.ndim == 1]
    bias_b = [p for p in b.parameters() if p.ndim == 1]
    assert max((p - q).abs().max().item() for p, q in zip(bias_a, bias_b, strict=True)) < 1e-15


def test_negative_trust_coefficient_is_refused():
    with pytest.raises(ValueError, match="trust_coefficient"):
        LARS(_model().parameters(), lr=0.1, trust_coefficient=-1)
    with pytest.raises(ValueError, match="trust_coefficient"):
        LAMB(_model().parameters(), lr=0.1, trust_coefficient=-1)


def test_make_optimizer_builds_them_and_keeps_sgd_as_it_was():
    model = _model()
    sgd = make_optimizer(ExperimentConfig(), model.parameters())
    assert type(sgd) is torch.optim.SGD and len(sgd.param_groups) == 1
    lars = make_optimizer(ExperimentConfig(optimizer="lars", weight_decay=1e-4), model.parameters())
    assert isinstance(lars, LARS) and lars.param_groups[0]["trust_coefficient"] == 0.001
    assert [g["weight_decay"] for g in lars.param_groups] == [1e-4, 0.0]  # the recipe's exclusions
    lamb = make_optimizer(
        ExperimentConfig(optimizer="lamb", trust_coefficient=0.5, no_bias_decay=False),
        model.parameters(),
    )
    assert isinstance(lamb, LAMB) and len(lamb.param_groups) == 1
    assert lamb.param_groups[0]["trust_coefficient"] == 0.5
    # Linear scaling is the recipe too: SGD without decay on biases and BatchNorm.
    recipe = make_optimizer(
        ExperimentConfig(lr_scaling="linear", weight_decay=1e-4), copy.deepcopy(model).parameters()
    )
    assert [g["weight_decay"] for g in recipe.param_groups] == [1e-4, 0.0]
