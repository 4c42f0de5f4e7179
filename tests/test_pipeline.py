"""Pipeline parallelism: schedules written out in full, the split model equal to the unsplit
one, GPipe and 1F1B equal to single-process training, data × pipeline equal to sequential
training on the combined batch, the bubble against (p − 1)/(M + p − 1), stashed activations."""

from __future__ import annotations

import pytest
import torch
from common import max_diff
from matplotlib.figure import Figure

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.experiment import Results
from scaledl_lab.models import build_model
from scaledl_lab.strategies.model_parallel.partition import (
    boundary_shapes,
    layers,
    split_evenly,
    stage_counts,
)
from scaledl_lab.strategies.model_parallel.pipeline import Stage
from scaledl_lab.strategies.model_parallel.schedules import (
    execution_order,
    gpipe,
    in_flight,
    one_f_one_b,
)
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for
from scaledl_lab.viz.gantt import bubble_summary, bubble_theory, plot_pipeline, step_bubbles

TINY = dict(
    dataset="fashion-mnist", train_subset=480, test_subset=64, val_size=64, epochs=1, lr=0.05
)
# What the exactness tests compare is parameters: no validation set and 8 test samples (the
# evaluations were four fifths of ResNet-18's split run).
EXACT = dict(TINY, test_subset=8, val_size=0)


def merged_state(results, cfg):
    """The whole model's state_dict from the stages of replica 0."""
    state = {}
    for out in results.outputs[cfg.label][: cfg.model_parallel_size]:
        state.update(out["state_dict"])
    return state


# -- schedules, written out in full -----------------------------------------------------------


def test_gpipe_schedule_fills_then_drains():
    F, B = "F", "B"
    expected = [(F, 0), (F, 1), (F, 2), (F, 3), (B, 3), (B, 2), (B, 1), (B, 0)]
    assert gpipe(2, 4) == [expected] * 2
    assert gpipe(4, 4) == [expected] * 4
    five = [(F, 0), (F, 1), (F, 2), (F, 3), (F, 4), (B, 4), (B, 3), (B, 2), (B, 1), (B, 0)]
    assert gpipe(3, 5) == [five] * 3


def test_one_f_one_b_schedule_warms_up_alternates_and_cools_down():
    F, B = "F", "B"
    assert one_f_one_b(2, 4) == [
        [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (F, 3), (B, 2), (B, 3)],
        [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2), (F, 3), (B, 3)],
    ]
    assert one_f_one_b(4, 4) == [
        [(F, 0), (F, 1), (F, 2), (F, 3), (B, 0), (B, 1), (B, 2), (B, 3)],
        [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3), (B, 1), (B, 2), (B, 3)],
        [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (F, 3), (B, 2), (B, 3)],
        [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2), (F, 3), (B, 3)],
    ]
    assert one_f_one_b(3, 5) == [
        [(F, 0), (F, 1), (F, 2), (B, 0), (F, 3), (B, 1), (F, 4), (B, 2), (B, 3), (B, 4)],
        [(F, 0), (F, 1), (B, 0), (F, 2), (B, 1), (F, 3), (B, 2), (F, 4), (B, 3), (B, 4)],
        [(F, 0), (B, 0), (F, 1), (B, 1), (F, 2), (B, 2), (F, 3), (B, 3), (F, 4), (B, 4)],
    ]


@pytest.mark.parametrize("schedule", [gpipe, one_f_one_b])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 4), (3, 5), (8, 16), (4, 1)])
def test_schedules_respect_every_dependency_and_never_deadlock(schedule, p, m):
    order = execution_order(schedule(p, m))
    position = {op: i for i, op in enumerate(order)}
    assert len(order) == 2 * p * m
    for s in range(p):
        for mb in range(m):
            assert position[(s, "F", mb)] < position[(s, "B", mb)]  # backward after forward
            if s:  # a receive after the matching send
                assert position[(s - 1, "F", mb)] < position[(s, "F", mb)]
                assert position[(s, "B", mb)] < position[(s - 1, "B", mb)]


def test_a_schedule_that_waits_for_itself_is_reported():
    backwards_first = [[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]]
    with pytest.raises(ValueError, match=r"the schedule deadlocks: stages \[0, 1\]"):
        execution_order(backwards_first)


