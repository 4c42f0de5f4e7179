"""The device mesh (#48): its grid and groups, its config errors, and its twins: meshes of
dp, tp, pp ∈ {1, 2} across the ZeRO stages, sequence parallelism, recomputation and the four
schedules (a pairwise covering set, not their product) equal single-process training of the
whole gpt-tiny; a broken composition fails the twin; real Dask workers equal the simulator."""

from __future__ import annotations

import itertools

import pytest
from common import assert_same_run, max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.strategies.mesh import program, view
from scaledl_lab.strategies.mesh.gather import assemble
from scaledl_lab.strategies.mesh.grid import Mesh
from scaledl_lab.strategies.mesh.layers import Deferred
from scaledl_lab.strategies.model_parallel.conjugates import Exchange
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for

TEXT = dict(
    strategy="mesh", runtime="sim", dataset="licenses", model="gpt-tiny", train_subset=160,
    val_size=8, test_subset=8, batch_size=8, epochs=1, max_steps=10, lr=0.05, momentum=0.9,
    precision="float64", seed=1, micro_batches=2,
)  # fmt: skip
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")

# Every pair of option values at least once: rows (zero stage i, schedule j) of the 4 × 4
# product, each two-valued option a distinct non-zero linear function over GF(2) of the bits
# of i and j (an orthogonal array): dp = i0+j0, tp = i1+j1, pp = i0+j1, sequence parallelism
# = i1+j0, recomputation = i0+i1+j0+j1. test_the_table_covers_every_pair checks it.
PAIRWISE = [
    (
        1 + (i & 1 ^ j & 1),
        1 + (i >> 1 ^ j >> 1),
        1 + (i & 1 ^ j >> 1),
        bool(i >> 1 ^ j & 1),
        bool((i & 1) ^ (i >> 1) ^ (j & 1) ^ (j >> 1)),
        i,
        SCHEDULES[j],
    )
    for i in range(4)
    for j in range(4)
]
FACTORS = ("dp", "tp", "pp", "sequence_parallel", "recompute", "zero_stage", "schedule")


def _config(dp, tp, pp, sp=False, recompute=False, zero=0, schedule="1f1b", **extra):
    virtual = 2 if schedule == "interleaved-1f1b" and pp == 2 else 1
    return ExperimentConfig(
        **{**TEXT, **extra}, mesh=f"dp={dp},pp={pp},tp={tp}", workers=dp * tp * pp,
        sequence_parallel=sp, recompute=recompute, zero_stage=zero, pipeline_schedule=schedule,
        virtual_stages=virtual,
    )  # fmt: skip


def test_the_table_covers_every_pair():
    values = [sorted(set(column)) for column in zip(*PAIRWISE, strict=True)]
    assert values[:5] == [[1, 2], [1, 2], [1, 2], [False, True], [False, True]]
    assert values[5:] == [[0, 1, 2, 3], sorted(SCHEDULES)]
    for a, b in itertools.combinations(range(len(FACTORS)), 2):
        seen = {(row[a], row[b]) for row in PAIRWISE}
        assert seen == set(itertools.product(values[a], values[b])), (FACTORS[a], FACTORS[b])


