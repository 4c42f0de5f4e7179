"""Streaming DiLoCo's fragments (Douillard et al. 2025, Section 2.1) and when each is
synchronised: pure functions of the model's layers and the schedule's numbers.

A fragment is a contiguous run of the model's layers (those that hold weights), cut so that
the largest fragment is as small as it can be (the peak bytes of one synchronisation). With H
inner steps per round and F fragments, fragment f is synchronised at the steps t > 0 with
(t − offset_f) mod H = 0, the offsets spread by H/F: offset_f = ⌊(f + 1)·H/F⌋ mod H. The last
fragment keeps DiLoCo's schedule (every H steps); with F = 1 the whole model is one fragment
synchronised every H steps, which is DiLoCo.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from ...data import sample_shape
from ...models import build_model
from ..model_parallel.partition import layers, split_evenly


class Fragment:
    """Some of a model's weights (parameters, then floating buffers) viewed as one flat vector."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = tensors
        self.numel = sum(t.numel() for t in tensors)

    def flat(self) -> torch.Tensor:
        """A private flat copy of the fragment's weights."""
        return torch.cat([t.reshape(-1) for t in self.tensors])

    def load(self, flat: torch.Tensor) -> None:
        """Write ``flat`` (from :meth:`flat`) back into the model, in place."""
        offset = 0
        for t in self.tensors:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view_as(t))
            offset += n


def weighted_layers(model: nn.Module) -> list[list[torch.Tensor]]:
    """Each layer's weights (parameters, then floating buffers), for the layers holding any,
    in the order of the forward pass."""
    out = []
    for layer in layers(model):
        held = [p.data for p in layer.parameters()]
        held += [b for b in layer.buffers() if b.is_floating_point()]
        if held:
            out.append(held)
    return out


@functools.lru_cache(maxsize=16)
def layer_total(model: str, dataset: str) -> int:
    """How many layers of ``model`` hold weights (the most fragments it can be cut into)."""
    return len(weighted_layers(build_model(model, sample_shape(dataset), 10, seed=0)))


def fragment_sizes(layer_sizes: list[int], fragments: int) -> list[int]:
    """Layers per fragment: contiguous runs whose largest element count is smallest."""
    return split_evenly(layer_sizes, fragments)


def fragments_of(model: nn.Module, fragments: int) -> list[Fragment]:
    """``model`` cut into ``fragments`` contiguous fragments of its layers (see module doc)."""
    held = weighted_layers(model)
    counts = fragment_sizes([sum(t.numel() for t in layer) for layer in held], fragments)
    out, start = [], 0
    for count in counts:
        out.append(Fragment([t for layer in held[start : start + count] for t in layer]))
        start += count
    return out


def offsets(sync_period: int, fragments: int) -> list[int]:
    """offset_f = ⌊(f + 1)·H/F⌋ mod H: the step (within each round of H) fragment f syncs."""
    return [(f + 1) * sync_period // fragments % sync_period for f in range(fragments)]


def syncs_at(step: int, offset: int, sync_period: int) -> bool:
    """Whether a fragment of ``offset`` is synchronised after inner step ``step`` (1-based)."""
    return step > 0 and (step - offset) % sync_period == 0
