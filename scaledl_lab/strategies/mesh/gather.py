"""The whole model back from a mesh: every rank's pieces (its ``tp`` slices of its ``pp``
stages' layers, ZeRO-3's shards gathered first) written into the unsplit model's state_dict,
by the unsplit model's names.

:func:`assemble` is the pure part: pieces ``(name, index, values)`` written into zeros of the
unsplit shapes. :func:`gather_model` runs it on every rank with the pieces each rank owns (every
``tp`` slice once, a replicated tensor from ``tp`` rank 0 only, replica 0 only along ``dp``),
then sums over every rank: each element has exactly one owner, so the sum is the model, exactly
(x + 0 = x).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from ...runtime.base import Comm
from .layers import Piece


def assemble(
    shapes: Mapping[str, torch.Tensor], pieces: Iterable[Piece]
) -> dict[str, torch.Tensor]:
    """A state_dict shaped as ``shapes`` (an unsplit state_dict), zeros but for ``pieces``."""
    state = {name: torch.zeros_like(t) for name, t in shapes.items()}
    for name, index, values in pieces:
        if name not in state:
            raise KeyError(f"{name!r} is no tensor of the unsplit model")
        state[name][index] = values.to(state[name].dtype)
    return state


async def gather_model(
    comm: Comm, shapes: Mapping[str, torch.Tensor], pieces: Iterable[Piece]
) -> dict[str, torch.Tensor]:
    """The whole unsplit state_dict on every rank, from each rank's owned ``pieces``."""
    state = assemble(shapes, pieces)
    flat = torch.cat([t.reshape(-1) for t in state.values()])
    await comm.allreduce(flat)
    parts = flat.split([t.numel() for t in state.values()])
    return {
        name: part.view_as(t).clone() for (name, t), part in zip(state.items(), parts, strict=True)
    }
