"""Compressed gradient messages: how each family sends what a compressor produced
(Seide et al. 2014; Alistarh et al. 2017; Lin et al. 2018; Vogels et al. 2019).

- :class:`CompressedAllreduce` (``allreduce``, ``allreduce-naive``): payloads that cannot be
  summed (bits, levels, top-k values and indices) are allgathered and every worker decodes and
  averages all of them in rank order; PowerSGD's P (with the uncompressed vectors) and then its
  Q are summed by two allreduces, as in Vogels et al.'s Algorithm 1;
- :class:`MessageCodec`: one stream of messages of a fixed size (NNT's gradient to its
  neighbours) or of any size (a parameter-server push, :class:`PushCodec`, one per shard).

Each keeps its worker's error feedback and counts the bytes it saves into ``ctx.bytes_saved``
(what the dense messages would have sent minus what was sent), so that train rows carry both.
"""

from __future__ import annotations

import torch
from torch import nn

from ...config import ExperimentConfig
from ...models import build_model
from ...params import flat_grad, write_grads
from ...training.worker import WorkerContext, load_for
from . import (
    CompressionSpec,
    Compressor,
    ErrorFeedback,
    Layout,
    Payload,
    PowerSGD,
    layout_of,
    momentum_correction,
    pack,
    parse,
    payload_bytes,
    shard_layouts,
    unpack,
)


def spec_of(cfg: ExperimentConfig) -> CompressionSpec | None:
    """The run's compression, or None without (the strategies' uncompressed code paths)."""
    spec = parse(cfg.compress)
    return None if spec.is_none else spec


def _compressor(
    ctx: WorkerContext, spec: CompressionSpec, layout: Layout, stream: int, warmup: bool
) -> Compressor:
    # PowerSGD's first Q must be equal on every worker (its P are summed); QSGD's draws are
    # independent per worker and per stream.
    cfg = ctx.config
    seed = cfg.seed if spec.name == "powersgd" else (cfg.seed * 1_000_003 + ctx.rank) * 97 + stream
    return spec.compressor(layout, seed=seed, warmup=warmup, error_feedback=cfg.error_feedback)


def _memory(ctx: WorkerContext, spec: CompressionSpec) -> ErrorFeedback:
    cfg = ctx.config
    return spec.memory(
        error_feedback=cfg.error_feedback,
        momentum=momentum_correction(cfg),
        world_size=ctx.world_size,
    )


class CompressedAllreduce:
    """Synchronous SGD's reducer with a compressor: average the workers' compressed gradients.

    Same interface as the uncompressed reducers of :mod:`..data_parallel.sync_sgd`: after backward,
    ``synchronize(stats)`` leaves the average in every ``.grad`` and returns ``stats`` summed.
    """

    def __init__(self, ctx: WorkerContext, model: nn.Module, spec: CompressionSpec) -> None:
        self.ctx, self.comm = ctx, ctx.comm
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.compressor = _compressor(ctx, spec, layout_of(self.params), 0, warmup=True)
        self.memory = _memory(ctx, spec)
        self.is_low_rank = spec.name == "powersgd"
        self.step = 0

    async def synchronize(self, stats: torch.Tensor) -> torch.Tensor:
        flat = flat_grad(self.params)
        self.compressor.set_epoch(self.step / self.ctx.steps_per_epoch)
        self.step += 1
        before = self.comm.bytes_sent
        mean = await (self._low_rank(flat) if self.is_low_rank else self._gather(flat))
        dense = self.comm.allreduce_bytes(flat.numel() * flat.element_size())
        self.ctx.bytes_saved += dense - (self.comm.bytes_sent - before)
        write_grads(self.params, mean)
        return await self.comm.allreduce(stats)

    async def _gather(self, flat: torch.Tensor) -> torch.Tensor:
        """Allgather every worker's payload; decode and average them in rank order."""
        corrected = self.memory.add(flat)
        payload = self.compressor.encode(corrected)
        sent = self.compressor.decode(payload)
        self.memory.keep(corrected, sent, payload)
        pieces = await self.comm.allgather(pack(payload))
        total = torch.zeros_like(flat)
        for rank, piece in enumerate(pieces):
            total += (
                sent if rank == self.comm.rank else self.compressor.decode(unpack(piece, payload))
            )
        return total / self.comm.world_size

    async def _low_rank(self, flat: torch.Tensor) -> torch.Tensor:
        """PowerSGD: allreduce P (and the uncompressed vectors), orthonormalise, allreduce Q.
        Each worker's error feedback keeps what its own approximation P̂ Qᵢᵀ left out."""
        c, n = self.compressor, self.comm.world_size
        assert isinstance(c, PowerSGD)
        corrected = self.memory.add(flat)
        mats, raw = c.split(corrected)
        p = c.p_stage(mats)
        first = torch.cat([p, raw])
        await self.comm.allreduce(first)
        p_hat = c.orthonormalise(first[: p.numel()])
        q = c.q_stage(mats, p_hat)
        self.memory.keep(corrected, c.assemble(p_hat, q, raw), {})
        if q.numel():
            await self.comm.allreduce(q)
        q /= n
        c.remember(q)
        return c.assemble(p_hat, q, first[p.numel() :] / n)


