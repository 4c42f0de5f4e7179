"""Activation checkpointing of one segment (Chen et al. 2016, "Training Deep Nets with Sublinear
Memory Cost"): forward keeps only the segment's input; backward runs the segment's forward
again, with autograd, and takes the gradients through it at once.

:func:`checkpoint` is an autograd function of the segment's input and parameters, so that
autograd calls its backward where the segment's gradients are due and accumulates them into
the parameters as it would without recomputation (the same kernels on the same values: the
same numbers). The input is saved with ``ctx.save_for_backward``, so the memory ledger's
``saved_tensors_hooks`` count it (:class:`~scaledl_lab.training.ledger.SavedTensors`), and so
are the tensors the recomputed forward saves, while its backward runs: the ledger sees the
checkpoints and one segment's activations at a time. The recomputed forward leaves the
segment's buffers as it found them (:func:`buffers_kept`: BatchNorm's running statistics move
once per forward, as without recomputation), runs under the first forward's autocast, and
notes its share of the model's forward for the simulator's clock
(:mod:`scaledl_lab.runtime.extra_work`).

Which segments a model has, and installing them on a model, is the memory family's
(:mod:`scaledl_lab.strategies.memory.recompute`); tensor parallelism checkpoints its block here,
and selective recomputation attention's core (:func:`checkpoint_function`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from ..runtime import extra_work


@contextlib.contextmanager
def buffers_kept(module: nn.Module) -> Iterator[None]:
    """``module``'s buffers (BatchNorm's running statistics) as they were: a recomputed forward
    must not move them a second time."""
    kept = [b.detach().clone() for b in module.buffers()]
    try:
        yield
    finally:
        with torch.no_grad():
            for b, k in zip(module.buffers(), kept, strict=True):
                b.copy_(k)


class _Checkpoint(torch.autograd.Function):
    """``run(inp)`` keeping only ``inp``; its parameters are inputs, so that a segment whose
    input needs no gradient (the data) still has a backward for its parameters."""

    @staticmethod
    def forward(ctx: Any, run: Callable, owner: nn.Module, share: float, inp, *params):  # type: ignore[override]
        ctx.run, ctx.owner, ctx.share, ctx.params = run, owner, share, params
        device = inp.device.type  # recomputed under the same autocast as the first forward
        ctx.autocast = (device, torch.get_autocast_dtype(device), torch.is_autocast_enabled(device))
        ctx.save_for_backward(inp)  # the checkpoint, counted by the ledger's hooks
        return run(inp)  # autograd is off inside: nothing else is saved

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):  # type: ignore[override]
        (inp,) = ctx.saved_tensors
        needs = ctx.needs_input_grad[3:]  # the input's, then each parameter's
        x = inp.detach().requires_grad_(needs[0])
        device, dtype, enabled = ctx.autocast
        with torch.enable_grad(), torch.autocast(device, dtype, enabled), buffers_kept(ctx.owner):
            out = ctx.run(x)
        extra_work.note_forward(ctx.share)
        wanted = [t for t, need in zip((x, *ctx.params), needs, strict=True) if need]
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        del out  # the recomputed activations go before the next segment's come
        return (None, None, None, *(next(grads) if need else None for need in needs))


# The owner of a function of its input alone (attention's core): no parameters, no buffers.
_NOTHING = nn.Module()


def checkpoint(
    run: Callable[[torch.Tensor], torch.Tensor],
    owner: nn.Module,
    inp: torch.Tensor,
    share: float,
) -> torch.Tensor:
    """``run(inp)``, recomputed in backward instead of keeping what it saves. ``owner`` holds
    the parameters and buffers ``run`` uses; ``share``: its part of one forward of the model
    (for the simulator). Without autograd (evaluation) it is just ``run(inp)``."""
    params = [p for p in owner.parameters() if p.requires_grad]
    if not torch.is_grad_enabled() or not (inp.requires_grad or params):
        return run(inp)
    return _Checkpoint.apply(run, owner, share, inp, *params)


def checkpoint_function(
    run: Callable[[torch.Tensor], torch.Tensor], inp: torch.Tensor, share: float
) -> torch.Tensor:
    """:func:`checkpoint` of a function of ``inp`` alone (no parameters, no buffers):
    selective recomputation's attention core."""
    return checkpoint(run, _NOTHING, inp, share)