def test_stashed_activations_gpipe_m_one_f_one_b_at_most_p_minus_stage():
    p, m = 4, 8
    assert [in_flight(ops) for ops in gpipe(p, m)] == [m] * p
    assert [in_flight(ops) for ops in one_f_one_b(p, m)] == [p - s for s in range(p)]


# -- partitioning ---------------------------------------------------------------------------


SHAPES = [("mlp", (1, 28, 28)), ("cnn", (1, 28, 28)), ("cnn1d", (1, 40)), ("resnet18", (3, 32, 32))]


@pytest.mark.parametrize(("name", "shape"), SHAPES)
def test_the_layers_composed_are_the_model(name, shape):
    model = build_model(name, shape, 10, seed=1).double().eval()
    x = torch.randn(3, *shape, dtype=torch.float64)
    out = x
    for layer in layers(model):
        out = layer(out)
    assert torch.equal(out, model(x))
    assert boundary_shapes(layers(model), x)[-1] == (3, 10)


def test_balance_by_counts_params_and_time():
    model = build_model("mlp", (1, 28, 28), 10, seed=0)
    assert stage_counts("2,3,1", layers(model), 3) == [2, 3, 1]
    # 784·512 + 512 parameters in layer 1, 512·512 + 512 in layer 3, 5130 in layer 5.
    assert stage_counts("params", layers(model), 2) == [2, 4]
    assert split_evenly([5, 1, 1, 1, 1, 1], 2) == [1, 5]
    assert split_evenly([1, 1, 1, 1], 4) == [1, 1, 1, 1]
    sample = torch.zeros(4, 1, 28, 28)
    counts = stage_counts("time", layers(model), 3, sample)
    assert sum(counts) == 6 and min(counts) >= 1


# -- exactness on the simulator --------------------------------------------------------------


# ResNet-18 split in 3 and 4 (~20 s each) runs with --runslow: its 2-stage split carries the
# residual and BatchNorm boundaries in CI, the MLP and the CNN every stage count.
SPLITS = [(m, s) for m in ("mlp", "cnn") for s in (2, 3, 4)] + [
    ("resnet18", 2),
    *(pytest.param("resnet18", s, marks=pytest.mark.slow) for s in (3, 4)),
]


@pytest.mark.parametrize("model,stages", SPLITS)
def test_the_split_model_trains_exactly_as_the_unsplit_one(model, stages):
    cfg = ExperimentConfig(
        strategy="model-parallel", runtime="sim", workers=stages, model=model,
        precision="float64", momentum=0.0, batch_size=8, max_steps=2 if model == "resnet18" else 4,
        **EXACT,
    )  # fmt: skip
    res = run(cfg, progress=False)
    twin = train_sequential(cfg, load_for(cfg))
    # Equal parameters after plain SGD steps: equal gradients at every step.
    assert max_diff(merged_state(res, cfg), twin) < 1e-10


@pytest.mark.parametrize("strategy", ["gpipe", "1f1b"])
@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_gpipe_and_1f1b_equal_single_process_training_on_the_mini_batch(strategy, recompute, model):
    cfg = ExperimentConfig(
        strategy=strategy, runtime="sim", workers=3, model=model, micro_batches=4,
        recompute=recompute, precision="float64", batch_size=16, max_steps=6,
        momentum=0.9, **EXACT,
    )  # fmt: skip
    res = run(cfg, progress=False)
    assert max_diff(merged_state(res, cfg), train_sequential(cfg, load_for(cfg))) < 1e-10


@pytest.mark.slow  # ResNet-18, recomputed and not: ~40 s
def test_recomputation_leaves_batchnorm_statistics_as_one_forward_does():
    base = dict(
        runtime="sim", workers=2, model="resnet18", precision="float64", batch_size=8,
        max_steps=2, micro_batches=1, **TINY,
    )  # fmt: skip
    plain = run(ExperimentConfig(strategy="gpipe", **base), progress=False)
    again = run(ExperimentConfig(strategy="gpipe", recompute=True, **base), progress=False)
    cfg = ExperimentConfig(strategy="gpipe", **base)
    assert max_diff(merged_state(plain, cfg), merged_state(again, cfg)) < 1e-12
    assert max_diff(merged_state(plain, cfg), train_sequential(cfg, load_for(cfg))) < 1e-10


