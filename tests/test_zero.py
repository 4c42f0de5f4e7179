"""ZeRO stages 1-3 (Rajbhandari et al. 2020) and the sharded collectives they use.

Comm.reduce_scatter and Comm.all_gather_into on both runtimes (values against a reference
sum and concatenation, bytes and simulated time as the ring formulas say); each stage trains
to the parameters of ``allreduce`` with the same optimiser, on both runtimes; zero1 against
``torch.distributed.optim.ZeroRedundancyOptimizer`` and zero3 against FSDP2 ``fully_shard``.
"""

from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from common import SMALL, max_diff, small_for

from scaledl_lab import ConfigError, ExperimentConfig, WorkerLostError, run
from scaledl_lab.errors import RunError
from scaledl_lab.models import build_model
from scaledl_lab.runtime.base import shard_numel
from scaledl_lab.runtime.sim.cost import (
    ComputeProfile,
    CostModel,
    NetworkProfile,
    Stragglers,
    allreduce_time,
    reduce_scatter_time,
    ring_all_gather_bytes,
    ring_allreduce_bytes,
    ring_reduce_scatter_bytes,
)
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.launch import execute
from scaledl_lab.strategies.memory.pytorch import train_with_pytorch
from scaledl_lab.training.worker import load_for

cloudpickle.register_pickle_by_value(sys.modules[__name__])

NET = NetworkProfile("test", 1e-3, 1e6)


def _world(size: int, algorithm: str = "ring") -> SimWorld:
    cost = CostModel(ComputeProfile("test", 1e-2, 1e-4), NET, algorithm, Stragglers())
    return SimWorld(size, cost)


def _inputs(rank: int, numel: int) -> torch.Tensor:
    """Rank ``rank``'s distinct input: values no two ranks share, so a wrong sum shows."""
    gen = torch.Generator().manual_seed(100 + rank)
    return torch.randn(numel, generator=gen, dtype=torch.float64)


