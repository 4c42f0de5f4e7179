"""Compressed outer gradients (Streaming DiLoCo's 4-bit outer gradients, Douillard et al. 2025,
Section 2.3; INTELLECT-1's int8 ones): each worker's Δ_i = θ − θ_i of a fragment goes through
one of the compression family's compressors, with its error feedback, before it is averaged.

Which compressors fit: quantisers and sparsifiers of one vector (``onebit``, ``qsgd:LEVELS``,
``topk:RATIO``). DGC's momentum correction assumes gradients that an optimiser without momentum
applies every step, and PowerSGD's two-allreduce protocol assumes gradients summed every step;
the outer step has momentum of its own and runs once a round, so both are refused
(:mod:`.checks`). Payloads of these compressors cannot be summed, so they are allgathered, and
every worker decodes and averages them in rank order, as the compressed allreduce of
synchronous SGD does.
"""

from __future__ import annotations

import torch

from ...runtime.base import Comm
from ...training.worker import WorkerContext
from ..compression import layout_of, pack, parse, unpack
from .fragments import Fragment

OUTER_COMPRESSORS = ("onebit", "qsgd", "topk")


class OuterCodec:
    """One fragment's stream of compressed outer gradients on one worker."""

    def __init__(self, ctx: WorkerContext, fragment: Fragment, stream: int) -> None:
        cfg = ctx.config
        spec = parse(cfg.compress)
        seed = (cfg.seed * 1_000_003 + ctx.rank) * 97 + stream  # QSGD's draws: per worker, stream
        layout = layout_of(fragment.tensors)
        self.ctx = ctx
        self.compressor = spec.compressor(
            layout, seed=seed, warmup=False, error_feedback=cfg.error_feedback
        )
        self.memory = spec.memory(error_feedback=cfg.error_feedback)

    async def average(self, comm: Comm, delta: torch.Tensor) -> torch.Tensor:
        """Every living worker's compressed Δ_i, decoded and averaged (collective)."""
        before = comm.bytes_sent
        corrected = self.memory.add(delta)
        payload = self.compressor.encode(corrected)
        sent = self.compressor.decode(payload)
        self.memory.keep(corrected, sent, payload)
        pieces = await comm.allgather(pack(payload))
        alive = comm.survivors()
        total = torch.zeros_like(delta)
        for rank, piece in zip(alive, pieces, strict=True):
            total += sent if rank == comm.rank else self.compressor.decode(unpack(piece, payload))
        dense = comm.allreduce_bytes(delta.numel() * delta.element_size())
        self.ctx.bytes_saved += dense - (comm.bytes_sent - before)
        return total / len(alive)


def outer_codec(ctx: WorkerContext, fragment: Fragment, stream: int) -> OuterCodec | None:
    """The codec of fragment ``stream``'s outer gradients, or None when uncompressed."""
    return None if parse(ctx.config.compress).is_none else OuterCodec(ctx, fragment, stream)
