"""What several test files share: a small Fashion-MNIST run, comparing parameter sets, and
importing a script of ``benchmarks/``."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

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


@contextmanager
def benchmark_module(name: str) -> Iterator[ModuleType]:
    """``benchmarks/NAME.py`` imported as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]
