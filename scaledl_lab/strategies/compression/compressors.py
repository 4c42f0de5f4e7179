"""Gradient compressors: 1-bit quantisation (Seide et al. 2014), QSGD (Alistarh et al. 2017),
top-k sparsification and DGC's sparsity warm-up (Lin et al. 2018). PowerSGD is in
:mod:`.powersgd`; error feedback and DGC's momentum correction are in :mod:`.feedback`.

A compressor turns a flat gradient into a :data:`~.wire.Payload` (``encode``) and back
(``decode``). It is stateless between calls (QSGD draws from its own seeded generator), so the
receiver's copy decodes what the sender's encoded. Every payload of one compressor on one layout
has the same structure, so it packs to a buffer of a fixed size (DGC during warm-up: a fixed
size per step).
"""

from __future__ import annotations

import abc
import math

import torch

from .wire import Layout, Payload, numel_of, pack_bits, unpack_bits


class Compressor(abc.ABC):
    """Encode a flat gradient into named tensors, and decode them back."""

    name = "compressor"

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.numel = numel_of(layout)

    @abc.abstractmethod
    def encode(self, x: torch.Tensor) -> Payload:
        """What is sent for the flat vector ``x`` (of this compressor's layout)."""

    @abc.abstractmethod
    def decode(self, payload: Payload) -> torch.Tensor:
        """The flat vector a payload stands for (``x``'s dtype and size)."""

    def set_epoch(self, epoch: float) -> None:
        """Training progress in epochs (DGC's warm-up reads it; the others only keep it)."""
        self.epoch = epoch

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name})"


class NoCompression(Compressor):
    """The dense gradient itself."""

    name = "none"

    def encode(self, x: torch.Tensor) -> Payload:
        return {"values": x.detach().clone()}

    def decode(self, payload: Payload) -> torch.Tensor:
        return payload["values"]


