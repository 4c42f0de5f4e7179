"""Ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers"): each of the
C members keeps its queries; the key/value blocks travel round the ring, one hop a step, while
the member attends to the block it holds; the softmax is merged online (FlashAttention's running
max m and sum l: a new block rescales what came before by exp(m_old − m_new)).

The backward is FlashAttention's, by blocks: with the forward's log-sum-exp, each block's
probabilities are exp(s − lse) again; the query's gradient stays, and each key/value block's
gradient travels round the ring behind its block, gathering every member's share, until it
comes home. Each step of either pass posts its exchanges before attending to the block it holds
(the forward: the next block; the backward: the next block, and the held block's dK/dV from the
members before, wanted only once this member's share is added), so the transfers hide behind
the block's attention where that takes longer; the backward sends each sum on once it has it.
What nothing hides: the last hop of dK/dV home, after the last block's work. The causal mask
between any two members' pieces comes from their positions (:class:`.context.Split`); a block
wholly in the future is skipped.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import torch

from .context import Split, causal_mask, scores

Charge = Callable[[int], AbstractAsyncContextManager[Any]]  # a block of n scores' compute


def _free(n: int) -> AbstractAsyncContextManager[Any]:
    return contextlib.nullcontext()  # type: ignore[return-value]


def _scores(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return s if mask is None else s.masked_fill(mask, float("-inf"))


def _block(
    split: Split, me: int, owner: int, causal: bool
) -> tuple[torch.Tensor | None, int, bool]:
    """The mask of member ``me``'s queries against ``owner``'s keys, their scores, and
    whether the block is wholly in the future (skipped)."""
    qpos, kpos = split.positions(me), split.positions(owner)
    mask = causal_mask(qpos, kpos) if causal else None
    return mask, scores(qpos, kpos, causal), mask is not None and bool(mask.all())


async def ring_attention(
    comm: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    split: Split,
    causal: bool,
    charge: Charge = _free,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """This member's attention output ``(B, H, S/C, d)`` from its ``q``, ``k``, ``v`` (its
    positions of the split), and what :func:`ring_backward` needs; ``saved["scores"]`` counts
    the attention scores it computed (its work)."""
    c, me = comm.world_size, comm.rank
    q = q.detach()
    b, h, s, _ = q.shape
    m = torch.full((b, h, s), float("-inf"), dtype=q.dtype, device=q.device)
    l_sum = torch.zeros_like(m)
    o = torch.zeros_like(q)
    block, count = torch.stack([k.detach(), v.detach()]), 0
    for t in range(c):
        if t < c - 1:  # the next block is on its way while this one is attended to
            incoming = comm.irecv(torch.empty_like(block), (me - 1) % c)
            sent = comm.isend(block, (me + 1) % c)
        mask, n, skip = _block(split, me, (me - t) % c, causal)
        if not skip:
            async with charge(n * b * h):
                sc = _scores(q, block[0], mask)
                m_new = torch.maximum(m, sc.amax(-1))
                p = torch.exp(sc - m_new[..., None])
                rescale = torch.exp(m - m_new)
                l_sum = l_sum * rescale + p.sum(-1)
                o = o * rescale[..., None] + p @ block[1]
                m = m_new
            count += n * b * h
        if t < c - 1:
            await sent.wait()
            block = await incoming.wait()
    out = o / l_sum[..., None]
    saved = {"q": q, "k": k.detach(), "v": v.detach(), "out": out, "scores": count}
    saved["lse"] = m + torch.log(l_sum)
    return out, saved


async def ring_backward(
    comm: Any,
    saved: dict[str, Any],
    grad: torch.Tensor,
    split: Split,
    causal: bool,
    charge: Charge = _free,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of this member's q, k, v from its output's gradient ``grad``."""
    c, me = comm.world_size, comm.rank
    q, lse, scale = saved["q"], saved["lse"], 1 / math.sqrt(saved["q"].shape[-1])
    b, h = q.shape[:2]
    delta = (grad * saved["out"]).sum(-1)  # D = rowsum(dO ∘ O)
    dq = torch.zeros_like(q)
    block = torch.stack([saved["k"], saved["v"]])
    sent_grad: Any = None
    for t in range(c):
        # Posted before this block's gradients, in the order the neighbour sends: the held
        # block's (dK, dV) so far (sent after its last block's work), then the next block.
        if t > 0:
            incoming_grad = comm.irecv(torch.empty_like(block), (me - 1) % c)
        if t < c - 1:
            incoming = comm.irecv(torch.empty_like(block), (me - 1) % c)
            sent = comm.isend(block, (me + 1) % c)
        mask, n, skip = _block(split, me, (me - t) % c, causal)
        mine = torch.zeros_like(block)
        if not skip:
            async with charge(2 * n * b * h):
                p = torch.exp(_scores(q, block[0], mask) - lse[..., None])
                mine[1] = p.transpose(-2, -1) @ grad
                ds = p * (grad @ block[1].transpose(-2, -1) - delta[..., None])
                dq += ds @ block[0] * scale
                mine[0] = ds.transpose(-2, -1) @ q * scale
        if c == 1:
            return dq, mine[0], mine[1]
        # The earlier members' shares arrived during this block's work; with mine added they
        # go on to the next member (after the last block: the hop home, which nothing hides).
        done = mine if t == 0 else await incoming_grad.wait() + mine
        if sent_grad is not None:
            await sent_grad.wait()
        sent_grad = comm.isend(done, (me + 1) % c)
        if t < c - 1:
            await sent.wait()
            block = await incoming.wait()
    home = await comm.irecv(torch.empty_like(block), (me - 1) % c).wait()  # my block's, whole
    await sent_grad.wait()
    return dq, home[0], home[1]
