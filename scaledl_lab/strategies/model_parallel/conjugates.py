"""Megatron's conjugate operators f and g (Shoeybi et al. 2019, §3), and their sequence-parallel
forms (Korthikanti et al. 2022, §4.2.2): an all-gather along the sequence and a reduce-scatter.

Tensor parallelism: f is the identity forward and an allreduce backward (entering a split
layer, every rank's part contributed to the input's gradient); g is an allreduce forward (the
partial sums of a row-parallel layer) and the identity backward. Sequence parallelism: f
all-gathers the sequence (backward: reduce-scatters the gradient), g reduce-scatters the partial
sums into each rank's positions (backward: all-gathers the gradient). Tensors are
sequence-first ``(S, B, h)``, so a rank's positions are one contiguous chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...runtime.base import Comm


@dataclass
class Exchange:
    """f and g of one degree, as tensor or sequence parallelism place them."""

    comm: Comm
    sequence_parallel: bool

    def _gather(self, part: torch.Tensor) -> torch.Tensor:
        p = self.comm.world_size
        return part.new_empty((part.shape[0] * p, *part.shape[1:]))

    async def all_gather(self, part: torch.Tensor) -> torch.Tensor:
        """The whole sequence from every rank's chunk (sequence-first)."""
        out = self._gather(part)
        await self.comm.all_gather_into(out.view(-1), part.reshape(-1))
        return out

    async def reduce_scatter(self, whole: torch.Tensor) -> torch.Tensor:
        """This rank's chunk of the sequence of the sum over ranks."""
        p = self.comm.world_size
        chunk = await self.comm.reduce_scatter(whole.reshape(-1))
        return chunk.view(whole.shape[0] // p, *whole.shape[1:])

    async def f(self, x: torch.Tensor) -> torch.Tensor:
        return await self.all_gather(x) if self.sequence_parallel else x

    async def f_backward(self, grad: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return await self.reduce_scatter(grad)
        await self.comm.allreduce(grad)
        return grad

    async def g(self, partial: torch.Tensor) -> torch.Tensor:
        if self.sequence_parallel:
            return await self.reduce_scatter(partial)
        summed = partial.clone()
        await self.comm.allreduce(summed)
        return summed

    async def g_backward(self, grad: torch.Tensor) -> torch.Tensor:
        return await self.all_gather(grad) if self.sequence_parallel else grad
