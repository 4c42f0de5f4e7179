"""What several test files share: a small Fashion-MNIST run, comparing parameter sets, and
importing a script of ``benchmarks/``."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

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


def small_for(steps: int, workers: int = 2, **changes: Any) -> dict[str, Any]:
    """SMALL cut to what a run of ``steps`` steps on ``workers`` workers reads: one epoch of
    exactly those batches, and evaluations on 64 samples (what a twin test compares is the
    parameters, not the accuracy)."""
    batch = changes.get("batch_size", SMALL["batch_size"])
    return {
        **SMALL,
        "max_steps": steps,
        "train_subset": steps * batch * workers,
        "val_size": 64,
        "test_subset": 64,
        **changes,
    }


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


def zero_formula(
    strategy: str, sizes: list[int], n: int, k: int, element: int
) -> tuple[int, int, int]:
    """(params, grads, optimiser) bytes per worker, ZeRO's Table 1 with ``element``-byte
    parameters and gradients and K bytes of optimiser state each (float32: 4; mixed precision:
    2, the float32 master weights in K). Data parallelism: (2e + K)Ψ; stage 1: 2eΨ + KΨ/N; stage
    2: eΨ + (e + K)Ψ/N; stage 3: (2e + K)Ψ/N; here Ψ is padded layer by layer to a multiple of N
    (the flat units), and Ψ/N is each layer's chunk, ⌈Ψ_layer/N⌉, summed."""
    from scaledl_lab.runtime.base import shard_numel

    psi = sum(sizes)
    padded = sum(n * shard_numel(s, n) for s in sizes)
    shard = padded // n
    if strategy == "allreduce":
        return element * psi, element * psi, k * psi
    if strategy == "zero1":
        return element * padded, element * padded, k * shard
    if strategy == "zero2":
        return element * padded, element * shard, k * shard
    return element * shard, element * shard, k * shard


def layer_sizes(cfg: Any) -> list[int]:
    """Parameters of each layer that has any (the units ZeRO shards), in order."""
    from scaledl_lab.models import build_model
    from scaledl_lab.training.worker import load_for

    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    sizes: dict[str, int] = {}
    for name, p in model.named_parameters():
        layer = name.rsplit(".", 1)[0]
        sizes[layer] = sizes.get(layer, 0) + p.numel()
    return list(sizes.values())


def partial_of(out: Path) -> Path:
    """The partial folder a failed run into ``out`` left beside it (``<out>.partial-<time>``)."""
    [partial] = sorted(out.parent.glob(f"{out.name}.partial-*"))
    return partial


def assert_same_run(sim: Any, real: Any) -> None:
    """Two runs of one config (the simulator's and real Dask workers'): the same whole model
    and, bit for bit, the same train rows' losses and bytes."""
    assert max_diff(sim.model_state_dict(), real.model_state_dict()) == 0.0
    columns = ["rank", "step", "loss", "bytes_sent"]
    frames = [
        r.frame[r.frame.kind == "train"][columns].sort_values(["rank", "step"], ignore_index=True)
        for r in (sim, real)
    ]
    assert frames[0].equals(frames[1])


def assert_recomputed_rows(fresh: Any, committed: Any, keys: list[str]) -> None:
    """A study's rows recomputed at small size equal the committed rows with the same ``keys``
    (to 1e-9 relative; dtypes may differ after a CSV round trip)."""
    import pandas as pd

    rows = committed.merge(fresh[keys], on=keys)  # the committed rows the recomputation has
    assert len(rows) == len(fresh)
    pd.testing.assert_frame_equal(
        fresh.reset_index(drop=True), rows[fresh.columns].reset_index(drop=True),
        check_dtype=False, rtol=1e-9,
    )  # fmt: skip
