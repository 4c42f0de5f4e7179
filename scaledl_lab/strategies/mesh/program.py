"""The mesh's program: gpt-tiny transformed one dimension at a time, as torchtitan's
``parallelize`` applies tensor parallelism, recomputation and FSDP to one model.

1. ``tp``: each block sliced over the rank's ``tp`` group (:mod:`.layers`);
2. ``pp``: the layers cut into stages, a schedule run over the ``pp`` group (:mod:`.stage`);
3. ``dp``: the gradients averaged over the ``dp`` group, the model states sharded over it at
   ``zero_stage`` 1–3 (:mod:`..memory.flat`'s flat units, ZeRO's reduce-scatter and all-gather
   over the group; stage 3 gathers each layer just before it computes and frees it after).

One step: the schedule's forwards and backwards (``tp``'s collectives inside every block,
``pp``'s messages between the stages), then with sequence parallelism the sum over ``tp`` of the
gradients of the regions split along the sequence, then ``dp``'s average, then the optimiser on
this rank's slices (or shards). Rows: ``kind="train"`` from every rank each step (its replica's
loss, shared along ``pp``), val/test from the last stage's ``tp`` rank 0 of replica 0, and from
``tp`` rank 0 of every stage and replica one event per forward, backward or W (the pipelines'
events table, which the Gantt charts draw). At the end every rank holds the whole unsplit model
(:mod:`.gather`); rank 0 returns it.
"""

from __future__ import annotations

import functools

import torch

from ...params import flat_grad, write_grads
from ...training.ledger import Peak, StepMemory, nbytes, optimizer_state_bytes
from ...training.worker import StepStats, WorkerContext, check_finite, lr_of
from ..memory.flat import FlatUnit
from ..model_parallel.parallel_transformer import Ledgers
from ..registry import register
from . import experts
from . import layers as mesh_layers
from .context_block import Context
from .gather import gather_model
from .grid import Mesh
from .layers import Dims
from .stage import Stage
from .view import mesh_views


