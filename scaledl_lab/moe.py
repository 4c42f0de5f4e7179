"""gpt-tiny-moe: gpt-tiny with each block's MLP replaced by a mixture of experts (Shazeer et al.
2017; GShard, Lepikhin et al. 2020; Switch Transformer, Fedus et al. 2021).

Each block's MLP becomes :class:`MoE`: a linear router (no bias) scores the ``E`` experts for
every token, a softmax over the experts gives the router's probabilities ``p``, and each token
goes to its top ``k`` experts (k = 1 or 2). Its gate for each is ``p`` itself for k = 1
(Switch); for k = 2 the two probabilities renormalised to sum to one (GShard's and Mixtral's).
Each expert is an MLP of gpt-tiny's shape (h → 4h, GELU, → h).

**Capacity.** Every expert takes at most ``C = ceil(capacity_factor × T × k / E)`` of the ``T``
tokens of one forward (one worker's batch: the capacity is counted over the tokens a worker
routes, as Switch does). Places are handed out in a fixed order: every token's first choice, in
token order (batch, then position), then every token's second choice, in token order (GShard's
priority of first choices); an expert's assignments past its ``C``-th are dropped. A dropped
assignment adds nothing: a token whose every choice was dropped gets a zero MLP output, so the
residual stream passes it through unchanged; with k = 2 and one choice dropped, the other keeps
its gate (no renormalising again).

**Load-balancing loss.** ``aux = E · Σ_e f_e · P_e``, with ``f_e`` the share of the T·k
assignments routed to expert e (before the capacity drops any) and ``P_e`` the mean router
probability of expert e over the tokens (Switch's eq. 4; 1 when the load is even). The model
adds ``aux_loss_weight × aux`` of every MoE layer to the loss through the backward only
(Megatron-LM's ``MoEAuxLossAutoScaler``): the logits, and so the cross-entropy every strategy
computes and logs, are the plain model's, and the gradient is that of CE + α · Σ_layers aux.

Each MoE layer keeps what its training forwards routed since it was last read (:class:`Load`):
the dropped share, each expert's load and the aux loss, the metrics' ``moe_*`` columns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .gpt import GPT, HEADS, HIDDEN, LAYERS, _init_weights

EXPERTS, TOP_K, CAPACITY_FACTOR, AUX_LOSS_WEIGHT = 4, 1, 1.25, 0.01


@dataclass(frozen=True)
class Settings:
    """A mixture's experts, its top-k, capacity factor and load-balancing loss weight."""

    experts: int = EXPERTS
    top_k: int = TOP_K
    capacity_factor: float = CAPACITY_FACTOR
    aux_loss_weight: float = AUX_LOSS_WEIGHT

    def __post_init__(self) -> None:
        if self.experts < 1:
            raise ValueError(f"experts={self.experts} must be at least 1")
        if self.top_k not in (1, 2) or self.top_k > self.experts:
            raise ValueError(f"top_k={self.top_k} must be 1 or 2, at most experts={self.experts}")
        if not self.capacity_factor > 0 or self.aux_loss_weight < 0:
            raise ValueError("capacity_factor must be positive and aux_loss_weight not negative")


def capacity(tokens: int, top_k: int, experts: int, factor: float) -> int:
    """Places per expert: ``ceil(factor × tokens × k / experts)``."""
    return math.ceil(factor * tokens * top_k / experts)


@dataclass
class Routing:
    """One forward's routing of ``T`` tokens: each token's ``k`` experts in order of preference
    and their gates ``(T, k)``, each assignment's place in its expert's buffer (-1: dropped),
    the router's probabilities ``(T, E)`` and the capacity."""

    expert: torch.Tensor
    gate: torch.Tensor
    slot: torch.Tensor
    probs: torch.Tensor
    capacity: int

    @property
    def kept(self) -> torch.Tensor:
        return self.slot >= 0


def slots(expert: torch.Tensor, experts: int, places: int) -> torch.Tensor:
    """Each assignment's place in its expert's buffer, or -1 where it is dropped: first
    choices in token order, then second choices, each expert keeping its first ``places``."""
    t, k = expert.shape
    order = expert.t().reshape(-1)  # choice-major: every first choice, then every second
    place = F.one_hot(order, experts).cumsum(0).gather(1, order[:, None])[:, 0] - 1
    place = torch.where(place < places, place, torch.full_like(place, -1))
    return place.view(k, t).t()


def route(logits: torch.Tensor, top_k: int, capacity_factor: float) -> Routing:
    """The routing of ``logits`` ``(T, E)``: softmax over the experts, the top k, their gates
    (renormalised for k = 2), the places under the capacity."""
    t, e = logits.shape
    probs = logits.softmax(-1)
    top, expert = probs.topk(top_k, dim=-1)
    gate = top if top_k == 1 else top / top.sum(-1, keepdim=True)
    places = capacity(t, top_k, e, capacity_factor)
    return Routing(expert, gate, slots(expert, e, places), probs, places)


def aux_loss(routing: Routing) -> torch.Tensor:
    """Switch's load-balancing loss ``E · Σ_e f_e · P_e`` (f: the routed share, no gradient;
    P: the mean router probability)."""
    e = routing.probs.shape[1]
    f = torch.bincount(routing.expert.reshape(-1), minlength=e).to(routing.probs.dtype)
    return e * (f / routing.expert.numel() * routing.probs.mean(0)).sum()


def dispatch(x: torch.Tensor, routing: Routing, experts: int) -> torch.Tensor:
    """The experts' input buffers ``(E, C, h)``: each kept assignment's token at its place,
    zeros in the places left empty."""
    token, choice = routing.kept.nonzero(as_tuple=True)
    at = routing.expert[token, choice] * routing.capacity + routing.slot[token, choice]
    out = x.new_zeros(experts * routing.capacity, x.shape[1])
    return out.index_copy(0, at, x[token]).view(experts, routing.capacity, -1)


