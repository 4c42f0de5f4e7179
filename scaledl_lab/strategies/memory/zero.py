"""ZeRO's three stages of sharded data parallelism (Rajbhandari et al. 2020), each rank a
replica's worth of batches but only 1/N of the model states:

- ``zero1`` (P_os): every rank holds the whole parameters and gradients, steps the optimiser
  on its shard only; after backward the gradients are reduce-scattered (each rank gets its
  shard's sum), and after the step the parameters are all-gathered;
- ``zero2`` (P_os+g): + backward runs block by block (a layer with parameters and the
  parameter-free layers after it, :func:`.flat.blocks`), each block's gradient is
  reduce-scattered as soon as it is there, at most two in flight, and the rank keeps only its
  shard of it;
- ``zero3`` (P_os+g+p, FSDP's full shard): + the parameters themselves are sharded: each layer
  is all-gathered just before its forward and again before its backward, and freed after each
  (``recompute``, at stages 2 and 3: each block's forward runs again in backward instead
  of keeping what it saved).

Traffic per step: a reduce-scatter and an all-gather of the model, 2(N−1)/N·Ψ as the ring
allreduce of data parallelism, for stages 1 and 2; one more all-gather, 3(N−1)/N·Ψ, for
stage 3. Gradients and updates are the allreduce's, element for element: the same sums in the
same order, divided by N, and an elementwise optimiser (SGD, Adam, AdaGrad) on a shard does
what it does on the whole. The blocks come from the model's ordered layers
(``partition.layers``). Backward is driven block by block from the program, not from autograd
hooks, so that a rank can wait for a collective between two blocks on either runtime (the
simulator can suspend a worker only at an ``await``).
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from ...objective import correct_count
from ...runtime.base import Pending
from ...training.ledger import Peak, SavedTensors, StepMemory, nbytes, optimizer_state_bytes
from ...training.recompute import buffers_kept
from ...training.worker import StepStats, WorkerContext, check_finite
from ..model_parallel.partition import layers as model_layers
from ..registry import register
from .flat import FlatUnit, blocks, flat_units

DESCRIPTIONS = {
    "zero1": "ZeRO stage 1: optimiser state sharded over the workers",
    "zero2": "ZeRO stage 2: optimiser state and gradients sharded",
    "zero3": "ZeRO stage 3 (FSDP full shard): optimiser state, gradients and parameters sharded",
}
STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}


class ShardedModel:
    """A model whose layers are :class:`FlatUnit` s, and what a ZeRO stage does with them;
    ``buffers`` and ``saved`` keep the step's memory ledger."""

    def __init__(self, ctx: WorkerContext, model: nn.Module, stage: int) -> None:
        self.ctx, self.comm, self.model, self.stage = ctx, ctx.comm, model, stage
        self.layers = blocks(model_layers(model))
        self.units = flat_units(self.layers, ctx.rank, ctx.world_size, private_shard=stage == 3)
        self.optimizer = ctx.make_optimizer(self.shards)  # 16 bits: float32 master shards
        # The loss of the layer-by-layer stages takes the last layer's output as the model's
        # forward hook gives it (16 bits: cast to float32, the gradient loss-scaled).
        self.to_loss = (lambda out: out) if ctx.precision is None else ctx.precision.logits
        self.pending: list[tuple[FlatUnit, Pending]] = []
        self.buffers, self.saved = Peak(), SavedTensors()

    @property
    def shards(self) -> list[nn.Parameter]:
        return [u.shard for u in self.units.values()]

    async def gather_all(self) -> None:
        """Every layer whole (stage 3: to evaluate the model, or to return it)."""
        for unit in self.units.values():
            await unit.gather(self.comm, self.buffers)

    def free_all(self) -> None:
        for unit in self.units.values():
            unit.free(self.buffers)

    def memory(self) -> StepMemory:
        """This step's ledger, taken after the optimiser's step."""
        units = self.units.values()
        held = [u.shard for u in units] if self.stage == 3 else [u.full for u in units]
        grads = [u.grad_full for u in units] if self.stage == 1 else [u.shard.grad for u in units]
        return StepMemory(
            params=nbytes(held),
            grads=nbytes(grads),
            optim=optimizer_state_bytes(self.optimizer),
            activations=self.saved.bytes.peak,
            buffers=self.buffers.peak,
        )

    # -- one step -------------------------------------------------------------------------

    async def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        """This rank's gradients, reduce-scattered (started; :meth:`reduce` waits)."""
        self.buffers.reset()  # nothing is in flight between steps
        self.saved.new_step()
        if self.stage > 1:
            return await self._forward_backward_by_layer(x, y)
        for unit in self.units.values():
            unit.keep_full_grads()
        async with self.comm.compute(len(y)):
            with self.saved.counting(self.model, params_move=True):
                out = self.model(x)
                loss = F.cross_entropy(out, y)
                loss.backward()
        # Stage 1: the whole gradient, then one reduce-scatter per layer.
        self.pending = [(u, u.reduce_start(self.comm, self.buffers)) for u in self.units.values()]
        return StepStats(loss.item(), correct_count(out, y), len(y))

    async def _forward_backward_by_layer(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        """Stages 2 and 3: layer by layer, the layers' graphs cut at their inputs, so that
        backward runs one layer at a time and each layer's gradient is reduce-scattered as
        soon as it is there (at most two in flight). Stage 3 gathers each layer before it
        computes and frees it after."""
        recompute = self.ctx.config.recompute is True  # whole layers ('selective': the model's)
        stage3 = self.stage == 3
        saved: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        h, needs_grad = x, False  # the data needs no gradient, nor what comes from it alone
        for i, layer in enumerate(self.layers):
            unit = self.units.get(i)
            if stage3 and unit is not None:
                await unit.gather(self.comm, self.buffers)
            inp = h.detach().requires_grad_(needs_grad)
            needs_grad = needs_grad or unit is not None
            async with self.comm.compute(len(y), share=_share(self.layers, i) / 3):
                no_grad = torch.no_grad() if recompute else contextlib.nullcontext()
                with no_grad, self.saved.counting(self.model, params_move=True):
                    out = layer(inp)
            if stage3 and unit is not None:
                unit.free(self.buffers)
            saved.append((self.saved.keep(inp) if recompute else inp, None if recompute else out))
            h = out
        logits = h
        with self.saved.counting(self.model, params_move=True):
            loss = F.cross_entropy(self.to_loss(logits), y) if not recompute else None
        del h  # with recompute, the checkpoints hold the layers' inputs, nothing else
        grad: torch.Tensor | None = None
        for i in reversed(range(len(self.layers))):
            layer, unit = self.layers[i], self.units.get(i)
            inp, out = saved[i]
            inp = inp.tensor if recompute else inp  # a checkpoint: held, counted as saved
            if not inp.requires_grad and unit is None:
                break  # the layers below have no parameters and their input needs no gradient
            if stage3 and unit is not None:
                await unit.gather(self.comm, self.buffers)
            backward = 2 / 3 + (1 / 3 if recompute else 0.0)  # and its forward again
            async with self.comm.compute(len(y), share=_share(self.layers, i) * backward):
                with self.saved.counting(self.model, params_move=True):
                    if out is None:  # recompute: run the layer again, statistics untouched
                        with buffers_kept(layer):
                            out = layer(inp)
                    if i == len(self.layers) - 1 and loss is None:
                        loss = F.cross_entropy(self.to_loss(out), y)
                if i == len(self.layers) - 1:
                    loss.backward()
                else:
                    torch.autograd.backward(out, grad)
            grad = inp.grad
            saved[i] = (inp, None)
            del out
            if unit is not None:
                if stage3:
                    unit.free(self.buffers)
                self.pending.append((unit, unit.reduce_start(self.comm, self.buffers)))
                if len(self.pending) > 1:  # the one before has had this layer's time to go
                    await self._finish(*self.pending.pop(0))
        loss_value = loss.item() if loss is not None else math.nan
        correct = correct_count(logits, y)
        return StepStats(loss_value, correct, len(y))

    async def _finish(self, unit: FlatUnit, pending: Pending) -> None:
        unit.set_shard_grad(await pending.wait(), self.comm.world_size, self.buffers)

    async def reduce(self) -> None:
        """Wait for the reduce-scatters still in flight: each shard's gradient is the average."""
        for unit, pending in self.pending:
            await self._finish(unit, pending)
        self.pending = []

    async def step(self, found_inf: bool | None = None) -> None:
        """Step the shards; stages 1 and 2 then gather the updated parameters. ``found_inf``:
        whether some rank's shard of the gradient overflowed (dynamic loss scaling)."""
        if found_inf is None:
            self.optimizer.step()
        else:
            self.optimizer.step(found_inf=found_inf)
        if self.stage < 3:
            for unit in self.units.values():
                await unit.gather(self.comm, self.buffers)


def _share(layers: list[nn.Module], i: int) -> float:
    """Layer ``i``'s part of a step's compute, by parameter count (at least a little)."""
    sizes = [max(1, sum(p.numel() for p in layer.parameters())) for layer in layers]
    return sizes[i] / sum(sizes)


async def train(ctx: WorkerContext) -> None:
    """The program one worker runs at every stage (``ctx.config.strategy``)."""
    cfg, comm = ctx.config, ctx.comm
    model = ctx.build_model()
    sharded = ShardedModel(ctx, model, STAGES[cfg.strategy])
    stage3 = sharded.stage == 3
    if stage3:
        sharded.free_all()
    await _evaluate(ctx, sharded, step=0)
    for step, (x, y) in enumerate(ctx.local_batches(), start=1):
        sent_before = comm.bytes_sent
        stats = await sharded.forward_backward(x, y)
        await sharded.reduce()
        # The loss goes to every worker, so that each sees a divergence at once; with dynamic
        # loss scaling, so does whether a shard's gradient overflowed (one verdict for all).
        checks = ctx.precision is not None and ctx.precision.checks_overflow
        values = [stats.loss, float(sharded.optimizer.found_inf())] if checks else [stats.loss]
        total = await comm.allreduce(torch.tensor(values, dtype=torch.float64))
        check_finite(
            total[0].item(), rank=ctx.rank, epoch=ctx.plan.epoch_of(step - 1), step=step - 1
        )
        lr = ctx.set_lr(sharded.optimizer, step - 1)
        await sharded.step(found_inf=bool(total[1] > 0) if checks else None)
        memory = sharded.memory().columns()
        sharded.optimizer.zero_grad()
        ctx.log_train(step, stats, sent=comm.bytes_sent - sent_before, lr=lr, memory=memory)
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await _evaluate(ctx, sharded, step=step)
    if stage3:
        await sharded.gather_all()
    ctx.keep_model(model)


async def _evaluate(ctx: WorkerContext, sharded: ShardedModel, *, step: int) -> None:
    """The shared evaluation (stage 3 gathers the whole model for it, then frees it again)."""
    if sharded.stage == 3:
        await sharded.gather_all()
    await ctx.evaluate_shared(sharded.model, epoch=ctx.progress(step), step=step)
    if sharded.stage == 3:
        sharded.free_all()


for _name, _description in DESCRIPTIONS.items():
    register(_name, _description)(train)
