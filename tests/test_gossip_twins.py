"""D-PSGD and AD-PSGD against their sequential twins, on the simulator, in float64.

D-PSGD is a matrix recursion: with the workers' weights as the rows of X and the topology's
mixing matrix W, one step is X ← W·X − lr·∇F(X_old) (the gradient taken at the weights before
mixing). ``reference.train_dpsgd_sequential`` computes it in one process from the same shards
and per-epoch batch orders. AD-PSGD's pairings depend on timing, so its twin is what the
pairwise averaging must keep: the workers' mean moves by the optimiser steps and nothing else.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from common import SMALL, max_diff
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.training.reference import train_dpsgd_sequential, train_sequential
from scaledl_lab.training.worker import load_for

# Five steps of plain SGD in float64: the twin's own rounding is ~1e-17.
EXACT = dict(SMALL, momentum=0.0, max_steps=5, precision="float64")


def _dpsgd(workers: int, topology: str, **changes) -> ExperimentConfig:
    return ExperimentConfig(
        strategy="dpsgd",
        runtime="sim",
        workers=workers,
        topology=topology,
        model="mlp",
        **{**EXACT, **changes},
    )


@pytest.mark.parametrize("workers,topology", [(4, "ring"), (9, "torus:3x3")])
def test_dpsgd_is_the_mixing_matrix_recursion(workers, topology):
    cfg = _dpsgd(workers, topology)
    res = run(cfg, progress=False)
    twin = train_dpsgd_sequential(cfg, load_for(cfg))
    for rank in range(workers):
        assert max_diff(res.state_dict(rank=rank), twin[rank]) < 1e-10, rank
    # The workers hold different models (gossip is not an allreduce), far apart next to 1e-10.
    assert max_diff(twin[0], twin[1]) > 1e-3


@pytest.mark.parametrize("momentum,weight_decay", [(0.9, 0.0), (0.0, 1e-2)])
def test_dpsgd_with_momentum_or_weight_decay(momentum, weight_decay):
    """Both are well defined per worker: momentum m_i ← μ·m_i + g_i(x_i old) then
    x_i ← Σ_j W_ij x_j − lr·m_i; the optimiser steps on the mixed weights, so weight decay
    acts on Σ_j W_ij x_j (not on x_i old, as a regulariser inside F would in Lian et al.)."""
    cfg = _dpsgd(4, "ring", momentum=momentum, weight_decay=weight_decay)
    res = run(cfg, progress=False)
    twin = train_dpsgd_sequential(cfg, load_for(cfg))
    for rank in range(4):
        assert max_diff(res.state_dict(rank=rank), twin[rank]) < 1e-10, rank


@pytest.mark.parametrize("strategy", ["dpsgd", "adpsgd"])
def test_one_worker_is_plain_sgd_bit_for_bit(strategy):
    """One worker has no neighbour: D-PSGD's W is [[1]] and the mixed vector x·1.0 is x
    exactly (IEEE multiplication by one), the gradient was taken at that same x, and the
    optimiser step is the sequential one; AD-PSGD has no one to ask. Same batches, same ops:
    equal bit for bit, in float32 and with momentum."""
    cfg = ExperimentConfig(strategy=strategy, runtime="sim", workers=1, model="mlp", **SMALL)
    res = run(cfg, progress=False)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) == 0.0


# -- AD-PSGD: the averaging keeps the mean ---------------------------------------------------


@contextlib.contextmanager
def _record_steps():
    """Every optimiser step taken in this process: lr·grad before it and the change it made."""
    steps: list[dict[str, list[torch.Tensor]]] = []
    before: dict[int, list[torch.Tensor]] = {}

    def pre(optimizer, args, kwargs):
        group = optimizer.param_groups[0]
        before[id(optimizer)] = [p.detach().clone() for p in group["params"]]
        steps.append({"lr_grad": [group["lr"] * p.grad.detach().clone() for p in group["params"]]})

    def post(optimizer, args, kwargs):
        params = optimizer.param_groups[0]["params"]
        old = before.pop(id(optimizer))
        steps[-1]["delta"] = [p.detach() - b for p, b in zip(params, old, strict=True)]

    handles = [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    try:
        yield steps
    finally:
        for h in handles:
            h.remove()


@pytest.mark.parametrize(
    "workers,topology,changes",
    [
        (4, "ring", {}),
        (16, "torus:4x4", {"train_subset": 1600}),
        (4, "ring", {"momentum": 0.9}),
        (4, "ring", {"optimizer": "adam", "lr": 1e-3}),
    ],
)
def test_adpsgd_averaging_keeps_the_mean(workers, topology, changes):
    """(x_a + x_p)/2 on both sides of a pair leaves x_a + x_p unchanged, so the workers' mean
    moves only by the optimiser steps: mean_T = x_0 + (1/N) Σ_steps Δ, where Δ is what each
    step changed (for plain SGD, −lr·∇F at the weights before averaging). Exact up to float64
    rounding (~1e-17 here); a lost or one-sided average would shift it by ~consensus/N."""
    cfg = ExperimentConfig(
        strategy="adpsgd",
        runtime="sim",
        workers=workers,
        topology=topology,
        model="mlp",
        **{**EXACT, "max_steps": 10, **changes},
    )
    with _record_steps() as steps:
        res = run(cfg, progress=False)
    data = load_for(cfg)
    init = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed).double()
    names = [name for name, _ in init.named_parameters()]
    x0 = [p.detach() for p in init.parameters()]
    finals = [res.state_dict(rank=r) for r in range(workers)]
    train = res.frame.query("kind == 'train'")
    assert len(steps) == len(train) == workers * train["step"].max()
    predictions = {
        "delta": [x + sum(s["delta"][i] for s in steps) / workers for i, x in enumerate(x0)]
    }
    if cfg.optimizer == "sgd" and cfg.momentum == 0:
        predictions["gradients"] = [
            x - sum(s["lr_grad"][i] for s in steps) / workers for i, x in enumerate(x0)
        ]
    means = [sum(f[name] for f in finals) / workers for name in names]
    for name, mean, *predicted in zip(names, means, *predictions.values(), strict=True):
        for how, p in zip(predictions, predicted, strict=True):
            assert (mean - p).abs().max().item() < 1e-13, (name, how)
    # The mean did move, pairs did average (bytes) and the workers still disagree.
    assert max((m - x).abs().max().item() for m, x in zip(means, x0, strict=True)) > 1e-3
    assert train["bytes_sent"].sum() > 0
    assert max_diff(finals[0], finals[1]) > 1e-4
