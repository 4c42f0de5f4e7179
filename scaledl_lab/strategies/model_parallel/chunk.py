"""A pipeline chunk of any model: a run of its layers (an ``nn.Sequential``) as one layer of
the executor (:mod:`.executor`), with its forward, its full backward (GPipe, 1F1B, with or
without recomputation) and zero bubble's split of that backward (Qi et al. 2023) into B, the
gradient of the chunk's input, and W, later, the gradients of its weights.

The simulator charges each operation one block of the chunk's ``share`` of a training step:
the forward a third, the full backward two thirds (the whole step with recomputation, which
runs the forward again), B and W a third each, as the paper's t_F = t_B = t_W. B keeps the
autograd graph (``retain_graph``) for W, which calls ``backward(inputs=params)``: the weight
gradients accumulate into ``.grad`` as a full backward's do, so a step's gradients are GPipe's.
W runs autograd again from the chunk's output, through the gradients of its inner activations
that B has taken already.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from ...runtime.base import Comm


class ChunkLayer:
    """Virtual stage ``virtual`` of ``last + 1``: its layers and its share of a step's cost."""

    def __init__(
        self, virtual: int, layers: nn.Sequential, share: float, last: int, comm: Comm,
        recompute: bool,
    ) -> None:  # fmt: skip
        """``recompute``: keep only the input, run the forward again during backward."""
        self.virtual, self.layers, self.share, self.comm = virtual, layers, share, comm
        self.is_first, self.is_last = virtual == 0, virtual == last
        self.recompute = recompute
        self.params = [p for p in layers.parameters() if p.requires_grad]

    async def forward(self, dims: Any, x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, Any]:
        """The chunk's output (without autograd when recomputing, or for ``grad`` False)."""
        inp = x.requires_grad_(True) if grad and not self.is_first else x
        keep = grad and not self.recompute
        async with self.comm.compute(len(inp), self.share / 3):
            with contextlib.nullcontext() if keep else torch.no_grad():
                out = self.layers(inp)
        return out, {"inp": inp, "out": out}

    async def backward(
        self, dims: Any, saved: Any, grad: torch.Tensor | None, weights: bool = True
    ) -> torch.Tensor | None:
        """The gradient of the chunk's input, to send back (None on the first chunk); with
        ``weights`` False zero bubble's B, the graph kept for W."""
        inp, out = saved["inp"], saved["out"]
        if not weights:
            saved["grad"] = grad
            async with self.comm.compute(len(inp), self.share / 3):
                if self.is_first:
                    return None
                return torch.autograd.grad(out, inp, grad, retain_graph=True)[0]
        async with self.comm.compute(len(inp), self.share * (1.0 if self.recompute else 2 / 3)):
            # The forward again, with autograd; BatchNorm's running statistics must move once per
            # micro-batch, so they are put back after the backward.
            kept = [b.detach().clone() for b in self.layers.buffers()] if self.recompute else []
            if self.recompute:
                out = self.layers(inp)
                if self.is_last:
                    out = saved["loss"](out)
            if out.requires_grad:  # a first stage without parameters has no graph
                out.backward(grad)
            if self.recompute:
                with torch.no_grad():
                    for b, s in zip(self.layers.buffers(), kept, strict=True):
                        b.copy_(s)
        return inp.grad

    async def weights(self, dims: Any, saved: Any) -> None:
        """W: the gradients of the chunk's weights, accumulated into their ``.grad``."""
        inp, out = saved["inp"], saved["out"]
        async with self.comm.compute(len(inp), self.share / 3):
            if self.params and out.requires_grad:
                out.backward(saved["grad"], inputs=self.params)

    def kept_bytes(self, saved: Any) -> int:
        """Activation bytes kept for backward: the input, plus the autograd graph's output
        unless recomputing (a proxy: the chunk's output, not every intermediate)."""
        inp, out = saved["inp"], saved["out"]
        total = inp.numel() * inp.element_size()
        if not self.recompute:
            total += out.numel() * out.element_size()
        return total
