"""PowerSGD (Vogels, Karimireddy, Jaggi 2019): a rank-r approximation of each gradient matrix
by one step of power iteration, warm-started from the previous step's Q.

For every parameter viewed as a matrix M (n × m: its first dimension by the rest):
P = M Q, P̂ = orthonormalise(P), Q = Mᵀ P̂, and M ≈ P̂ Qᵀ. Sent: P̂ and Q, (n + m)·r numbers
instead of n·m. Vectors (biases, norms) and matrices too small to gain at least 2× (PyTorch's
``min_compression_rate``) are sent as they are.

In an allreduce both stages are linear in M, so the workers sum their P (one allreduce),
orthonormalise the same sum, and sum their Q (a second allreduce): the result is P̂ (Σ Qᵢ)ᵀ / N,
the average of every worker's approximation P̂ Qᵢᵀ. Elsewhere (a parameter-server push, a
neighbour's message) one worker does both stages alone (:meth:`PowerSGD.encode`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .compressors import Compressor
from .wire import Layout, Payload

MIN_COMPRESSION_RATE = 2.0  # as torch's powerSGD_hook: compress a matrix only if it gains 2×


@dataclass(frozen=True)
class _Segment:
    offset: int
    numel: int
    rows: int
    cols: int
    rank: int  # 0: sent as it is


def orthonormalise(p: torch.Tensor) -> torch.Tensor:
    """Orthonormal columns spanning ``p``'s (reduced QR; exact for rank-deficient ``p``)."""
    return torch.linalg.qr(p, mode="reduced").Q


class PowerSGD(Compressor):
    """Rank-``rank`` PowerSGD on the matrices of a layout; the rest sent as it is."""

    name = "powersgd"

    def __init__(self, layout: Layout, rank: int, seed: int = 0) -> None:
        super().__init__(layout)
        self.rank = rank
        self.segments: list[_Segment] = []
        offset = 0
        for shape in layout:
            numel = math.prod(shape)
            rows, cols = (shape[0], numel // shape[0]) if len(shape) >= 2 else (numel, 1)
            r = min(rank, rows, cols)
            gains = len(shape) >= 2 and (rows + cols) * r * MIN_COMPRESSION_RATE < rows * cols
            self.segments.append(_Segment(offset, numel, rows, cols, r if gains else 0))
            offset += numel
        self.matrices = [s for s in self.segments if s.rank]
        self.raw = [s for s in self.segments if not s.rank]
        gen = torch.Generator().manual_seed(seed)
        # The same seed on every worker: the same starting Q, as an allreduce needs.
        self.q = [
            torch.randn(s.cols, s.rank, generator=gen, dtype=torch.float64) for s in self.matrices
        ]

    # -- the stages, usable one by one around collectives -----------------------------------

    def split(self, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
        """The matrices (views of ``x``) and the uncompressed entries (one new vector)."""
        mats = [x[s.offset : s.offset + s.numel].view(s.rows, s.cols) for s in self.matrices]
        raw = [x[s.offset : s.offset + s.numel] for s in self.raw]
        return mats, torch.cat(raw) if raw else x.new_empty(0)

    def p_stage(self, mats: list[torch.Tensor]) -> torch.Tensor:
        """P = M Q for every matrix (warm-started Q), concatenated."""
        ps = [m @ q.to(m.dtype) for m, q in zip(mats, self.q, strict=True)]
        return torch.cat([p.reshape(-1) for p in ps]) if ps else torch.empty(0)

    def orthonormalise(self, p: torch.Tensor) -> torch.Tensor:
        """P̂: each matrix's P with orthonormal columns, concatenated."""
        out = [orthonormalise(part) for part in self._views(p, rows=True)]
        return torch.cat([o.reshape(-1) for o in out]) if out else p

    def q_stage(self, mats: list[torch.Tensor], p_hat: torch.Tensor) -> torch.Tensor:
        """Q = Mᵀ P̂ for every matrix, concatenated."""
        qs = [m.T @ p for m, p in zip(mats, self._views(p_hat, rows=True), strict=True)]
        return torch.cat([q.reshape(-1) for q in qs]) if qs else p_hat

    def remember(self, q: torch.Tensor) -> None:
        """Warm start: the next step's power iteration starts from this Q."""
        self.q = [part.detach().clone() for part in self._views(q, rows=False)]

    def assemble(self, p_hat: torch.Tensor, q: torch.Tensor, raw: torch.Tensor) -> torch.Tensor:
        """The flat vector P̂ Qᵀ (each matrix) and the uncompressed entries stand for."""
        out = torch.empty(self.numel, dtype=raw.dtype if raw.numel() else p_hat.dtype)
        for s, p, qq in zip(
            self.matrices, self._views(p_hat, rows=True), self._views(q, rows=False), strict=True
        ):
            out[s.offset : s.offset + s.numel] = (p @ qq.T).reshape(-1)
        taken = 0
        for s in self.raw:
            out[s.offset : s.offset + s.numel] = raw[taken : taken + s.numel]
            taken += s.numel
        return out

    def _views(self, flat: torch.Tensor, *, rows: bool) -> list[torch.Tensor]:
        views, offset = [], 0
        for s in self.matrices:
            n = s.rows if rows else s.cols
            views.append(flat[offset : offset + n * s.rank].view(n, s.rank))
            offset += n * s.rank
        return views

    # -- one worker alone -------------------------------------------------------------------

    def encode(self, x: torch.Tensor) -> Payload:
        mats, raw = self.split(x.detach())
        p_hat = self.orthonormalise(self.p_stage(mats))
        q = self.q_stage(mats, p_hat)
        self.remember(q)
        return {"p": p_hat, "q": q, "raw": raw}

    def decode(self, payload: Payload) -> torch.Tensor:
        return self.assemble(payload["p"], payload["q"], payload["raw"])
