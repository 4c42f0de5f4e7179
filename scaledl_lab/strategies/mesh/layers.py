"""gpt-tiny's layers on one rank of the mesh, each written once for any ``tp``: the replicated
embedding and head, and each block sliced over the ``tp`` group (Megatron-LM's layout and its
f and g operators, :mod:`..model_parallel.parallel_transformer`, run over the group instead of
the world; ``--sequence-parallel`` splits the residual stream along the sequence between them).

Every layer takes and returns sequence-first ``(S, B, h)`` activations (with sequence
parallelism, its rank's ``S/tp`` positions), so a pipeline sends what lies between two layers
as it is, and its backward is written out (``forward`` returns what ``backward`` needs) since a
collective is awaited. ``recompute`` keeps only a block's input and runs its forward again,
collectives and all, just before its backward (Megatron's full recomputation); the embedding and
the head keep what they save. ``unit``, a ZeRO-3 flat shard of the layer's parameters over
``dp``, is gathered by the stage before each computation and freed after.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...gpt import GPT
from ..model_parallel.conjugates import Exchange
from ..model_parallel.parallel_transformer import BACKWARD, FORWARD, Ledgers, ParallelBlock
from .context_block import Context, ContextBlock
from .view import GroupComm

Piece = tuple[str, tuple, torch.Tensor]  # (unsplit name, index into it, this rank's values)
# Zero bubble's split, charged as the pipeline strategy ``zb-h1`` charges it: F, B and W a
# third of a layer's step each (B the half of BACKWARD that is not W).
W = BACKWARD / 2


def _b(weights: bool) -> float:
    """The backward's share of a layer's step: all of BACKWARD, or zero bubble's B."""
    return BACKWARD if weights else BACKWARD - W


@dataclass
class Dims:
    """What a layer needs of the mesh: the ``tp`` group, and how the step runs."""

    tp: GroupComm
    sequence_parallel: bool
    recompute: bool
    ledgers: Ledgers
    context: Context | None = None  # cp: this rank's positions of the sequence, its group

    @property
    def exchange(self) -> Exchange:
        return Exchange(self.tp, self.sequence_parallel)  # type: ignore[arg-type]

    def positions(self, s: int) -> slice:
        chunk = s // self.tp.world_size
        return slice(self.tp.rank * chunk, (self.tp.rank + 1) * chunk)


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(grad)


class _Replicated:
    """A layer whole on every ``tp`` rank: zero bubble's W of its weights (the batch is the
    second size of ``saved[BATCH]``), and its parameters, kept by one rank."""

    module: nn.Module
    share: float
    prefix: str
    BATCH = "out"

    async def weights(self, dims: Dims, saved: Any) -> None:
        async with dims.tp.compute(saved[self.BATCH].shape[1], self.share * W):
            saved["deferred"].weights(self.module)

    def pieces(self, owner: bool) -> list[Piece]:
        return _whole(self.prefix, self.module) if owner else []


class Embedding(_Replicated):
    """Token and position embeddings, replicated over ``tp``; enters the sequence split."""

    def __init__(self, gpt: GPT, share: float) -> None:
        self.module, self.share, self.prefix = copy.deepcopy(gpt.embed), share, "embed."
        self.unit: Any = None

    async def forward(self, dims: Dims, idx: torch.Tensor, grad: bool) -> tuple[torch.Tensor, Any]:
        async with dims.tp.compute(len(idx), self.share * FORWARD):
            with torch.set_grad_enabled(grad):
                embedded = self.module(idx).transpose(0, 1)  # (S, B, h)
        x = embedded.detach()
        if dims.sequence_parallel:  # a copy: only its positions stay alive
            x = x[dims.positions(x.shape[0])].clone()
        if dims.context is not None:  # cp: this rank's positions of the sequence
            x = dims.context.take(x, 0)
        return x, {"out": embedded}

    async def backward(
        self, dims: Dims, saved: Any, grad: torch.Tensor, weights: bool = True
    ) -> None:
        if dims.sequence_parallel:
            grad = await dims.exchange.all_gather(grad)  # every rank's positions
        if dims.context is not None:  # the other positions are other cp ranks' to send back
            grad = dims.context.spread(grad, saved["out"].shape[0])
        async with dims.tp.compute(grad.shape[1], self.share * _b(weights)):
            Deferred.run(saved, [], weights)(saved["out"], grad)  # no input gradient


class Head(_Replicated):
    """The final LayerNorm and the vocabulary projection, replicated over ``tp``; leaves the
    sequence split. Its output is the logits ``(B, V, S)``; the stage makes it the loss."""

    BATCH = "z"

    def __init__(self, gpt: GPT, share: float) -> None:
        self.module, self.share, self.prefix = copy.deepcopy(gpt.head), share, "head."
        self.unit: Any = None

    async def forward(self, dims: Dims, x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, Any]:
        if dims.sequence_parallel:
            x = await dims.exchange.all_gather(x.detach())
        z = _leaf(x, grad)
        async with dims.tp.compute(z.shape[1], self.share * FORWARD):
            with torch.set_grad_enabled(grad):
                logits = self.module(z.transpose(0, 1))
        return logits, {"z": z, "out": logits}

    async def backward(
        self, dims: Dims, saved: Any, grad: torch.Tensor | None, weights: bool = True
    ) -> torch.Tensor:
        z = saved["z"]
        async with dims.tp.compute(z.shape[1], self.share * _b(weights)):
            Deferred.run(saved, [z], weights)(saved["out"], grad)  # None: "out" is the loss
        grad_in = z.grad
        if dims.sequence_parallel:  # the head is replicated: this rank's positions, no sum
            grad_in = grad_in[dims.positions(grad_in.shape[0])].contiguous()
        return grad_in


