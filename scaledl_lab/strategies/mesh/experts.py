"""The mesh's ``ep`` dimension: gpt-tiny-moe's experts spread over the ``ep`` ranks, which are
data ranks too (torchtitan's and Megatron-LM's layout: experts borrow the data-parallel ranks).

On ``dp=D,ep=E`` every one of the D·E ranks trains on its own batch with a whole copy of the
non-expert weights (embedding, attention, LayerNorms, routers, head), and holds ``experts / E``
experts of every block: ``ep`` rank r the r-th run of them. Each rank routes its own tokens (the
capacity counted over its own batch, as Switch does, so the twin is the unsplit model trained
data-parallel over the same D·E ranks, each routing its own batch); :class:`Exchange`'s
dispatch all-to-all sends every expert's buffer ``(C, h)`` to the rank that holds the expert,
the expert runs over the buffers of its ``ep`` group's ranks at once, and the combine all-to-all
brings its outputs back. As Megatron's f and g (:mod:`..model_parallel.conjugates`), each
exchange's backward is the other: the combine's gradient goes back to the experts' ranks by the
dispatch's all-to-all pattern and the dispatch's comes home by the combine's (an all-to-all is
its own inverse: member i's j-th chunk becomes member j's i-th).

Gradients: the non-expert weights' are averaged over all D·E data ranks; an expert's already
sums its ``ep`` group's tokens, so it is summed over the D ranks that hold the same expert
(``dp``, none when dp = 1) and divided by D·E, the data ranks whose losses it serves. It composes
with ``dp`` only so far (:func:`.checks.check_ep`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...moe import MoE, combine, dispatch, with_aux_loss
from ...objective import correct_count, model_input, summed_loss
from ...params import flat_grad, write_grads
from ...training.ledger import StepMemory, nbytes, optimizer_state_bytes
from ...training.worker import StepStats, WorkerContext, check_finite, lr_of
from ..model_parallel.parallel_transformer import BACKWARD, FORWARD
from .gather import gather_model
from .grid import Mesh
from .view import GroupComm, mesh_views


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


class Exchange:
    """Dispatch and combine over the ``ep`` group, each an all-to-all of the experts' buffers;
    ``sent``: the bytes its all-to-alls sent (the ``bytes_all_to_all`` column)."""

    def __init__(self, ep: GroupComm, experts: int) -> None:
        self.ep, self.per, self.sent = ep, experts // ep.world_size, 0

    async def _swap(self, t: torch.Tensor) -> torch.Tensor:
        if self.ep.world_size == 1:
            return t
        before = self.ep.bytes_sent
        got = await self.ep.all_to_all(t.contiguous())
        self.sent += self.ep.bytes_sent - before
        return got

    async def dispatch(self, buffers: torch.Tensor) -> torch.Tensor:
        """``(experts, C, h)`` of this rank's tokens → ``(ep, experts/ep, C, h)``: member m's
        buffers of this rank's experts."""
        return await self._swap(buffers.reshape(self.ep.world_size, self.per, *buffers.shape[1:]))

    async def combine(self, out: torch.Tensor) -> torch.Tensor:
        """This rank's experts' outputs ``(ep, experts/ep, C, h)`` → ``(experts, C, h)``: every
        expert's output for this rank's tokens."""
        got = await self._swap(out)
        return got.reshape(-1, *out.shape[2:])

    async def dispatch_backward(self, grad: torch.Tensor) -> torch.Tensor:
        return await self.combine(grad)

    async def combine_backward(self, grad: torch.Tensor) -> torch.Tensor:
        return await self.dispatch(grad)


