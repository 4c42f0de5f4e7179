"""Pipeline model parallelism: the naive split, GPipe (Huang et al. 2019), 1F1B
(PipeDream-flush, Narayanan et al. 2021), interleaved 1F1B (Narayanan et al. 2021, Megatron-LM)
and zero bubble H1 (Qi et al. 2023), times data parallelism across pipeline replicas.

The model's ordered layers (:mod:`.partition`) are cut into p·V contiguous virtual stages
(``p = cfg.stages``, ``V = cfg.virtual_stages``, 1 but for interleaving; ``cfg.balance`` says
how many layers each), each one layer of the pipeline executor (:mod:`.chunk`). The ranks form
the mesh ``dp=R,pp=p`` (:mod:`..mesh.grid`): worker k of replica r runs on rank r·p + k and
holds chunks k, k + p, …, k + (V − 1)·p. A mini-batch is cut into ``M = cfg.micro_batches``
micro-batches; each worker runs its schedule (:mod:`.schedules`) on the executor
(:mod:`.executor`, the one the mesh's ``pp`` runs on too): a forward receives the activations
of the previous virtual stage (the first reads the batch), runs the chunk's layers and sends its
output on; a backward receives the gradient of that output from the next virtual stage (the
last starts from the loss) and sends the gradient of its input back. With p ≥ 2 consecutive
virtual stages sit on different workers, so every boundary is a message (:mod:`.channels`),
its buffers shaped by a dry run (:func:`.partition.boundary_shapes`). Zero bubble splits the
backward into B, the gradient of the chunk's input, and W, later, that of its weights
(:mod:`.chunk`). Gradients accumulate over the micro-batches; one optimiser step per
mini-batch, after the replicas of each stage have averaged their gradients (an allreduce within
the stage's ``dp`` group). With ``recompute`` a stage keeps only its inputs and runs the forward
again during backward.

``model-parallel`` is GPipe with one micro-batch: one stage busy at a time.

Rows: ``kind="train"`` from every rank per step (the replica's loss, shared by an allreduce of
two numbers within the pipeline, so every stage stops together on divergence), val/test rows
from the last stage of replica 0, and one event per forward or backward (the events table:
stage, micro-batch, phase, start, end, chunk) from which the bubble is measured.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn

from ...models import model_flops
from ...objective import model_input
from ...training.worker import StepStats, WorkerContext, check_finite, lr_of
from ..mesh.grid import Mesh
from ..mesh.view import mesh_views
from ..registry import register
from . import partition
from .chunk import ChunkLayer
from .executor import Chunk, Executor


class Stage(Executor):
    """This rank's stage of any model: its chunks (one, or V interleaved), each a run of the
    model's layers as one layer of the executor, and its groups, the mesh ``dp=R,pp=p``."""

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
        cfg = ctx.config
        self.ctx = ctx
        self.stages, self.virtual = cfg.model_parallel_size, cfg.virtual_stages
        views = mesh_views(ctx.comm, Mesh(("dp", "pp"), (cfg.replicas, self.stages)))
        self.dp = views["dp"]  # each stage across the replicas (data parallelism)
        self.index, self.replica = views["pp"].rank, self.dp.rank
        shapes = [sample.shape, *partition.boundary_shapes(every, sample)]
        flops = [model_flops(layer, shapes[i][1:], 1) for i, layer in enumerate(every)]
        total = self.stages * self.virtual  # virtual stages
        ends = list(itertools.accumulate(counts))
        chunks = []
        for v in range(total):
            lo, hi = ends[v] - counts[v], ends[v]
            share = self.cost_share(flops[lo:hi], flops)
            chunks.append(ChunkLayer(v, nn.Sequential(*every[lo:hi]), share, total - 1,
                                     ctx.comm, cfg.recompute is True))  # fmt: skip
        # Every virtual stage is one layer of the executor; the shapes at the cuts between them.
        super().__init__(
            chunks, [1] * total, [shapes[end] for end in ends[:-1]], views["pp"], None,
            schedule=cfg.strategy, micro_batches=cfg.micro_batches, virtual=self.virtual,
            dtype=cfg.dtype,
        )  # fmt: skip
        mine: list[ChunkLayer] = self.layers
        owned = [layer for chunk in mine for layer in chunk.layers]
        # One chunk: its Sequential; several: a container of them (what the optimiser steps).
        self.module = mine[0].layers if self.virtual == 1 else nn.ModuleList(
            [chunk.layers for chunk in mine]
        )  # fmt: skip
        self.names = partition.parameter_names(model, owned)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.micro = len(sample)

    def cost_share(self, mine: list[int], every: list[int]) -> float:
        """A chunk's share of a training step's cost on the simulator: its FLOPs."""
        if sum(every):
            return sum(mine) / sum(every)
        return 1.0 / (self.stages * self.ctx.config.virtual_stages)

    def kept_bytes(self, chunk: Chunk, saved: list) -> int:
        """What the chunk's one layer keeps for backward (:meth:`.ChunkLayer.kept_bytes`)."""
        return chunk.layers[0].kept_bytes(saved[0])

    # -- one mini-batch ------------------------------------------------------------------

    async def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepStats:
        """Run this stage's schedule on one mini-batch; return the replica's loss and hits."""
        ctx = self.ctx
        self.on_event = lambda m, phase, start, end, c: ctx.log_event(
            step=step, micro_batch=m, phase=phase, start=start, end=end, chunk=c
        )
        loss_sum, correct = await self.run(x, y, ctx.config.batch_size)
        stats = torch.tensor([loss_sum, float(correct)], dtype=torch.float64)
        await self.pp.allreduce(stats)  # only the last stage adds anything
        check_finite(stats[0].item(), rank=ctx.rank, epoch=step // ctx.steps_per_epoch, step=step)
        if self.dp.world_size > 1:
            await self.dp.average_grads(self.params)
        return StepStats(stats[0].item(), stats[1].item(), len(y))  # a sequence: a share

    # -- evaluation ----------------------------------------------------------------------

    async def evaluate(self, *, epoch: float, step: int) -> None:
        """Replica 0's pipeline scores val and test in slices of a micro-batch (BatchNorm in
        eval mode); the last stage logs the rows."""
        if self.replica != 0:
            return
        data = self.ctx.data
        self.module.eval()
        for kind, split in (("val", data.val), ("test", data.test)):
            loss, hits, count = await self.score(split, self.micro, self.ctx.device)
            if self.is_last and count:
                self.ctx.log_eval(kind, epoch, step, loss, hits, count)
        self.module.train()


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
    optimizer = ctx.build_optimizer(stage.module) if stage.params else None
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
        layers=sum(len(chunk.layers) for chunk in stage.layers),
        peak_stashed=stage.peak_count,
        peak_stashed_bytes=stage.peak_bytes,
        peak_stashed_until_w=stage.peak_until_w,
        messages_sent=stage.messages_sent,
        chunk_shares={chunk.virtual: chunk.share for chunk in stage.layers},
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
