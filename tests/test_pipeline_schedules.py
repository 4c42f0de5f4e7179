"""Interleaved 1F1B and zero bubble H1: the schedules written out in full and equal to
torch.distributed.pipelining's, every dependency kept, the messages in order, both equal to GPipe
and to single-process training, real Dask equal to the simulator, the bubbles against their
formulas, the stashed activations, and the config errors."""

from __future__ import annotations

import asyncio

import pytest
import torch
from common import max_diff
from torch import nn

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.errors import ConfigError
from scaledl_lab.strategies.model_parallel import channels, partition
from scaledl_lab.strategies.model_parallel.pipeline import Stage
from scaledl_lab.strategies.model_parallel.schedules import (
    bubble,
    execution_order,
    in_flight,
    interleaved_1f1b,
    one_f_one_b,
    zb_h1,
)
from scaledl_lab.studies.model_parallel.study import compare_schedules
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for
from scaledl_lab.viz.gantt import step_bubbles

TINY = dict(
    dataset="fashion-mnist", train_subset=480, test_subset=64, val_size=64, epochs=1, lr=0.05
)
F, B, W = "F", "B", "W"


def merged_state(results, cfg):
    state = {}
    for out in results.outputs[cfg.label][: cfg.model_parallel_size]:
        state.update(out["state_dict"])
    return state


# -- the schedules, written out in full ----------------------------------------------------------


