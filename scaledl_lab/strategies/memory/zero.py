"""ZeRO's three stages of sharded data parallelism (Rajbhandari et al. 2020), each rank a
replica's worth of batches but only 1/N of the model states:

- ``zero1`` (P_os): every rank holds the whole parameters and gradients, steps the optimiser
  on its shard only; after backward the gradients are reduce-scattered (each rank gets its
  shard's sum), and after the step the parameters are all-gathered;
- ``zero2`` (P_os+g): + each layer's gradient is reduce-scattered as soon as backward has
  produced it, and the rank keeps only its shard of it;
- ``zero3`` (P_os+g+p, FSDP's full shard): + the parameters themselves are sharded: each layer
  is all-gathered just before its forward and again before its backward, and freed after each
  (``recompute``: its forward runs again in backward instead of keeping what it saved).

Traffic per step: a reduce-scatter and an all-gather of the model, 2(N−1)/N·Ψ as the ring
allreduce of data parallelism, for stages 1 and 2; one more all-gather, 3(N−1)/N·Ψ, for
stage 3. Gradients and updates are the allreduce's, element for element: the same sums in the
same order, divided by N, and an elementwise optimiser (SGD, Adam, AdaGrad) on a shard does
what it does on the whole. The layers are the model's ordered layers (``partition.layers``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from ...runtime.base import Pending
from ...training.worker import StepStats, WorkerContext, check_finite, make_optimizer
from ..model_parallel.partition import layers as model_layers
from ..registry import register
from .flat import FlatUnit, flat_units

DESCRIPTIONS = {
    "zero1": "ZeRO stage 1: optimiser state sharded over the workers",
    "zero2": "ZeRO stage 2: optimiser state and gradients sharded",
    "zero3": "ZeRO stage 3 (FSDP full shard): optimiser state, gradients and parameters sharded",
}
STAGES = {"zero1": 1, "zero2": 2, "zero3": 3}


class ShardedModel:
    """A model whose layers are :class:`FlatUnit` s, and what a ZeRO stage does with them."""

    def __init__(self, ctx: WorkerContext, model: nn.Module, stage: int) -> None:
        self.ctx, self.comm, self.model, self.stage = ctx, ctx.comm, model, stage
        self.layers = model_layers(model)
        self.units = flat_units(self.layers, ctx.rank, ctx.world_size, private_shard=stage == 3)
        self.optimizer = make_optimizer(ctx.config, self.shards)
        self.pending: list[tuple[FlatUnit, Pending]] = []
        if stage == 2:  # each layer's gradient goes as soon as backward has filled it
            self._ready = dict.fromkeys(self.units, 0)
            self._unit_of = {id(p): i for i, u in self.units.items() for p in u.params}
            for unit in self.units.values():
                for p in unit.params:
                    p.register_post_accumulate_grad_hook(self._on_grad_ready)

    @property
    def shards(self) -> list[nn.Parameter]:
        return [u.shard for u in self.units.values()]

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        i = self._unit_of[id(p)]
        self._ready[i] += 1
        unit = self.units[i]
        if self._ready[i] == len(unit.params):
            self.pending.append((unit, unit.reduce_start(self.comm)))

    async def gather_all(self) -> None:
        """Every layer whole (stage 3: to evaluate the model, or to return it)."""
        for unit in self.units.values():
            await unit.gather(self.comm)

    def free_all(self) -> None:
        for unit in self.units.values():
            unit.free()

    # -- one step -------------------------------------------------------------------------

    async def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        """This rank's gradients, reduce-scattered (started; :meth:`reduce` waits)."""
        if self.stage == 3:
            return await self._forward_backward_by_layer(x, y)
        if self.stage == 1:
            for unit in self.units.values():
                unit.keep_full_grads()
        else:
            self._ready = dict.fromkeys(self.units, 0)
        async with self.comm.compute(len(y)):
            out = self.model(x)
            loss = F.cross_entropy(out, y)
            loss.backward()  # zero2: reduce-scatters start in here
        if self.stage == 1:  # the whole gradient, then one reduce-scatter per layer
            self.pending = [(u, u.reduce_start(self.comm)) for u in self.units.values()]
        return StepStats(loss.item(), int((out.argmax(1) == y).sum().item()), len(y))

    async def _forward_backward_by_layer(self, x: torch.Tensor, y: torch.Tensor) -> StepStats:
        """Stage 3: layer by layer, each gathered before it computes and freed after; the
        layers' graphs are cut at their inputs, so that backward runs one layer at a time."""
        recompute = self.ctx.config.recompute
        saved: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        h, needs_grad = x, False  # the data needs no gradient, nor what comes from it alone
        for i, layer in enumerate(self.layers):
            unit = self.units.get(i)
            if unit is not None:
                await unit.gather(self.comm)
            inp = h.detach().requires_grad_(needs_grad)
            needs_grad = needs_grad or unit is not None
            async with self.comm.compute(len(y), share=_share(self.layers, i) / 3):
                no_grad = torch.no_grad() if recompute else contextlib.nullcontext()
                with no_grad:
                    out = layer(inp)
            if unit is not None:
                unit.free()
            saved.append((inp, None if recompute else out))
            h = out
        logits = h
        loss = F.cross_entropy(logits, y) if not recompute else None
        grad: torch.Tensor | None = None
        for i in reversed(range(len(self.layers))):
            layer, unit = self.layers[i], self.units.get(i)
            inp, out = saved[i]
            if not inp.requires_grad and unit is None:
                break  # the layers below have no parameters and their input needs no gradient
            if unit is not None:
                await unit.gather(self.comm)
            backward = 2 / 3 + (1 / 3 if recompute else 0.0)  # and its forward again
            async with self.comm.compute(len(y), share=_share(self.layers, i) * backward):
                if out is None:  # recompute: run the layer again, its statistics untouched
                    with _buffers_kept(layer):
                        out = layer(inp)
                if i == len(self.layers) - 1:
                    last = F.cross_entropy(out, y) if loss is None else loss
                    last.backward()
                else:
                    torch.autograd.backward(out, grad)
            grad = inp.grad
            saved[i] = (inp, None)
            if unit is not None:
                unit.free()
                self.pending.append((unit, unit.reduce_start(self.comm)))
        loss_value = F.cross_entropy(logits.detach(), y).item() if loss is None else loss.item()
        correct = int((logits.argmax(1) == y).sum().item())
        return StepStats(loss_value, correct, len(y))

    async def reduce(self) -> None:
        """Wait for every layer's reduce-scatter: each shard's gradient is the average."""
        if self.stage == 2:  # layers whose parameters got no gradient this step
            done = {id(u) for u, _ in self.pending}
            for unit in self.units.values():
                if id(unit) not in done:
                    self.pending.append((unit, unit.reduce_start(self.comm)))
        for unit, pending in self.pending:
            unit.set_shard_grad(await pending.wait(), self.comm.world_size)
        self.pending = []

    async def step(self) -> None:
        """Step the shards; stages 1 and 2 then gather the updated parameters."""
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.stage < 3:
            for unit in self.units.values():
                await unit.gather(self.comm)


def _share(layers: list[nn.Module], i: int) -> float:
    """Layer ``i``'s part of a step's compute, by parameter count (at least a little)."""
    sizes = [max(1, sum(p.numel() for p in layer.parameters())) for layer in layers]
    return sizes[i] / sum(sizes)


@contextlib.contextmanager
def _buffers_kept(layer: nn.Module):
    """Running statistics (BatchNorm) as they were: a recomputed forward must not move them."""
    kept = [b.clone() for b in layer.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, k in zip(layer.buffers(), kept, strict=True):
                b.copy_(k)


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
        # The loss goes to every worker, so that each sees a divergence at once.
        total = await comm.allreduce(torch.tensor([stats.loss], dtype=torch.float64))
        check_finite(
            total[0].item(), rank=ctx.rank, epoch=ctx.plan.epoch_of(step - 1), step=step - 1
        )
        lr = ctx.set_lr(sharded.optimizer, step - 1)
        await sharded.step()
        ctx.log_train(step, stats, sent=comm.bytes_sent - sent_before, lr=lr)
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
