"""The plain PyTorch baseline the benchmarks share: a timed single-process SGD loop."""

from __future__ import annotations

import time

import torch.nn.functional as F


def timed_steps(model, optimizer, data, order, warmup: int, steps: int) -> float:
    """Seconds for ``steps`` plain SGD steps on the batches ``order`` (indices into
    ``data.train``), after ``warmup`` untimed ones; ``loss.item()`` syncs every step, as a
    training loop that logs its loss does."""
    for i, idx in enumerate(order[: warmup + steps]):
        if i == warmup:
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.train.x[idx]), data.train.y[idx])
        loss.backward()
        optimizer.step()
        loss.item()
    return time.perf_counter() - start
