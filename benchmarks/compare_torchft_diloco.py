"""Two delayed Streaming DiLoCo rounds of torchft's fragment against ours, on one replica.

torchft (``torchft.local_sgd._StreamingDiLoCoFragment``, version 0.2.0) is not a dependency:
install it beside the lab, e.g. ``pip install --no-deps --target /tmp/torchft torchft==0.2.0``
and ``pip install --target /tmp/otel opentelemetry-sdk opentelemetry-exporter-otlp-proto-http``,
then ``PYTHONPATH=/tmp/torchft:/tmp/otel python benchmarks/compare_torchft_diloco.py``.

Its Manager needs torchft's lighthouse service; with one replica its allreduce is the tensor
itself and every commit succeeds, so a one-replica stand-in answers those two calls. Both sides
take the same inner moves, outer Nesterov 0.7 / 0.9, τ = 1 and α = 0.5; the script prints the
largest difference of the weights (0.0 on torch 2.13 CPU: the same arithmetic).
"""

from __future__ import annotations

import torch
from torch import nn
from torchft.local_sgd import _StreamingDiLoCoFragment
from torchft.manager import _DummyWork

from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.low_communication.fragments import Fragment
from scaledl_lab.strategies.low_communication.outer import OuterOptimizer, OuterSum

LR, MOMENTUM, ALPHA, ROUNDS = 0.7, 0.9, 0.5, 2


class OneReplica:
    """What the fragment asks of torchft's Manager, for a single replica."""

    def allreduce(self, tensor: torch.Tensor, should_quantize: bool = False) -> _DummyWork:
        return _DummyWork(tensor)

    def should_commit(self) -> bool:
        return True

    def register_state_dict_fn(self, *args: object, **kwargs: object) -> None:
        pass


def move(model: nn.Module, delta: torch.Tensor) -> None:
    """An inner 'step': add ``delta`` in place (the fragments hold the parameters' tensors)."""
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            p.add_(delta[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def main() -> None:
    torch.manual_seed(0)
    theirs_model = nn.Linear(5, 3).double()
    ours_model = nn.Linear(5, 3).double()
    ours_model.load_state_dict(theirs_model.state_dict())
    numel = sum(p.numel() for p in theirs_model.parameters())
    gen = torch.Generator().manual_seed(1)
    moves = [0.01 * torch.randn(numel, generator=gen, dtype=torch.float64) for _ in range(2)]

    inner = torch.optim.SGD(theirs_model.parameters(), lr=0.1)
    outer = torch.optim.SGD(theirs_model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
    fragment = _StreamingDiLoCoFragment(
        OneReplica(), theirs_model, 0, 0, inner, outer, 4, fragment_sync_delay=1,
        fragment_update_alpha=ALPHA,
    )  # fmt: skip
    fragment.save_parameters()  # torchft's DiLoCo does this when it is built
    for k in range(ROUNDS):
        move(theirs_model, moves[0] * (k + 1))
        fragment.prepare_sync()  # the round starts
        move(theirs_model, moves[1])  # τ = 1 inner step while it travels
        fragment.perform_sync()  # outer step, merged with α
    theirs = nn.utils.parameters_to_vector(theirs_model.parameters()).detach()

    out: dict[str, torch.Tensor] = {}

    async def program(comm: object) -> None:
        ours = Fragment([p.data for p in ours_model.parameters()])
        theta, optimizer = ours.flat(), OuterOptimizer("nesterov", LR, MOMENTUM)
        for k in range(ROUNDS):
            move(ours_model, moves[0] * (k + 1))
            pending = OuterSum(comm, theta - ours.flat())
            move(ours_model, moves[1])
            optimizer.step(theta, await pending.wait())
            ours.load(ours.flat().mul_(ALPHA).add_(theta, alpha=1 - ALPHA))
        out["ours"] = ours.flat()

    cost = CostModel(ComputeProfile("t", 0.0, 1e-9), NetworkProfile("t", 0.0, 1e9))
    SimWorld(1, cost, [], [], False).run([program])
    print(f"max |torchft - ours| after {ROUNDS} delayed rounds: "
          f"{(theirs - out['ours']).abs().max().item():.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
