"""Pipeline model parallelism: the naive split, GPipe (Huang et al. 2019) and 1F1B
(PipeDream-flush, Narayanan et al. 2021), times data parallelism across pipeline replicas.

The model's ordered layers (:mod:`.partition`) are cut into ``K = cfg.stages`` contiguous
stages; stage k of replica r runs on rank r·K + k. A mini-batch is cut into
``M = cfg.micro_batches`` micro-batches; each stage runs its schedule (:mod:`.schedules`), a list
of forwards and backwards: a forward receives the activations of the previous stage (stage 0
reads the batch), runs the stage's layers and sends its output on; a backward receives the
gradient of that output from the next stage (the last stage starts from the loss), runs
backward through the stage and sends the gradient of its input back. Gradients accumulate over
the micro-batches; one optimiser step per mini-batch, after the replicas of each stage have
averaged their gradients (an allreduce within the stage's group). With ``recompute`` a stage
keeps only its inputs and runs the forward again during backward (GPipe's re-materialisation).

``model-parallel`` is GPipe with one micro-batch: one stage busy at a time.

Rows: ``kind="train"`` from every rank per step (the replica's loss, shared by an allreduce of
two numbers within the pipeline, so every stage stops together on divergence), val/test rows
from the last stage of replica 0, and one event per forward or backward (the events table:
stage, micro-batch, phase, start, end) from which the bubble is measured.
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from ...models import model_flops
from ...objective import correct_count, model_input, summed_loss
from ...params import flat_grad, write_grads
from ...runtime.base import Group, Pending
from ...training.worker import StepStats, WorkerContext, check_finite, lr_of
from ..registry import register
from . import partition
from .schedules import SCHEDULES, in_flight


class Stage:
    """This rank's stage: its layers, its neighbours, buffers from a dry run, its groups."""

    def __init__(
        self,
        ctx: WorkerContext,
        model: nn.Module,
        every: list[nn.Module],
        sample: torch.Tensor,
        counts: list[int],
    ) -> None:
        """``every``: the model's layers; ``sample``: one micro-batch (for the dry run)."""
        cfg, comm = ctx.config, ctx.comm
        self.ctx, self.comm = ctx, comm
        self.stages = cfg.model_parallel_size
        self.index = ctx.rank % self.stages
        self.replica = ctx.data_rank
        self.is_first, self.is_last = self.index == 0, self.index == self.stages - 1
        self.prev = None if self.is_first else ctx.rank - 1
        self.next = None if self.is_last else ctx.rank + 1
        lo, hi = sum(counts[: self.index]), sum(counts[: self.index + 1])
        self.layers = nn.Sequential(*every[lo:hi])
        self.names = partition.parameter_names(model, every[lo:hi])
        self.params = [p for p in self.layers.parameters() if p.requires_grad]
        self.micro = len(sample)
        shapes = [sample.shape, *partition.boundary_shapes(every, sample)]
        self.in_shape, self.out_shape = shapes[lo], shapes[hi]
        flops = [model_flops(layer, shapes[i][1:], 1) for i, layer in enumerate(every)]
        self.share = self.cost_share(flops[lo:hi], flops)
        self.ops = SCHEDULES[cfg.strategy](self.stages, cfg.micro_batches)[self.index]
        self.depth = in_flight(self.ops)  # stashed micro-batches at the peak
        dtype = cfg.dtype
        self.inputs = [torch.empty(self.in_shape, dtype=dtype) for _ in range(self.depth)]
        self.grad_in = torch.empty(self.out_shape, dtype=dtype)
        # Groups (every rank creates every group, in the same order): each replica's pipeline,
        # and each stage across the replicas (data parallelism).
        replicas = cfg.replicas
        pipes = [
            comm.new_group(range(r * self.stages, (r + 1) * self.stages)) for r in range(replicas)
        ]
        across = [comm.new_group(range(s, cfg.workers, self.stages)) for s in range(self.stages)]
        self.pipeline: Group = pipes[self.replica]
        self.across: Group = across[self.index]
        self.peak_count = self.peak_bytes = 0  # stashed micro-batches (and their bytes)

    def cost_share(self, mine: list[int], every: list[int]) -> float:
        """The stage's share of a training step's cost on the simulator: its FLOPs."""
        return sum(mine) / sum(every) if sum(every) else 1.0 / self.stages

    # -- one mini-batch ------------------------------------------------------------------

    async def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepStats:
        """Run this stage's schedule on one mini-batch; return the replica's loss and hits."""
        cfg, comm = self.ctx.config, self.comm
        xs, ys = x.split(self.micro), y.split(self.micro)
        stash: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        sends: list[Pending] = []
        loss_sum, correct = 0.0, 0
        for phase, m in self.ops:
            if phase == "F":
                inp = await self._input(xs, m)
                start = comm.now()  # busy from here: waiting for the input is the bubble
                context = torch.no_grad() if cfg.recompute else contextlib.nullcontext()
                async with comm.compute(len(inp), self.share / 3):
                    with context:
                        out = self.layers(inp)
                        if self.is_last:
                            correct += correct_count(out, ys[m])
                            out = summed_loss(out, ys[m]) / cfg.batch_size
                end = comm.now()  # before the send: a receiver may start before isend returns
                if self.is_last:
                    loss_sum += out.item()
                else:
                    sends.append(comm.isend(out.detach(), self.next))
                stash[m] = (inp, out)
                self.peak_count = max(self.peak_count, len(stash))
                self.peak_bytes = max(self.peak_bytes, self._stashed_bytes(stash))
            else:
                inp, out = stash.pop(m)
                grad = None if self.is_last else await comm.recv(self.grad_in, self.next)
                start = comm.now()
                share = self.share * (1.0 if cfg.recompute else 2 / 3)
                async with comm.compute(len(inp), share):
                    # The forward again, with autograd; BatchNorm's running statistics must
                    # move once per micro-batch, so they are put back after the backward.
                    saved = (
                        [b.detach().clone() for b in self.layers.buffers()] if cfg.recompute else []
                    )
                    if cfg.recompute:
                        out = self._forward_with_loss(inp, ys[m])
                    if out.requires_grad:  # a first stage without parameters has no graph
                        out.backward(grad)
                    if cfg.recompute:
                        with torch.no_grad():
                            for b, s in zip(self.layers.buffers(), saved, strict=True):
                                b.copy_(s)
                end = comm.now()
                if not self.is_first:
                    sends.append(comm.isend(inp.grad, self.prev))
            self.ctx.log_event(step=step, micro_batch=m, phase=phase, start=start, end=end)
        for pending in sends:
            await pending.wait()
        stats = torch.tensor([loss_sum, float(correct)], dtype=torch.float64)
        await comm.allreduce(stats, self.pipeline)  # only the last stage adds anything
        check_finite(
            stats[0].item(), rank=self.ctx.rank, epoch=step // self.ctx.steps_per_epoch, step=step
        )
        if cfg.replicas > 1:
            await self._average_gradients()
        return StepStats(stats[0].item(), int(stats[1].item()), len(y))

    async def _input(self, xs: tuple[torch.Tensor, ...], m: int) -> torch.Tensor:
        if self.is_first:
            return xs[m]
        buffer = self.inputs[m % self.depth]
        buffer.requires_grad_(False)
        await self.comm.recv(buffer, self.prev)
        buffer.grad = None
        return buffer.requires_grad_(True)

    def _forward_with_loss(self, inp: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = self.layers(inp)
        if self.is_last:
            out = summed_loss(out, y) / self.ctx.config.batch_size
        return out

    def _stashed_bytes(self, stash: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Activation bytes kept for backward: the inputs, plus the autograd graph's outputs
        unless recomputing (a proxy: the stage output, not every intermediate)."""
        total = 0
        for inp, out in stash.values():
            total += inp.numel() * inp.element_size()
            if not self.ctx.config.recompute:
                total += out.numel() * out.element_size()
        return total

    async def _average_gradients(self) -> None:
        flat = flat_grad(self.params)
        await self.comm.allreduce(flat, self.across)
        write_grads(self.params, flat / self.ctx.config.replicas)

    # -- evaluation ----------------------------------------------------------------------

    async def evaluate(self, *, epoch: float, step: int) -> None:
        """Replica 0's pipeline scores val and test in chunks; its last stage logs the rows."""
        if self.replica != 0:
            return
        data, cfg, comm = self.ctx.data, self.ctx.config, self.comm
        self.layers.eval()
        for kind, split in (("val", data.val), ("test", data.test)):
            totals = [0.0, 0, 0]
            for start in range(0, len(split), self.micro):
                n = min(self.micro, len(split) - start)
                if self.is_first:
                    inp = model_input(split.x[start : start + n], self.ctx.device, cfg.dtype)
                else:
                    inp = await comm.recv(
                        torch.empty((n, *self.in_shape[1:]), dtype=cfg.dtype), self.prev
                    )
                async with comm.compute(n, self.share / 3):
                    with torch.no_grad():
                        out = self.layers(inp)
                if self.is_last:
                    y = split.y[start : start + n].to(self.ctx.device)
                    totals[0] += summed_loss(out, y).item()
                    totals[1] += correct_count(out, y)
                    totals[2] += n
                else:
                    await comm.send(out, self.next)
            if self.is_last and totals[2]:
                self.ctx.log_eval(kind, epoch, step, totals[0], totals[1], totals[2])
        self.layers.train()


async def _counts(ctx: WorkerContext, every: list[nn.Module], sample: torch.Tensor) -> list[int]:
    """Layers per stage; with balance "time" rank 0's measurement is everyone's."""
    cfg = ctx.config
    counts = partition.stage_counts(cfg.balance, every, cfg.model_parallel_size, sample)
    if cfg.balance == "time":
        shared = torch.tensor(counts, dtype=torch.float64)
        await ctx.comm.broadcast(shared, 0)
        counts = [int(c) for c in shared.tolist()]
    return counts


async def train(ctx: WorkerContext) -> None:
    """The program every rank of a pipeline runs: its stage, its schedule, every step."""
    comm = ctx.comm
    model = ctx.build_model()  # the same seeded weights everywhere; each rank keeps its stage
    cfg = ctx.config
    every = partition.layers(model)
    sample = model_input(
        ctx.data.train.x[: cfg.batch_size // cfg.micro_batches], ctx.device, cfg.dtype
    )
    stage = Stage(ctx, model, every, sample, await _counts(ctx, every, sample))
    # A stage of parameter-free layers only (a pooling, say) has nothing to step.
    optimizer = ctx.build_optimizer(stage.layers) if stage.params else None
    await stage.evaluate(epoch=0.0, step=0)
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        if optimizer is not None:
            optimizer.zero_grad()
        stats = await stage.train_step(x, y, step)
        if optimizer is not None:
            ctx.set_lr(optimizer, step)
            optimizer.step()
        step += 1
        lr = lr_of(optimizer) if optimizer is not None else math.nan
        counted = stats.samples if stage.is_last else 0  # a mini-batch counts once per replica
        sent = comm.bytes_sent - sent_before
        ctx.log_train(step, stats, sent=sent, lr=lr, counted=counted)
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await stage.evaluate(epoch=ctx.progress(step), step=step)
    state = model.state_dict()
    ctx.result["state_dict"] = {k: state[k].detach().cpu().clone() for k in stage.names}
    ctx.result.update(
        stage=stage.index,
        replica=stage.replica,
        layers=len(stage.layers),
        peak_stashed=stage.peak_count,
        peak_stashed_bytes=stage.peak_bytes,
    )


DESCRIPTIONS: dict[str, str] = {
    "model-parallel": "the model split into consecutive stages, one micro-batch at a time",
    "gpipe": "GPipe: micro-batches fill then drain the pipeline, one step per mini-batch",
    "1f1b": "1F1B (PipeDream-flush): one forward, one backward; fewer activations stashed",
}
for _name, _description in DESCRIPTIONS.items():
    register(_name, _description)(train)