def test_interleaved_1f1b_two_workers_four_micro_batches_two_chunks():
    # Worker 0 warms up with (2 − 0 − 1)·2 + (2 − 1)·2 = 4 forwards, worker 1 with 2; forwards go
    # through chunk 0 in groups of p = 2 micro-batches, then chunk 1; backwards chunk 1 first.
    assert interleaved_1f1b(2, 4, 2) == [
        [(F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
         (F, 2, 0), (B, 0, 1), (F, 3, 0), (B, 1, 1), (F, 2, 1), (B, 0, 0), (F, 3, 1), (B, 1, 0),
         (B, 2, 1), (B, 3, 1), (B, 2, 0), (B, 3, 0)],
        [(F, 0, 0), (F, 1, 0),
         (F, 0, 1), (B, 0, 1), (F, 1, 1), (B, 1, 1), (F, 2, 0), (B, 0, 0), (F, 3, 0), (B, 1, 0),
         (F, 2, 1), (B, 2, 1), (F, 3, 1), (B, 3, 1),
         (B, 2, 0), (B, 3, 0)],
    ]  # fmt: skip


def test_interleaving_with_one_chunk_is_1f1b():
    for p, m in [(2, 4), (4, 8), (3, 5)]:
        assert interleaved_1f1b(p, m, 1) == [
            [(phase, mb, 0) for phase, mb in ops] for ops in one_f_one_b(p, m)
        ]


def test_zb_h1_defers_stage_s_weight_gradients_by_s():
    assert zb_h1(2, 4) == [
        [(F, 0), (F, 1), (B, 0), (W, 0), (F, 2), (B, 1), (W, 1), (F, 3), (B, 2), (W, 2),
         (B, 3), (W, 3)],
        [(F, 0), (B, 0), (F, 1), (B, 1), (W, 0), (F, 2), (B, 2), (W, 1), (F, 3), (B, 3), (W, 2),
         (W, 3)],
    ]  # fmt: skip
    assert zb_h1(4, 4)[3] == [
        (F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2), (F, 3), (B, 3), (W, 0), (W, 1), (W, 2),
        (W, 3),
    ]  # fmt: skip
    # F and B in 1F1B's order: only the Ws are new.
    for p, m in [(4, 8), (3, 2)]:
        for zb, ref in zip(zb_h1(p, m), one_f_one_b(p, m), strict=True):
            assert [op for op in zb if op[0] != W] == ref


CASES = [(p, m, v) for p in (2, 4, 8) for m in (4, 8, 16) for v in (1, 2) if v == 1 or m % p == 0]


@pytest.mark.parametrize(("p", "m", "v"), CASES)
def test_interleaved_and_zb_h1_keep_every_dependency_and_never_deadlock(p, m, v):
    zero_bubble = [[(*op, 0) for op in ops] for ops in zb_h1(p, m)]
    for schedule, chunks in ((interleaved_1f1b(p, m, v), v), (zero_bubble, 1)):
        order = execution_order(schedule)
        at = {(op[1], op[2], op[3] * p + op[0]): i for i, op in enumerate(order)}  # virtual
        phases = {op[1] for op in order}
        assert len(order) == len(phases) * p * chunks * m and len(at) == len(order)
        last = p * chunks - 1
        for stage in range(p * chunks):
            for mb in range(m):
                assert at[(F, mb, stage)] < at[(B, mb, stage)]
                if stage:
                    assert at[(F, mb, stage - 1)] < at[(F, mb, stage)]
                if stage < last:
                    assert at[(B, mb, stage + 1)] < at[(B, mb, stage)]
                if W in phases:
                    assert at[(B, mb, stage)] < at[(W, mb, stage)]


def test_the_checker_reports_a_weight_gradient_before_its_backward_and_a_chunk_out_of_order():
    with pytest.raises(ValueError, match=r"deadlocks: stages \[0\]"):
        execution_order([[(F, 0), (W, 0), (B, 0)], [(F, 0), (B, 0), (W, 0)]])
    # Worker 1's chunk 1 (virtual stage 3) before its chunk 0 (virtual stage 1).
    swapped = [[(F, 0, 0), (F, 0, 1), (B, 0, 1), (B, 0, 0)],
               [(F, 0, 1), (F, 0, 0), (B, 0, 1), (B, 0, 0)]]  # fmt: skip
    with pytest.raises(ValueError, match="deadlocks"):
        execution_order(swapped)
    with pytest.raises(ValueError, match="multiple of stages=4"):
        interleaved_1f1b(4, 6, 2)


def test_the_peak_stash_of_zb_h1_is_1f1bs_and_interleavings_follows_its_warm_up():
    p, m = 4, 8
    assert [in_flight(ops) for ops in zb_h1(p, m)] == [p - s for s in range(p)]
    assert [in_flight(ops) for ops in zb_h1(p, m)] == [in_flight(o) for o in one_f_one_b(p, m)]
    # Stage s also holds, between B and W, the s micro-batches whose W it has deferred.
    assert [in_flight(ops, until=W) for ops in zb_h1(p, m)] == [p] * p
    assert [in_flight(ops, until=W) for ops in one_f_one_b(p, m)] == [p - s for s in range(p)]
    v = 2  # warm-up + 1 (chunk, micro-batch) pairs: each 1/V of a stage's activations
    assert [in_flight(ops) for ops in interleaved_1f1b(p, m, v)] == [
        (p - s - 1) * 2 + (v - 1) * p + 1 for s in range(p)
    ]


# -- torch.distributed.pipelining's order of operations ---------------------------------------


def torch_order(schedule_class, p, m, v):
    """The class's pipeline_order for p ranks of v local stages, computed without a process
    group: its per-rank helper reads only these four attributes."""
    from torch.distributed.pipelining.schedules import _ComputationType as T

    schedule = object.__new__(schedule_class)
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = p, v, m
    schedule.number_of_rounds = max(1, m // p)
    schedule.microbatches_per_round = m // schedule.number_of_rounds
    phase = {T.FORWARD: F, T.FULL_BACKWARD: B, T.BACKWARD_INPUT: B, T.BACKWARD_WEIGHT: W}
    return [
        [(phase[a.computation_type], a.microbatch_index, a.stage_index // p)
         for a in schedule._calculate_single_rank_operations(rank) if a is not None]
        for rank in range(p)
    ]  # fmt: skip


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 4, 2), (8, 16, 2), (4, 8, 4)])
def test_interleaved_1f1b_is_torch_pipelinings_schedule_interleaved_1f1b(p, m, v):
    from torch.distributed.pipelining.schedules import ScheduleInterleaved1F1B

    assert torch_order(ScheduleInterleaved1F1B, p, m, v) == interleaved_1f1b(p, m, v)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 2), (8, 16), (8, 4)])
