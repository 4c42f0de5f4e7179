"""D-PSGD with compressed messages (after CHOCO-SGD, Koloskova, Stich, Jaggi 2019).

Weights cannot be sparsified or quantised directly, so each worker sends the compressed
*change* of its weights since its previous message, and every worker keeps a public copy x̂ⱼ of
each neighbour (and of itself) built from those messages alone. The gossip step becomes
x_i ← x_i + Σⱼ W_ij x̂ⱼ − x̂_i (consensus step 1), which is D-PSGD's x_i ← Σⱼ W_ij x_j when
nothing is compressed (x̂ = x). With error feedback what a message left out is sent later, so
x̂_i = x_i − residual (CHOCO's compression of x_i − x̂_i); without it x̂ drifts from x (the
scheme of Tang et al. 2018 without its extrapolation). W is doubly stochastic, so the workers'
mean is kept either way.
"""

from __future__ import annotations

import torch
from torch import nn

from ... import topology
from ...params import state_vector
from ...runtime.base import Incoming, Pending
from ...training.worker import WorkerContext
from . import CompressionSpec, pack
from .messages import MessageCodec


def _state_layout(model: nn.Module) -> tuple[tuple[int, ...], ...]:
    """The layout of :func:`~scaledl_lab.params.state_vector`: parameters, floating buffers."""
    tensors = [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]
    return tuple(tuple(t.shape) for t in tensors)


class CompressedGossip:
    """One worker's side of compressed D-PSGD: its codec and the public copies it keeps."""

    def __init__(self, ctx: WorkerContext, model: nn.Module, spec: CompressionSpec) -> None:
        comm = ctx.comm
        self.comm = comm
        topo = ctx.config.resolved_topology
        self.neighbours = topology.neighbours(topo, comm.world_size, comm.rank)
        row = topology.mixing_matrix(topo, comm.world_size)[comm.rank]
        self.members = [comm.rank, *self.neighbours]
        self.weights = [float(row[j]) for j in self.members]
        start = state_vector(model)  # the same on every worker (same seed)
        self.public = {j: start.clone() for j in self.members}
        self.last = start
        self.codec = MessageCodec(
            ctx, spec, _state_layout(model), start.dtype, copies=len(self.neighbours)
        )

    def start(self, x: torch.Tensor) -> CompressedRound:
        """Send the compressed change of ``x`` to the neighbours; post their receives."""
        change, self.last = x - self.last, x.clone()
        wire = pack(self.codec.encode_payload(change))
        buffers = [self.codec.wire_like() for _ in self.neighbours]
        # Receives first, then sends: every worker's sends find their peer's receive posted.
        incoming = [self.comm.irecv(b, j) for b, j in zip(buffers, self.neighbours, strict=True)]
        sends = [self.comm.isend(wire, j) for j in self.neighbours]
        self.public[self.comm.rank] += self.codec.decoded
        return CompressedRound(self, x, incoming, sends)


class CompressedRound:
    """A started round; :meth:`finish` gives x_i + Σⱼ W_ij x̂ⱼ − x̂_i."""

    def __init__(
        self,
        gossip: CompressedGossip,
        x: torch.Tensor,
        incoming: list[Incoming],
        sends: list[Pending],
    ) -> None:
        self.gossip, self.x, self.incoming, self.sends = gossip, x, incoming, sends

    async def finish(self) -> torch.Tensor:
        g = self.gossip
        for j, incoming in zip(g.neighbours, self.incoming, strict=True):
            g.public[j] += g.codec.decode(await incoming.wait())
        for pending in self.sends:
            await pending.wait()
        mixed = self.x - g.public[g.comm.rank]
        for j, w in zip(g.members, g.weights, strict=True):
            mixed.add_(g.public[j], alpha=w)
        return mixed
