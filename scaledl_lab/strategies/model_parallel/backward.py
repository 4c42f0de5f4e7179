"""The backwards of a pipeline chunk: the full one (GPipe, 1F1B, with or without
recomputation) and zero bubble's split of it (Qi et al. 2023) into B, the gradient of the
chunk's input, and W, later, the gradients of its weights.

B keeps the autograd graph (``retain_graph``) for W, which calls ``backward(inputs=params)``:
the weight gradients accumulate into ``.grad`` as a full backward's do, so a step's gradients
are GPipe's. W runs autograd again from the chunk's output, through the gradients of its inner
activations that B has taken already; the simulator charges F, B and W a third of the chunk's
step each, as the paper's t_F = t_B = t_W.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...runtime.base import Comm
from .partition import Chunk


async def full(
    comm: Comm, chunk: Chunk, inp: torch.Tensor, out: torch.Tensor, grad: torch.Tensor | None,
    recompute: bool, loss: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor | None:  # fmt: skip
    """The chunk's whole backward (``loss``: of the last chunk's logits, for recomputing);
    returns the gradient of its input, to send back."""
    async with comm.compute(len(inp), chunk.share * (1.0 if recompute else 2 / 3)):
        # The forward again, with autograd; BatchNorm's running statistics must move once per
        # micro-batch, so they are put back after the backward.
        saved = [b.detach().clone() for b in chunk.layers.buffers()] if recompute else []
        if recompute:
            out = chunk.layers(inp)
            if chunk.is_last:
                out = loss(out)
        if out.requires_grad:  # a first stage without parameters has no graph
            out.backward(grad)
        if recompute:
            with torch.no_grad():
                for b, s in zip(chunk.layers.buffers(), saved, strict=True):
                    b.copy_(s)
    return inp.grad


async def input_grad(
    comm: Comm, chunk: Chunk, inp: torch.Tensor, out: torch.Tensor, grad: torch.Tensor | None
) -> torch.Tensor | None:
    """B: the gradient of the chunk's input only (none on the first chunk), the graph kept."""
    async with comm.compute(len(inp), chunk.share / 3):
        if chunk.is_first:
            return None
        return torch.autograd.grad(out, inp, grad, retain_graph=True)[0]


async def weight_grad(
    comm: Comm, chunk: Chunk, inp: torch.Tensor, out: torch.Tensor, grad: torch.Tensor | None
) -> None:
    """W: the gradients of the chunk's weights, accumulated into their ``.grad``."""
    async with comm.compute(len(inp), chunk.share / 3):
        if chunk.params and out.requires_grad:
            out.backward(grad, inputs=chunk.params)