def combine(out: torch.Tensor, routing: Routing) -> torch.Tensor:
    """Each token's output ``(T, h)``: the gated sum of its kept assignments' expert outputs
    (``out``: ``(E, C, h)``), zero where every choice was dropped."""
    token, choice = routing.kept.nonzero(as_tuple=True)
    at = routing.expert[token, choice] * routing.capacity + routing.slot[token, choice]
    gated = out.reshape(-1, out.shape[-1])[at] * routing.gate[token, choice][:, None]
    tokens = routing.expert.shape[0]
    return out.new_zeros(tokens, out.shape[-1]).index_add(0, token, gated)


class _AuxGradient(torch.autograd.Function):
    """The identity on ``y`` whose backward also hands ``weight`` to ``aux``: the gradient of
    a loss with ``weight × aux`` added, the logits left as they were."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, aux: torch.Tensor, weight: float) -> torch.Tensor:  # type: ignore[override]
        ctx.weight = weight
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:  # type: ignore[override]
        return grad, torch.full((), ctx.weight, dtype=grad.dtype, device=grad.device), None


def with_aux_loss(y: torch.Tensor, aux: torch.Tensor, weight: float) -> torch.Tensor:
    return _AuxGradient.apply(y, aux, weight) if weight and aux.requires_grad else y


class Load:
    """What a layer's training forwards routed since it was last read: assignments routed to
    each expert, those dropped, the aux losses (summed) and the forwards."""

    def __init__(self, experts: int) -> None:
        self.experts = experts
        self.reset()

    def reset(self) -> None:
        self.routed = torch.zeros(self.experts, dtype=torch.float64)
        self.dropped, self.aux, self.forwards = 0.0, 0.0, 0

    def add(self, routing: Routing, aux: torch.Tensor) -> None:
        routed = torch.bincount(routing.expert.reshape(-1), minlength=self.experts)
        self.routed += routed.double()
        self.dropped += float((~routing.kept).sum())
        self.aux += float(aux.detach())
        self.forwards += 1


def columns(loads: list[Load]) -> dict[str, float]:
    """The train row's ``moe_*`` columns from the layers' loads (reset after): the share of
    assignments dropped, the mean over layers of the busiest expert's load over the mean load,
    the mean over layers and forwards of the aux loss; none when nothing was routed."""
    seen = [load for load in loads if load.forwards]
    if not seen:
        return {}
    routed = sum(float(load.routed.sum()) for load in seen)
    out = {
        "moe_dropped": sum(load.dropped for load in seen) / routed,
        "moe_load_max": sum(float(lo.routed.max() / lo.routed.mean()) for lo in seen) / len(seen),
        "moe_aux_loss": sum(load.aux / load.forwards for load in seen) / len(seen),
    }
    for load in seen:
        load.reset()
    return out


class Expert(nn.Module):
    """One expert: gpt-tiny's MLP (h → 4h, GELU, → h)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.proj = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class MoE(nn.Module):
    """A mixture of ``settings.experts`` experts in place of a block's MLP: ``(N, S, h)`` in
    and out. ``settings`` other than the number of experts may change between forwards."""

    def __init__(self, hidden: int, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.router = nn.Linear(hidden, settings.experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden) for _ in range(settings.experts))
        self.load = Load(settings.experts)

    def routing(self, x: torch.Tensor) -> tuple[Routing, torch.Tensor]:
        """The routing of ``x`` ``(T, h)`` and its aux loss (recorded in a training forward)."""
        s = self.settings
        routing = route(self.router(x), s.top_k, s.capacity_factor)
        aux = aux_loss(routing)
        if torch.is_grad_enabled():
            self.load.add(routing, aux)
        return routing, aux

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        routing, aux = self.routing(flat)
        buffers = dispatch(flat, routing, len(self.experts))
        out = torch.stack([expert(buffers[e]) for e, expert in enumerate(self.experts)])
        y = with_aux_loss(combine(out, routing), aux, self.settings.aux_loss_weight)
        return y.view_as(x)


class MoEGPT(GPT):
    """gpt-tiny with a :class:`MoE` as every block's MLP (same names otherwise; the experts'
    weights are ``blocks.i.mlp.experts.j.*``, the router's ``blocks.i.mlp.router.weight``)."""

    def __init__(
        self,
        vocabulary: int,
        sequence: int,
        settings: Settings | None = None,
        layers: int = LAYERS,
        hidden: int = HIDDEN,
        heads: int = HEADS,
    ) -> None:
        super().__init__(vocabulary, sequence, layers, hidden, heads)
        self.settings = settings = settings or Settings()
        for block in self.blocks:
            block.mlp = MoE(hidden, settings)
        self.apply(_init_weights)

    def mixtures(self) -> list[MoE]:
        return [m for m in self.modules() if isinstance(m, MoE)]

    def configure(self, settings: Settings) -> None:
        """Route with ``settings`` (the same number of experts) from the next forward on."""
        if settings.experts != self.settings.experts:
            raise ValueError(f"the model has {self.settings.experts} experts, not {settings}")
        self.settings = settings
        for moe in self.mixtures():
            moe.settings = settings


__all__ = [
    "MoE",
    "MoEGPT",
    "Expert",
    "Load",
    "Routing",
    "Settings",
    "aux_loss",
    "capacity",
    "columns",
    "combine",
    "dispatch",
    "route",
    "slots",
    "with_aux_loss",
]
