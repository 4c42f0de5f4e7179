"""Sharp and flat minima (Keskar et al. 2016): how sharp a trained model's minimum is, how much
worse it does on test than on train, and the loss along the line between two minima.

- :func:`top_eigenvalue`: the Hessian's largest eigenvalue, by power iteration on
  Hessian-vector products (double backward; the Hessian is never formed);
- :func:`epsilon_sharpness`: Keskar's metric 2.1 in the full space,
  100·(max_{|z_i| ≤ ε(|x_i|+1)} f(x+z) − f(x)) / (1 + f(x)), the max approached by projected
  sign-gradient ascent (Keskar used 10 L-BFGS-B iterations; both give a lower bound);
- :func:`analyse`: both, with train/test accuracy and the gap, for every run of a ``Results``;
- :func:`loss_slice`: f((1−α)·θ_a + α·θ_b) for α from below 0 to above 1 (their Figure 3).

The loss is the mean cross-entropy on a fixed probe set (the first ``samples`` training
samples), in eval mode, so every number is deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ...data import Dataset
from ...models import build_model
from ...objective import correct_count, summed_loss
from ...training.plan import load_for

SAMPLES = 1000  # probe set for the Hessian and ε-sharpness
TRAIN_SAMPLES = 10_000  # training samples scored for the train/test gap
EPSILON = 1e-3  # Keskar et al.'s ε (they also report 5e-4)


def _params(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def _probe(split: Dataset, samples: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    n = min(samples, len(split))
    return split.x[:n].to(dtype), split.y[:n]


def hessian_vector_product(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    """v ↦ H·v for the loss on (x, y), H the Hessian in the model's parameters (flattened).

    The gradient's graph is built once; each product is one more backward through it.
    """
    params = _params(model)
    loss = F.cross_entropy(model(x), y)
    grads = torch.autograd.grad(loss, params, create_graph=True)
    flat = torch.cat([g.reshape(-1) for g in grads])

    def product(v: torch.Tensor) -> torch.Tensor:
        parts = torch.autograd.grad(flat, params, grad_outputs=v, retain_graph=True,
                                    allow_unused=True)  # fmt: skip
        return torch.cat([
            (h if h is not None else torch.zeros_like(p)).reshape(-1)
            for h, p in zip(parts, params, strict=True)
        ])  # fmt: skip

    return product


def top_eigenvalue(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    iterations: int = 20,
    tol: float = 1e-3,
    seed: int = 0,
) -> tuple[float, int]:
    """The Hessian's eigenvalue of largest magnitude and the iterations it took: v ← Hv/||Hv||
    from a seeded random v until the Rayleigh quotient vᵀHv changes by less than ``tol``
    (relative), at most ``iterations`` times."""
    was_training = model.training
    model.eval()
    try:
        hvp = hessian_vector_product(model, x, y)
        n = sum(p.numel() for p in _params(model))
        like = _params(model)[0]
        gen = torch.Generator().manual_seed(seed)
        v = torch.randn(n, generator=gen, dtype=torch.float64).to(like.dtype)
        v /= torch.linalg.vector_norm(v)
        value = 0.0
        for i in range(1, iterations + 1):
            hv = hvp(v)
            new = float(v @ hv)
            v = hv / torch.linalg.vector_norm(hv)
            if i > 1 and abs(new - value) <= tol * abs(new):
                return new, i
            value = new
        return value, iterations
    finally:
        model.train(was_training)


def epsilon_sharpness(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epsilon: float = EPSILON,
    steps: int = 5,
) -> float:
    """Keskar et al.'s ε-sharpness in the full space (A = I), in percent; the model is restored.

    Ascent: z ← clip(z + (2.5/steps)·r ⊙ sign(∇f(x+z)), −r, r) with r = ε(|x|+1).
    """
    params = _params(model)
    start = [p.detach().clone() for p in params]
    radius = [epsilon * (p.abs() + 1) for p in start]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            base = F.cross_entropy(model(x), y).item()
        worst = base
        for _ in range(steps):
            loss = F.cross_entropy(model(x), y)
            worst = max(worst, loss.item())
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, p0, r, g in zip(params, start, radius, grads, strict=True):
                    p.add_(r * g.sign(), alpha=2.5 / steps)
                    p.copy_(torch.minimum(torch.maximum(p, p0 - r), p0 + r))
        with torch.no_grad():
            worst = max(worst, F.cross_entropy(model(x), y).item())
            for p, p0 in zip(params, start, strict=True):
                p.copy_(p0)
    finally:
        model.train(was_training)
    return 100.0 * (worst - base) / (1.0 + base)


def evaluate(model: nn.Module, split: Dataset, samples: int | None = None) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on the first ``samples`` of ``split`` (all: None)."""
    like = _params(model)[0]
    n = len(split) if samples is None else min(samples, len(split))
    loss_sum, correct = 0.0, 0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, n, 1000):
            end = min(n, start + 1000)
            out = model(split.x[start:end].to(like.dtype))
            loss_sum += summed_loss(out, split.y[start:end]).item()
            correct += correct_count(out, split.y[start:end])
    model.train(was_training)
    return loss_sum / n, correct / n