def test_data_times_pipeline_equals_sequential_training_on_the_combined_batch():
    cfg = ExperimentConfig(
        strategy="1f1b", runtime="sim", workers=4, stages=2, micro_batches=2, model="mlp",
        precision="float64", batch_size=8, max_steps=10, **EXACT,
    )  # fmt: skip
    assert cfg.replicas == 2 and cfg.effective_batch_size == 16
    res = run(cfg, progress=False)
    twin = train_sequential(cfg, load_for(cfg))
    for replica in range(2):
        assert max_diff(res.model_state_dict(replica=replica), twin) < 1e-10


def test_float32_pipeline_stays_within_the_runs_own_rounding():
    cfg = ExperimentConfig(
        strategy="gpipe", runtime="sim", workers=2, micro_batches=4, model="mlp",
        batch_size=16, max_steps=20, **TINY,
    )  # fmt: skip
    res = run(cfg, progress=False)
    exact = train_sequential(cfg.replace(precision="float64"), load_for(cfg))
    seq = train_sequential(cfg, load_for(cfg))
    # The pipelined float32 run lies no farther from the exact trajectory than a few times the
    # plain float32 run does (a wrong split or loss scaling would be orders of magnitude off).
    assert max_diff(merged_state(res, cfg), exact) <= 4 * max_diff(seq, exact) + 1e-7


# -- the bubble and the memory ---------------------------------------------------------------


@pytest.mark.parametrize("stages", [2, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 4, 16])
def test_the_bubble_is_p_minus_1_over_m_plus_p_minus_1_with_equal_stages(
    monkeypatch, stages, micro_batches
):
    monkeypatch.setattr(Stage, "cost_share", lambda self, mine, every: 1.0 / self.stages)
    # Every stage costs the same (above): the model only needs a layer per stage, and the MLP
    # has 6; the CNN's 9 split 8 ways at a fraction of ResNet-18's cost.
    cfg = ExperimentConfig(
        strategy="gpipe", runtime="sim", workers=stages, model="cnn" if stages > 6 else "mlp",
        micro_batches=micro_batches, batch_size=16, max_steps=1, network="custom:0:1e18",
        dataset="fashion-mnist", train_subset=160, test_subset=16, val_size=16,
    )  # fmt: skip
    events = run(cfg, progress=False).events
    idle = step_bubbles(events)["idle"].mean()
    assert bubble_theory(stages, micro_batches) == (stages - 1) / (micro_batches + stages - 1)
    assert idle == pytest.approx(bubble_theory(stages, micro_batches), abs=0.02)


@pytest.mark.parametrize("micro_batches", [1, 4, 16])
def test_with_unequal_stages_the_bubble_follows_the_slowest_stage(micro_batches):
    # The MLP cut after its first Linear: the simulator charges each stage its FLOPs.
    cfg = ExperimentConfig(
        strategy="gpipe", runtime="sim", workers=2, model="mlp", balance="2,4",
        micro_batches=micro_batches, batch_size=2 * micro_batches, max_steps=2,
        network="custom:0:1e18", **TINY,
    )  # fmt: skip
    model = build_model("mlp", (1, 28, 28), 10, seed=0)
    costs = [784 * 512, 512 * 512 + 512 * 10]  # multiply-adds per sample of each stage
    res = run(cfg, progress=False)
    measured = bubble_summary(res.events)["bubble"].mean()
    assert len(layers(model)) == 6
    assert measured == pytest.approx(bubble_theory(2, micro_batches, costs), abs=1e-6)
    assert bubble_theory(2, micro_batches, [1.0, 1.0]) == pytest.approx(
        bubble_theory(2, micro_batches)
    )
    if micro_batches > 1:
        assert measured > bubble_theory(2, micro_batches)  # imbalance costs idle time
    with pytest.raises(ValueError, match="stage_costs"):
        bubble_theory(2, 4, [1.0])