def test_ring_byte_formulas_are_the_two_halves_of_the_allreduce():
    for p in (1, 2, 3, 4, 8):
        for n in (0, 8, 1000, 4096):
            assert ring_reduce_scatter_bytes(n, p) == -(-(p - 1) * n // p)
            assert ring_all_gather_bytes(n, p) == ring_reduce_scatter_bytes(n, p)
            if n % p == 0:  # no rounding: the halves add up exactly
                assert 2 * ring_reduce_scatter_bytes(n, p) == ring_allreduce_bytes(n, p)
        assert 2 * reduce_scatter_time(4000, p, NET) == pytest.approx(allreduce_time(4000, p, NET))


@pytest.mark.parametrize("algorithm", ["ring", "recursive-doubling"])
@pytest.mark.parametrize("size", [2, 3, 4])
def test_reduce_scatter_and_all_gather_on_sim(size, algorithm):
    world = _world(size, algorithm)
    numel = 6 * size
    seen = {}

    async def program(comm):
        mine = _inputs(comm.rank, numel)
        chunk = await comm.reduce_scatter(mine)
        after_rs = (comm.now(), comm.bytes_sent)
        whole = torch.empty(numel, dtype=torch.float64)
        await comm.all_gather_into(whole, chunk)
        seen[comm.rank] = (mine.clone(), chunk, whole, after_rs, comm.now(), comm.bytes_sent)

    world.run([program] * size)
    total = sum(_inputs(r, numel) for r in range(size))  # in rank order, as the allreduce
    nbytes = numel * 8
    for rank, (mine, chunk, whole, (t_rs, b_rs), t_end, b_end) in seen.items():
        assert torch.equal(mine, _inputs(rank, numel))  # the input is left as it was
        assert torch.equal(chunk, total.chunk(size)[rank])
        assert torch.equal(whole, total)
        assert b_rs == (size - 1) * nbytes // size
        assert b_end == 2 * (size - 1) * nbytes // size
        expected = reduce_scatter_time(nbytes, size, NET, algorithm)
        assert t_rs == pytest.approx(expected)
        assert t_end == pytest.approx(2 * expected)


def test_sharded_collectives_refuse_sizes_that_do_not_divide():
    world = _world(3)
    errors = {}

    async def program(comm):
        try:
            await comm.reduce_scatter(torch.zeros(10))
        except RunError as exc:
            errors[("rs", comm.rank)] = str(exc)
        try:
            await comm.all_gather_into(torch.zeros(10), torch.zeros(3))
        except RunError as exc:
            errors[("ag", comm.rank)] = str(exc)

    world.run([program] * 3)
    assert "divides by the group's 3 members" in errors[("rs", 0)]
    assert "pad it with zeros to 12 elements" in errors[("rs", 0)]
    assert "flat out of 3 × the shard's size" in errors[("ag", 2)]


async def _sharded_program(ctx):
    comm = ctx.comm
    size = comm.world_size
    mine = _inputs(comm.rank, 4 * size)
    before = comm.bytes_sent
    chunk = await comm.reduce_scatter_start(mine).wait()
    rs_sent = comm.bytes_sent - before
    whole = torch.empty(4 * size, dtype=torch.float64)
    await comm.all_gather_into_start(whole, chunk).wait()
    ctx.result.update(chunk=chunk, whole=whole, rs_sent=rs_sent, sent=comm.bytes_sent - before)


@pytest.mark.parametrize("runtime", ["dask", "sim"])
def test_sharded_collectives_on_both_runtimes(runtime, request):
    client = request.getfixturevalue("client") if runtime == "dask" else None
    cfg = ExperimentConfig(strategy="allreduce", runtime=runtime, workers=2, model="mlp", **SMALL)
    out = execute(cfg, "sharded", lambda rows: None, client=client, program=_sharded_program)
    total = _inputs(0, 8) + _inputs(1, 8)
    for rank, res in enumerate(out.results):
        assert torch.equal(res["chunk"], total.chunk(2)[rank])  # a + b: bit for bit
        assert torch.equal(res["whole"], total)
        assert res["rs_sent"] == 4 * 8  # (p − 1)/p of 64 bytes
        assert res["sent"] == 2 * 4 * 8


# -- the stages against their sequential twin (allreduce) and against PyTorch ---------------

ADAM = dict(optimizer="adam", lr=1e-3)


def _zero_cfg(strategy: str, runtime: str, **changes) -> ExperimentConfig:
    """Eight steps by default (SGD with momentum and Adam both past their first steps), on the
    data those steps read; what is compared is bits, which a wrong stage changes at step one."""
    steps, workers = changes.pop("max_steps", 8), changes.get("workers", 2)
    options = {"workers": 2, "model": "mlp", **small_for(steps, workers), **changes}
    return ExperimentConfig(strategy=strategy, runtime=runtime, **options)


@pytest.fixture(scope="module")
def allreduce_runs():
    """allreduce on the simulator, SGD with momentum and Adam: the twin of every stage (it
    equals single-process training on the combined batch: test_sync_sgd)."""
    return {
        opt: run(_zero_cfg("allreduce", "sim", **extra), progress=False)
        for opt, extra in (("sgd", {}), ("adam", ADAM))
    }


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3"])
@pytest.mark.parametrize("runtime", ["sim", "dask"])
def test_each_stage_trains_to_the_parameters_of_allreduce(
    runtime, strategy, optimizer, allreduce_runs, request
):
    """Bit for bit, in float32: every gradient element is the same a + b (two ranks: gloo's
    and the simulator's sum), divided by 2 as allreduce divides, and SGD and Adam step each
    element from its own gradient and state, so a shard steps as the whole model would. The
    simulator equals gloo bit for bit too: the Dask run is compared with the same reference."""
    client = request.getfixturevalue("client") if runtime == "dask" else None
    extra = ADAM if optimizer == "adam" else {}
    res = run(_zero_cfg(strategy, runtime, **extra), client=client, progress=False)
    ref = allreduce_runs[optimizer]
    for rank in (0, 1):
        assert max_diff(res.state_dict(rank=rank), ref.state_dict(rank=0)) == 0.0
    assert max_diff(ref.state_dict(), _initial(ref.configs[0])) > 1e-3  # it trained
    # The same evaluations, and the traffic of data parallelism (stages 1-2) or 1.5x (stage 3).
    cols = ["kind", "step", "loss", "accuracy"]
    evals = res.frame.query("kind != 'train'")[cols].reset_index(drop=True)
    assert evals.equals(ref.frame.query("kind != 'train'")[cols].reset_index(drop=True))
    _assert_traffic(res, strategy)


def _initial(cfg: ExperimentConfig) -> dict[str, torch.Tensor]:
    data = load_for(cfg)
    return build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed).state_dict()


def _assert_traffic(res, strategy: str) -> None:
    """Bytes per step from the layers' padded sizes: reduce-scatter + all-gather (+ one more
    all-gather at stage 3) of each layer, and the loss's 8-byte allreduce."""
    cfg = res.configs[0]
    p = cfg.workers
    model = _initial(cfg)
    sizes = [model[f"net.{i}.weight"].numel() + model[f"net.{i}.bias"].numel() for i in (1, 3, 5)]
    padded = sum(p * shard_numel(n, p) * 4 for n in sizes)
    passes = 3 if strategy == "zero3" else 2
    expected = passes * ring_reduce_scatter_bytes(padded, p) + ring_allreduce_bytes(8, p)
    train = res.frame.query("kind == 'train'")
    assert (train["bytes_sent"] == expected).all()


