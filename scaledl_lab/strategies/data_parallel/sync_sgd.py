"""Synchronous data-parallel SGD: average the workers' gradients with an allreduce every step.

Each worker holds a full replica, computes the gradient of its own mini-batch, and the replicas
stay identical because every worker applies the same averaged gradient (Goyal et al. 2017; the
"global communication pattern" the paper's survey starts from). Two reducers sit side by side:
``NaiveAllreduce`` (flatten everything, one allreduce after backward) and ``BucketedAllreduce``
(start an allreduce per gradient bucket as soon as backward fills it, as DistributedDataParallel
does, so communication overlaps the rest of backward).
"""

from __future__ import annotations

import math
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from ...objective import correct_count
from ...params import grad_or_zeros
from ...runtime.base import Comm, Pending
from ...training.ledger import SavedTensors, nbytes, replica_memory
from ...training.snapshots import save_if_due, start_or_resume
from ...training.worker import StepStats, WorkerContext, check_finite
from ..compression.messages import CompressedAllreduce, spec_of
from ..registry import register


def _scatter_back(flat: torch.Tensor, params: list[nn.Parameter], world_size: int) -> None:
    """Write ``flat`` / world_size (the average over the workers) back into each ``.grad``."""
    offset = 0
    for p in params:
        n = p.numel()
        summed = flat[offset : offset + n].view_as(p)
        if p.grad is None:
            p.grad = summed / world_size
        else:
            torch.div(summed, world_size, out=p.grad)
        offset += n


class NaiveAllreduce:
    """After backward: flatten every gradient (plus the step's stats) into one buffer, one call."""

    def __init__(self, model: nn.Module, comm: Comm) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.comm = comm
        self.flat_bytes = 0

    def buffer_bytes(self) -> int:
        """The flat buffer of the last step (the memory ledger's communication buffers)."""
        return self.flat_bytes

    async def synchronize(self, stats: torch.Tensor) -> torch.Tensor:
        """Average gradients in place; return ``stats`` summed over the workers."""
        grads = [grad_or_zeros(p).reshape(-1) for p in self.params]
        flat = torch.cat(grads + [stats.to(grads[0].device, grads[0].dtype)])
        await self.comm.allreduce(flat)
        self.flat_bytes = flat.numel() * flat.element_size()  # the ledger's buffer
        summed = flat[-len(stats) :].to(stats.device, stats.dtype)
        _scatter_back(flat[: -len(stats)], self.params, self.comm.world_size)
        return summed


def bucket_params(params: list[nn.Parameter], limit: int) -> list[list[nn.Parameter]]:
    """``params`` (in the order backward produces their gradients) in buckets of at most
    ``limit`` bytes, filled in that order: a bucket closes when the next parameter would take
    it past the limit (a parameter larger than the limit has a bucket of its own)."""
    buckets: list[list[nn.Parameter]] = [[]]
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if buckets[-1] and size + nbytes > limit:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += nbytes
    return buckets


TRIAL_STEPS = 4  # steps timed in each mode, after WARMUP_STEPS untimed ones
WARMUP_STEPS = 2