@pytest.mark.parametrize("strategy", ["gpipe", "1f1b"])
def test_peak_stashed_activations(strategy):
    p, m = 4, 8
    cfg = ExperimentConfig(
        strategy=strategy, runtime="sim", workers=p, model="mlp", micro_batches=m,
        batch_size=32, max_steps=2, **TINY,
    )  # fmt: skip
    outs = run(cfg, progress=False).outputs[cfg.label]
    peaks = [o["peak_stashed"] for o in outs]
    if strategy == "gpipe":
        assert peaks == [m] * p
    else:
        assert peaks == [p - s for s in range(p)]
    # Each stashed micro-batch keeps the stage's input and output (the last stage's: the loss,
    # a scalar), float32, in micro-batches of 32 / m samples.
    model_layers = layers(build_model("mlp", (1, 28, 28), 10, seed=0))
    sample = torch.zeros(32 // m, 1, 28, 28)
    shapes = [sample.shape, *boundary_shapes(model_layers, sample)]
    counts = stage_counts(cfg.balance, model_layers, p, sample)
    cuts = [sum(counts[:s]) for s in range(p + 1)]
    kept = [4 * (shapes[cuts[s]].numel() + shapes[cuts[s + 1]].numel()) for s in range(p - 1)]
    kept.append(4 * (shapes[cuts[p - 1]].numel() + 1))
    expected = [n * b for n, b in zip(peaks, kept, strict=True)]
    assert [o["peak_stashed_bytes"] for o in outs] == expected


def test_results_keep_the_events_and_summarise_the_pipeline(tmp_path):
    cfg = ExperimentConfig(
        strategy="gpipe", runtime="sim", workers=2, model="mlp", micro_batches=4,
        batch_size=16, max_steps=3, **TINY,
    )  # fmt: skip
    res = run(cfg, progress=False, out=tmp_path)
    assert len(res.events) == 2 * 2 * 4 * 3  # stages × phases × micro-batches × steps
    summary = (tmp_path / "summary.md").read_text()
    assert "## Pipeline schedule" in summary and "| gpipe-sim-2w | 2 | 4 |" in summary
    assert (tmp_path / "pipeline_gpipe-sim-2w.png").stat().st_size > 0
    loaded = Results.load(tmp_path)
    assert loaded.events.equals(res.events)
    table = bubble_summary(res.events, res.outputs)
    assert list(table["peak_stashed"]) == [4, 4]
    assert max_diff(res.model_state_dict(), merged_state(res, cfg)) == 0.0
    fig = Figure()
    ax = plot_pipeline(res.events, step=2, ax=fig.subplots(), from_zero=True)
    lefts = [bar.get_x() for bar in ax.patches]
    assert min(lefts) == 0.0 and ax.get_xlabel() == "time from the step's start (s)"
    assert res.model_state_dict().keys() == build_model("mlp", (1, 28, 28), 10).state_dict().keys()
    train = res.frame.query("kind == 'train'")
    # A mini-batch counts once towards throughput (on the last stage); both log its loss.
    assert list(train.groupby("rank")["samples"].sum()) == [0, 3 * 16]
    assert (train.groupby("step")["loss"].nunique() == 1).all()


# -- real Dask ------------------------------------------------------------------------------


def test_two_stages_on_real_dask_equal_the_simulator_and_the_twin(client):
    cfg = ExperimentConfig(
        strategy="1f1b", workers=2, model="cnn", micro_batches=4, precision="float64",
        batch_size=16, max_steps=6, **TINY,
    )  # fmt: skip
    real = run(cfg, client=client, progress=False)
    on_sim = cfg.replace(runtime="sim")
    sim = run(on_sim, progress=False)
    assert max_diff(merged_state(real, cfg), merged_state(sim, on_sim)) == 0.0
    assert max_diff(merged_state(real, cfg), train_sequential(cfg, load_for(cfg))) < 1e-10
    assert set(real.events["phase"]) == {"F", "B"}
    assert len(real.events) == 2 * 2 * 4 * 6  # stages × phases × micro-batches × steps
    # One clock for both ranks: a stage starts a micro-batch only after its neighbour's end. The
    # ranks' origins agree to the reading of two clocks in each process (40 µs off was seen on
    # a loaded machine); origins of their own would differ by the processes' start-up, seconds.
    skew = 1e-3
    times = real.events.set_index(["step", "micro_batch", "stage", "phase"])
    for step, m in times.index.droplevel([2, 3]).unique():
        assert times.loc[(step, m, 1, "F"), "start"] >= times.loc[(step, m, 0, "F"), "end"] - skew
        assert times.loc[(step, m, 0, "B"), "start"] >= times.loc[(step, m, 1, "B"), "end"] - skew
