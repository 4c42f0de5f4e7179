"""The memory ledger: the bytes one worker holds in a step, by what they are for (the
Ultra-Scale Playbook's breakdown; Rajbhandari et al. 2020 §3 call the first three the model
states and the rest residual states).

- ``params``: parameters held between steps (a ZeRO-3 rank: its shards);
- ``grads``: gradients held when the optimiser steps (ZeRO-2/3: the shards' gradients);
- ``optim``: optimiser state, the tensors shaped as what they step (momentum, Adam's two
  moments, AdaGrad's sum; the scalar step counters are left out); in 16 bits
  (:mod:`.precision`) the float32 master weights too, while ``params`` and ``grads`` take 2
  bytes per element: ZeRO's (2 + 2 + K)Ψ;
- ``activations``: the most bytes saved for backward alive at once during the step, counted by
  ``torch.autograd.graph.saved_tensors_hooks`` (:class:`SavedTensors`): every distinct storage
  autograd keeps, less the parameters' own, so recomputation and pipelines show what they keep;
- ``buffers``: the most bytes of communication buffers alive at once (flat buckets, gathered
  layers, gradients in flight; :class:`Peak`).

Each is exact accounting of tensor sizes, not a reading of the allocator; a test checks it
against ``torch.profiler`` (CPU) and ``torch.cuda.max_memory_allocated`` (GPU).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

CATEGORIES = ("params", "grads", "optim", "activations", "buffers")


def nbytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the tensors' elements (None counts nothing)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the optimiser's state tensors shaped as their parameter (no step counters)."""
    total = 0
    for p, state in optimizer.state.items():
        for value in state.values():
            if isinstance(value, torch.Tensor) and value.shape == p.shape and value.dim() > 0:
                total += value.numel() * value.element_size()
    return total


class Peak:
    """A running count of bytes with its maximum (buffers allocated and freed in a step)."""

    def __init__(self) -> None:
        self.now = self.peak = 0

    def add(self, n: int) -> None:
        self.now += n
        self.peak = max(self.peak, self.now)

    def sub(self, n: int) -> None:
        self.now -= n

    def reset(self) -> None:
        self.now = self.peak = 0


class _Saved:
    """What the pack hook hands autograd: the tensor, and a release when autograd drops it."""

    __slots__ = ("key", "owner", "tensor")

    def __init__(self, tensor: torch.Tensor, owner: SavedTensors, key: int) -> None:
        self.tensor, self.owner, self.key = tensor, owner, key

    def __del__(self) -> None:
        self.owner.release(self.key)


class SavedTensors:
    """Counts the storages autograd saves for backward while :meth:`counting` is on: each
    distinct storage once, while some saved tensor still refers to it (a saved tensor is
    dropped once its node's backward has run); the parameters' storages are not counted."""

    def __init__(self) -> None:
        self._live: dict[int, list[int]] = {}  # storage address -> [references, bytes]
        self.bytes = Peak()

    def release(self, key: int) -> None:
        entry = self._live.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.bytes.sub(entry[1])
            del self._live[key]

    def keep(self, tensor: torch.Tensor) -> _Saved:
        """Hold ``tensor`` for backward outside autograd (a recomputation's checkpoint),
        counted as saved until the holder is dropped; ``holder.tensor`` is the tensor."""
        return self._pack(tensor, set())

    def _pack(self, tensor: torch.Tensor, own: set[int]) -> Any:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key == 0 or key in own:
            return tensor
        entry = self._live.get(key)
        if entry is None:
            self._live[key] = [1, storage.nbytes()]
            self.bytes.add(storage.nbytes())
        else:
            entry[0] += 1
        return _Saved(tensor, self, key)

    def new_step(self) -> None:
        """Start a step's peak from what is alive now."""
        self.bytes.peak = self.bytes.now

    @contextlib.contextmanager
    def counting(self, model: nn.Module | None, *, params_move: bool = False) -> Iterator[None]:
        """Count what autograd saves inside (``model``'s parameters excepted; None: count
        nothing). Never across an ``await``: the hooks are one stack per thread, and the
        simulator runs every worker's program on one thread. ``params_move``: the parameters'
        storage may change inside (ZeRO-3 gathers and frees each layer's), so it is asked at
        every saved tensor instead of once."""
        if model is None:
            yield
            return

        def own() -> set[int]:
            return {p.untyped_storage().data_ptr() for p in model.parameters()}

        fixed = None if params_move else own()

        def pack(tensor: torch.Tensor) -> Any:
            return self._pack(tensor, own() if fixed is None else fixed)

        def unpack(saved: Any) -> torch.Tensor:
            return saved.tensor if isinstance(saved, _Saved) else saved

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield


@dataclass
class StepMemory:
    """One step's ledger (bytes); :meth:`columns` gives the metrics row's ``mem_*`` fields."""

    params: float = math.nan
    grads: float = math.nan
    optim: float = math.nan
    activations: float = math.nan
    buffers: float = math.nan

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optim

    def columns(self) -> dict[str, float]:
        return {f"mem_{k}": float(getattr(self, k)) for k in CATEGORIES}


def replica_memory(
    model: nn.Module, optimizer: torch.optim.Optimizer, saved: SavedTensors, buffers: float
) -> StepMemory:
    """The ledger of a worker holding a whole replica (data parallelism), after its step."""
    params = [p for p in model.parameters()]
    return StepMemory(
        params=nbytes(params),
        grads=nbytes(p.grad for p in params),
        optim=optimizer_state_bytes(optimizer),
        activations=saved.bytes.peak,
        buffers=buffers,
    )


def memory_markdown(frame: Any) -> str:
    """The summary's breakdown: for each run that keeps the ledger, the largest bytes per
    worker of each category over its train rows (MB), and the model states' sum; "" if none."""
    columns = [f"mem_{k}" for k in CATEGORIES]
    if not set(columns) <= set(frame.columns):
        return ""
    train = frame[(frame["kind"] == "train") & frame["mem_params"].notna()]
    if train.empty:
        return ""
    lines = [
        "\n## Memory per worker (the ledger, largest over steps and workers, MB)\n",
        "| run | parameters | gradients | optimiser | model states | activations | buffers |",
        "| :--- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run, rows in train.groupby("run", sort=False):
        top = rows[columns].max()
        states = rows[columns[:3]].sum(axis=1).max()
        cells = [top[c] for c in columns[:3]] + [states] + [top[c] for c in columns[3:]]
        lines.append(f"| {run} | " + " | ".join(_mb(v) for v in cells) + " |")
    return "\n".join(lines) + "\n"


def _mb(value: float) -> str:
    return "–" if math.isnan(value) else f"{value / 1e6:.2f}"
