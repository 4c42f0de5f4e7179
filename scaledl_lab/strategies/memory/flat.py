"""One layer's parameters as a flat buffer sharded over the workers: ZeRO's partitions and
FSDP's ``FlatParameter`` (Rajbhandari et al. 2020, §5; Zhao et al. 2023, §3.2).

A :class:`FlatUnit` makes a layer's parameters views of one flat buffer (``full``), padded with
zeros at its end to a multiple of the world size (:func:`~scaledl_lab.runtime.base.shard_numel`),
so that rank r owns the r-th of N equal chunks (``shard``). The optimiser steps the shards only.
Stages 1 and 2 keep ``full`` all the time and the shard is a view of it; stage 3 keeps only a
private shard and gives ``full`` memory just while the layer computes (:meth:`gather`,
:meth:`free`): its storage is resized to nothing and back, as FSDP1 does, so that the tensors
autograd saved from the parameters during forward are valid again once it is gathered for
backward.
"""

from __future__ import annotations

import torch
from torch import nn

from ...runtime.base import Comm, Pending, shard_numel
from ...training.ledger import Peak


class FlatUnit:
    """The parameters of ``layer`` as one padded flat buffer; this rank owns one chunk of it.

    ``private_shard``: the shard is its own tensor (stage 3, which frees ``full``), else a view
    of ``full`` (stages 1 and 2: stepping it steps the layer's parameters in place).
    """

    def __init__(self, layer: nn.Module, rank: int, world_size: int, private_shard: bool) -> None:
        self.layer, self.rank = layer, rank
        self.params = [p for p in layer.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.chunk = shard_numel(self.numel, world_size)
        first = self.params[0]
        self.full = torch.zeros(self.chunk * world_size, dtype=first.dtype, device=first.device)
        self.views: list[torch.Tensor] = []
        offset = 0
        for p in self.params:
            view = self.full[offset : offset + p.numel()].view_as(p)
            view.copy_(p.detach())
            p.data = view  # the layer computes with the flat buffer's memory
            self.views.append(view)
            offset += p.numel()
        mine = self.full[rank * self.chunk : (rank + 1) * self.chunk]
        self.shard = nn.Parameter(mine.clone() if private_shard else mine)
        self.grad_full: torch.Tensor | None = None  # stage 1: the layer's whole gradient
        self.nbytes = self.full.numel() * self.full.element_size()
        self.is_gathered = True

    @property
    def shard_bytes(self) -> int:
        return self.chunk * self.full.element_size()

    # -- parameters: gathered before a layer computes, freed after (stage 3) ---------------

    def free(self, buffers: Peak) -> None:
        """Give back ``full``'s memory; the parameters keep their shapes, not their values."""
        self.full.untyped_storage().resize_(0)
        self.is_gathered = False
        buffers.sub(self.nbytes)

    async def gather(self, comm: Comm, buffers: Peak) -> None:
        """Every rank's shard into ``full``: the layer's whole parameters, for one computation
        (stage 3: ``full`` is a buffer of the ledger until :meth:`free`)."""
        if not self.is_gathered:
            self.full.untyped_storage().resize_(self.nbytes)
            self.is_gathered = True
            buffers.add(self.nbytes)
        # The shard goes as a copy: gloo is not asked to read a chunk of the buffer it writes.
        buffers.add(self.shard_bytes)
        await comm.all_gather_into(self.full, self.shard.detach().clone())
        buffers.sub(self.shard_bytes)

    # -- gradients: summed over the workers, each rank keeping its chunk --------------------

    def flat_grad(self) -> torch.Tensor:
        """The layer's gradients as one padded flat tensor (zeros where there is none); the
        parameters' ``.grad`` are dropped (stages 2 and 3 keep only their chunk)."""
        flat = torch.zeros_like(self.full) if self.grad_full is None else self.grad_full
        if self.grad_full is None:
            offset = 0
            for p in self.params:
                if p.grad is not None:
                    flat[offset : offset + p.numel()].copy_(p.grad.reshape(-1))
                offset += p.numel()
                p.grad = None
        return flat

    def keep_full_grads(self) -> None:
        """Stage 1: ``.grad`` of every parameter becomes a zeroed view of one flat gradient
        buffer that lives all run, so backward accumulates into what is reduce-scattered."""
        if self.grad_full is None:
            self.grad_full = torch.zeros_like(self.full)
            offset = 0
            for p in self.params:
                p.grad = self.grad_full[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
        self.grad_full.zero_()

    def reduce_start(self, comm: Comm, buffers: Peak) -> Pending:
        """Start the reduce-scatter of this layer's gradient (this rank gets its chunk's sum);
        the flat gradient (stages 2 and 3) and the chunk's sum are buffers until it ends."""
        flat = self.flat_grad()
        buffers.add(self.shard_bytes + (self.nbytes if self.grad_full is None else 0))
        return comm.reduce_scatter_start(flat)

    def set_shard_grad(self, summed: torch.Tensor, world_size: int, buffers: Peak) -> None:
        """The optimiser's gradient of the shard: the workers' average, as allreduce divides.
        Stage 1 keeps it in its chunk of the whole gradient; stages 2 and 3 keep the sum."""
        buffers.sub(self.shard_bytes + (self.nbytes if self.grad_full is None else 0))
        if self.grad_full is not None:
            mine = self.grad_full[self.rank * self.chunk : (self.rank + 1) * self.chunk]
            summed = mine.copy_(summed)
        if world_size > 1:
            summed.div_(world_size)
        self.shard.grad = summed  # stages 2 and 3: the sum, now held as a gradient


def blocks(layers: list[nn.Module]) -> list[nn.Module]:
    """The ordered layers grouped so that each group holds one layer with parameters and the
    parameter-free layers after it (activations, pooling; those before the first join it):
    what is gathered, checkpointed and reduce-scattered together, as FSDP wraps a block."""
    groups: list[list[nn.Module]] = [[]]
    for layer in layers:
        owns = any(True for _ in layer.parameters())
        if owns and any(any(True for _ in m.parameters()) for m in groups[-1]):
            groups.append([])
        groups[-1].append(layer)
    return [g[0] if len(g) == 1 else nn.Sequential(*g) for g in groups]


def flat_units(
    layers: list[nn.Module], rank: int, world_size: int, private_shard: bool
) -> dict[int, FlatUnit]:
    """A unit for each layer that has parameters, by the layer's position."""
    return {
        i: FlatUnit(layer, rank, world_size, private_shard)
        for i, layer in enumerate(layers)
        if any(p.requires_grad for p in layer.parameters())
    }