def test_zb_h1_is_torch_pipelinings_interleaved_zero_bubble_with_one_local_stage(p, m):
    from torch.distributed.pipelining.schedules import ScheduleInterleavedZeroBubble

    ours = [[(*op, 0) for op in ops] for ops in zb_h1(p, m)]
    assert torch_order(ScheduleInterleavedZeroBubble, p, m, 1) == ours


# -- messages -----------------------------------------------------------------------------------


def test_every_boundary_is_a_message_interleaving_sends_pv_minus_1_over_p_minus_1_times_more():
    for p, m, v in [(2, 4, 2), (4, 8, 2), (4, 8, 3)]:
        sent = channels.messages(interleaved_1f1b(p, m, v))
        flat = sorted(sent.values(), key=len)
        assert sum(map(len, flat)) == 2 * m * (p * v - 1)
        assert sum(map(len, channels.messages(one_f_one_b(p, m)).values())) == 2 * m * (p - 1)
    # Two workers: 0 → 1 carries chunk 0's activations to chunk 1 (virtual stage 1), chunk 1's
    # to chunk 3, and chunk 2's input gradients back to chunk 1, in the order worker 0 runs them.
    assert channels.messages(interleaved_1f1b(2, 4, 2))[(0, 1)] == [
        (F, 0, 1), (F, 1, 1), (F, 0, 3), (F, 1, 3), (F, 2, 1), (B, 0, 1), (F, 3, 1), (B, 1, 1),
        (F, 2, 3), (F, 3, 3), (B, 2, 1), (B, 3, 1),
    ]  # fmt: skip
    assert channels.messages(zb_h1(3, 2)) == channels.messages(one_f_one_b(3, 2))


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_every_link_delivers_in_the_order_its_receiver_needs(p):
    for m in (p, 2 * p, 4 * p):
        for v in (1, 2, 3, 4):
            schedule = interleaved_1f1b(p, m, v)
            assert channels.receives(schedule) == channels.messages(schedule)
        assert channels.receives(zb_h1(p, m)) == channels.messages(zb_h1(p, m))


@pytest.mark.parametrize("ahead", [True, False], ids=["posted ahead", "posted when due"])
def test_the_inbox_keeps_an_early_message_until_its_operation_runs(ahead):
    class Link:  # one FIFO link, as gloo's and the simulator's point-to-point messages
        posts_ahead = ahead

        def __init__(self, sent):
            self.sent, self.posted = list(sent), 0

        def irecv(self, tensor, src):
            self.posted += 1
            sent = self.sent

            class Posted:  # received in the order posted
                async def wait(self):
                    return tensor.copy_(sent.pop(0))

            return Posted()

    order = [(F, 0, 1), (B, 0, 1), (F, 1, 1)]
    values = {key: torch.full((2,), float(i)) for i, key in enumerate(order)}
    link = Link(values[k] for k in order)
    inbox = channels.Inbox(link, {5: order}, lambda k: (2,), torch.float64, ahead=2)
    assert link.posted == (2 if ahead else 0)  # the next two, as the step starts

    async def take_out_of_order():
        return [await inbox.take(key, 5) for key in [(F, 1, 1), (F, 0, 1), (B, 0, 1)]]

    got = asyncio.run(take_out_of_order())
    assert [t[0].item() for t in got] == [2.0, 0.0, 1.0]
    assert inbox.early == {} and link.posted == 3


def test_a_run_counts_its_messages():
    p, m, v, steps = 2, 4, 2, 3
    base = dict(runtime="sim", workers=p, model="mlp", micro_batches=m, batch_size=8,
                max_steps=steps, **TINY)  # fmt: skip
    inter = ExperimentConfig(strategy="interleaved-1f1b", virtual_stages=v, **base)
    plain = ExperimentConfig(strategy="1f1b", **base)
    count = {
        cfg.strategy: sum(o["messages_sent"] for o in run(cfg, progress=False).outputs[cfg.label])
        for cfg in (inter, plain)
    }
    assert count == {"interleaved-1f1b": steps * 2 * m * (p * v - 1), "1f1b": steps * 2 * m}