def test_ranks_lie_on_the_grid_with_the_last_name_innermost():
    mesh = Mesh.parse("dp=2,tp=2,pp=2")
    assert mesh.world_size == 8 and mesh.size("dp") == 2
    assert mesh.groups("pp") == [(0, 1), (2, 3), (4, 5), (6, 7)]  # adjacent ranks
    assert mesh.groups("tp") == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert mesh.groups("dp") == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert [mesh.coordinate(5, n) for n in ("dp", "tp", "pp")] == [1, 0, 1]
    inner = Mesh.parse("pp=2,tp=4")
    assert inner.groups("tp") == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert inner.group_of(6, "pp") == (2, 6) and inner.group_of(6, "dp") == (6,)
    assert str(inner) == "pp=2,tp=4"


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(mesh="dp=2,tp=2"), r"mesh='dp=2,tp=2' has 4 ranks but workers=2; the product"),
        (dict(mesh="tp=8", workers=8), r"tp=8 does not divide gpt-tiny's 4 attention heads"),
        (
            dict(mesh="pp=3", workers=3),
            r"pp=3 × virtual_stages=1 = 3 stages do not divide "
            r"gpt-tiny's 4 layers",
        ),  # fmt: skip
        (
            dict(mesh="dp=2", micro_batches=3),
            r"micro_batches=3 does not divide the per-replica "
            r"batch_size=8",
        ),  # fmt: skip
        (dict(mesh="dp=2", global_batch_size=9), r"global_batch_size=9 .*2 replicas"),
        (dict(mesh="dp=2,xp=1"), r"unknown dimension 'xp'; the mesh's dimensions are dp, tp, pp"),
        (dict(mesh="dp=1,dp=2"), r"mesh='dp=1,dp=2' names 'dp' twice"),
        (dict(mesh="ep=2"), r"ep=2 spreads the experts of model='gpt-tiny-moe'"),
        (dict(mesh="dp=two"), r"dp='two' must be a positive integer"),
        (dict(mesh=" "), r"mesh=' ' must name the dimensions and their sizes"),
        (dict(mesh=None), r"strategy='mesh' needs mesh=..., its dimensions"),
        (
            dict(mesh="dp=2", model="mlp", dataset="fashion-mnist"),
            r"strategy='mesh' splits gpt-tiny's blocks; model='mlp' is not supported",
        ),  # fmt: skip
        (dict(mesh="dp=2", zero_stage=4), r"zero_stage=4 must be one of 0, 1, 2, 3"),
        (
            dict(mesh="dp=2", pipeline_schedule="pipedream"),
            r"pipeline_schedule='pipedream' must be one of 'gpipe', '1f1b'",
        ),  # fmt: skip
        (dict(mesh="dp=2", optimizer="lars"), r"optimizer='lars' scales each layer's step"),
        (dict(mesh="dp=2", virtual_stages=0), r"virtual_stages=0 must be a positive integer"),
        (dict(mesh="dp=2", micro_batches=0), r"micro_batches=0 must be a positive integer"),
        (
            dict(mesh="pp=2", virtual_stages=2),
            r"virtual_stages=2 needs "
            r"pipeline_schedule='interleaved-1f1b' and pp of at least 2",
        ),  # fmt: skip
        (
            dict(
                mesh="pp=2", virtual_stages=2, pipeline_schedule="interleaved-1f1b", micro_batches=1
            ),
            r"micro_batches=1 is not a multiple of pp=2",
        ),  # fmt: skip
    ],
)
def test_config_errors_before_any_work(fields, message):
    given = {**TEXT, "workers": 2, **fields}
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**given)


def test_mesh_options_belong_to_the_mesh():
    for name, value in (("mesh", "dp=2"), ("zero_stage", 1), ("pipeline_schedule", "gpipe")):
        with pytest.raises(ConfigError, match=f"{name}=.* applies only to strategy='mesh'"):
            ExperimentConfig(strategy="allreduce", workers=2, **{name: value})


def test_assemble_writes_pieces_by_the_unsplit_names():
    import torch

    shapes = {"a": torch.ones(2, 4), "b": torch.ones(3)}
    state = assemble(shapes, [("a", (slice(None), slice(0, 2)), torch.full((2, 2), 5.0))])
    assert state["a"].tolist() == [[5, 5, 0, 0], [5, 5, 0, 0]] and state["b"].tolist() == [0] * 3
    with pytest.raises(KeyError, match="'c' is no tensor of the unsplit model"):
        assemble(shapes, [("c", (slice(None),), torch.ones(1))])