def model_of(cfg: Any, state: dict[str, torch.Tensor]) -> nn.Module:
    """A run's model with the weights ``state`` (its config's architecture and precision)."""
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(cfg.dtype)
    model.load_state_dict(state)
    return model


def analyse(
    results: Any,
    runs: Sequence[str] | None = None,
    *,
    samples: int = SAMPLES,
    train_samples: int = TRAIN_SAMPLES,
    iterations: int = 20,
    tol: float = 1e-3,
    epsilon: float = EPSILON,
    steps: int = 5,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per run of ``results`` (a :class:`~scaledl_lab.experiment.Results` with its
    final weights, in memory or read back from ``weights.pt``): effective batch, train and test
    loss and accuracy, the gap in accuracy points, the top Hessian eigenvalue, ε-sharpness."""
    configs = {c.label: c for c in results.configs}
    labels = list(runs) if runs is not None else [r for r in results.outputs if r in configs]
    if not labels:
        raise ValueError("no run has saved weights: run with out=DIR (weights.pt) first")
    rows = []
    for label in labels:
        cfg = configs[label]
        model = model_of(cfg, results.weights(label))
        data = load_for(cfg)
        x, y = _probe(data.train, samples, cfg.dtype)
        train_loss, train_acc = evaluate(model, data.train, train_samples)
        test_loss, test_acc = evaluate(model, data.test)
        eig, done = top_eigenvalue(model, x, y, iterations=iterations, tol=tol, seed=seed)
        rows.append({
            "run": label, "effective_batch_size": cfg.effective_batch_size,
            "optimizer": cfg.optimizer, "train_loss": train_loss, "train_accuracy": train_acc,
            "test_loss": test_loss, "test_accuracy": test_acc,
            "gap": 100.0 * (train_acc - test_acc), "top_eigenvalue": eig,
            "epsilon_sharpness": epsilon_sharpness(model, x, y, epsilon=epsilon, steps=steps),
            "hessian_iterations": done,
        })  # fmt: skip
    return pd.DataFrame(rows)


def loss_slice(
    results: Any,
    run_a: str,
    run_b: str,
    *,
    alphas: Sequence[float] | None = None,
    samples: int = TRAIN_SAMPLES,
) -> pd.DataFrame:
    """Train and test loss and accuracy at θ(α) = (1−α)·θ_a + α·θ_b (α = 0: run_a's minimum,
    1: run_b's); floating-point buffers are interpolated too, counters kept from run_a."""
    alphas = np.linspace(-0.5, 1.5, 21) if alphas is None else alphas
    configs = {c.label: c for c in results.configs}
    cfg = configs[run_a]
    a, b = results.weights(run_a), results.weights(run_b)
    model = model_of(cfg, a)
    data = load_for(cfg)
    rows = []
    for alpha in alphas:
        mixed = {
            k: (1 - alpha) * a[k] + alpha * b[k] if a[k].is_floating_point() else a[k] for k in a
        }
        model.load_state_dict(mixed)
        train_loss, train_acc = evaluate(model, data.train, samples)
        test_loss, test_acc = evaluate(model, data.test, samples)
        rows.append({"alpha": float(alpha), "train_loss": train_loss, "train_accuracy": train_acc,
                     "test_loss": test_loss, "test_accuracy": test_acc})  # fmt: skip
    return pd.DataFrame(rows)