class MeshModel:
    """This rank's part of gpt-tiny on the mesh, its groups, its optimiser."""

    def __init__(self, ctx: WorkerContext, mesh: Mesh | None = None) -> None:
        """``mesh``: the config's unless given (``tensor-parallel`` on gpt-tiny: ``tp=p``)."""
        cfg, comm = ctx.config, ctx.comm
        self.ctx, self.mesh = ctx, mesh or Mesh.parse(cfg.mesh)
        self.view = mesh_views(comm, self.mesh)
        self.tp, self.pp, self.dp = self.view["tp"], self.view["pp"], self.view["dp"]
        self.cp = self.view["cp"]
        gpt = ctx.build_model()
        self.shapes = {k: v.detach() for k, v in gpt.state_dict().items()}
        self.context = (
            Context(self.cp, gpt.sequence, cfg.cp_method) if self.cp.world_size > 1 else None
        )
        whole = cfg.recompute is True  # 'selective': attention's core only, the blocks' own
        self.dims = Dims(self.tp, cfg.sequence_parallel, whole, Ledgers(), self.context)
        self.zero, self.buffers = cfg.zero_stage, Peak()
        # What crosses a cut between stages: the residual stream, sequence-first, of one
        # micro-batch (with sequence parallelism, this rank's positions).
        split = self.tp.world_size if cfg.sequence_parallel else 1
        micro = cfg.batch_size // cfg.micro_batches
        boundary = torch.Size((gpt.sequence // split, micro, gpt.embed.token.embedding_dim))
        self.stage = Stage(
            mesh_layers.build(gpt, self.tp, self.context), self.pp, self.dims,
            schedule=cfg.pipeline_schedule, micro_batches=cfg.micro_batches,
            virtual=cfg.virtual_stages, boundary=boundary, dtype=cfg.dtype, dp=self.dp,
            buffers=self.buffers,
        )  # fmt: skip
        if ctx.precision is not None:
            self.stage.to_loss = ctx.precision.logits
        self.layers = self.stage.layers
        self.blocks = [layer for layer in self.layers if isinstance(layer, mesh_layers.Block)]
        self.params = [p for layer in self.layers for p in layer.module.parameters()]
        self.units: list[FlatUnit] = []
        if self.zero:
            self.units = [
                FlatUnit(layer.module, self.dp.rank, self.dp.world_size, self.zero == 3)
                for layer in self.layers
            ]
            if self.zero == 3:
                for layer, unit in zip(self.layers, self.units, strict=True):
                    layer.unit = unit
                    unit.free(self.buffers)
            self.optimizer = ctx.make_optimizer([u.shard for u in self.units])
        else:
            self.optimizer = ctx.make_optimizer(self.params)

    # -- one step --------------------------------------------------------------------------

    async def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepStats:
        cfg, ctx = self.ctx.config, self.ctx
        self.buffers.reset()
        self.dims.ledgers.new_step()
        for block in self.blocks:
            block.bytes_sent = 0
        for unit in self.units if self.zero == 1 else ():
            unit.keep_full_grads()  # backward accumulates into the flat gradient
        if self.context is not None:  # cp: the targets of this rank's positions
            y = self.context.take(y, 1)
        if self.tp.rank == 0:  # one row per stage and replica, as the pipelines write
            self.stage.on_event = functools.partial(self._event, step)
        loss_sum, correct = await self.stage.run(x, y, cfg.batch_size)
        stats = torch.tensor([loss_sum, float(correct)], dtype=torch.float64)
        await self.pp.allreduce(stats)  # the last stage's loss, to every stage
        await self._average_over_cp(stats)
        check_finite(stats[0].item(), rank=ctx.rank, epoch=ctx.plan.epoch_of(step), step=step)
        if cfg.sequence_parallel and self.tp.world_size > 1:
            await self._sum_split_regions()
        if self.context is not None:
            flat = flat_grad(self.params)
            await self._average_over_cp(flat)
            write_grads(self.params, flat)
        if self.zero:
            await self._reduce_scatter()
        elif self.dp.world_size > 1:
            await self.dp.average_grads(self.params)
        ctx.set_lr(self.optimizer, step)
        if ctx.precision is not None and ctx.precision.checks_overflow:
            # Dynamic loss scaling: one verdict for every rank, each holding a part of the
            # gradient (its slices, its stages, its shards).
            found = torch.tensor([float(self.optimizer.found_inf())], dtype=torch.float64)
            await ctx.comm.allreduce(found)
            self.optimizer.step(found_inf=bool(found[0] > 0))
        else:
            self.optimizer.step()
        if self.zero in (1, 2):
            for unit in self.units:
                await unit.gather(self.dp, self.buffers)
        self.step_memory = self.memory()  # before the gradients go
        self.optimizer.zero_grad()
        if not self.zero:
            for p in self.params:
                p.grad = None
        return StepStats(stats[0].item(), stats[1].item(), len(y))  # a sequence: a share

    async def _average_over_cp(self, flat: torch.Tensor) -> None:
        """cp: each rank's loss is the mean over its S/C positions, C times its share of the
        sequence's mean; the sum over ``cp`` of the losses (or of the gradients of the
        weights, whole on every rank) divided by C is the whole sequence's."""
        if self.context is not None:
            await self.cp.allreduce(flat)
            flat /= self.cp.world_size

    def _event(self, step: int, micro_batch: int, phase: str, start: float, end: float,
               chunk: int) -> None:  # fmt: skip
        """One forward or backward (or zero bubble's W) of this rank's stage: a row of the
        events table, the stage and replica being the rank's ``pp`` and ``dp`` coordinates."""
        ctx = self.ctx
        ctx.emit({"table": "events", "run": ctx.run_label, "rank": ctx.rank,
                  "replica": self.dp.rank, "stage": self.pp.rank, "step": step,
                  "micro_batch": micro_batch, "phase": phase, "start": start, "end": end,
                  "chunk": chunk})  # fmt: skip

    async def _sum_split_regions(self) -> None:
        """Sequence parallelism: each ``tp`` rank saw its positions only, so the LayerNorms'
        and the two biases' gradients are summed over ``tp``."""
        params = [p for block in self.blocks for p in block.module.split_region_parameters()]
        if not params:
            return
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        await self.tp.allreduce(flat)
        for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):
            p.grad.copy_(part.view_as(p))

    async def _reduce_scatter(self) -> None:
        """ZeRO over ``dp``: each layer's gradient reduce-scattered, this rank's shard averaged."""
        pending = [(u, u.reduce_start(self.dp, self.buffers)) for u in self.units]
        for unit, started in pending:
            unit.set_shard_grad(await started.wait(), self.dp.world_size, self.buffers)

    def memory(self) -> StepMemory:
        """This step's ledger, after the optimiser's step: the parameters this rank holds (its
        slices, or its ZeRO-3 shards), gradients (stage 1: whole; 2, 3: the shards'), the
        optimiser's state, what its blocks saved for backward, ZeRO's buffers in flight."""
        units = self.units
        if self.zero == 3:
            held = [u.shard for u in units]
        else:
            held = [u.full for u in units] if units else self.params
        grads = [u.grad_full for u in units] if self.zero == 1 else [u.shard.grad for u in units]
        return StepMemory(
            params=nbytes(held),
            grads=nbytes(grads if units else [p.grad for p in self.params]),
            optim=optimizer_state_bytes(self.optimizer),
            activations=self.dims.ledgers.norms.bytes.peak + self.dims.ledgers.rest.bytes.peak,
            buffers=self.buffers.peak,
        )

    # -- whole layers (ZeRO-3), evaluation, the model back ---------------------------------

    async def gather_all(self) -> None:
        if self.zero == 3:
            for unit in self.units:
                await unit.gather(self.dp, self.buffers)

    def free_all(self) -> None:
        if self.zero == 3:
            for unit in self.units:
                unit.free(self.buffers)

    async def evaluate(self, *, epoch: float, step: int) -> None:
        """Replica 0 scores val and test in slices of a micro-batch, each through every
        virtual stage in turn; the last stage's ``tp`` rank 0 logs the rows, with the bytes it
        sent for each split."""
        ctx, cfg, stage = self.ctx, self.ctx.config, self.stage
        if self.zero == 3:  # every replica takes part in the gathers
            for layer in self.layers:
                layer.unit = None
            await self.gather_all()
        if self.dp.rank == 0:
            micro = cfg.batch_size // cfg.micro_batches
            context = self.context
            take = (lambda y: y) if context is None else (lambda y: context.take(y, 1))
            for kind, split in (("val", ctx.data.val), ("test", ctx.data.test)):
                sent_before = ctx.comm.bytes_sent
                loss, hits, n_all = await stage.score(split, micro, ctx.device, take)
                if self.context is not None:
                    scores = torch.tensor([loss, float(hits)], dtype=torch.float64)
                    await self._average_over_cp(scores)
                    loss, hits = scores[0].item(), scores[1].item()
                if stage.is_last and self.tp.rank == 0 and self.cp.rank == 0 and n_all:
                    sent = ctx.comm.bytes_sent - sent_before
                    ctx.log_eval(kind, epoch, step, loss, hits, n_all, sent)
        if self.zero == 3:
            self.free_all()
            for layer, unit in zip(self.layers, self.units, strict=True):
                layer.unit = unit

    async def unsplit(self) -> dict[str, torch.Tensor]:
        """The whole gpt-tiny, by the unsplit model's names, on every rank."""
        await self.gather_all()
        owner = self.dp.rank == 0 and self.tp.rank == 0
        pieces = []
        for layer in self.layers:
            if self.dp.rank == 0 and self.cp.rank == 0:  # cp ranks hold the same weights
                pieces += layer.pieces(owner)
        return await gather_model(self.ctx.comm, self.shapes, pieces)


@register(
    "mesh",
    "a device mesh: data (ZeRO), tensor/sequence, pipeline and context parallelism composed on "
    "gpt-tiny, experts over data ranks on gpt-tiny-moe (--mesh dp=D,tp=T,pp=P,cp=C,ep=E)",
)
async def train(ctx: WorkerContext, mesh: Mesh | None = None) -> None:
    """``mesh``: the config's unless given (``tensor-parallel`` on gpt-tiny runs ``tp=p``)."""
    if ctx.config.model == "gpt-tiny-moe":  # dp × ep: the experts over the data ranks
        return await experts.train(ctx)
    comm = ctx.comm
    model = MeshModel(ctx, mesh)
    await model.evaluate(epoch=0.0, step=0)
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        stats = await model.train_step(x, y, step)
        step += 1
        # What the tensor-parallel study compares (studies/model_parallel): the blocks' traffic
        # of the last step (f and g), the LayerNorm regions' largest saved bytes.
        ctx.result["block_bytes_sent"] = sum(block.bytes_sent for block in model.blocks)
        norms = model.dims.ledgers.norms.bytes.peak
        ctx.result["norm_activations"] = max(ctx.result.get("norm_activations", 0), norms)
        counted = model.stage.is_last and model.tp.rank == 0 and model.cp.rank == 0
        counted = stats.samples if counted else 0
        sent, lr = comm.bytes_sent - sent_before, lr_of(model.optimizer)
        memory = model.step_memory.columns()
        ctx.log_train(step, stats, sent=sent, lr=lr, counted=counted, memory=memory)
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await model.evaluate(epoch=ctx.progress(step), step=step)
    state = await model.unsplit()
    ctx.result["state_dict"] = state if comm.rank == 0 else {}
    ctx.result.update(mesh=str(model.mesh), stage=model.pp.rank, replica=model.dp.rank)