def test_the_ledger_halves_what_each_zero_stage_shards_over_dp():
    columns = ["mem_params", "mem_grads", "mem_optim"]
    ledger = {}
    for zero in range(4):
        cfg = _config(2, 2, 2, zero=zero, max_steps=2, precision="float32")
        train = run(cfg, progress=False, log=None).frame.query("kind == 'train' and rank == 0")
        ledger[zero] = train[columns].iloc[-1].tolist()
    params, grads, optim = ledger[0]
    assert ledger[1] == [params, grads, optim / 2]
    assert ledger[2] == [params, grads / 2, optim / 2]
    assert ledger[3] == [params / 2, grads / 2, optim / 2]


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_sixteen_bits_train_on_a_mesh(precision):
    adam = dict(optimizer="adam", lr=3e-3, momentum=0.0, max_steps=12, train_subset=320)
    cfg = _config(2, 2, 2, True, False, 2, "1f1b", precision=precision, **adam)
    train = run(cfg, progress=False, log=None).frame.query("kind == 'train'")
    first, last = train[train.step == 1], train[train.step == cfg.max_steps]
    assert last["loss"].mean() < first["loss"].mean() - 0.5  # it learns
    scales = train["loss_scale"].dropna()  # float16: the dynamic scale, the same everywhere
    assert len(scales) == (len(train) if precision == "float16" else 0)


def _twin_diff(cfg: ExperimentConfig) -> float:
    res = run(cfg, progress=False, log=None)
    return max_diff(res.model_state_dict(), train_sequential(cfg, load_for(cfg)))


@pytest.mark.parametrize("row", PAIRWISE, ids=lambda r: "-".join(map(str, r)))
def test_every_pair_of_dimensions_and_options_equals_the_sequential_twin(row):
    dp, tp, pp, sp, recompute, zero, schedule = row
    cfg = _config(dp, tp, pp, sp, recompute, zero, schedule)
    assert _twin_diff(cfg) < 1e-10


def test_rows_and_the_whole_model_back():
    cfg = _config(2, 2, 2, True, False, 3, "1f1b")
    res = run(cfg, progress=False, log=None)
    frame = res.frame
    train = frame[frame.kind == "train"]
    assert sorted(train["rank"].unique()) == list(range(8))
    assert len(train) == 8 * cfg.max_steps
    evals = frame[frame.kind.isin(["val", "test"])]
    assert evals["rank"].unique().tolist() == [2]  # replica 0, the last stage, tp rank 0
    assert train[train.step == cfg.max_steps]["samples"].sum() == 2 * cfg.batch_size
    state = res.model_state_dict()
    reference = train_sequential(cfg, load_for(cfg))
    assert list(state) == list(reference)  # all of gpt-tiny's tensors, by their names
    init = train_sequential(cfg.replace(max_steps=1, lr=1e-12), load_for(cfg))
    assert max_diff(reference, init) > 1e-3  # the twin moved: the comparison has power


async def _no_region_sum(self):  # sequence parallelism's split regions left unsummed
    return None


def _no_dp_average(params, flat):  # the dp sum written back, not divided by dp
    from scaledl_lab.params import write_grads

    return write_grads(params, flat * 2)


def _no_weights(self, module):  # zero bubble's W left out
    return None


@pytest.mark.parametrize(
    "target, name, broken, mesh",
    [
        (Exchange, "f_backward", None, dict(dp=1, tp=2, pp=1)),
        (Deferred, "weights", _no_weights, dict(dp=1, tp=2, pp=2, schedule="zb-h1")),
        (program.MeshModel, "_sum_split_regions", _no_region_sum, dict(dp=1, tp=2, pp=1, sp=True)),
        (view, "write_grads", _no_dp_average, dict(dp=2, tp=1, pp=2)),
    ],
)
def test_a_broken_composition_fails_the_twin(monkeypatch, target, name, broken, mesh):
    if broken is None:

        async def broken(self, grad):
            if self.sequence_parallel:
                return await self.reduce_scatter(grad)
            return grad  # the allreduce left out

    monkeypatch.setattr(target, name, broken)
    assert _twin_diff(_config(**mesh)) > 1e-4


@pytest.mark.parametrize("mesh", [dict(dp=2, tp=2, pp=1), dict(dp=1, tp=2, pp=2)])
def test_four_dask_workers_equal_the_simulator_bit_for_bit(four_workers, mesh):
    cfg = _config(**mesh, sp=True, zero=1, max_steps=3)
    sim = run(cfg, progress=False, log=None)
    real = run(cfg.replace(runtime="dask"), client=four_workers, progress=False, log=None)
    assert_same_run(sim, real)