class Block:
    """Block ``index``: this rank's heads and MLP columns (:class:`ParallelBlock` over ``tp``)."""

    def __init__(
        self, gpt: GPT, index: int, tp: GroupComm, shares: tuple[float, float],
        context: Context | None = None,
    ) -> None:  # fmt: skip
        self.unsplit = gpt.blocks[index]
        self.module = (
            ParallelBlock(self.unsplit, tp.rank, tp.world_size)
            if context is None
            else ContextBlock(self.unsplit, tp.rank, tp.world_size, context)
        )
        self.shares, self.prefix = shares, f"blocks.{index}."
        self.unit: Any = None
        self.bytes_sent = 0  # by f and g (and their sequence-parallel forms) since reset

    async def forward(self, dims: Dims, x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, Any]:
        before = dims.tp.bytes_sent
        if dims.recompute and grad:  # keep the input only
            out, _ = await self._run(dims, _leaf(x, False), grad=False)
            self.bytes_sent += dims.tp.bytes_sent - before
            return out, {"x": x.detach()}
        out, saved = await self._run(dims, _leaf(x, grad), grad=grad)
        self.bytes_sent += dims.tp.bytes_sent - before
        return out, saved

    async def _run(self, dims: Dims, x: torch.Tensor, grad: bool) -> tuple[torch.Tensor, Any]:
        return await self.module.forward_async(
            dims.exchange, x, self.shares, dims.ledgers, grad=grad
        )

    async def backward(
        self, dims: Dims, saved: Any, grad: torch.Tensor, weights: bool = True
    ) -> torch.Tensor:
        kept, before = saved, dims.tp.bytes_sent  # kept: where W finds its graphs
        if dims.recompute:  # the forward again, its collectives too, then its backward
            _, saved = await self._run(dims, _leaf(saved["x"], True), grad=True)
        leaves = [saved[k] for k in ("x", "a", "s1", "r1_leaf", "c", "s2")]
        run = Deferred.run(kept, leaves, weights)
        # zero bubble's B: a third of the step (BACKWARD's half), W the other third
        shares = self.shares if weights else (self.shares[0] / 2, self.shares[1] / 2)
        grad_in = await self.module.backward(dims.exchange, saved, grad, shares, run)
        self.bytes_sent += dims.tp.bytes_sent - before
        return grad_in

    async def weights(self, dims: Dims, saved: Any) -> None:
        async with dims.tp.compute(saved["x"].shape[1], sum(self.shares) * W):
            saved["deferred"].weights(self.module)

    def pieces(self, owner: bool) -> list[Piece]:
        """The tp slices of this rank (every rank has its own), and the replicated tensors
        (LayerNorms, the two biases added after a sum) where ``owner``."""
        scratch = copy.deepcopy(self.unsplit)  # write_into copies the replicated ones into it
        names = {id(t): n for n, t in scratch.named_parameters()}
        parts = self.module.write_into(scratch)
        split = {id(target) for target, _, _ in parts}
        out = [(self.prefix + names[id(t)], index, s.detach()) for t, index, s in parts]
        if owner:
            out += [
                (self.prefix + n, (slice(None),), t.detach())
                for n, t in scratch.named_parameters()
                if id(t) not in split
            ]
        return out


class Deferred:
    """Zero bubble's split of a layer's backward (Qi et al. 2023): B runs each local graph
    into its leaves only (the input's gradient, and those the layer passes on), keeping the
    graphs; W, later, runs them into the weights. Each weight hangs from one graph, so the
    gradients are the whole backward's."""

    def __init__(self, leaves: list[torch.Tensor]) -> None:
        self.leaves = [t for t in leaves if t.requires_grad]
        self.graphs: list[tuple[torch.Tensor, torch.Tensor | None]] = []

    @staticmethod
    def run(saved: Any, leaves: list[torch.Tensor], weights: bool) -> Any:
        """The backward of one graph: whole (``weights``), else B's, W's kept in ``saved``."""
        if weights:
            return torch.autograd.backward
        saved["deferred"] = deferred = Deferred(leaves)
        return deferred

    def __call__(self, tensor: torch.Tensor, grad: torch.Tensor | None) -> None:
        self.graphs.append((tensor, grad))
        if self.leaves:
            torch.autograd.backward(tensor, grad, inputs=self.leaves, retain_graph=True)

    def weights(self, module: nn.Module) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        for tensor, grad in self.graphs:
            torch.autograd.backward(tensor, grad, inputs=params)
        self.graphs.clear()


def _whole(prefix: str, module: nn.Module) -> list[Piece]:
    return [(prefix + n, (slice(None),), t.detach()) for n, t in module.state_dict().items()]


def build(
    gpt: GPT, tp: GroupComm, context: Context | None = None
) -> list[Embedding | Block | Head]:
    """gpt-tiny's layers in order, this rank's part of each; shares of a step's compute from
    the unsplit model's multiply-accumulates, as tensor parallelism charges them (with ``cp``,
    of this rank's positions: 1/C of the sequence)."""
    s = gpt.sequence
    part = 1 if context is None else context.cp.world_size
    total = sum(m.weight.numel() for m in gpt.modules() if isinstance(m, nn.Linear)) * s
    total += sum(2 * s * s * b.attn.proj.in_features for b in gpt.blocks)
    blocks = []
    for i in range(len(gpt.blocks)):
        block = Block(gpt, i, tp, (0.0, 0.0), context)
        module = block.module
        block.shares = (module.attention_macs(s) / total / part, module.mlp_macs(s) / total / part)
        blocks.append(block)
    head_share = s * gpt.head.out.weight.numel() / total / part
    return [Embedding(gpt, 0.0), *blocks, Head(gpt, head_share)]
