"""DiLoCo's outer step (Douillard et al. 2023, Algorithm 1, lines 9-11): the workers' average
outer gradient Δ = (1/k) Σ_i (θ_global − θ_i), and the outer optimiser that applies it.

The outer gradient points from where the workers went back to where they started, so a plain
SGD step of rate 1 lands on the workers' average (FedAvg, local SGD); DiLoCo steps with
Nesterov momentum instead, in ``torch.optim.SGD(nesterov=True)``'s convention (the tests
compare the two on the same Δ):

    v ← μ·v + Δ                          (v = Δ on the first step)
    sgd:       θ ← θ − η·v               (μ = 0: θ ← θ − η·Δ)
    nesterov:  θ ← θ − η·(Δ + μ·v)
"""

from __future__ import annotations

from typing import Any

import torch

from ...runtime.base import Comm
from .fragments import Fragment


class OuterOptimizer:
    """The outer optimiser of one flat block of weights (the whole model, or one fragment).

    Every worker holds one with the same state: it sees the same Δ and starts from the same θ,
    so the global weights stay equal everywhere without being sent.
    """

    def __init__(self, kind: str, lr: float, momentum: float) -> None:
        self.kind, self.lr, self.momentum = kind, lr, momentum
        self.velocity: torch.Tensor | None = None

    def step(self, theta: torch.Tensor, delta: torch.Tensor) -> None:
        """θ ← θ − η·(update of Δ), in place on ``theta``."""
        if self.momentum == 0:
            theta.sub_(delta, alpha=self.lr)
            return
        if self.velocity is None:
            self.velocity = delta.clone()
        else:
            self.velocity.mul_(self.momentum).add_(delta)
        if self.kind == "nesterov":
            theta.sub_(delta.add(self.velocity, alpha=self.momentum), alpha=self.lr)
        else:
            theta.sub_(self.velocity, alpha=self.lr)

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        return {"velocity": None if self.velocity is None else self.velocity.clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor | None]) -> None:
        velocity = state["velocity"]
        self.velocity = None if velocity is None else velocity.clone()


def outer_optimizer(cfg: Any) -> OuterOptimizer:
    """The outer optimiser a config names (outer_optimizer, outer_lr, outer_momentum)."""
    return OuterOptimizer(cfg.outer_optimizer, cfg.outer_lr, cfg.outer_momentum)


class OuterSum:
    """An outer gradient's allreduce under way: started now, its average Δ waited for later
    (Streaming DiLoCo overlaps it with inner steps; DiLoCo waits at once)."""

    def __init__(self, comm: Comm, delta: torch.Tensor) -> None:
        self.comm, self.delta = comm, delta
        self.pending = comm.allreduce_background(delta)

    async def wait(self) -> torch.Tensor:
        """Δ averaged over the workers still alive (a lost worker drops out of the average)."""
        await self.pending.wait()
        return self.delta.div_(len(self.comm.survivors()))


class Averaged:
    """An outer gradient already averaged (a compressed round's allgather has ended)."""

    def __init__(self, delta: torch.Tensor) -> None:
        self.delta = delta

    async def wait(self) -> torch.Tensor:
        return self.delta


class GlobalFragment:
    """A fragment's global weights θ with their outer optimiser, the same on every worker,
    beside the worker's own (local) weights of the fragment, which its inner steps move."""

    def __init__(self, cfg: Any, fragment: Fragment, codec: Any = None) -> None:
        self.fragment = fragment
        self.theta = fragment.flat()
        self.outer = outer_optimizer(cfg)
        self.codec = codec  # compressed outer gradients (compressed.OuterCodec), or None

    async def start(self, comm: Comm) -> OuterSum | Averaged:
        """Start averaging the outer gradient θ − θ_i: one allreduce of the fragment, under way
        on return; compressed, an allgather of the payloads, done on return."""
        delta = self.theta - self.fragment.flat()
        if self.codec is None:
            return OuterSum(comm, delta)
        return Averaged(await self.codec.average(comm, delta))

    async def finish(self, pending: OuterSum | Averaged, alpha: float = 0.0) -> None:
        """The outer step θ ← Outer(θ, Δ), then the local weights take it: θ_i ← θ (DiLoCo),
        or θ_i ← α·θ_i + (1 − α)·θ (Streaming DiLoCo's merge, after τ more inner steps)."""
        self.outer.step(self.theta, await pending.wait())
        if alpha == 0:
            self.fragment.load(self.theta)
        else:
            self.fragment.load(self.fragment.flat().mul_(alpha).add_(self.theta, alpha=1 - alpha))

    async def sync(self, comm: Comm, alpha: float = 0.0) -> None:
        await self.finish(await self.start(comm), alpha)

    def state_dict(self) -> dict[str, Any]:
        return {"theta": self.theta.clone(), "outer": self.outer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.theta = state["theta"].clone()
        self.outer.load_state_dict(state["outer"])