# -- equal to GPipe and to single-process training ---------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "workers", "virtual", "model"),
    [("interleaved-1f1b", 2, 2, "mlp"), ("interleaved-1f1b", 3, 2, "mlp"),
     ("interleaved-1f1b", 2, 3, "cnn"), ("zb-h1", 3, 1, "mlp"), ("zb-h1", 2, 1, "cnn")],
)  # fmt: skip
def test_interleaved_and_zb_h1_equal_gpipe_and_single_process_training(
    strategy, workers, virtual, model
):
    # Four steps: the first update, then updates that read the momentum and weights of those
    # before (a stage stepped with stale weights or a gradient left over shows from step 2).
    common = dict(runtime="sim", workers=workers, model=model, micro_batches=2 * workers,
                  precision="float64", batch_size=8 * workers, max_steps=4, momentum=0.9,
                  **TINY)  # fmt: skip
    cfg = ExperimentConfig(strategy=strategy, virtual_stages=virtual, **common)
    res = run(cfg, progress=False)
    # GPipe over the same p·V stages (a pipeline's cut does not change its gradients).
    ref = ExperimentConfig(strategy="gpipe", **common)
    gpipe = run(ref, progress=False)
    ours = merged_state(res, cfg)
    assert ours.keys() == merged_state(gpipe, ref).keys()
    assert max_diff(ours, merged_state(gpipe, ref)) < 1e-10
    assert max_diff(ours, train_sequential(cfg, load_for(cfg))) < 1e-10
    assert max_diff(res.model_state_dict(), ours) == 0.0


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_bit_for_bit_zb_h1_is_1f1b_and_interleaving_is_1f1b_over_p_v_workers(model):
    # Each stage (chunk) accumulates its micro-batches' weight gradients in the same order,
    # with the same kernels: ZB-H1's Ws in 1F1B's order of backwards, and interleaving's
    # chunks as 1F1B's stages when every virtual stage has a worker of its own.
    common = dict(runtime="sim", model=model, precision="float64", micro_batches=4,
                  batch_size=16, max_steps=4, momentum=0.9, **TINY)  # fmt: skip
    pairs = [
        (ExperimentConfig(strategy="zb-h1", workers=2, **common),
         ExperimentConfig(strategy="1f1b", workers=2, **common)),
        (ExperimentConfig(strategy="interleaved-1f1b", virtual_stages=2, workers=2, **common),
         ExperimentConfig(strategy="1f1b", workers=4, **common)),
    ]  # fmt: skip
    for ours, ref in pairs:
        a, b = run(ours, progress=False), run(ref, progress=False)
        assert max_diff(merged_state(a, ours), merged_state(b, ref)) == 0.0


def test_zb_h1_and_interleaving_with_data_parallel_replicas_equal_the_combined_batch():
    for strategy, virtual in (("zb-h1", 1), ("interleaved-1f1b", 2)):
        cfg = ExperimentConfig(
            strategy=strategy, virtual_stages=virtual, runtime="sim", workers=4, stages=2,
            micro_batches=2, model="mlp", precision="float64", batch_size=8, max_steps=8, **TINY,
        )  # fmt: skip
        res = run(cfg, progress=False)
        twin = train_sequential(cfg, load_for(cfg))
        for replica in range(2):
            assert max_diff(res.model_state_dict(replica=replica), twin) < 1e-10


@pytest.mark.slow  # ResNet-18 through four runs: ~1 min; the CNN cases above run in every suite
def test_resnet_batchnorm_stages_under_zb_h1_equal_gpipe_and_the_twin():
    # BatchNorm normalises each micro-batch: with one the twin is exact, with more GPipe is.
    base = dict(runtime="sim", workers=2, model="resnet18", precision="float64", batch_size=8,
                max_steps=2, **TINY)  # fmt: skip
    one = ExperimentConfig(strategy="zb-h1", micro_batches=1, **base)
    res = run(one, progress=False)
    assert max_diff(merged_state(res, one), train_sequential(one, load_for(one))) < 1e-10
    two = ExperimentConfig(strategy="zb-h1", micro_batches=2, **base)
    ref = ExperimentConfig(strategy="gpipe", micro_batches=2, **base)
    ours, gpipe = run(two, progress=False), run(ref, progress=False)
    assert max_diff(merged_state(ours, two), merged_state(gpipe, ref)) < 1e-10


