"""What a worker remembers between compressed steps: error feedback, and DGC's momentum
correction.

Error feedback (Seide et al. 2014; Karimireddy et al. 2019): what the compressor left out of a
step is added to the next step's gradient, so nothing is lost, only delayed. After any number of
steps, Σ transmitted + residual = Σ raw gradients (the invariant the tests check). Without it,
a biased compressor (1-bit, top-k) throws the rest away every step.

DGC (Lin et al. 2018) keeps two vectors: the momentum u ← m·u + g and the accumulation
v ← v + u, sends the top-k of v, and zeroes the sent entries of both (momentum-factor masking);
each gradient is first clipped to ``clip_norm / √N`` (local gradient clipping). Since u carries
the momentum, the optimiser that applies the averaged update must have none
(:func:`~.spec.momentum_correction`).
"""

from __future__ import annotations

import math

import torch

from .wire import Payload

DGC_CLIP_NORM = 5.0  # the global gradient-norm threshold; each worker clips to this / √N


class ErrorFeedback:
    """Error feedback around any compressor: ``add`` the residual, compress, ``keep`` the rest.

    With ``enabled=False`` it passes the gradient through and keeps nothing.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.residual: torch.Tensor | None = None

    def add(self, raw: torch.Tensor) -> torch.Tensor:
        """What to compress this step: the raw gradient plus what earlier steps left out."""
        if self.enabled and self.residual is not None:
            return raw + self.residual
        return raw

    def keep(self, corrected: torch.Tensor, sent: torch.Tensor, payload: Payload) -> None:
        """Remember what was not sent: ``corrected`` (from ``add``) minus its decoded payload."""
        if self.enabled:
            self.residual = corrected - sent


class DGCMemory(ErrorFeedback):
    """DGC's momentum correction, local clipping and momentum-factor masking around top-k.

    ``residual`` is DGC's accumulation v (the error feedback); ``velocity`` is its momentum u.
    With ``enabled=False`` v is not kept: each step sends the top-k of u alone.
    """

    def __init__(
        self,
        momentum: float,
        world_size: int,
        enabled: bool = True,
        clip_norm: float | None = DGC_CLIP_NORM,
    ) -> None:
        super().__init__(enabled)
        self.momentum = momentum
        self.clip = clip_norm / math.sqrt(world_size) if clip_norm else None
        self.velocity: torch.Tensor | None = None

    def add(self, raw: torch.Tensor) -> torch.Tensor:
        g = raw
        if self.clip is not None:
            norm = float(raw.norm())
            if norm > self.clip:
                g = raw * (self.clip / norm)
        if self.velocity is None or self.momentum == 0:
            self.velocity = g.clone()
        else:
            self.velocity = self.velocity * self.momentum + g
        return super().add(self.velocity)

    def keep(self, corrected: torch.Tensor, sent: torch.Tensor, payload: Payload) -> None:
        super().keep(corrected, sent, payload)
        assert self.velocity is not None
        self.velocity[payload["indices"].long()] = 0  # momentum-factor masking
