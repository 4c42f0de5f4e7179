"""Context parallelism's attention (ring attention, Ulysses) against full attention on one
process, in float64: outputs and the gradients of the inputs and of the projections around it,
for C = 2 and 4, the plain and zig-zag splits, causal and not; the work of each member under a
causal mask (zig-zag's max/min 1, the plain split's near 2C − 1); the errors before work."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scaledl_lab.errors import ConfigError
from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.mesh.context import (
    Split,
    attention,
    causal_mask,
    ulysses_attention,
    ulysses_backward,
    work,
)
from scaledl_lab.strategies.mesh.ring import ring_attention, ring_backward
from scaledl_lab.strategies.mesh.view import GroupComm

B, S, HIDDEN, HEADS = 2, 16, 32, 4
COST = CostModel(ComputeProfile("t", 1e-3, 1e-6), NetworkProfile("t", 1e-4, 1e8), "ring")


def _projections() -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(0)
    return nn.Linear(HIDDEN, 3 * HIDDEN).double(), nn.Linear(HIDDEN, HIDDEN).double()


def _heads(t: torch.Tensor) -> torch.Tensor:
    b, s, _ = t.shape
    return t.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2)


def _full(x: torch.Tensor, causal: bool):
    """y = proj(attention(qkv(x))) on one process, and the gradients of x and the weights."""
    qkv, proj = _projections()
    x = x.clone().requires_grad_()
    q, k, v = (_heads(t) for t in qkv(x).split(HIDDEN, dim=2))
    everything = torch.arange(S)
    a = attention(q, k, v, causal_mask(everything, everything) if causal else None)
    y = proj(a.transpose(1, 2).reshape(B, S, HIDDEN))
    (y * _probe()).sum().backward()
    return y.detach(), x.grad, [p.grad for p in (*qkv.parameters(), *proj.parameters())]


def _probe() -> torch.Tensor:
    return torch.linspace(-1, 1, B * S * HIDDEN, dtype=torch.float64).view(B, S, HIDDEN)


def _split_run(x: torch.Tensor, c: int, method: str, zigzag: bool, causal: bool):
    """The same on c simulated ranks, each holding its positions of the split."""
    split, found = Split(S, c, zigzag), {}
    attend, back = {
        "ring": (ring_attention, lambda *a: ring_backward(*a, causal)),
        "ulysses": (ulysses_attention, ulysses_backward),
    }[method]

    async def program(comm):
        group = GroupComm(comm, tuple(range(c)))
        qkv, proj = _projections()
        xl = split.take(x, comm.rank, 1).requires_grad_()
        q, k, v = (_heads(t) for t in qkv(xl).split(HIDDEN, dim=2))
        a, saved = await attend(group, q, k, v, split, causal)
        a = a.requires_grad_()
        y = proj(a.transpose(1, 2).reshape(B, -1, HIDDEN))
        (y * split.take(_probe(), comm.rank, 1)).sum().backward()
        dq, dk, dv = await back(group, saved, a.grad, split)
        torch.autograd.backward([q, k, v], [dq, dk, dv])
        grads = [p.grad for p in (*qkv.parameters(), *proj.parameters())]
        for g in grads:  # the weights are replicated: their gradients sum over the ranks
            await group.allreduce(g)
        found[comm.rank] = (y.detach(), xl.grad, grads, saved["scores"])

    SimWorld(c, COST).run([program] * c)
    return split, found


@pytest.mark.parametrize("method", ["ring", "ulysses"])
@pytest.mark.parametrize("c", [2, 4])
@pytest.mark.parametrize("zigzag", [True, False])
@pytest.mark.parametrize("causal", [True, False])
def test_split_attention_equals_full_attention(method, c, zigzag, causal):
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y, dx, dw = _full(x, causal)
    split, found = _split_run(x, c, method, zigzag, causal)
    for rank, (yl, dxl, grads, _) in found.items():
        assert (yl - split.take(y, rank, 1)).abs().max() < 1e-10
        assert (dxl - split.take(dx, rank, 1)).abs().max() < 1e-10
        assert max((g - w).abs().max().item() for g, w in zip(grads, dw, strict=True)) < 1e-10


def test_zigzag_balances_causal_work_and_the_plain_split_does_not():
    for c in (2, 4, 8):
        plain, zigzag = work(Split(1024, c, zigzag=False)), work(Split(1024, c))
        assert max(zigzag) == min(zigzag)
        assert 0.98 * (2 * c - 1) < max(plain) / min(plain) < 2 * c - 1  # near 2C − 1
    assert work(Split(16, 4), causal=False) == [4 * 16] * 4


@pytest.mark.parametrize("zigzag", [True, False])
def test_ring_counts_the_work_it_does(zigzag):
    x = torch.randn(B, S, HIDDEN, dtype=torch.float64)
    split, found = _split_run(x, 4, "ring", zigzag, causal=True)
    counted = [found[r][3] for r in range(4)]
    assert counted == [n * B * HEADS for n in work(split)]
    assert (max(counted) / min(counted) == 1) if zigzag else max(counted) / min(counted) > 4


def test_errors_before_work():
    with pytest.raises(ConfigError, match=r"into 2C = 8 zig-zag chunks: a sequence of 12"):
        Split(12, 4)
    with pytest.raises(ConfigError, match=r"into C = 5 chunks: a sequence of 12"):
        Split(12, 5, zigzag=False)
    x = torch.zeros(1, 3, 4, 2)

    async def program(comm):
        await ulysses_attention(GroupComm(comm, (0, 1)), x, x, x, Split(8, 2), True)

    with pytest.raises(ConfigError, match=r"3 heads do not divide by 2 \(use ring attention\)"):
        SimWorld(2, COST).run([program] * 2)
