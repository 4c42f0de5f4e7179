"""What several test files share: a small Fashion-MNIST run, and comparing parameter sets."""

from __future__ import annotations

import torch

# 2400 training samples, batch 32 per worker, 20 steps: seconds per run on two cores.
SMALL = dict(
    dataset="fashion-mnist",
    train_subset=2400,
    test_subset=400,
    val_size=400,
    batch_size=32,
    epochs=1,
    max_steps=20,
    lr=0.05,
    momentum=0.9,
)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two state_dicts, computed in float64."""
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)
