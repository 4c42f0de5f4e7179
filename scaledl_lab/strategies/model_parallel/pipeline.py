"""Pipeline model parallelism: the naive split, GPipe (Huang et al. 2019), 1F1B
(PipeDream-flush, Narayanan et al. 2021), interleaved 1F1B (Narayanan et al. 2021, Megatron-LM)
and zero bubble H1 (Qi et al. 2023), times data parallelism across pipeline replicas.

The model's ordered layers (:mod:`.partition`) are cut into p·V contiguous virtual stages
(``p = cfg.stages``, ``V = cfg.virtual_stages``, 1 but for interleaving); worker k of replica r
runs on rank r·p + k and holds chunks k, k + p, …, k + (V − 1)·p. A mini-batch is cut into
``M = cfg.micro_batches`` micro-batches; each worker runs its schedule (:mod:`.schedules`): a
forward receives the activations of the previous virtual stage (the first reads the batch), runs
the chunk's layers and sends its output on; a backward receives the gradient of that output from
the next virtual stage (the last starts from the loss) and sends the gradient of its input back.
With p ≥ 2 consecutive virtual stages sit on different workers, so every boundary is a message
(:mod:`.channels`). Zero bubble splits the backward: B takes the gradient of the chunk's input
only (``torch.autograd.grad``, the graph kept), W later that of its weights
(``backward(inputs=params)``, which on real workers runs again through the chunk's inner
activation gradients; the simulator charges F, B and W a third of the chunk's step each).
Gradients accumulate over the micro-batches; one optimiser step per mini-batch, after the
replicas of each stage have averaged their gradients (an allreduce within the stage's group).
With ``recompute`` a stage keeps only its inputs and runs the forward again during backward.

``model-parallel`` is GPipe with one micro-batch: one stage busy at a time.

Rows: ``kind="train"`` from every rank per step (the replica's loss, shared by an allreduce of
two numbers within the pipeline, so every stage stops together on divergence), val/test rows
from the last stage of replica 0, and one event per forward or backward (the events table:
stage, micro-batch, phase, start, end, chunk) from which the bubble is measured.
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch
from torch import nn

from ...models import model_flops
from ...objective import correct_count, model_input, summed_loss
from ...params import flat_grad, write_grads
from ...runtime.base import Group, Pending
from ...training.worker import StepStats, WorkerContext, check_finite, lr_of
from ..registry import register
from . import backward, channels, partition, schedules
from .partition import Chunk


def loss_of(logits: torch.Tensor, y: torch.Tensor, batch_size: int) -> torch.Tensor:
    """A micro-batch's share of the mini-batch's mean loss (its sum over the whole batch)."""
    return summed_loss(logits, y) / batch_size


class Stage:
    """This rank's stage: its chunks (one, or V interleaved), its neighbours, buffer shapes
    from a dry run, its groups."""

    def __init__(
        self,
        ctx: WorkerContext,
        model: nn.Module,
        every: list[nn.Module],
        sample: torch.Tensor,
        counts: list[int],
    ) -> None:
        """``every``: the model's layers; ``sample``: one micro-batch (for the dry run);
        ``counts``: layers per virtual stage (p·V of them)."""
        cfg, comm = ctx.config, ctx.comm
        self.ctx, self.comm = ctx, comm
        self.stages = cfg.model_parallel_size
        self.virtual = cfg.virtual_stages
        self.index = ctx.rank % self.stages
        self.replica = ctx.data_rank
        self.is_first, self.is_last = self.index == 0, self.index == self.stages - 1
        self.base = ctx.rank - self.index  # the rank of this replica's stage 0
        shapes = [sample.shape, *partition.boundary_shapes(every, sample)]
        flops = [model_flops(layer, shapes[i][1:], 1) for i, layer in enumerate(every)]
        last = self.stages * self.virtual - 1
        self.chunks: list[Chunk] = []
        owned: list[nn.Module] = []
        for c in range(self.virtual):
            v = c * self.stages + self.index
            lo, hi = sum(counts[:v]), sum(counts[: v + 1])
            owned += every[lo:hi]
            share = self.cost_share(flops[lo:hi], flops)
            chunk = Chunk(v, nn.Sequential(*every[lo:hi]), shapes[lo], shapes[hi], share, last,
                          self.stages)  # fmt: skip
            self.chunks.append(chunk)
        self.by_virtual = {chunk.virtual: chunk for chunk in self.chunks}
        # One chunk: its Sequential; several: a container of them (what the optimiser steps).
        self.layers = self.chunks[0].layers if self.virtual == 1 else nn.ModuleList(
            [chunk.layers for chunk in self.chunks]
        )  # fmt: skip
        self.names = partition.parameter_names(model, owned)
        self.params = [p for p in self.layers.parameters() if p.requires_grad]
        self.micro = len(sample)
        schedule = schedules.schedule(cfg.strategy, self.stages, cfg.micro_batches, self.virtual)
        self.ops = schedule[self.index]
        self.splits_backward = any(op[0] == "W" for op in self.ops)  # B (input) and W (weights)
        self.ahead = schedules.in_flight(self.ops)  # receives kept posted: as many as it stashes
        sent = channels.messages(schedule)
        self.expected = {src: keys for (src, dst), keys in sent.items() if dst == self.index}
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
        self.peak_until_w = 0  # stashed or waiting for their weight gradient (zero bubble)
        self.messages_sent = 0

    def cost_share(self, mine: list[int], every: list[int]) -> float:
        """A chunk's share of a training step's cost on the simulator: its FLOPs."""
        if sum(every):
            return sum(mine) / sum(every)
        return 1.0 / (self.stages * self.ctx.config.virtual_stages)

    def _shape_of(self, key: channels.Key) -> torch.Size:
        phase, _, v = key
        chunk = self.by_virtual[v]
        return chunk.in_shape if phase == "F" else chunk.out_shape

    def _send(self, tensor: torch.Tensor, worker: int) -> Pending:
        self.messages_sent += 1
        return self.comm.isend(tensor, self.base + worker)

    # -- one mini-batch ------------------------------------------------------------------

    async def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepStats:
        """Run this stage's schedule on one mini-batch; return the replica's loss and hits."""
        cfg, comm = self.ctx.config, self.comm
        whole = cfg.recompute is True  # 'selective' recomputes inside the model's attention
        xs, ys = x.split(self.micro), y.split(self.micro)
        inbox = channels.Inbox(comm, self._expected_ranks(), self._shape_of, cfg.dtype, self.ahead)
        stash: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        waiting_w: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor | None]] = {}
        sends: list[Pending] = []
        loss_sum, correct = 0.0, 0
        for op in self.ops:
            phase, m = op[0], op[1]
            c = op[2] if len(op) > 2 else 0
            chunk = self.chunks[c]
            if phase == "F":
                inp = await self._input(inbox, xs, m, chunk)
                start = comm.now()  # busy from here: waiting for the input is the bubble
                context = torch.no_grad() if whole else contextlib.nullcontext()
                async with comm.compute(len(inp), chunk.share / 3):
                    with context:
                        out = chunk.layers(inp)
                        if chunk.is_last:
                            correct += correct_count(out, ys[m])
                            out = loss_of(out, ys[m], cfg.batch_size)
                end = comm.now()  # before the send: a receiver may start before isend returns
                if chunk.is_last:
                    loss_sum += out.item()
                else:
                    sends.append(self._send(out.detach(), chunk.next_worker))
                stash[(c, m)] = (inp, out)
            elif phase == "B":
                inp, out = stash.pop((c, m))
                grad = await self._output_grad(inbox, m, chunk)
                start = comm.now()
                if self.splits_backward:  # zero bubble: the input's gradient, the graph kept
                    grad_in = await backward.input_grad(comm, chunk, inp, out, grad)
                    waiting_w[(c, m)] = (inp, out, grad)  # type: ignore[assignment]
                else:
                    loss = functools.partial(loss_of, y=ys[m], batch_size=cfg.batch_size)
                    grad_in = await backward.full(comm, chunk, inp, out, grad, whole, loss)
                end = comm.now()
                if not chunk.is_first:
                    sends.append(self._send(grad_in, chunk.prev_worker))
            else:  # "W": the weight gradients, accumulated as the full backward does
                inp, out, grad = waiting_w.pop((c, m))  # type: ignore[misc]
                start = comm.now()
                await backward.weight_grad(comm, chunk, inp, out, grad)
                end = comm.now()
            self._track(stash, waiting_w)
            self.ctx.log_event(step=step, micro_batch=m, phase=phase, start=start, end=end,
                               chunk=c)  # fmt: skip
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

    def _expected_ranks(self) -> dict[int, list[channels.Key]]:
        return {self.base + src: list(keys) for src, keys in self.expected.items()}

    async def _input(
        self, inbox: channels.Inbox, xs: tuple[torch.Tensor, ...], m: int, chunk: Chunk
    ) -> torch.Tensor:
        if chunk.is_first:
            return xs[m]
        buffer = await inbox.take(("F", m, chunk.virtual), self.base + chunk.prev_worker)
        return buffer.requires_grad_(True)

    async def _output_grad(
        self, inbox: channels.Inbox, m: int, chunk: Chunk
    ) -> torch.Tensor | None:
        if chunk.is_last:
            return None
        return await inbox.take(("B", m, chunk.virtual), self.base + chunk.next_worker)

    def _track(self, stash: dict, waiting_w: dict) -> None:
        """The peaks of stashed micro-batches (forward run, backward not), of those also
        waiting for their weight gradient, and of their bytes."""
        self.peak_count = max(self.peak_count, len(stash))
        self.peak_until_w = max(self.peak_until_w, len(stash) + len(waiting_w))
        kept = [(inp, out) for inp, out, *_ in [*stash.values(), *waiting_w.values()]]
        self.peak_bytes = max(self.peak_bytes, self._stashed_bytes(kept))

    def _stashed_bytes(self, kept: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """Activation bytes kept for backward: the inputs, plus the autograd graph's outputs
        unless recomputing (a proxy: the stage output, not every intermediate)."""
        total = 0
        for inp, out in kept:
            total += inp.numel() * inp.element_size()
            if self.ctx.config.recompute is not True:
                total += out.numel() * out.element_size()
        return total

    async def _average_gradients(self) -> None:
        flat = flat_grad(self.params)
        await self.comm.allreduce(flat, self.across)
        write_grads(self.params, flat / self.ctx.config.replicas)

    # -- evaluation ----------------------------------------------------------------------

    async def evaluate(self, *, epoch: float, step: int) -> None:
        """Replica 0's pipeline scores val and test in slices of a micro-batch, each slice
        through every virtual stage in turn; the last stage logs the rows."""
        if self.replica != 0:
            return
        data, cfg, comm = self.ctx.data, self.ctx.config, self.comm
        self.layers.eval()
        for kind, split in (("val", data.val), ("test", data.test)):
            totals = [0.0, 0, 0]
            for start in range(0, len(split), self.micro):
                n = min(self.micro, len(split) - start)
                for chunk in self.chunks:
                    if chunk.is_first:
                        inp = model_input(split.x[start : start + n], self.ctx.device, cfg.dtype)
                    else:
                        buffer = torch.empty((n, *chunk.in_shape[1:]), dtype=cfg.dtype)
                        inp = await comm.recv(buffer, self.base + chunk.prev_worker)
                    async with comm.compute(n, chunk.share / 3):
                        with torch.no_grad():
                            out = chunk.layers(inp)
                    if chunk.is_last:
                        y = split.y[start : start + n].to(self.ctx.device)
                        totals[0] += summed_loss(out, y).item()
                        totals[1] += correct_count(out, y)
                        totals[2] += n
                    else:
                        await comm.send(out, self.base + chunk.next_worker)
            if self.is_last and totals[2]:
                self.ctx.log_eval(kind, epoch, step, totals[0], totals[1], totals[2])
        self.layers.train()


async def _counts(ctx: WorkerContext, every: list[nn.Module], sample: torch.Tensor) -> list[int]:
    """Layers per virtual stage; with balance "time" rank 0's measurement is everyone's."""
    cfg = ctx.config
    virtual = cfg.model_parallel_size * cfg.virtual_stages
    counts = partition.stage_counts(cfg.balance, every, virtual, sample)
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
        layers=sum(len(chunk.layers) for chunk in stage.chunks),
        peak_stashed=stage.peak_count,
        peak_stashed_bytes=stage.peak_bytes,
        peak_stashed_until_w=stage.peak_until_w,
        messages_sent=stage.messages_sent,
        chunk_shares={chunk.virtual: chunk.share for chunk in stage.chunks},
    )


DESCRIPTIONS: dict[str, str] = {
    "model-parallel": "the model split into consecutive stages, one micro-batch at a time",
    "gpipe": "GPipe: micro-batches fill then drain the pipeline, one step per mini-batch",
    "1f1b": "1F1B (PipeDream-flush): one forward, one backward; fewer activations stashed",
    "interleaved-1f1b": "interleaved 1F1B (Megatron-LM): V model chunks per worker "
    "(--virtual-stages), a V times smaller bubble for about V times the messages",
    "zb-h1": "zero bubble H1: backward split into input (B) and weight (W) gradients, the Ws "
    "deferred into 1F1B's cool-down bubble",
}
for _name, _description in DESCRIPTIONS.items():
    register(_name, _description)(train)