class BucketedAllreduce:
    """Gradients grouped into ~``bucket_mb`` buckets, each reduced as soon as backward fills it.

    Whether overlapping pays (allreduces started from inside backward, competing with it for
    the cores) or not (one blocking allreduce per bucket after backward) depends on the model,
    the batch and the machine, so the run's first steps time both, alternating, and the faster
    one is kept. Both give the same numbers: the same buckets go through the same collectives,
    in the order backward filled them, so ranks that chose differently still pair them up.
    """

    def __init__(self, model: nn.Module, comm: Comm, bucket_mb: float) -> None:
        self.comm = comm
        # Backward produces gradients roughly from the last layer to the first.
        params = [p for p in model.parameters() if p.requires_grad][::-1]
        self.buckets = bucket_params(params, int(bucket_mb * 2**20))
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        # Each bucket's flat buffer, and its parameters' views of it, made at first use.
        self._flat: list[torch.Tensor | None] = [None] * len(self.buckets)
        self._views: list[list[torch.Tensor]] = [[] for _ in self.buckets]
        self._ready = [0] * len(self.buckets)
        # Filled buckets in the order backward filled them: started (overlap) or not yet (None).
        self._pending: dict[int, Pending | None] = {}
        self.reducing = True  # off while accumulating micro-batches: only the last one reduces
        self.overlap = True
        self._timed: dict[bool, list[float]] = {True: [], False: []}
        self._steps = 0
        # The hook holds the reducer weakly: a parameter's hooks live in C++, where Python's
        # garbage collector cannot see the cycle parameter -> hook -> reducer -> parameter, so a
        # strong one kept every run's replicas (models, gradients, buffers, its world) alive.
        reducer = weakref.ref(self)

        def on_grad_ready(p: torch.Tensor) -> None:
            alive = reducer()
            if alive is not None:
                alive._on_grad_ready(p)

        for p in params:
            p.register_post_accumulate_grad_hook(on_grad_ready)

    def buffer_bytes(self) -> int:
        """The buckets' flat buffers (one parameter's bucket is its gradient: nothing more)."""
        return nbytes(self._flat)

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if not self.reducing:
            return
        b = self._bucket_of[id(p)]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._launch(b)

    def _launch(self, b: int) -> None:
        if not self.overlap:  # note the order only: synchronize reduces it after backward
            self._pending[b] = None
            return
        # In the background: a real runtime starts it now; the simulator times it from the
        # point of backward that filled the bucket, so virtual time shows the overlap too.
        self._pending[b] = self.comm.allreduce_background(self._flatten(b))

    def _flatten(self, b: int) -> torch.Tensor:
        """Bucket ``b``'s gradients as one tensor for the allreduce to sum in place; after it,
        each of their ``.grad`` is a view of that tensor, so averaging it in place is all.

        A bucket of one parameter is its gradient itself (nothing copied). Otherwise the
        bucket keeps one flat buffer for the whole run: each gradient is copied into its
        slice (zeros where there is none) and ``.grad`` becomes that slice; a gradient that
        is the slice already (``zero_grad(set_to_none=False)``) is left where it is.
        """
        params = self.buckets[b]
        grad = params[0].grad
        if len(params) == 1 and grad is not None and grad.is_contiguous():
            return grad
        flat = self._flat[b]
        if flat is None:
            sizes = [p.numel() for p in params]
            flat = torch.empty(sum(sizes), dtype=params[0].dtype, device=params[0].device)
            self._flat[b] = flat
            self._views[b] = [v.view_as(p) for v, p in zip(flat.split(sizes), params, strict=True)]
        for p, view in zip(params, self._views[b], strict=True):
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad)
            p.grad = view
        return flat

    async def synchronize(self, stats: torch.Tensor) -> torch.Tensor:
        """Wait for every bucket, average in place; return ``stats`` summed over the workers."""
        for b in range(len(self.buckets)):
            if b not in self._pending:  # parameters that got no gradient this step
                self._launch(b)
        stats_pending = self.comm.allreduce_start(stats) if self.overlap else None
        for b, pending in self._pending.items():
            if pending is None:
                flat = await self.comm.allreduce(self._flatten(b))
            else:
                flat = await pending.wait()
            if self.comm.world_size > 1:  # the average, in place: the .grad are views of it
                flat.div_(self.comm.world_size)
        self._pending.clear()
        self._ready = [0] * len(self.buckets)
        if stats_pending is None:
            return await self.comm.allreduce(stats)
        return await stats_pending.wait()

    async def timed(self, seconds: float) -> None:
        """The last step took ``seconds`` (forward to averaged gradients): while trying both
        modes, note it and switch; after, keep the faster (overlap on a tie, as on the sim).
        Every rank keeps rank 0's choice: ranks that chose differently wait for each other."""
        self._steps += 1
        trial = self._steps - WARMUP_STEPS
        if trial < 0 or trial > 2 * TRIAL_STEPS:
            return
        if trial > 0:
            self._timed[self.overlap].append(seconds)
        if trial < 2 * TRIAL_STEPS:
            self.overlap = trial % 2 == 1
            return
        with_overlap, without = (sorted(self._timed[m])[TRIAL_STEPS // 2] for m in (True, False))
        self.overlap = await self.comm.rank0_choice(with_overlap <= without)


async def forward_backward(
    ctx: WorkerContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    reducer: NaiveAllreduce | BucketedAllreduce,
    x: torch.Tensor,
    y: torch.Tensor,
    saved: SavedTensors | None = None,
) -> StepStats:
    """Gradients of this worker's batch in ``accumulate`` micro-batches (``--accumulate K``):
    each backward adds (1/K)·∇loss, so the sum is the gradient of the whole batch's mean loss.
    Only the last backward starts the bucketed allreduces (as DDP's ``no_sync``)."""
    k = ctx.config.accumulate
    loss_sum, correct = 0.0, 0
    for i, (xm, ym) in enumerate(zip(x.chunk(k), y.chunk(k), strict=True)):
        if isinstance(reducer, BucketedAllreduce):
            reducer.reducing = i == k - 1
        async with ctx.comm.compute(len(ym)):
            if i == 0:
                optimizer.zero_grad()
            with (saved or SavedTensors()).counting(model if saved else None):  # the ledger
                out = model(xm)
                loss = F.cross_entropy(out, ym)
                (loss / k if k > 1 else loss).backward()  # bucketed: allreduces start in here
        loss_sum += loss.item()
        correct += correct_count(out, ym)
    return StepStats(loss_sum / k, correct, len(y))


@register(
    "allreduce",
    "synchronous data parallelism, bucketed gradient allreduce overlapping backward",
)
async def train(ctx: WorkerContext, *, naive: bool = False) -> None:
    """The program one worker runs (Algorithm: synchronous SGD with allreduce)."""
    cfg, comm = ctx.config, ctx.comm
    # The same seed: the same weights on every worker (or a checkpoint's, resumed at ``step``).
    model, optimizer, step = await start_or_resume(ctx)
    spec = spec_of(cfg)
    reducer: NaiveAllreduce | BucketedAllreduce | CompressedAllreduce
    if spec is not None:  # compressed gradients: one reducer for both, after backward
        reducer = CompressedAllreduce(ctx, model, spec)
    elif naive:
        reducer = NaiveAllreduce(model, comm)
    else:
        reducer = BucketedAllreduce(model, comm, cfg.bucket_mb)
    saved = SavedTensors()  # the memory ledger's activations
    for x, y in ctx.local_batches(step):
        sent_before, started = comm.bytes_sent, comm.now()
        saved.new_step()
        stats = await forward_backward(ctx, model, optimizer, reducer, x, y, saved)
        # The loss travels with the gradients so that every worker sees a divergence at once.
        totals = await reducer.synchronize(torch.tensor([stats.loss], dtype=torch.float64))
        if isinstance(reducer, BucketedAllreduce):
            await reducer.timed(comm.now() - started)
        check_finite(totals[0].item(), rank=ctx.rank, epoch=ctx.plan.epoch_of(step), step=step)
        lr = ctx.set_lr(optimizer, step)  # the scheduled rate (constant by default)
        optimizer.step()
        step += 1
        buffers = math.nan if spec is not None else reducer.buffer_bytes()
        memory = replica_memory(model, optimizer, saved, buffers).columns()
        ctx.log_train(step, stats, sent=comm.bytes_sent - sent_before, lr=lr, memory=memory)
        ctx.die_if_killed(step)
        if ctx.is_boundary(step):
            await ctx.evaluate_shared(model, epoch=ctx.progress(step), step=step)
        await save_if_due(ctx, step, model, optimizer)
    if isinstance(reducer, BucketedAllreduce):
        ctx.result["overlap"] = reducer.overlap  # what the first steps' timing chose
    ctx.keep_model(model)


@register("allreduce-naive", "synchronous data parallelism, one flat allreduce after backward")
async def train_naive(ctx: WorkerContext) -> None:
    await train(ctx, naive=True)