@pytest.mark.parametrize(
    ("strategy", "runtime"), [("zero3", "sim"), ("zero3", "dask"), ("zero2", "sim")]
)
def test_recomputation_equals_no_recomputation(strategy, runtime, request):
    """Each block's forward run again in backward gives the same gradients, bit for bit."""
    client = request.getfixturevalue("client") if runtime == "dask" else None
    cfg = _zero_cfg(strategy, runtime, max_steps=8, **ADAM)
    plain = run(cfg, client=client, progress=False)
    again = run(cfg.replace(recompute=True), client=client, progress=False)
    assert max_diff(plain.state_dict(), again.state_dict()) == 0.0


@pytest.mark.parametrize("workers", [3, 4])
def test_stages_on_more_workers_equal_allreduce_on_sim(workers):
    """Three workers: every layer's size is padded to a multiple of 3 (the last shard holds
    zeros); the simulator sums in rank order for both collectives, so still bit for bit."""
    cfg = _zero_cfg("allreduce", "sim", workers=workers, max_steps=6, **ADAM)
    ref = run(cfg, progress=False).state_dict()
    for strategy in ("zero1", "zero2", "zero3"):
        res = run(cfg.replace(strategy=strategy), progress=False)
        assert max_diff(res.state_dict(rank=workers - 1), ref) == 0.0


def test_zero3_on_the_cnn_equals_allreduce_on_sim():
    cfg = _zero_cfg("allreduce", "sim", model="cnn", max_steps=4, **ADAM)
    ref = run(cfg, progress=False).state_dict()
    for recompute in (False, True):
        res = run(cfg.replace(strategy="zero3", recompute=recompute), progress=False)
        assert max_diff(res.state_dict(), ref) == 0.0


@pytest.mark.parametrize(
    ("strategy", "kind", "optimizer"),
    [("zero1", "zero-redundancy", {}), ("zero3", "fully-shard", ADAM)],
)
def test_stages_give_the_parameters_of_pytorchs_own(strategy, kind, optimizer, client):
    """zero1 against ZeroRedundancyOptimizer (after an allreduce of gradients divided by 2, as
    DDP does), zero3 against FSDP2 fully_shard on every layer (gradients divided by 2 before
    its reduce-scatter: exact for two workers, a power of two), 2 gloo processes, 10 steps:
    the same bits."""
    cfg = _zero_cfg(strategy, "dask", max_steps=10, **optimizer)
    lab = run(cfg, client=client, progress=False).state_dict()
    theirs = train_with_pytorch(cfg, kind)
    assert max_diff(lab, theirs) == 0.0
    assert max_diff(theirs, _initial(cfg)) > 1e-3


def test_zero3_in_bfloat16_gives_the_parameters_of_fsdp2_mixed_precision():
    """zero3 with --precision bfloat16 against fully_shard with MixedPrecisionPolicy (bfloat16
    compute and reduce-scatter, float32 shards stepped by Adam, float32 logits), its shards
    started from the 16-bit weights as the lab's masters are: 10 steps, the same bits."""
    cfg = _zero_cfg("zero3", "sim", max_steps=10, precision="bfloat16", **ADAM)
    lab = run(cfg, progress=False).state_dict()
    theirs = train_with_pytorch(cfg, "fully-shard")
    assert all(v.dtype == torch.bfloat16 for v in theirs.values())
    assert max_diff(lab, theirs) == 0.0
    assert max_diff(theirs, _initial(cfg)) > 1e-3


# -- errors before any work -----------------------------------------------------------------


def test_layerwise_optimisers_are_refused():
    with pytest.raises(ConfigError, match="optimizer='lars' scales each layer's step"):
        _zero_cfg("zero2", "sim", optimizer="lars")


def test_no_bias_decay_is_refused():
    with pytest.raises(ConfigError, match="set no_bias_decay=False"):
        _zero_cfg("zero1", "sim", no_bias_decay=True)


def test_compression_is_refused():
    with pytest.raises(ConfigError, match="compress='topk:0.01'"):
        _zero_cfg("zero2", "sim", compress="topk:0.01")


def test_pytorch_comparison_refuses_an_unknown_kind():
    with pytest.raises(ConfigError, match="kind='ddp' is unknown"):
        train_with_pytorch(_zero_cfg("zero1", "sim"), "ddp")


@pytest.mark.parametrize(
    ("precision", "kind"),
    [("float16", "fully-shard"), ("bfloat16", "zero-redundancy")],
)
def test_pytorch_comparison_refuses_a_precision_without_a_twin(precision, kind):
    cfg = _zero_cfg("zero3", "sim", precision=precision)
    with pytest.raises(ConfigError, match=f"precision='{precision}' has no PyTorch twin here"):
        train_with_pytorch(cfg, kind)


def test_a_killed_worker_stops_a_zero_run():
    """ZeRO is synchronous: every rank holds a shard no other rank has, so losing one ends it."""
    with pytest.raises(WorkerLostError, match="rank 1 died after step 3"):
        run(_zero_cfg("zero2", "sim", faults="kill:1:3"), progress=False)
