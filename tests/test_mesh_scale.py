"""The mesh at scale (#48): a 64-rank mesh (dp=4, tp=4, pp=4) trains in the simulator with the
rows, groups and bytes the grid predicts, so the 512-rank path of
``benchmarks/bench_mesh_scale.py`` stays tested without running 512 ranks; the data check
counts replicas; the mesh writes the pipelines' events table, and its zero bubble is charged
as the ``zb-h1`` strategy charges it."""

from __future__ import annotations

import matplotlib
import pytest
from common import benchmark_module

from scaledl_lab import ConfigError, ExperimentConfig, quick, run
from scaledl_lab.models import build_model
from scaledl_lab.strategies.launch import check_data
from scaledl_lab.strategies.mesh.grid import Mesh
from scaledl_lab.strategies.model_parallel.parallel_transformer import ParallelBlock
from scaledl_lab.training.worker import load_for
from scaledl_lab.viz import gantt

matplotlib.use("Agg")

TEXT = dict(
    strategy="mesh", runtime="sim", dataset="licenses", model="gpt-tiny", val_size=8,
    test_subset=8, epochs=1, lr=0.05, seed=1,
)  # fmt: skip


def _ring(nbytes: int, p: int) -> int:
    """Bytes one member sends in a ring allreduce: 2(p − 1)/p of the tensor."""
    return -(-2 * (p - 1) * nbytes // p)


def test_a_64_rank_mesh_trains_with_the_rows_and_bytes_the_grid_predicts():
    dp, tp, pp, micro_batches, batch = 4, 4, 4, 2, 4
    cfg = ExperimentConfig(
        **TEXT, mesh=f"dp={dp},tp={tp},pp={pp}", workers=64, batch_size=batch,
        micro_batches=micro_batches, max_steps=2, train_subset=64 * 8,
    )  # fmt: skip
    res = run(cfg, progress=False, log=None)
    train = res.frame[res.frame.kind == "train"]
    assert sorted(train["rank"]) == sorted(list(range(64)) * cfg.max_steps)  # every rank, step
    mesh = Mesh.parse(cfg.mesh)
    assert [len(mesh.groups(n)) for n in ("dp", "tp", "pp")] == [16, 16, 16]
    assert {len(g) for n in ("dp", "tp", "pp") for g in mesh.groups(n)} == {4}
    evals = res.frame[res.frame.kind.isin(["val", "test"])]
    where = {"dp": 0, "tp": 0, "pp": pp - 1}  # replica 0, tp rank 0, the last stage
    writer = [r for r in range(64) if all(mesh.coordinate(r, n) == c for n, c in where.items())]
    assert evals["rank"].unique().tolist() == writer
    counted = train[train.step == cfg.max_steps]["samples"].sum()
    assert counted == dp * batch  # each replica's mini-batch counted once

    data = load_for(cfg)
    gpt = build_model("gpt-tiny", data.input_shape, data.num_classes, seed=0)
    s, h, word = data.input_shape[0], gpt.embed.token.embedding_dim, 4  # float32
    activation = s * (batch // micro_batches) * h * word  # what crosses a boundary
    sizes = [
        sum(p.numel() for p in gpt.embed.parameters()),
        *(sum(p.numel() for p in ParallelBlock(b, 0, tp).parameters()) for b in gpt.blocks),
        sum(p.numel() for p in gpt.head.parameters()),
    ]  # one layer a stage: the embedding, the two blocks, the head
    for rank in range(64):
        stage = mesh.coordinate(rank, "pp")
        block = stage in (1, 2)
        predicted = (
            micro_batches * 4 * _ring(activation, tp) * block  # g forward, f backward, twice
            + micro_batches * activation * ((stage < pp - 1) + (stage > 0))  # to the neighbours
            + _ring(16, pp)  # the replica's loss and hits to every stage (two float64)
            + _ring(sizes[stage] * word, dp)  # the gradients' average over dp
        )
        sent = train[train["rank"] == rank]["bytes_sent"].tolist()
        assert sent == [predicted] * cfg.max_steps, rank


def test_the_data_check_counts_replicas_not_the_ranks_of_one_model():
    cfg = quick(ExperimentConfig(**{**TEXT, "val_size": 2000, "test_subset": None},
                                 mesh="dp=32,tp=4,pp=4", workers=512, batch_size=16,
                                 micro_batches=4))  # fmt: skip
    check_data(cfg)  # the benchmark's 512 ranks: 32 replicas of 145 samples each
    small = cfg.replace(mesh="dp=2,tp=4,pp=4", workers=32, train_subset=60, batch_size=32)
    with pytest.raises(ConfigError, match="each of the 2 replicas gets 30 training samples, "
                                          "fewer than batch_size=32; use a smaller batch, "
                                          "fewer replicas"):  # fmt: skip
        check_data(small)


def _pipeline(**fields) -> ExperimentConfig:
    return ExperimentConfig(
        **{**TEXT, "train_subset": 128, "batch_size": 16, "micro_batches": 4, "max_steps": 3,
           "workers": 2, **fields}
    )  # fmt: skip


def test_a_mesh_writes_the_events_table_the_gantt_chart_draws():
    cfg = _pipeline(mesh="dp=2,tp=2,pp=2", workers=8, pipeline_schedule="1f1b")
    res = run(cfg, progress=False, log=None)
    events = res.events
    mesh = Mesh.parse(cfg.mesh)
    tp0 = [r for r in range(8) if mesh.coordinate(r, "tp") == 0]
    assert sorted(events["rank"].unique()) == tp0  # one row per stage and replica
    assert len(events) == 2 * 2 * cfg.max_steps * cfg.micro_batches * 2  # replicas, stages, F/B
    for row in events.itertuples():
        assert row.stage == mesh.coordinate(row.rank, "pp")
        assert row.replica == mesh.coordinate(row.rank, "dp")
        assert row.end > row.start
    bubbles = gantt.bubble_summary(events)
    assert len(bubbles) == 2 and bubbles["bubble"].between(0.05, 0.9).all()
    ax = gantt.plot_pipeline(events, cfg.label)
    assert "bubble" in ax.get_title() and len(ax.patches) > 2 * 2 * cfg.micro_batches


def test_the_mesh_zero_bubble_costs_what_the_zb_h1_strategy_costs():
    mesh = run(_pipeline(mesh="pp=2", pipeline_schedule="zb-h1"), progress=False, log=None)
    strategy = run(_pipeline(strategy="zb-h1", stages=2), progress=False, log=None)
    ours, theirs = (gantt.step_bubbles(r.events) for r in (mesh, strategy))
    assert len(ours) == len(theirs) == 2 * 3  # stages × steps
    assert ours["idle"].tolist() == pytest.approx(theirs["idle"].tolist(), rel=1e-9)
    busy = {phase: (e := mesh.events[mesh.events.phase == phase])["end"] - e["start"]
            for phase in "FBW"}  # fmt: skip
    for phase in "BW":  # a third of the step each, as F: not all of the backward in B
        assert busy[phase].sum() == pytest.approx(busy["F"].sum(), rel=1e-9)


def test_the_ranks_own_arithmetic_runs_every_rank_alone():
    import asyncio

    import torch

    with benchmark_module("bench_mesh_scale") as bench:
        solo = bench.Solo(5, 8)  # member 1 of the group (4, 5)
        x = torch.arange(4.0)
        assert asyncio.run(solo.allreduce(x)).tolist() == [0, 1, 2, 3]  # the values kept
        assert asyncio.run(solo.reduce_scatter(x, (4, 5))).tolist() == [2, 3]  # its chunk
        out = asyncio.run(solo.all_gather_into(torch.empty(4), torch.ones(2), (4, 5)))
        assert out.tolist() == [1, 1, 1, 1]
        assert asyncio.run(solo.recv(torch.full((2,), 7.0), 4)).tolist() == [0, 0]
        cfg = _pipeline(mesh="dp=2,tp=2,pp=2", workers=8, max_steps=2)
        for in_turns in (True, False):  # every rank's program runs to its end, either way
            wall, cpu = bench.ranks_arithmetic(cfg, in_turns=in_turns)
            assert wall > 0 and cpu > 0
