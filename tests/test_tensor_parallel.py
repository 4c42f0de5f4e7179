"""Megatron-style tensor parallelism equals the unsplit MLP: one block, then whole training runs."""

from __future__ import annotations

import pytest
import torch
from common import SMALL, max_diff
from torch import nn

from scaledl_lab import DivergenceError, ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.runtime.sim.cost import ring_allreduce_bytes
from scaledl_lab.strategies.launch import execute
from scaledl_lab.strategies.model_parallel import tensor_parallel
from scaledl_lab.strategies.model_parallel.tensor_parallel import ParallelMLPBlock
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for

TP = dict(strategy="tensor-parallel", model="mlp", precision="float64", **SMALL)
HIDDEN, BATCH = 512, SMALL["batch_size"]


def _count_allreduces(ctx) -> list[int]:
    """Wrap this rank's Comm so that every allreduce's element count is recorded, in order."""
    calls: list[int] = []
    start = ctx.comm.allreduce_start

    def counted(tensor, group=None):
        calls.append(tensor.numel())
        return start(tensor, group)

    ctx.comm.allreduce_start = counted
    return calls


def _unsplit_block() -> tuple[nn.Linear, nn.Linear, torch.Tensor, torch.Tensor]:
    """Linear(12, 8) → ReLU → Linear(8, 6) in float64, an input and an output gradient."""
    gen = torch.Generator().manual_seed(0)
    first, second = nn.Linear(12, 8).double(), nn.Linear(8, 6).double()
    with torch.no_grad():
        for p in [*first.parameters(), *second.parameters()]:
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
    x = torch.randn(5, 12, generator=gen, dtype=torch.float64)
    return first, second, x, torch.randn(5, 6, generator=gen, dtype=torch.float64)


async def _block_program(ctx) -> None:
    """Every rank: its slices of the block, forward and backward with an input that needs a
    gradient, so both of Megatron's operators run (g in forward, f in backward)."""
    calls = _count_allreduces(ctx)
    first, second, x, grad_out = _unsplit_block()
    block = ParallelMLPBlock(first, second, ctx.rank, ctx.world_size)
    out, saved = await block.forward_async(ctx.comm, x.requires_grad_(), share=1.0)
    out.backward(grad_out)  # stands for the layers above: the bias and the summed output
    grad_in = await block.backward(ctx.comm, saved, share=1.0)
    ctx.result.update(
        out=out.detach(),
        grad_in=grad_in,
        grads={
            "first.weight": block.up.weight.grad,
            "first.bias": block.up.bias.grad,
            "second.weight": block.down.grad,
            "second.bias": block.bias.grad,
        },
        units=block.units,
        calls=calls,
    )


@pytest.mark.parametrize("degree", [2, 4])
def test_block_forward_and_backward_equal_nn_linear(degree):
    cfg = ExperimentConfig(runtime="sim", workers=degree, **TP)
    results = execute(cfg, "block", lambda rows: None, program=_block_program).results
    first, second, x, grad_out = _unsplit_block()
    x.requires_grad_()
    out = second(torch.relu(first(x)))
    out.backward(grad_out)
    for r in results:
        units = r["units"]
        assert (r["out"] - out).abs().max() < 1e-12
        assert (r["grad_in"] - x.grad).abs().max() < 1e-12
        grads = r["grads"]
        assert (grads["first.weight"] - first.weight.grad[units]).abs().max() < 1e-12
        assert (grads["first.bias"] - first.bias.grad[units]).abs().max() < 1e-12
        assert (grads["second.weight"] - second.weight.grad[:, units]).abs().max() < 1e-12
        assert (grads["second.bias"] - second.bias.grad).abs().max() < 1e-12
        # One allreduce forward (g, batch × out) and one backward (f, batch × in), no more.
        assert r["calls"] == [5 * 6, 5 * 12]
    # The slices tile the hidden width.
    covered = sorted(i for r in results for i in range(8)[r["units"]])
    assert covered == list(range(8))


