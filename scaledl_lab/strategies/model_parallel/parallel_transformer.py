"""Tensor parallelism of whole transformer blocks (Shoeybi et al. 2019, Megatron-LM §3, Fig. 3),
with sequence parallelism (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", §4.2.2).

Layout, degree ``p``, ``w = h / p``. In each block, rank ``r`` owns heads
``r·A/p … (r+1)·A/p − 1``: its rows of Q, K and V in the QKV Linear (column-parallel; the heads
need no communication, each attends on its own), and the matching columns of the output
projection (row-parallel, a partial sum of the output); the MLP as in :mod:`.tensor_parallel`,
its first Linear column-, its second row-parallel. The LayerNorms, the two biases added after a
row-parallel product, the embeddings and the head are replicated.

Communication, per block, around each of the two sub-layers (the program writes them out, since
a ``Comm`` call is awaited):

- f, before: forward identity, backward the allreduce of the input gradients' partial sums;
- g, after: forward the allreduce of the partial outputs, backward identity.

Sequence parallelism splits the rest of the block (the LayerNorms and the residual adds: the
regions that tensor parallelism replicates) along the sequence: rank r holds positions
``r·S/p … (r+1)·S/p − 1`` of the residual stream. f becomes an all-gather along the sequence
(backward: a reduce-scatter) and g a reduce-scatter (backward: an all-gather): a ring
all-gather plus a ring reduce-scatter send the bytes of one ring allreduce, so a block sends
exactly what it sends under tensor parallelism, and every activation the LayerNorm regions save
for backward is 1/p as large. What sequence parallelism adds, outside the blocks: the
replicated embedding's output enters the split (backward: an all-gather of its gradient), the
last block's output is all-gathered for the replicated head (backward: none), and the
parameters of the split regions (LayerNorms, the two biases) get one allreduce of their
gradients per step, since each rank saw only its positions. The whole model, those steps
outside the blocks included, runs on the mesh (``tensor-parallel`` on gpt-tiny is the mesh
``tp=p``): the replicated embedding and head in :mod:`..mesh.layers`, the split regions' sum in
:mod:`..mesh.program`.

Every tensor of a parallel block is sequence-first, ``(S, B, h)``, as Megatron's: a split along
the sequence is then a contiguous chunk, what ``reduce_scatter`` and ``all_gather_into`` take.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ...gpt import Block, causal_attention
from ...runtime.base import Comm
from ...training.ledger import SavedTensors
from ...training.recompute import checkpoint_function
from .conjugates import Exchange

FORWARD, BACKWARD = 1 / 3, 2 / 3  # a step's FLOPs: forward ~1/3, backward ~2/3
Backward = Callable[[torch.Tensor, torch.Tensor], None]  # one local graph's backward


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


@dataclass
class Ledgers:
    """Bytes saved for backward, counted apart for the LayerNorm regions and the rest."""

    norms: SavedTensors = field(default_factory=SavedTensors)
    rest: SavedTensors = field(default_factory=SavedTensors)

    def new_step(self) -> None:
        self.norms.new_step()
        self.rest.new_step()


class ParallelBlock(nn.Module):
    """Rank ``rank``'s part of one pre-LayerNorm block: its heads, its MLP columns, the rest
    replicated."""

    def __init__(self, block: Block, rank: int, degree: int) -> None:
        super().__init__()
        h = block.ln1.normalized_shape[0]
        w, inner = h // degree, block.mlp[0].out_features // degree
        self.heads = block.attn.heads // degree
        self.cols = slice(rank * w, (rank + 1) * w)  # this rank's heads' units of h
        self.inner = slice(rank * inner, (rank + 1) * inner)  # its units of the MLP's 4h
        self.ln1, self.ln2 = copy.deepcopy(block.ln1), copy.deepcopy(block.ln2)
        qkv, proj, up, down = block.attn.qkv, block.attn.proj, block.mlp[0], block.mlp[2]
        rows = [slice(k * h + self.cols.start, k * h + self.cols.stop) for k in range(3)]
        self.qkv_weight = nn.Parameter(torch.cat([qkv.weight[r] for r in rows]).detach().clone())
        self.qkv_bias = nn.Parameter(torch.cat([qkv.bias[r] for r in rows]).detach().clone())
        self.proj_weight = nn.Parameter(proj.weight[:, self.cols].detach().clone())
        self.proj_bias = nn.Parameter(proj.bias.detach().clone())  # replicated, added once
        self.up_weight = nn.Parameter(up.weight[self.inner].detach().clone())
        self.up_bias = nn.Parameter(up.bias[self.inner].detach().clone())
        self.down_weight = nn.Parameter(down.weight[:, self.inner].detach().clone())
        self.down_bias = nn.Parameter(down.bias.detach().clone())  # replicated, added once
        self._rows = rows
        self.selective = getattr(block.attn, "recomputed_core", None) is not None  # selective

    def split_region_parameters(self) -> list[nn.Parameter]:
        """The parameters sequence parallelism's split regions use (whole on every rank)."""
        return [*self.ln1.parameters(), *self.ln2.parameters(), self.proj_bias, self.down_bias]

    def attention_macs(self, s: int) -> int:
        """Multiply-accumulates per sequence of this rank's attention (Linear and products)."""
        return (
            s * (self.qkv_weight.numel() + self.proj_weight.numel())
            + 2 * s * s * (self.proj_weight.shape[1])
        )

    def mlp_macs(self, s: int) -> int:
        return s * (self.up_weight.numel() + self.down_weight.numel())

    def _core(self, qkv: torch.Tensor) -> torch.Tensor:
        """This rank's heads' softmax(QKᵀ)·V, ``(S, B, 3w)`` -> ``(S, B, w)``."""
        s, b, _ = qkv.shape
        q, k, v = (t.reshape(s, b, self.heads, -1).permute(1, 2, 0, 3) for t in qkv.chunk(3, dim=2))
        return causal_attention(q, k, v).permute(2, 0, 1, 3).reshape(s, b, -1)

    def _attention(self, a: torch.Tensor, share: float = 0.0) -> torch.Tensor:
        """The sub-layer; with selective recomputation its core keeps the QKV output only
        (``share``: the sub-layer's part of a step, the core's part of it charged again)."""
        qkv = F.linear(a, self.qkv_weight, self.qkv_bias)
        if not self.selective:
            return F.linear(self._core(qkv), self.proj_weight)
        s = a.shape[0]
        core = share * 2 * s * s * self.proj_weight.shape[1] / self.attention_macs(s)
        return F.linear(checkpoint_function(self._core, qkv, core), self.proj_weight)

    async def _attention_forward(
        self, comm: Comm, t: dict, n: int, share: float, ledgers: Ledgers, grad: bool
    ) -> None:
        """``t["p1"]`` from ``t["a"]``: one local graph here; context parallelism's blocks
        (:mod:`..mesh.context_block`) put the members' exchanges inside."""
        async with comm.compute(n, share * FORWARD):
            with torch.set_grad_enabled(grad), ledgers.rest.counting(self if grad else None):
                t["p1"] = self._attention(t["a"], share)

    async def _attention_backward(
        self, comm: Comm, t: dict, grad: torch.Tensor, n: int, share: float, run: Backward
    ) -> None:
        async with comm.compute(n, share * BACKWARD):
            run(t["p1"], grad)

    def _mlp(self, c: torch.Tensor) -> torch.Tensor:
        return F.linear(F.gelu(F.linear(c, self.up_weight, self.up_bias)), self.down_weight)

    async def forward_async(
        self, ex: Exchange, x: torch.Tensor, shares: tuple[float, float], ledgers: Ledgers,
        *, grad: bool,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
        """The block's output (the rank's positions under sequence parallelism, else whole) and
        the leaves and outputs of its five local graphs, for :meth:`backward`."""
        comm, n = ex.comm, x.shape[1]
        t: dict[str, torch.Tensor] = {"x": x}
        with torch.set_grad_enabled(grad), ledgers.norms.counting(self if grad else None):
            t["h1"] = self.ln1(x)  # LayerNorm region
        t["a"] = _leaf(await ex.f(t["h1"].detach()), grad)
        await self._attention_forward(comm, t, n, shares[0], ledgers, grad)
        t["s1"] = _leaf(await ex.g(t["p1"].detach()), grad)
        with torch.set_grad_enabled(grad), ledgers.norms.counting(self if grad else None):
            t["r1"] = x + t["s1"] + self.proj_bias  # LayerNorm region: residual and LN2
            t["r1_leaf"] = _leaf(t["r1"], grad)
            t["h2"] = self.ln2(t["r1_leaf"])
        t["c"] = _leaf(await ex.f(t["h2"].detach()), grad)
        async with comm.compute(n, shares[1] * FORWARD):
            with torch.set_grad_enabled(grad), ledgers.rest.counting(self if grad else None):
                t["p2"] = self._mlp(t["c"])
        t["s2"] = _leaf(await ex.g(t["p2"].detach()), grad)
        with torch.set_grad_enabled(grad):
            out = t["r1_leaf"] + t["s2"] + self.down_bias
        t["out"] = out
        return out, t

    async def backward(
        self, ex: Exchange, t: dict[str, torch.Tensor], grad_out: torch.Tensor,
        shares: tuple[float, float], run: Backward | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """Accumulate the block's gradients from its output's; return its input's. ``run``
        takes each local graph's backward (a zero-bubble B: into the leaves only, the
        graph kept for the weights' W)."""
        comm, n = ex.comm, t["x"].shape[1]
        run = run or torch.autograd.backward
        run(t["out"], grad_out)  # into r1_leaf, s2 and the bias
        g2 = await ex.g_backward(t["s2"].grad)
        async with comm.compute(n, shares[1] * BACKWARD):
            run(t["p2"], g2)
        run(t["h2"], await ex.f_backward(t["c"].grad))
        run(t["r1"], t["r1_leaf"].grad)  # into x, s1 and the bias
        g1 = await ex.g_backward(t["s1"].grad)
        await self._attention_backward(comm, t, g1, n, shares[0], run)
        run(t["h1"], await ex.f_backward(t["a"].grad))
        return t["x"].grad

    def write_into(self, block: Block) -> list[tuple[torch.Tensor, tuple, torch.Tensor]]:
        """(the unsplit tensor, this rank's index into it, the slice) of every split tensor;
        the replicated ones are copied into ``block`` here."""
        qkv, proj, up, down = block.attn.qkv, block.attn.proj, block.mlp[0], block.mlp[2]
        w = self.cols.stop - self.cols.start
        parts = []
        for k, rows in enumerate(self._rows):
            parts.append((qkv.weight, (rows,), self.qkv_weight[k * w : (k + 1) * w]))
            parts.append((qkv.bias, (rows,), self.qkv_bias[k * w : (k + 1) * w]))
        parts += [
            (proj.weight, (slice(None), self.cols), self.proj_weight),
            (up.weight, (self.inner,), self.up_weight),
            (up.bias, (self.inner,), self.up_bias),
            (down.weight, (slice(None), self.inner), self.down_weight),
        ]
        with torch.no_grad():
            block.ln1.load_state_dict(self.ln1.state_dict())
            block.ln2.load_state_dict(self.ln2.state_dict())
            proj.bias.copy_(self.proj_bias)
            down.bias.copy_(self.down_bias)
        return parts
