"""The ``cp`` dimension inside a block: the members of a ``cp`` group each hold their positions
of the sequence (:class:`.context.Split`), and everything in a block but attention acts on them
alone (the LayerNorms, the residual adds, the MLP, the Q/K/V and output projections); attention
gathers what it needs from the other members by ring attention (:mod:`.ring`, the zig-zag split)
or Ulysses (:mod:`.context`, the plain split). The block's attention sub-layer is three local
graphs: the QKV projection, the members' attention (its backward written out), the output
projection. The weights are whole on every member: the program sums their gradients over
``cp`` as over ``dp``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ...gpt import Block
from ..model_parallel.parallel_transformer import (
    BACKWARD,
    FORWARD,
    Backward,
    Ledgers,
    ParallelBlock,
)
from .context import Split, scores, ulysses_attention, ulysses_backward
from .ring import Charge, ring_attention, ring_backward
from .view import GroupComm

METHODS = ("ring", "ulysses")


@dataclass(frozen=True)
class Context:
    """The rank's ``cp`` group, the split of the sequence over it and the attention's method."""

    cp: GroupComm
    sequence: int
    method: str

    @property
    def split(self) -> Split:  # ring attention balances its work by the zig-zag split
        return Split(self.sequence, self.cp.world_size, zigzag=self.method == "ring")

    def take(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """This member's positions of ``x`` along ``dim``."""
        return self.split.take(x, self.cp.rank, dim)

    def spread(self, part: torch.Tensor, whole: int) -> torch.Tensor:
        """``part`` (sequence-first, this member's positions) in a zero tensor of ``whole``."""
        out = part.new_zeros((whole, *part.shape[1:]))
        out[self.split.positions(self.cp.rank).to(part.device)] = part
        return out

    def charge(self, comm: Any, batch: int, share: float, heads: int, per_score: int) -> Charge:
        """Ring attention's compute, block by block: ``share`` of a step for this member's
        unmasked scores over the whole sequence (the ring counts ``per_score`` for each)."""
        mine = scores(self.split.positions(self.cp.rank), torch.arange(self.sequence), True)
        rate = share / (mine * batch * heads * per_score)
        return lambda n: comm.compute(batch, rate * n)

    async def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ledger: Any, owner: Any,
        charge: Charge,
    ) -> Any:  # fmt: skip
        """The members' attention; what it keeps for backward counted in ``ledger`` (a
        :class:`~...training.ledger.SavedTensors`) unless ``owner`` is None (no backward)."""
        if self.method == "ulysses":
            count = lambda: ledger.counting(owner)  # noqa: E731
            return await ulysses_attention(self.cp, q, k, v, self.split, True, count)
        out, saved = await ring_attention(self.cp, q, k, v, self.split, True, charge)
        if owner is not None:  # Q, K, V, the output and the log-sum-exp, not the scores
            names = ("q", "k", "v", "out", "lse")
            saved["kept"] = [ledger.keep(saved[n]) for n in names]
        return out, saved

    async def attend_backward(self, saved: Any, grad: torch.Tensor, charge: Charge) -> Any:
        if self.method == "ring":
            return await ring_backward(self.cp, saved, grad, self.split, True, charge)
        return await ulysses_backward(self.cp, saved, grad, self.split)


class ContextBlock(ParallelBlock):
    """A block (``tp``'s slice of it) on this member's positions of the sequence."""

    def __init__(self, block: Block, rank: int, degree: int, context: Context) -> None:
        super().__init__(block, rank, degree)
        self.context = context

    def _split_share(self, share: float) -> tuple[float, float]:
        """``share`` (the attention sub-layer's) as (the two projections', the scores')."""
        s, w = self.context.sequence, self.proj_weight.shape[1]
        linear = s * (self.qkv_weight.numel() + self.proj_weight.numel())
        products = 2 * s * s * w
        return share * linear / (linear + products), share * products / (linear + products)

    async def _charge(self, comm: Any, n: int, share: float) -> None:
        """Ulysses' local attention, charged after it (it overlaps nothing)."""
        if self.context.method == "ulysses":
            async with comm.compute(n, share):
                pass

    async def _attention_forward(
        self, comm: Any, t: dict, n: int, share: float, ledgers: Ledgers, grad: bool
    ) -> None:
        s, b, _ = t["a"].shape
        linear, products = self._split_share(share)

        def counting() -> Any:
            return ledgers.rest.counting(self if grad else None)

        async with comm.compute(n, linear * FORWARD / 2):
            with torch.set_grad_enabled(grad), counting():
                qkv = F.linear(t["a"], self.qkv_weight, self.qkv_bias)
                t["qkv"] = qkv.reshape(s, b, 3, self.heads, -1).permute(2, 1, 3, 0, 4)
        q, k, v = t["qkv"].detach()
        owner = self if grad else None
        charge = self.context.charge(comm, n, products * FORWARD, self.heads, 1)
        heads, t["attention"] = await self.context.attend(q, k, v, ledgers.rest, owner, charge)
        await self._charge(comm, n, products * FORWARD)
        t["heads"] = heads = heads.requires_grad_(grad)
        async with comm.compute(n, linear * FORWARD / 2):
            with torch.set_grad_enabled(grad), counting():
                t["p1"] = F.linear(heads.permute(2, 0, 1, 3).reshape(s, b, -1), self.proj_weight)

    async def _attention_backward(
        self, comm: Any, t: dict, grad: torch.Tensor, n: int, share: float, run: Backward
    ) -> None:
        linear, products = self._split_share(share)
        async with comm.compute(n, linear * BACKWARD / 2):
            run(t["p1"], grad)
        charge = self.context.charge(comm, n, products * BACKWARD, self.heads, 2)
        saved = t.pop("attention")
        dq, dk, dv = await self.context.attend_backward(saved, t["heads"].grad, charge)
        await self._charge(comm, n, products * BACKWARD)
        async with comm.compute(n, linear * BACKWARD / 2):
            run(t["qkv"], torch.stack([dq, dk, dv]))
