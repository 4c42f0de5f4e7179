"""Context parallelism's split of the sequence, and Ulysses (Jacobs et al. 2023, DeepSpeed-
Ulysses): attention over a sequence split across the C members of a group.

Every member holds the queries, keys and values of its own positions, ``(B, H, S/C, d)``.
:class:`Split` says which: the plain split gives member r the r-th of C chunks; the zig-zag
split (Llama 3's and Megatron-LM's) cuts the sequence into 2C chunks and gives member r chunks
r and 2C − 1 − r, so that under a causal mask every member has the same work (:func:`work`).

Ulysses trades the sequence split for a split of the heads: an all-to-all gives each member
every position of H/C heads, it attends over the whole sequence for those heads, and a second
all-to-all gives the output back by positions. Its backward is the same two exchanges the other
way round (the gradient of an all-to-all is the inverse all-to-all) around the local attention's
own backward. Ring attention, which keeps the queries and passes the keys and values round the
members, is in :mod:`.ring`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch

from ...errors import ConfigError


@dataclass(frozen=True)
class Split:
    """``sequence`` positions over ``members``: member r's positions, in the order it holds
    them (zig-zag: chunk r, then chunk 2C − 1 − r of 2C)."""

    sequence: int
    members: int
    zigzag: bool = True

    def __post_init__(self) -> None:
        chunks = 2 * self.members if self.zigzag else self.members
        if self.sequence % chunks:
            how = f"2C = {chunks} zig-zag chunks" if self.zigzag else f"C = {chunks} chunks"
            raise ConfigError(
                f"context parallelism over {self.members} ranks splits the sequence into {how}: "
                f"a sequence of {self.sequence} does not divide by {chunks}"
            )

    def positions(self, member: int) -> torch.Tensor:
        """The sequence positions member ``member`` holds (a long tensor of S/C)."""
        c = self.members
        if not self.zigzag:
            size = self.sequence // c
            return torch.arange(member * size, (member + 1) * size)
        size = self.sequence // (2 * c)
        first, second = member * size, (2 * c - 1 - member) * size
        return torch.cat([torch.arange(first, first + size), torch.arange(second, second + size)])

    def take(self, x: torch.Tensor, member: int, dim: int) -> torch.Tensor:
        """Member ``member``'s positions of ``x`` along ``dim`` (a copy)."""
        return x.index_select(dim, self.positions(member).to(x.device))

    def order(self) -> torch.Tensor:
        """Where each position lies in the members' pieces laid end to end: the inverse
        permutation that puts them back in sequence order."""
        return torch.cat([self.positions(m) for m in range(self.members)]).argsort()


def scores(q_positions: torch.Tensor, k_positions: torch.Tensor, causal: bool) -> int:
    """Attention scores a block of queries computes against a block of keys: those the causal
    mask keeps (a kernel skips the masked ones), all of them without it."""
    if not causal:
        return len(q_positions) * len(k_positions)
    return int((k_positions[None, :] <= q_positions[:, None]).sum())


def work(split: Split, causal: bool = True) -> list[int]:
    """Each member's attention scores over the whole sequence: its queries against every key.
    Under a causal mask the plain split's last member has about 2C − 1 times the first's;
    the zig-zag split's members have the same."""
    everything = torch.arange(split.sequence)
    return [scores(split.positions(m), everything, causal) for m in range(split.members)]


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """softmax(QKᵀ/√d, masked where ``mask`` is True)·V, the explicit form gpt.py uses."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return (s if mask is None else s.masked_fill(mask, float("-inf"))).softmax(-1) @ v


def causal_mask(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """True where a query may not see a key: the key comes later in the sequence."""
    return k_positions[None, :] > q_positions[:, None]


# -- Ulysses --------------------------------------------------------------------------------


async def _to_heads(comm: Any, x: torch.Tensor, split: Split) -> torch.Tensor:
    """(n, B, H, S/C, d) of this member's positions → (n, B, H/C, S, d) of its heads, in
    sequence order: head group i goes to member i, member j's positions come back from it."""
    c = comm.world_size
    n, b, h, s, d = x.shape
    parts = x.reshape(n, b, c, h // c, s, d).permute(2, 0, 1, 3, 4, 5).contiguous()
    got = await comm.all_to_all(parts)  # (C, n, B, H/C, S/C, d): the j-th from member j
    whole = got.permute(1, 2, 3, 0, 4, 5).reshape(n, b, h // c, c * s, d)
    return whole.index_select(3, split.order().to(x.device))


async def _to_positions(comm: Any, x: torch.Tensor, split: Split) -> torch.Tensor:
    """The inverse of :func:`_to_heads`: (n, B, H/C, S, d) → (n, B, H, S/C, d)."""
    c = comm.world_size
    n, b, hc, _, d = x.shape
    parts = torch.stack([split.take(x, m, 3) for m in range(c)])  # (C, n, B, H/C, S/C, d)
    got = await comm.all_to_all(parts)  # the i-th: head group i of my positions
    return got.permute(1, 2, 0, 3, 4, 5).reshape(n, b, c * hc, -1, d)


async def ulysses_attention(
    comm: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, split: Split, causal: bool,
    counting: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
) -> tuple[torch.Tensor, dict[str, Any]]:  # fmt: skip
    """Attention of this member's positions over the whole sequence (Ulysses): ``q``, ``k``,
    ``v`` are ``(B, H, S/C, d)``; H must divide by C. Returns the output, ``(B, H, S/C, d)``,
    and what :func:`ulysses_backward` needs (and ``scores``, the attention scores computed).
    ``counting``: a ledger's count of what the local attention saves for backward."""
    if q.shape[1] % comm.world_size:
        raise ConfigError(
            f"Ulysses gives each of the {comm.world_size} context-parallel ranks H/C heads: "
            f"{q.shape[1]} heads do not divide by {comm.world_size} (use ring attention)"
        )
    qh, kh, vh = (t.detach().requires_grad_() for t in await _to_heads(comm, _qkv(q, k, v), split))
    everything = torch.arange(split.sequence, device=q.device)
    mask = causal_mask(everything, everything) if causal else None
    with torch.enable_grad(), counting():
        out = attention(qh, kh, vh, mask)
    mine = await _to_positions(comm, out.detach()[None], split)
    count = scores(everything, everything, causal) * qh.shape[0] * qh.shape[1]
    return mine[0], {"leaves": (qh, kh, vh), "out": out, "scores": count}


async def ulysses_backward(
    comm: Any, saved: dict[str, Any], grad: torch.Tensor, split: Split
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of this member's q, k, v from its output's gradient ``grad``."""
    grad_heads = (await _to_heads(comm, grad[None], split))[0]
    leaves = saved["leaves"]
    dq, dk, dv = torch.autograd.grad(saved["out"], leaves, grad_heads)
    back = await _to_positions(comm, torch.stack([dq, dk, dv]), split)
    return back[0], back[1], back[2]


def _qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.stack([q.detach(), k.detach(), v.detach()])  # one all-to-all for the three