class ExpertBlock:
    """Block ``index`` of gpt-tiny-moe on one rank: its attention and router whole, its
    mixture's experts ``first`` to ``first + experts/ep``. Forward and backward are written
    out, since the two all-to-alls are awaited between the local graphs."""

    def __init__(self, block: nn.Module, index: int, ep: GroupComm) -> None:
        self.module = copy.deepcopy(block)
        self.moe: MoE = self.module.mlp
        experts = len(self.moe.experts)
        per = experts // ep.world_size
        self.first, self.experts, self.prefix = ep.rank * per, experts, f"blocks.{index}."
        self.moe.experts = nn.ModuleList(list(self.moe.experts)[self.first : self.first + per])
        self.expert_params = list(self.moe.experts.parameters())
        held = {id(p) for p in self.expert_params}
        self.rest = [p for p in self.module.parameters() if id(p) not in held]

    async def forward(
        self, ex: Exchange, x: torch.Tensor, grad: bool, comm: GroupComm, shares: tuple
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        block, moe, n = self.module, self.moe, x.shape[0]
        x = _leaf(x, grad)
        async with comm.compute(n, shares[0] * FORWARD):
            with torch.set_grad_enabled(grad):
                a = x + block.attn(block.ln1(x))
                flat = block.ln2(a).reshape(-1, a.shape[-1])
                routing, aux = moe.routing(flat)
                buffers = dispatch(flat, routing, self.experts)
        got = _leaf(await ex.dispatch(buffers.detach()), grad)  # (ep, per, C, h)
        async with comm.compute(n, shares[1] * FORWARD):
            with torch.set_grad_enabled(grad):
                rows = got.transpose(0, 1).reshape(len(moe.experts), -1, got.shape[-1])
                out = torch.stack([e(rows[j]) for j, e in enumerate(moe.experts)])
                out = out.view(got.shape[1], got.shape[0], *got.shape[2:]).transpose(0, 1)
        back = _leaf(await ex.combine(out.detach()), grad)  # (experts, C, h)
        with torch.set_grad_enabled(grad):
            y = with_aux_loss(combine(back, routing), aux, moe.settings.aux_loss_weight)
            h = a + y.view_as(a)
        saved = {"x": x, "buffers": buffers, "got": got, "out": out, "back": back, "h": h}
        return h.detach(), saved

    async def backward(
        self, ex: Exchange, saved: dict[str, Any], grad: torch.Tensor, comm: GroupComm,
        shares: tuple,
    ) -> torch.Tensor:  # fmt: skip
        n = grad.shape[0]
        (grad_back,) = torch.autograd.grad(saved["h"], saved["back"], grad, retain_graph=True)
        grad_out = await ex.combine_backward(grad_back)
        async with comm.compute(n, shares[1] * BACKWARD):
            inputs = [saved["got"], *self.expert_params]
            torch.autograd.backward(saved["out"], grad_out, inputs=inputs)
        grad_buffers = await ex.dispatch_backward(saved["got"].grad)
        async with comm.compute(n, shares[0] * BACKWARD):
            inputs = [saved["x"], *self.rest]
            torch.autograd.backward([saved["h"], saved["buffers"]], [grad, grad_buffers],
                                    inputs=inputs)  # fmt: skip
        return saved["x"].grad

    def pieces(self, owner: bool) -> list[tuple[str, tuple, torch.Tensor]]:
        """This rank's experts by the unsplit names, and where ``owner`` the rest."""
        out = []
        for name, t in self.module.state_dict().items():
            if name.startswith("mlp.experts."):
                j, _, rest = name.removeprefix("mlp.experts.").partition(".")
                name = f"mlp.experts.{self.first + int(j)}.{rest}"
            elif not owner:
                continue
            out.append((self.prefix + name, (slice(None),), t.detach()))
        return out


def held_parameters(model: nn.Module, ep: int) -> int:
    """The parameters one ``ep`` rank of gpt-tiny-moe holds (a plan's count, the ledger's
    ``mem_params`` over the element size): every non-expert weight, 1/ep of the experts."""
    experts = sum(p.numel() for m in model.modules() if isinstance(m, MoE)
                  for p in m.experts.parameters())  # fmt: skip
    return sum(p.numel() for p in model.parameters()) - experts + experts // ep


def _shares(gpt: nn.Module) -> tuple[float, float, float]:
    """A step's compute per block outside the experts and in them, and the head's, from the
    multiply-accumulates of one sequence (the experts: every place of their buffers)."""
    s, h = gpt.sequence, gpt.embed.token.embedding_dim
    settings = gpt.settings
    places = -(-settings.capacity_factor * s * settings.top_k // settings.experts)
    rest = s * (4 * h * h + h * settings.experts) + 2 * s * s * h
    experts = settings.experts * places * 8 * h * h
    head = s * h * gpt.vocabulary
    total = len(gpt.blocks) * (rest + experts) + head
    return rest / total, experts / total, head / total


class ExpertModel:
    """This rank's gpt-tiny-moe on a ``dp × ep`` mesh, its groups, its optimiser."""

    def __init__(self, ctx: WorkerContext) -> None:
        cfg, comm = ctx.config, ctx.comm
        self.ctx, self.mesh = ctx, Mesh.parse(cfg.mesh)
        view = mesh_views(comm, self.mesh)
        self.dp, self.ep = view["dp"], view["ep"]
        gpt = ctx.build_model()
        self.shapes = {k: v.detach() for k, v in gpt.state_dict().items()}
        self.embed, self.head = gpt.embed, gpt.head
        self.blocks = [ExpertBlock(b, i, self.ep) for i, b in enumerate(gpt.blocks)]
        ctx.moe_loads = [b.moe.load for b in self.blocks]
        self.exchange = Exchange(self.ep, gpt.settings.experts)
        rest, experts, self.head_share = _shares(gpt)
        self.shares = (rest, experts)
        self.rest = [*self.embed.parameters(), *self.head.parameters()]
        self.rest += [p for b in self.blocks for p in b.rest]
        self.experts = [p for b in self.blocks for p in b.expert_params]
        self.optimizer = ctx.make_optimizer(self.rest + self.experts)

    async def forward(self, x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, list[Any]]:
        """The logits of ``x`` (token ids) and what the backward needs."""
        comm = self.dp
        with torch.set_grad_enabled(grad):  # no mode held across an await: ranks share a thread
            embedded = self.embed(model_input(x, self.ctx.device, self.ctx.config.dtype))
        h, saved = embedded, [embedded]
        for block in self.blocks:
            h, kept = await block.forward(self.exchange, h, grad, comm, self.shares)
            saved.append(kept)
        z = _leaf(h, grad)
        async with comm.compute(len(x), self.head_share * FORWARD):
            with torch.set_grad_enabled(grad):
                logits = self.head(z)
        if self.ctx.precision is not None:
            logits = self.ctx.precision.logits(logits)
        return logits, [*saved, z]

    async def train_step(self, x: torch.Tensor, y: torch.Tensor, step: int) -> StepStats:
        ctx, comm = self.ctx, self.dp
        self.exchange.sent = 0
        logits, saved = await self.forward(x, grad=True)
        with torch.enable_grad():
            loss = F.cross_entropy(logits, y)
        z = saved[-1]
        async with comm.compute(len(x), self.head_share * BACKWARD):
            loss.backward(inputs=[z, *self.head.parameters()])
        grad = z.grad
        for block, kept in zip(self.blocks[::-1], saved[-2:0:-1], strict=True):
            grad = await block.backward(self.exchange, kept, grad, comm, self.shares)
        saved[0].backward(grad)  # the embedding
        check_finite(loss.item(), rank=ctx.rank, epoch=ctx.plan.epoch_of(step), step=step)
        world = ctx.comm.world_size  # every rank is a data rank
        flat = flat_grad(self.rest)
        await ctx.comm.allreduce(flat)
        write_grads(self.rest, flat / world)
        flat = flat_grad(self.experts)
        await self._sum_over_replicas(flat)
        write_grads(self.experts, flat / world)
        ctx.set_lr(self.optimizer, step)
        self.optimizer.step()
        params = self.rest + self.experts
        self.step_memory = StepMemory(
            params=nbytes(params), grads=nbytes([p.grad for p in params]),
            optim=optimizer_state_bytes(self.optimizer),
        )  # fmt: skip
        self.optimizer.zero_grad()
        for p in params:
            p.grad = None
        return StepStats(loss.item(), correct_count(logits, y), len(y))

    async def _sum_over_replicas(self, flat: torch.Tensor) -> None:
        """An expert's gradient, summed over the ``dp`` ranks that hold the same experts."""
        if self.dp.world_size > 1:
            await self.dp.allreduce(flat)

    async def evaluate(self, *, epoch: float, step: int) -> None:
        """``dp`` replica 0's ``ep`` group scores val and test, each rank routing the same
        slices of a batch (the experts need every member); rank 0 logs the rows."""
        ctx, cfg = self.ctx, self.ctx.config
        if self.dp.rank != 0:
            return
        for kind, split in (("val", ctx.data.val), ("test", ctx.data.test)):
            loss, hits = 0.0, 0.0
            for start in range(0, len(split), cfg.batch_size):
                part = slice(start, start + cfg.batch_size)
                logits, _ = await self.forward(split.x[part], grad=False)
                y = split.y[part].to(ctx.device)
                loss += summed_loss(logits, y).item()
                hits += correct_count(logits, y)
            if ctx.rank == 0 and len(split):
                ctx.log_eval(kind, epoch, step, loss, hits, len(split))

    async def unsplit(self) -> dict[str, torch.Tensor]:
        """The whole gpt-tiny-moe by its unsplit names, on every rank: ``dp`` replica 0's
        experts, rank 0's other weights."""
        pieces: list[tuple[str, tuple, torch.Tensor]] = []
        if self.dp.rank == 0:
            owner = self.ep.rank == 0
            for prefix, module in (("embed.", self.embed), ("head.", self.head)):
                if owner:
                    pieces += [(prefix + n, (slice(None),), t.detach())
                               for n, t in module.state_dict().items()]  # fmt: skip
            for block in self.blocks:
                pieces += block.pieces(owner)
        return await gather_model(self.ctx.comm, self.shapes, pieces)


async def train(ctx: WorkerContext) -> None:
    """The mesh's program for gpt-tiny-moe (``dp × ep``): every rank a data rank."""
    comm = ctx.comm
    model = ExpertModel(ctx)
    await model.evaluate(epoch=0.0, step=0)
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        stats = await model.train_step(x, y, step)
        step += 1
        sent, lr = comm.bytes_sent - sent_before, lr_of(model.optimizer)
        memory = {**model.step_memory.columns(), "bytes_all_to_all": model.exchange.sent}
        ctx.log_train(step, stats, sent=sent, lr=lr, memory=memory)
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await model.evaluate(epoch=ctx.progress(step), step=step)
    state = await model.unsplit()
    ctx.result["state_dict"] = state if comm.rank == 0 else {}
    ctx.result.update(mesh=str(model.mesh), stage=0, replica=ctx.data_rank)