class MessageCodec:
    """One stream of compressed messages with its error feedback.

    ``copies``: the receivers of each message (NNT: the neighbours), for the byte count.
    ``warmup``: DGC's sparsity warm-up changes the size of messages, so only streams whose
    receivers take any size (parameter-server calls) warm up; fixed-size streams start at the
    target density.
    """

    def __init__(
        self,
        ctx: WorkerContext,
        spec: CompressionSpec,
        layout: Layout,
        dtype: torch.dtype,
        *,
        stream: int = 0,
        copies: int = 1,
        warmup: bool = False,
    ) -> None:
        self.ctx, self.copies = ctx, copies
        self.compressor = _compressor(ctx, spec, layout, stream, warmup)
        self.memory = _memory(ctx, spec)
        # The payload's structure, from a throwaway compressor (encoding moves state).
        probe = spec.compressor(layout, warmup=False)
        self.like = probe.encode(torch.zeros(probe.numel, dtype=dtype))
        self.sent = 0  # messages encoded

    def encode_payload(self, flat: torch.Tensor) -> Payload:
        """The next message's payload (error feedback applied), counted as ``copies`` sends."""
        self.compressor.set_epoch(self.sent / self.ctx.steps_per_epoch)
        self.sent += 1
        corrected = self.memory.add(flat)
        payload = self.compressor.encode(corrected)
        self.decoded = self.compressor.decode(payload)  # what the receivers will decode
        self.memory.keep(corrected, self.decoded, payload)
        dense = flat.numel() * flat.element_size()
        self.ctx.bytes_saved += (dense - payload_bytes(payload)) * self.copies
        return payload

    def encode(self, flat: torch.Tensor) -> torch.Tensor:
        """The next message as one byte buffer of the stream's fixed size."""
        return pack(self.encode_payload(flat))

    def decode(self, wire: torch.Tensor) -> torch.Tensor:
        return self.compressor.decode(unpack(wire, self.like))

    def wire_like(self) -> torch.Tensor:
        """An empty buffer of one message's size (for posted receives)."""
        return torch.empty(payload_bytes(self.like), dtype=torch.uint8)


def message_codec(
    ctx: WorkerContext, params: list[nn.Parameter], copies: int
) -> MessageCodec | None:
    """The codec of a worker's gradient messages to ``copies`` peers (None: uncompressed)."""
    spec = spec_of(ctx.config)
    if spec is None:
        return None
    return MessageCodec(ctx, spec, layout_of(params), params[0].dtype, copies=copies)


class PushCodec:
    """A parameter-server push, one compressed payload per shard (each its own error feedback);
    a parameter cut by a shard boundary is compressed as flat pieces."""

    def __init__(self, ctx: WorkerContext, spec: CompressionSpec, params: list[nn.Parameter]):
        self.codecs = [
            MessageCodec(ctx, spec, layout, params[0].dtype, stream=i, warmup=True)
            for i, layout in enumerate(shard_layouts(layout_of(params), ctx.config.servers))
        ]

    def encode(self, grad: torch.Tensor) -> list[Payload]:
        parts = torch.tensor_split(grad, len(self.codecs))
        return [c.encode_payload(part) for c, part in zip(self.codecs, parts, strict=True)]


def push_codec(ctx: WorkerContext, params: list[nn.Parameter]) -> PushCodec | None:
    spec = spec_of(ctx.config)
    return None if spec is None else PushCodec(ctx, spec, params)


def push_decoder(cfg: ExperimentConfig, index: int) -> Compressor | None:
    """What parameter-server shard ``index`` decodes pushes with (None: uncompressed)."""
    spec = spec_of(cfg)
    if spec is None:
        return None
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    layout = shard_layouts(layout_of(model.parameters()), cfg.servers)[index]
    return spec.compressor(layout, error_feedback=cfg.error_feedback)  # decodes as pushers encode