@pytest.mark.parametrize(
    "degree, options",
    [(2, {}), (4, {}), (2, {"optimizer": "adam", "lr": 1e-3, "weight_decay": 1e-4})],
)
def test_sim_equals_unsplit_mlp(degree, options):
    cfg = ExperimentConfig(runtime="sim", workers=degree, **{**TP, **options})
    res = run(cfg, progress=False, log=None)
    reference = train_sequential(cfg, load_for(cfg))  # replicas = 1: the batch is the batch
    for rank in range(degree):  # every rank reassembles the whole unsplit model
        assert max_diff(res.state_dict(rank=rank), reference) < 1e-10
    init = train_sequential(cfg.replace(max_steps=1, lr=1e-12), load_for(cfg))
    assert max_diff(reference, init) > 1e-3  # ... and training really moved it


def test_dask_equals_sim_and_unsplit_mlp(client):
    cfg = ExperimentConfig(runtime="dask", workers=2, **TP)
    dask = run(cfg, client=client, progress=False, log=None)
    sim = run(cfg.replace(runtime="sim"), progress=False, log=None)
    reference = train_sequential(cfg, load_for(cfg))
    assert max_diff(dask.state_dict(rank=0), reference) < 1e-10
    assert max_diff(dask.state_dict(rank=0), dask.state_dict(rank=1)) == 0.0
    # Two ranks sum a + b on gloo as on the simulator: the runs agree bit for bit.
    assert max_diff(dask.state_dict(rank=0), sim.state_dict(rank=0)) == 0.0
    train = dask.frame[dask.frame.kind == "train"]
    assert (train["bytes_sent"] == ring_allreduce_bytes(BATCH * HIDDEN * 8, 2)).all()


@pytest.mark.parametrize("degree", [2, 4])
def test_traffic_is_one_allreduce_per_step(degree):
    cfg = ExperimentConfig(runtime="sim", workers=degree, **TP)

    async def program(ctx) -> None:
        calls = _count_allreduces(ctx)
        await tensor_parallel.train(ctx)
        ctx.result["calls"] = calls

    rows: list[dict] = []
    outcome = execute(cfg, "traffic", rows.extend, program=program)
    steps = SMALL["max_steps"]
    # Evaluations: val then test, each two batches (250 + 150 samples), at step 0 and the end.
    evaluation = [250 * HIDDEN, 150 * HIDDEN] * 2
    mlp = build_model("mlp", (1, 28, 28), 10)
    sliced = mlp.net[1].weight.numel() + mlp.net[1].bias.numel() + mlp.net[3].weight.numel()
    expected = evaluation + [BATCH * HIDDEN] * steps + evaluation + [sliced]
    assert all(r["calls"] == expected for r in outcome.results)
    train = [r for r in rows if r["kind"] == "train"]
    assert len(train) == degree * steps
    # Exactly the one allreduce of batch × hidden float64 values, ring cost 2(p-1)/p · n.
    assert {r["bytes_sent"] for r in train} == {ring_allreduce_bytes(BATCH * HIDDEN * 8, degree)}
    evals = [r for r in rows if r["kind"] in ("val", "test")]
    assert {r["rank"] for r in evals} == {0} and len(evals) == 4
    assert {r["bytes_sent"] for r in evals} == {ring_allreduce_bytes(400 * HIDDEN * 8, degree)}
    # Every rank computes the same loss from the replicated logits.
    for step in range(1, steps + 1):
        assert len({r["loss"] for r in train if r["step"] == step}) == 1


def test_divergence_stops_every_rank_with_reason():
    cfg = ExperimentConfig(runtime="sim", workers=2, **{**TP, "lr": 1e6})
    with pytest.raises(DivergenceError, match=r"training diverged: loss=(nan|inf)"):
        run(cfg, progress=False, log=None)