class OneBit(Compressor):
    """1-bit SGD (Seide et al. 2014): one sign bit per entry and, per row of every matrix (per
    output unit; a vector is one row), the mean of its non-negative and of its negative entries
    as the two reconstruction values (Seide et al. quantise each column of their gradient
    matrices). Sent: ⌈n/8⌉ bytes of bits + 2 floats per row."""

    name = "onebit"

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.sizes = [math.prod(s) for s in layout]
        self.rows = [s[0] if len(s) >= 2 and s[0] > 0 else 1 for s in layout]

    def _rows(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [t.view(r, -1) for t, r in zip(flat.split(self.sizes), self.rows, strict=True)]

    def encode(self, x: torch.Tensor) -> Payload:
        positive = x >= 0
        scales = []
        for seg, pos in zip(self._rows(x), self._rows(positive), strict=True):
            count = pos.sum(1, dtype=x.dtype)
            total = seg.sum(1)
            above = seg.clamp(min=0).sum(1)
            below = (total - above) / (seg.shape[1] - count).clamp(min=1)
            scales.append(torch.stack([above / count.clamp(min=1), below]))
        return {"bits": pack_bits(positive, 1), "scales": torch.cat(scales, dim=1).reshape(-1)}

    def decode(self, payload: Payload) -> torch.Tensor:
        positive = unpack_bits(payload["bits"], 1, self.numel).bool()
        scales = payload["scales"].view(2, -1)
        out = torch.empty(self.numel, dtype=scales.dtype)
        row = 0
        for seg, pos in zip(self._rows(out), self._rows(positive), strict=True):
            above, below = scales[:, row : row + seg.shape[0]].unsqueeze(2)
            torch.where(pos, above, below, out=seg)
            row += seg.shape[0]
        return out


QSGD_BUCKET = 512  # entries per norm, as in Alistarh et al.'s experiments


def qsgd_bits(levels: int) -> int:
    """Bits per entry of QSGD's fixed-width code: a signed level in [-s, s] (2s + 1 values)."""
    for bits in (2, 4, 8, 16):
        if 2 * levels + 1 <= 2**bits:
            return bits
    raise ValueError(f"QSGD levels={levels} exceeds the 16-bit code (at most 32767)")


class QSGD(Compressor):
    """QSGD (Alistarh et al. 2017): per bucket of 512 entries its L2 norm, and per entry a sign
    and a level ξ ∈ {0, …, s}, rounded up with probability |v|/‖v‖·s − ⌊|v|/‖v‖·s⌋, so that
    E[decode] = v (unbiased). Sent: the levels as fixed-width codes (2, 4, 8 or 16 bits; the
    paper's Elias coding would send fewer) and one float per bucket.

    Its variance is at most ω‖v‖² with ω = min(d/s², √d/s) (d = 512): more than the signal
    itself below s ≈ 23. Error feedback needs a compressor that keeps some of every vector
    (‖C(v) − v‖ < ‖v‖), and would grow the residual geometrically with this one, so
    ``contractive=True`` decodes Q(v)/(1 + ω) (Stich & Karimireddy 2019): biased, contractive.
    """

    name = "qsgd"

    def __init__(
        self, layout: Layout, levels: int, seed: int = 0, *, contractive: bool = False
    ) -> None:
        super().__init__(layout)
        self.levels = levels
        self.bits = qsgd_bits(levels)
        self.generator = torch.Generator().manual_seed(seed)
        self.buckets = math.ceil(self.numel / QSGD_BUCKET)
        self.scale = 1 / (1 + self.variance_bound()) if contractive else 1.0

    def variance_bound(self) -> float:
        """ω: E‖Q(v) − v‖² ≤ ω‖v‖² for buckets of d = min(512, n) entries (Alistarh et al.)."""
        d = min(QSGD_BUCKET, self.numel)
        return min(d / self.levels**2, math.sqrt(d) / self.levels)

    def _bucketed(self, x: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(self.buckets * QSGD_BUCKET, dtype=x.dtype)
        padded[: self.numel] = x
        return padded.view(self.buckets, QSGD_BUCKET)

    def encode(self, x: torch.Tensor) -> Payload:
        v = self._bucketed(x.detach())
        norms = v.norm(dim=1, keepdim=True)
        scaled = v.abs().mul_(self.levels / torch.where(norms > 0, norms, 1))  # |v|/‖v‖·s
        level = scaled.floor()
        draw = torch.rand(scaled.shape, generator=self.generator, dtype=scaled.dtype)
        level += draw < scaled.sub_(level)  # round up with probability r − ⌊r⌋
        codes = torch.copysign(level, v).add_(self.levels).reshape(-1)[: self.numel]
        packed = codes.to(torch.int16) if self.bits == 16 else pack_bits(codes, self.bits)
        return {"codes": packed, "norms": norms.reshape(-1)}

    def decode(self, payload: Payload) -> torch.Tensor:
        codes, norms = payload["codes"], payload["norms"]
        if self.bits != 16:
            codes = unpack_bits(codes, self.bits, self.numel)
        v = torch.zeros(self.buckets * QSGD_BUCKET, dtype=norms.dtype)
        v[: self.numel] = codes
        v[: self.numel] -= self.levels
        v = (v.view(self.buckets, QSGD_BUCKET) * norms.view(-1, 1) / self.levels).reshape(-1)
        return v[: self.numel] if self.scale == 1.0 else v[: self.numel] * self.scale


def topk_count(ratio: float, numel: int) -> int:
    """k of top-k: ⌈ratio · n⌉ entries, at least one."""
    return max(1, min(numel, math.ceil(ratio * numel)))


class TopK(Compressor):
    """Top-k sparsification: the k = ⌈ratio·n⌉ entries of largest magnitude, as values and
    their indices (int32). Sent: k · (value + 4) bytes, so ratio 0.005 is 100× fewer bytes
    than the dense float32 gradient."""

    name = "topk"

    def __init__(self, layout: Layout, ratio: float) -> None:
        super().__init__(layout)
        self.ratio = ratio
        self.k = topk_count(ratio, self.numel)
        self.index_dtype = torch.int32 if self.numel < 2**31 else torch.int64

    def encode(self, x: torch.Tensor) -> Payload:
        flat = x.detach().reshape(-1)
        _, indices = torch.topk(flat.abs(), self.k, sorted=False)
        return {"values": flat[indices], "indices": indices.to(self.index_dtype)}

    def decode(self, payload: Payload) -> torch.Tensor:
        values = payload["values"]
        out = torch.zeros(self.numel, dtype=values.dtype)
        out[payload["indices"].long()] = values
        return out


DGC_WARMUP_EPOCHS = 1.0  # Lin et al. warm up over 4 of 90 epochs; our runs last a few epochs
DGC_WARMUP_STAGES = 4  # densities 25%, 6.25%, 1.5625%, 0.39% (sparsity 75% … 99.6%), then target


def dgc_density(ratio: float, epoch: float, warmup_epochs: float = DGC_WARMUP_EPOCHS) -> float:
    """DGC's sparsity warm-up: the density falls exponentially, 0.25 ** (stage + 1), over
    ``warmup_epochs`` split into four stages, never below the target ``ratio``."""
    if epoch >= warmup_epochs:
        return ratio
    stage = int(epoch / warmup_epochs * DGC_WARMUP_STAGES)
    return max(ratio, 0.25 ** (stage + 1))


class DGC(TopK):
    """Deep Gradient Compression's sparsifier (Lin et al. 2018): top-k whose density warms up
    from 25% to the target over the first epoch. With ``warmup=False`` (messages whose size is
    fixed in advance) it starts at the target. Its momentum correction, local clipping and
    momentum-factor masking act before it, in :class:`~.feedback.DGCMemory`."""

    name = "dgc"

    def __init__(self, layout: Layout, ratio: float, *, warmup: bool = True) -> None:
        super().__init__(layout, ratio)
        self.target = ratio
        self.warmup = warmup
        self.set_epoch(0.0)

    def set_epoch(self, epoch: float) -> None:
        super().set_epoch(epoch)
        density = dgc_density(self.target, epoch) if self.warmup else self.target
        self.k = topk_count(density, self.numel)