def test_recompute_under_interleaving_equals_the_twin():
    cfg = ExperimentConfig(
        strategy="interleaved-1f1b", virtual_stages=2, recompute=True, runtime="sim", workers=2,
        model="mlp", precision="float64", micro_batches=4, batch_size=16, max_steps=10, **TINY,
    )  # fmt: skip
    res = run(cfg, progress=False)
    assert max_diff(merged_state(res, cfg), train_sequential(cfg, load_for(cfg))) < 1e-10


# -- the bubble and the stash on the simulator -------------------------------------------------


def deep_mlp_layers(monkeypatch, count=16):
    """The MLP's layers and identity layers after them up to ``count``: the same function, with
    as many cut points as p·V virtual stages need (the chunks' costs are patched equal)."""
    real = partition.layers

    def padded(model):
        found = real(model)
        return found + [nn.Identity() for _ in range(count - len(found))]

    monkeypatch.setattr(partition, "layers", padded)
    monkeypatch.setattr(partition, "layer_count", lambda *a, **k: count)
    monkeypatch.setattr(
        Stage, "cost_share", lambda self, mine, every: 1.0 / (self.stages * self.virtual)
    )


def equal_cost_run(strategy, p, m, v=1):
    cfg = ExperimentConfig(
        strategy=strategy, virtual_stages=v, runtime="sim", workers=p, model="mlp",
        micro_batches=m, batch_size=m, max_steps=1, network="custom:0:1e18",
        dataset="fashion-mnist", train_subset=160, test_subset=16, val_size=16,
    )  # fmt: skip
    return run(cfg, progress=False)


@pytest.mark.parametrize(("p", "m", "v"), CASES)
def test_the_interleaved_bubble_is_p_minus_1_over_vm_plus_p_minus_1(monkeypatch, p, m, v):
    deep_mlp_layers(monkeypatch)
    events = equal_cost_run("interleaved-1f1b", p, m, v).events
    assert set(events["chunk"]) == set(range(v))
    assert bubble("interleaved-1f1b", p, m, v) == (p - 1) / (v * m + p - 1)
    idle = step_bubbles(events)["idle"].mean()
    assert idle == pytest.approx(bubble("interleaved-1f1b", p, m, v), abs=0.02)


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("m", [4, 8, 16])
def test_the_zb_h1_bubble_is_a_third_of_1f1bs(monkeypatch, p, m):
    deep_mlp_layers(monkeypatch)
    res = equal_cost_run("zb-h1", p, m)
    idle = step_bubbles(res.events)["idle"].mean()
    expected = bubble("zb-h1", p, m)
    assert idle == pytest.approx(expected, abs=0.02)
    if m >= p:  # idle (p − 1)·t of a (3M + p − 1)·t step; 1F1B's (p − 1)·3t of (M + p − 1)·3t
        assert expected == pytest.approx((p - 1) / (3 * m + p - 1))
        idle_zb, idle_1f1b = expected * (3 * m + p - 1), bubble("1f1b", p, m) * (m + p - 1) * 3
        assert idle_zb == pytest.approx(idle_1f1b / 3)
    phases = res.events.groupby("phase")["micro_batch"].count().to_dict()
    assert phases == {F: p * m, B: p * m, W: p * m}
    outs = res.outputs[res.configs[0].label]
    assert [o["peak_stashed"] for o in outs] == [min(p - s, m) for s in range(p)]  # 1F1B's
    # Those waiting for W too, as the pure schedule counts them.
    assert [o["peak_stashed_until_w"] for o in outs] == [in_flight(o, W) for o in zb_h1(p, m)]


# -- real Dask ------------------------------------------------------------------------------------


