"""Tensor (intra-layer) model parallelism for the MLP, as Megatron-LM (Shoeybi et al. 2019, §3);
gpt-tiny's whole blocks, with or without sequence parallelism, in :mod:`.parallel_transformer`,
run as the mesh ``tp=p`` (:mod:`..mesh.program`: one dimension of the mesh above 1).

Layout. The MLP ``784 → 512 → 512 → 10`` becomes one Megatron block and a replicated head; with
``p`` workers (the tensor-parallel degree) and ``w = 512 / p``, rank ``r`` owns slice
``r·w : (r+1)·w`` of the hidden width:

- block, ``Linear(784, 512)`` column-parallel: rank r keeps rows r·w:(r+1)·w of weight and bias
  (Megatron's A = [A_1 … A_p]); ReLU acts on the local slice, no communication needed;
- block, ``Linear(512, 512)`` row-parallel: rank r keeps columns r·w:(r+1)·w of the weight
  (B split by rows of Bᵀ), so each rank's product is a partial sum of the output; the bias is
  replicated and added once, after the sum;
- head, ``ReLU`` then ``Linear(512, 10)`` on every rank (5k parameters, under 1% of the FLOPs):
  the logits, the loss and the accuracy are computed identically on every rank.

Communication. Megatron's conjugate operators are written out in the program rather than hidden
in autograd functions, because a ``Comm`` call is awaited (the simulator must suspend there):

- g, after the block: forward, the allreduce sum of the partial outputs (B × 512 values);
  backward, identity (the output gradient comes from the replicated head, already whole);
- f, before the block: forward, identity; backward, the allreduce sum of the ranks' partial
  input gradients. :meth:`ParallelMLPBlock.backward` runs it whenever the block's input requires
  a gradient (a block deeper in a network; the stand-alone block of the tests). The MLP's block
  reads the pixels, which need no gradient, so in training f sends nothing.

So one training step sends exactly one allreduce, of B × 512 values, and each worker sends
``ring(B · 512 · s, p) = 2(p − 1)/p · B · 512 · s`` bytes (s = 4 in float32, 8 in float64). The
replicated head and the replicated row-parallel bias get identical gradients on every rank, so
they need no allreduce either, and the optimiser steps every rank's slices locally (SGD with
momentum, Adam and AdaGrad act elementwise: the slices follow exactly the unsplit update).
Evaluation runs the same forwards (one allreduce per evaluation batch) on every rank. At the
end an allreduce of zero-padded full-size tensors reassembles the unsplit model's state_dict on
every rank, comparable with the sequential twin.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...models import MLP
from ...objective import correct_count, model_input, summed_loss
from ...runtime.base import Comm
from ...training.recompute import checkpoint
from ...training.worker import (
    EVAL_BATCH,
    StepStats,
    WorkerContext,
    check_finite,
    lr_of,
    make_optimizer,
)
from ..mesh import program as mesh_program
from ..mesh.grid import Mesh
from ..registry import register

FORWARD, BACKWARD = 1 / 3, 2 / 3  # a step's FLOPs: forward ~1/3, backward (two matmuls) ~2/3


@dataclass
class Saved:
    """What a block's backward needs: its input and local partial output (the local autograd
    graph), and ``summed``, the leaf that stands for the allreduced output downstream."""

    inp: torch.Tensor
    partial: torch.Tensor
    summed: torch.Tensor


class ParallelMLPBlock(nn.Module):
    """Rank ``rank``'s slices of ``Linear → ReLU → Linear`` (column- then row-parallel)."""

    def __init__(
        self, first: nn.Linear, second: nn.Linear, rank: int, degree: int, recompute: bool = False
    ) -> None:
        super().__init__()
        self.recompute = recompute  # keep the input only; the local forward again in backward
        width = first.out_features // degree
        self.units = slice(rank * width, (rank + 1) * width)  # this rank's hidden units
        weight = first.weight
        self.up = nn.Linear(first.in_features, width, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.up.weight.copy_(weight[self.units])
            self.up.bias.copy_(first.bias[self.units])
        self.down = nn.Parameter(second.weight[:, self.units].detach().clone())
        self.bias = nn.Parameter(second.bias.detach().clone())  # replicated, added once

    def local_macs(self) -> int:
        """Multiply-accumulates per sample of this rank's slices."""
        return self.up.weight.numel() + self.down.numel()

    async def forward_async(
        self, comm: Comm, x: torch.Tensor, share: float, *, grad: bool = True
    ) -> tuple[torch.Tensor, Saved]:
        """The block's output (whole, on every rank) and what its backward needs."""
        inp = x.detach().requires_grad_(grad and x.requires_grad)
        # Grad mode is set inside the compute block only: the simulator interleaves ranks at
        # every await, so a grad-mode context held across one would leak into other ranks.
        async with comm.compute(len(x), share * FORWARD):
            with torch.set_grad_enabled(grad):
                if self.recompute:
                    partial = checkpoint(self._local, self, inp, share)
                else:
                    partial = self._local(inp)
        summed = partial.detach().clone()
        await comm.allreduce(summed)  # g: the partial sums of the row-parallel layer
        summed.requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            out = summed + self.bias
        return out, Saved(inp, partial, summed)

    def _local(self, inp: torch.Tensor) -> torch.Tensor:
        """This rank's partial sum of the block's output."""
        return F.linear(torch.relu(self.up(inp)), self.down)

    async def backward(self, comm: Comm, saved: Saved, share: float) -> torch.Tensor | None:
        """Accumulate the slices' gradients; return the input's gradient (f), if it has one."""
        async with comm.compute(len(saved.inp), share * BACKWARD):
            torch.autograd.backward(saved.partial, saved.summed.grad)
        if not saved.inp.requires_grad:
            return None  # the block reads data: f has nothing to send
        grad = saved.inp.grad
        await comm.allreduce(grad)  # f: every rank's slice contributed to the input's gradient
        return grad


class TensorParallelMLP(nn.Module):
    """The MLP on one rank: flatten, the parallel block, then the replicated head."""

    def __init__(self, mlp: MLP, rank: int, degree: int, recompute: bool = False) -> None:
        super().__init__()
        _, first, _, second, _, last = mlp.net
        self.block = ParallelMLPBlock(first, second, rank, degree, recompute)
        self.head = nn.Sequential(nn.ReLU(), copy.deepcopy(last))
        # Shares of the unsplit model's FLOPs, for the simulator's compute charges.
        total = sum(m.weight.numel() for m in (first, second, last))
        self.block_share = self.block.local_macs() / total
        self.head_share = last.weight.numel() / total

    async def forward_async(
        self, comm: Comm, x: torch.Tensor, *, grad: bool = True
    ) -> tuple[torch.Tensor, Saved]:
        hidden, saved = await self.block.forward_async(
            comm, x.flatten(1), self.block_share, grad=grad
        )
        with torch.set_grad_enabled(grad):
            return self.head(hidden), saved

    async def unsplit(self, comm: Comm, full: MLP) -> MLP:
        """Write every rank's slices into ``full`` (an unsplit MLP): one allreduce of the
        zero-padded full-size tensors gathers the slices exactly (x + 0 = x)."""
        _, first, _, second, _, last = full.net
        units = self.block.units
        targets = [
            (first.weight, units),
            (first.bias, units),
            (second.weight, (slice(None), units)),
        ]
        sources = [self.block.up.weight, self.block.up.bias, self.block.down]
        padded = []
        for (target, index), source in zip(targets, sources, strict=True):
            buffer = torch.zeros_like(target)
            buffer[index] = source.detach()
            padded.append(buffer.reshape(-1))
        flat = torch.cat(padded)
        await comm.allreduce(flat)
        with torch.no_grad():
            for (target, _), part in zip(
                targets, flat.split([t.numel() for t, _ in targets]), strict=True
            ):
                target.copy_(part.view_as(target))
            second.bias.copy_(self.block.bias)
            last.load_state_dict(self.head[1].state_dict())
        return full


async def evaluate(
    ctx: WorkerContext, model: TensorParallelMLP, *, epoch: float, step: int
) -> None:
    """Every rank runs the same forwards on whole splits (each holds an allreduce); rank 0
    records one row per split."""
    comm = ctx.comm
    for kind, split in (("val", ctx.data.val), ("test", ctx.data.test)):
        if len(split) == 0:
            continue
        sent_before = comm.bytes_sent
        loss_sum, correct = 0.0, 0
        for start in range(0, len(split), EVAL_BATCH):
            x = model_input(split.x[start : start + EVAL_BATCH], ctx.device, ctx.config.dtype)
            y = split.y[start : start + EVAL_BATCH].to(ctx.device)
            out, _ = await model.forward_async(comm, x, grad=False)
            loss_sum += summed_loss(out, y).item()
            correct += correct_count(out, y)
        if comm.is_root:
            sent = comm.bytes_sent - sent_before
            ctx.log_eval(kind, epoch, step, loss_sum, correct, len(split), sent)


@register(
    "tensor-parallel",
    "Megatron-style tensor parallelism: the MLP's hidden layers, or gpt-tiny's attention heads "
    "and MLP, split over the workers (--sequence-parallel: and its LayerNorms along the sequence)",
)
async def train(ctx: WorkerContext) -> None:
    """The program one worker runs: every rank reads the same batch and holds 1/p of the block."""
    cfg, comm = ctx.config, ctx.comm
    if cfg.model == "gpt-tiny":  # the mesh with one dimension above 1
        return await mesh_program.train(ctx, Mesh(("tp",), (cfg.workers,)))
    model = TensorParallelMLP(ctx.build_model(), comm.rank, comm.world_size, cfg.recompute)
    optimizer = make_optimizer(cfg, model.parameters())  # the slices, stepped locally
    await evaluate(ctx, model, epoch=0.0, step=0)
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        optimizer.zero_grad()
        out, saved = await model.forward_async(comm, x)  # one allreduce (g)
        async with comm.compute(len(y), model.head_share):  # the head: forward and backward
            loss = F.cross_entropy(out, y)
            loss.backward()  # the head's gradients, and the block output's (whole, replicated)
        stats = StepStats(loss.item(), int((out.argmax(1) == y).sum().item()), len(y))
        # The logits are replicated, so every rank sees the same loss and stops at once.
        check_finite(stats.loss, rank=ctx.rank, epoch=step // ctx.steps_per_epoch, step=step)
        await model.block.backward(comm, saved, model.block_share)  # f: none, x is data
        ctx.set_lr(optimizer, step)  # the scheduled rate (constant by default)
        optimizer.step()
        step += 1
        counted = stats.samples if comm.is_root else 0  # one batch for all: counted once
        sent = comm.bytes_sent - sent_before
        ctx.log_train(step, stats, sent=sent, lr=lr_of(optimizer), counted=counted)
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await evaluate(ctx, model, epoch=ctx.progress(step), step=step)
    ctx.keep_model(await model.unsplit(comm, ctx.build_model()))