def test_interleaved_and_zb_h1_on_real_dask_equal_the_simulator_bit_for_bit(client):
    for strategy, virtual in (("interleaved-1f1b", 2), ("zb-h1", 1)):
        cfg = ExperimentConfig(
            strategy=strategy, virtual_stages=virtual, workers=2, model="cnn", micro_batches=4,
            precision="float64", batch_size=16, max_steps=4, **TINY,
        )  # fmt: skip
        real = run(cfg, client=client, progress=False)
        on_sim = cfg.replace(runtime="sim")
        sim = run(on_sim, progress=False)
        assert max_diff(merged_state(real, cfg), merged_state(sim, on_sim)) == 0.0
        assert max_diff(merged_state(real, cfg), train_sequential(cfg, load_for(cfg))) < 1e-10
        assert len(real.events) == len(sim.events)


# -- config errors, before any work --------------------------------------------------------------


BASE = dict(runtime="sim", workers=2, model="mlp", batch_size=8, micro_batches=4, **TINY)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            dict(strategy="interleaved-1f1b", virtual_stages=4),
            r"virtual_stages=4 × stages=2 = 8 virtual stages exceed the model's 6 layers "
            r"\(cfg.model='mlp'\): every virtual stage needs one; use at most virtual_stages=3",
        ),
        (
            dict(strategy="interleaved-1f1b", virtual_stages=2, workers=3, batch_size=12),
            r"micro_batches=4 is not a multiple of stages=3: interleaved 1F1B with "
            r"virtual_stages=2 sends micro-batches through the chunks in groups of 3; choose a "
            r"multiple of 3",
        ),
        (
            dict(strategy="1f1b", virtual_stages=2),
            r"virtual_stages=2 applies only to strategy='interleaved-1f1b' \(model chunks per "
            r"worker\), not to strategy='1f1b'",
        ),
        (
            dict(strategy="allreduce", virtual_stages=2, micro_batches=1),
            r"virtual_stages=2 applies only to strategy='interleaved-1f1b'",
        ),
        (
            dict(strategy="interleaved-1f1b", virtual_stages=0),
            r"virtual_stages=0 must be a positive integer",
        ),
        (
            dict(strategy="zb-h1", recompute=True),
            r"recompute=True is not supported by strategy='zb-h1': its weight gradient W runs "
            r"after B on the graph B keeps",
        ),
        (
            dict(strategy="interleaved-1f1b", virtual_stages=2, balance="1,1,1,1"),
            r"balance='1,1,1,1' must give 4 positive layer counts \(one per stage\) summing to "
            r"the model's 6 layers",
        ),
    ],
)
def test_config_errors_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**{**BASE, **fields})


def test_the_four_schedules_side_by_side():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 10))
    table = compare_schedules(stages=2, micro_batches=4, virtual_stages=2, fig=fig,
                              zoom=(1e-4, 2e-4))  # fmt: skip
    assert list(table["strategy"]) == ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1"]
    # The replayed schedule is the simulator's timing with free messages, the CNN's unequal
    # stages included; with equal stages the formulas rank zero bubble first.
    for row in table.itertuples():
        assert row.measured == pytest.approx(row.predicted, abs=1e-9)
    assert len(fig.axes) == 5 and "zb-h1: bubble measured" in fig.axes[3].get_title()
    # The last panel is the interleaved chart again, over the window the caller asked for.
    interleaved, zoomed = fig.axes[2], fig.axes[4]
    assert zoomed.get_xlim() == (1e-4, 2e-4) and "(0.1 to 0.2 ms)" in zoomed.get_title()
    bars = [(p.get_x(), p.get_width()) for p in interleaved.patches if p.get_width() > 0]
    assert [(p.get_x(), p.get_width()) for p in zoomed.patches] == bars[: len(zoomed.patches)]
    assert interleaved.get_xlim() == fig.axes[0].get_xlim() != zoomed.get_xlim()
    with pytest.raises(ValueError, match="shows an interleaved schedule, and .* has none"):
        compare_schedules(strategies=("gpipe", "1f1b"), zoom=(0.0, 1.0))
    gp, one, inter, zb = table["equal_stages"]
    assert gp == one == pytest.approx(1 / 5) and inter == pytest.approx(1 / 9)
    assert zb == pytest.approx(1 / 13)
    assert table["predicted"][3] <= table["predicted"][1] + 1e-12 < table["predicted"][0]
    assert list(table["peak_stashed"]) == [4, 2, 5, 2]
