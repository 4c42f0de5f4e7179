"""DiLoCo and Streaming DiLoCo: the outer step against torch's SGD, AdamW against torch's, the
reductions to local SGD and synchronous SGD, the sequential twin, Dask against the simulator,
the traffic, the schedule of fragments, worker loss, checkpoints and the config errors."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from common import SMALL, max_diff, small_for
from torch import nn

from scaledl_lab import ConfigError, ExperimentConfig, Results, run
from scaledl_lab.cli import main
from scaledl_lab.models import build_model
from scaledl_lab.resume import resume
from scaledl_lab.runtime.sim.cost import NETWORKS, ring_allreduce_bytes
from scaledl_lab.strategies.low_communication.fragments import (
    fragment_sizes,
    fragments_of,
    offsets,
    syncs_at,
    weighted_layers,
)
from scaledl_lab.strategies.low_communication.outer import OuterOptimizer
from scaledl_lab.strategies.low_communication.twins import train_diloco_sequential
from scaledl_lab.training.checkpoint import latest_step
from scaledl_lab.training.optim import AdamW
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for

BASE = dict(SMALL, model="mlp", workers=2)
F64 = dict(BASE, precision="float64")
# The twins: 12 steps, two or more outer rounds at every H below (3 to 6), on the 12 x 32 x 3
# samples three workers read, evaluations on 64.
TWIN64 = dict(small_for(12, workers=3), model="mlp", workers=2, precision="float64")
PLAIN_OUTER = dict(outer_optimizer="sgd", outer_lr=1.0, outer_momentum=0.0)


def train_rows(frame: pd.DataFrame) -> pd.DataFrame:
    train = frame[frame.kind == "train"][["rank", "step", "loss", "accuracy"]]
    return train.sort_values(["rank", "step"]).reset_index(drop=True)


# -- the optimisers ---------------------------------------------------------------------------


def test_adamw_is_torch_adamw_with_decoupled_decay():
    torch.manual_seed(0)
    a = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    b = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)).double()
    b.load_state_dict(a.state_dict())
    ours = AdamW(a.parameters(), lr=0.01, weight_decay=0.1)
    theirs = torch.optim.AdamW(b.parameters(), lr=0.01, weight_decay=0.1, foreach=False)
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        x = torch.randn(16, 6, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 3, (16,), generator=gen)
        for model, opt in ((a, ours), (b, theirs)):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
    # Same operations in the same order: equal up to float64 rounding.
    assert max_diff(a.state_dict(), b.state_dict()) < 1e-15
    # Decoupled: a weight with zero gradient still shrinks by lr·λ per step, m and v stay 0.
    w = nn.Parameter(torch.ones(3, dtype=torch.float64))
    opt = AdamW([w], lr=0.1, weight_decay=0.5)
    w.grad = torch.zeros(3, dtype=torch.float64)
    opt.step()
    assert torch.allclose(w.detach(), torch.full((3,), 0.95, dtype=torch.float64))


@pytest.mark.parametrize(
    "kind,lr,momentum", [("nesterov", 0.7, 0.9), ("sgd", 0.7, 0.5), ("sgd", 1.0, 0.0)]
)
def test_outer_step_is_torch_sgd_on_the_same_outer_gradient(kind, lr, momentum):
    gen = torch.Generator().manual_seed(3)
    theta = torch.randn(50, generator=gen, dtype=torch.float64)
    reference = nn.Parameter(theta.clone())
    torch_sgd = torch.optim.SGD([reference], lr=lr, momentum=momentum, nesterov=kind == "nesterov")
    outer = OuterOptimizer(kind, lr, momentum)
    for _ in range(5):
        delta = torch.randn(50, generator=gen, dtype=torch.float64)
        outer.step(theta, delta)
        reference.grad = delta.clone()
        torch_sgd.step()
        assert torch.allclose(theta, reference.detach(), rtol=0, atol=1e-14)


# -- reductions and twins, on both runtimes -----------------------------------------------------


def test_outer_sgd_at_rate_one_is_local_sgd(client):
    """θ − 1·(1/k)Σ(θ − θ_i) = (1/k)Σθ_i: model averaging, for any H and any inner optimiser."""
    cfg = ExperimentConfig(strategy="diloco", sync_period=3, **PLAIN_OUTER, **TWIN64)
    inner = {name: getattr(cfg, name) for name in ("optimizer", "lr", "momentum", "weight_decay")}
    local = ExperimentConfig(**{**TWIN64, **inner, "strategy": "local-sgd", "sync_period": 3})
    for runtime, kwargs in (("sim", {}), ("dask", {"client": client})):
        ours = run(cfg.replace(runtime=runtime), progress=False, **kwargs)
        theirs = run(local.replace(runtime=runtime), progress=False, **kwargs)
        a, b = train_rows(ours.frame), train_rows(theirs.frame)
        assert (a[["rank", "step"]] == b[["rank", "step"]]).all().all()
        assert (a.loss - b.loss).abs().max() < 1e-10
        for rank in (0, 1):
            assert max_diff(ours.state_dict(rank=rank), theirs.state_dict(rank=rank)) < 1e-10


def test_one_inner_step_of_plain_sgd_with_outer_sgd_at_rate_one_is_synchronous_sgd(client):
    cfg = ExperimentConfig(
        strategy="diloco",
        sync_period=1,
        **PLAIN_OUTER,
        **{**TWIN64, "optimizer": "sgd", "momentum": 0.0, "weight_decay": 0.0},
    )
    twin = train_sequential(cfg, load_for(cfg))
    for runtime, kwargs in (("sim", {}), ("dask", {"client": client})):
        res = run(cfg.replace(runtime=runtime), progress=False, **kwargs)
        for rank in (0, 1):
            assert max_diff(res.state_dict(rank=rank), twin) < 1e-10


@pytest.mark.parametrize(
    "options",
    [
        dict(strategy="diloco", sync_period=5, optimizer="adamw", lr=1e-3, weight_decay=0.01),
        dict(strategy="diloco", sync_period=4, sharding="label-skew"),
        dict(strategy="streaming-diloco", sync_period=6, fragments=3, overlap_steps=2),
        dict(strategy="streaming-diloco", sync_period=4, fragments=2, overlap_steps=1,
             mixing_alpha=0.3, optimizer="adamw", lr=1e-3, sharding="label-skew"),
    ],
)  # fmt: skip
def test_the_workers_match_the_sequential_twin(options):
    cfg = ExperimentConfig(runtime="sim", **{**TWIN64, **options, "workers": 3})
    twin = train_diloco_sequential(cfg, load_for(cfg))
    res = run(cfg, progress=False)
    for rank in range(3):
        # The twin sums the outer gradients parameter by parameter, the workers as one flat
        # vector, in the same rank order: the same float64 arithmetic, to rounding.
        assert max_diff(res.state_dict(rank=rank), twin) < 1e-10


def test_streaming_with_one_fragment_and_no_delay_is_diloco(client):
    cfg = ExperimentConfig(
        strategy="diloco", sync_period=4, **{**BASE, "optimizer": "adamw", "lr": 1e-3}
    )
    for runtime, kwargs in (("sim", {}), ("dask", {"client": client})):
        diloco = run(cfg.replace(runtime=runtime), progress=False, **kwargs)
        streaming = run(
            cfg.replace(runtime=runtime, strategy="streaming-diloco"), progress=False, **kwargs
        )
        assert train_rows(diloco.frame).equals(train_rows(streaming.frame))
        assert max_diff(diloco.state_dict(), streaming.state_dict()) == 0.0


@pytest.mark.parametrize(
    "options",
    [
        dict(strategy="diloco", sync_period=5, optimizer="adamw", lr=1e-3),
        dict(strategy="streaming-diloco", sync_period=4, fragments=2, overlap_steps=1),
        dict(strategy="streaming-diloco", sync_period=4, fragments=2, compress="qsgd:7"),
    ],
)
def test_dask_equals_the_simulator_bit_for_bit(client, options):
    cfg = ExperimentConfig(**{**BASE, **options})
    on_dask = run(cfg, client=client, progress=False)
    on_sim = run(cfg.replace(runtime="sim"), progress=False)
    assert train_rows(on_dask.frame).equals(train_rows(on_sim.frame))
    for rank in (0, 1):
        assert max_diff(on_dask.state_dict(rank=rank), on_sim.state_dict(rank=rank)) == 0.0


# -- traffic, schedule and time ---------------------------------------------------------------


def test_bytes_per_step_fall_as_one_over_h():
    per_step = {}
    for h in (1, 2, 5, 10):  # each divides the run's 20 steps
        cfg = ExperimentConfig(strategy="diloco", runtime="sim", sync_period=h, **BASE)
        train = run(cfg, progress=False).frame.query("kind == 'train'")
        per_step[h] = train.bytes_sent.sum() / len(train)
    assert per_step[1] > 0
    for h in (2, 5, 10):
        assert per_step[h] * h == per_step[1]


def test_fragments_are_contiguous_layers_with_the_smallest_largest_part():
    model = build_model("cnn", (1, 28, 28), 10, seed=0)
    sizes = [sum(t.numel() for t in layer) for layer in weighted_layers(model)]
    assert len(sizes) == 4 and max(sizes) == sizes[2]  # two convolutions, two linear layers
    # The first linear layer dwarfs the rest: it goes with the smaller of its neighbours.
    assert fragment_sizes(sizes, 2) == [2, 2]
    assert fragment_sizes(sizes, 3) == [2, 1, 1]
    assert fragment_sizes(sizes, 4) == [1, 1, 1, 1]
    parts = fragments_of(model, 2)
    assert [p.numel for p in parts] == [sum(sizes[:2]), sum(sizes[2:])]
    flat = torch.cat([p.flat() for p in parts])
    assert torch.equal(flat, torch.cat([t.detach().reshape(-1) for t in model.parameters()]))


def test_fragment_offsets_spread_by_h_over_f_and_the_last_keeps_dilocos_schedule():
    assert offsets(10, 1) == [0]
    assert offsets(10, 2) == [5, 0]
    assert offsets(12, 4) == [3, 6, 9, 0]
    assert offsets(10, 3) == [3, 6, 0]
    synced = {f: [t for t in range(1, 25) if syncs_at(t, o, 12)] for f, o in enumerate([3, 0])}
    assert synced == {0: [3, 15], 1: [12, 24]}


def test_streaming_sends_one_fragment_at_a_time():
    """Peak bytes of one synchronisation: the largest fragment's allreduce, not the model's."""
    cfg = ExperimentConfig(
        strategy="streaming-diloco", runtime="sim", sync_period=6, fragments=3, **BASE
    )
    model = build_model("mlp", (1, 28, 28), 10, seed=0)
    sizes = [p.numel for p in fragments_of(model, 3)]
    train = run(cfg, progress=False).frame.query("kind == 'train' and step < 20")
    sent = train.groupby("step").bytes_sent.first()
    expected = {t: ring_allreduce_bytes(4 * sizes[f], 2) for f, o in enumerate(offsets(6, 3))
                for t in range(1, 20) if syncs_at(t, o, 6)}  # fmt: skip
    assert {t: b for t, b in sent.items() if b} == expected
    whole = ring_allreduce_bytes(4 * sum(sizes), 2)
    assert sent.max() == ring_allreduce_bytes(4 * max(sizes), 2) < whole


def test_overlapping_the_outer_allreduce_hides_it_on_a_wan():
    assert NETWORKS["wan"].latency_s == 40e-3 and NETWORKS["wan"].bandwidth_Bps == 0.125e9
    cfg = ExperimentConfig(
        strategy="streaming-diloco", runtime="sim", network="wan", sync_period=6, fragments=3,
        **BASE,
    )  # fmt: skip
    blocking = run(cfg, progress=False).frame
    overlapped = run(cfg.replace(overlap_steps=2), progress=False).frame
    # The same traffic, less time: the background allreduce runs behind two inner steps.
    sent = [f.query("kind == 'train'").bytes_sent.sum() for f in (blocking, overlapped)]
    assert sent[0] == sent[1]
    assert overlapped.time.max() < blocking.time.max()
    # DiLoCo against synchronous SGD on the same link: one allreduce every 5 steps, not every 1.
    allreduce = run(cfg.replace(strategy="allreduce", sync_period=4, fragments=1), progress=False)
    diloco = run(cfg.replace(strategy="diloco", sync_period=5, fragments=1), progress=False)
    assert diloco.frame.time.max() < allreduce.frame.time.max()


@pytest.mark.parametrize("compress", ["qsgd:7", "onebit", "topk:0.1"])
def test_compressed_outer_gradients_send_their_payloads_and_still_train(compress):
    cfg = ExperimentConfig(
        strategy="diloco", runtime="sim", sync_period=5, compress=compress, **BASE
    )
    dense_frame = run(cfg.replace(compress="none"), progress=False).frame
    frame = run(cfg, progress=False).frame
    dense, train = (f.query("kind == 'train'") for f in (dense_frame, frame))
    rounds = train[train.bytes_sent > 0]
    assert rounds.step.tolist() == [5, 5, 10, 10, 15, 15, 20, 20]
    # What was sent plus what the codec saved is the dense allreduce of the outer gradient.
    assert (rounds.bytes_uncompressed == dense[dense.bytes_sent > 0].bytes_sent.values).all()
    assert (rounds.bytes_sent < rounds.bytes_uncompressed / 3).all()
    # Error feedback keeps the run on course: its final test accuracy is within 0.1 of the
    # dense run's (4 standard errors of an accuracy near 0.6 measured on 400 test samples).
    accuracy = [f.query("kind == 'test'").accuracy.iloc[-1] for f in (dense_frame, frame)]
    assert accuracy[1] > accuracy[0] - 0.1


# -- faults, checkpoints --------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [dict(strategy="diloco"), dict(strategy="streaming-diloco", fragments=2, overlap_steps=1)],
)
def test_a_lost_worker_drops_out_of_the_next_outer_average(options):
    cfg = ExperimentConfig(
        runtime="sim", sync_period=4, faults="kill:1:6", **{**F64, "workers": 3, **options}
    )
    res = run(cfg, progress=False)
    frame = res.frame
    assert frame.query("kind == 'worker-lost'")["rank"].tolist() == [1]
    assert frame.query("kind == 'train' and rank == 1").step.max() == 6
    assert frame.query("kind == 'train' and rank != 1").step.max() == 20
    # The twin averages over rank 1 up to its step 6 and over ranks 0 and 2 after it.
    twin = train_diloco_sequential(cfg, load_for(cfg))
    for rank in (0, 2):
        assert max_diff(res.state_dict(rank=rank), twin) < 1e-10
    assert frame.query("kind == 'test'").step.tolist() == [0, 20]


def test_diloco_resumed_from_a_checkpoint_equals_a_straight_run(tmp_path):
    # 9 steps an epoch (1152 samples, 4 workers × 32): the checkpoint at its end falls inside
    # the second outer round (steps 8-14), after the outer momentum's first update.
    base = {k: v for k, v in BASE.items() if k != "max_steps"}
    cfg = ExperimentConfig(
        strategy="diloco", runtime="sim", sync_period=7, checkpoint_every="1epochs",
        **{**base, "train_subset": 1152, "workers": 4, "optimizer": "adamw", "lr": 1e-3},
    )  # fmt: skip
    run(cfg, out=tmp_path, progress=False, figures=False)
    assert latest_step(tmp_path) is not None
    resumed = resume(tmp_path, epochs=2, progress=False, log=None)
    straight = run(cfg.replace(epochs=2, checkpoint_every=None), progress=False)
    assert train_rows(resumed.frame).equals(train_rows(straight.frame))


# -- errors and the CLI ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "options,message",
    [
        (dict(outer_lr=0.0), r"outer_lr=0.0 must be a positive number"),
        (dict(outer_lr=-1), r"outer_lr=-1 must be a positive number"),
        (dict(outer_momentum=1.0), r"outer_momentum=1.0 must lie in \[0, 1\)"),
        (dict(outer_optimizer="adam"), r"outer_optimizer='adam' is unknown; allowed: 'sgd', "
         "'nesterov'"),
        (dict(outer_momentum=0.0), r"outer_optimizer='nesterov' needs outer_momentum > 0"),
        (dict(strategy="local-sgd", outer_lr=1.0), r"outer_lr=1.0 applies only to 'diloco', "
         "'streaming-diloco', not to strategy='local-sgd'"),
        (dict(strategy="diloco", fragments=2), r"fragments=2 applies only to 'streaming-diloco'"),
        (dict(strategy="streaming-diloco", fragments=0), r"fragments=0 must be a positive"),
        (dict(strategy="streaming-diloco", fragments=4, sync_period=8),
         r"fragments=4 exceeds the 3 layers with weights of model='mlp'"),
        (dict(strategy="streaming-diloco", fragments=3, sync_period=2),
         r"fragments=3 exceeds sync_period=2"),
        (dict(strategy="streaming-diloco", overlap_steps=4, sync_period=4),
         r"overlap_steps=4 must be below sync_period=4"),
        (dict(strategy="streaming-diloco", overlap_steps=-1), r"overlap_steps=-1 must be a non"),
        (dict(strategy="streaming-diloco", mixing_alpha=1.5), r"mixing_alpha=1.5 must lie in"),
        (dict(strategy="streaming-diloco", checkpoint_every=5),
         r"checkpoint_every does not apply to strategy='streaming-diloco'"),
        (dict(compress="dgc:0.01"), r"compress='dgc:0.01' does not fit DiLoCo's outer "
         r"gradients .*; use 'onebit', 'qsgd', 'topk'"),
        (dict(strategy="streaming-diloco", compress="powersgd:2"), r"compress='powersgd:2' does "
         "not fit"),
    ],
)  # fmt: skip
def test_bad_low_communication_options_are_refused(options, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**{"strategy": "diloco", "runtime": "sim", **BASE, **options})


def test_the_cli_runs_diloco_with_its_flags_and_lists_the_wan(tmp_path, capsys):
    argv = [
        "run", "--strategy", "streaming-diloco", "--runtime", "sim", "--workers", "2",
        "--dataset", "fashion-mnist", "--model", "mlp", "--batch-size", "32",
        "--train-subset", "400", "--test-subset", "100", "--val-size", "100",
        "--optimizer", "adamw", "--lr", "0.001", "--sync-period", "4", "--fragments", "2",
        "--overlap-steps", "1", "--mixing-alpha", "0.25", "--outer-optimizer", "sgd",
        "--outer-lr", "0.9", "--outer-momentum", "0.5", "--network", "wan",
        "--out", str(tmp_path),
    ]  # fmt: skip
    assert main(argv) == 0
    (saved,) = Results.load(tmp_path).configs
    assert (saved.fragments, saved.overlap_steps, saved.mixing_alpha) == (2, 1, 0.25)
    assert (saved.outer_optimizer, saved.outer_lr, saved.outer_momentum) == ("sgd", 0.9, 0.5)
    capsys.readouterr()
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "wan" in out.split("sim networks: ")[1].split("\n")[0]
    assert "  low_communication: " in out
    assert main(["run", "--strategy", "diloco", "--runtime", "sim", "--outer-lr", "0"]) == 1
    assert "outer_lr=0.0 must be a positive number" in capsys.readouterr().err


# -- the study's verdicts -------------------------------------------------------------------


def _runs(accuracy: dict[str, list[float]], **columns: dict[str, float]) -> pd.DataFrame:
    """A per-run table as ``study.table`` makes it: one row per (what, seed)."""
    rows = []
    for what, values in accuracy.items():
        for seed, acc in enumerate(values):
            row = {"what": what, "seed": seed, "test_accuracy": acc}
            row.update({name: float(col.get(what, 1.0)) for name, col in columns.items()})
            rows.append(row)
    return pd.DataFrame(rows)


def test_the_study_decides_its_claims_on_the_seed_spreads():
    from scaledl_lab.studies.low_communication import study

    grid = {f"diloco H={h}": [0.80, 0.81, 0.82] for h in study.H_GRID}
    grid["diloco H=100"] = [0.70, 0.71, 0.72]  # more than a point below synchronous SGD
    grid["diloco H=500"] = [0.60, 0.61, 0.62]
    accuracy = {
        "allreduce": [0.81, 0.81, 0.81],
        **grid,
        "fedavg H=50": [0.75, 0.76, 0.77],
        "streaming H=50": [0.81, 0.81, 0.81],
    }
    bytes_per_step = {"allreduce": 500.0, **{f"diloco H={h}": 500.0 / h for h in study.H_GRID}}
    peak = {"diloco H=50": 3000.0, "streaming H=50": 1000.0}
    time = {"diloco H=50": 10.0, "streaming H=50": 8.0}
    runs = _runs(accuracy, bytes_per_step=bytes_per_step, peak_bytes=peak, time_s=time)
    claims = {c.key: c for c in study.verdicts(runs)}
    h = claims["diloco-h"]
    assert h.verdict == "supported" and h.figures["largest_h"] == 50
    assert h.figures["bytes_ratio"] == pytest.approx(50)
    # "up to the largest H" holds for every H below it: a gap at H = 10 leaves nothing supported
    gap = _runs({**accuracy, "diloco H=10": [0.70, 0.71, 0.72]}, bytes_per_step=bytes_per_step,
                peak_bytes=peak, time_s=time)  # fmt: skip
    gapped = {c.key: c for c in study.verdicts(gap)}["diloco-h"]
    assert gapped.verdict == "not supported" and gapped.figures["largest_h"] == 0
    assert "at H = 1, 50 of" in gapped.reason  # the ones that held, listed all the same
    # "H times less": bytes per step that do not fall with H do not bear the claim out
    flat = _runs(accuracy, bytes_per_step={**bytes_per_step, "diloco H=50": 100.0},
                 peak_bytes=peak, time_s=time)  # fmt: skip
    flat_h = {c.key: c for c in study.verdicts(flat)}["diloco-h"]
    assert flat_h.verdict == "not supported" and flat_h.figures["bytes_ratio"] == 5
    assert claims["nesterov-vs-fedavg"].verdict == "supported"  # +5 points, 2 SE 1.6
    assert claims["nesterov-vs-fedavg"].figures["gap"] == pytest.approx(0.05)
    assert claims["streaming"].verdict == "supported"
    assert claims["streaming"].figures["peak_ratio"] == pytest.approx(3.0)
    # Slower on the wan: not supported, whatever the accuracy and the peak say.
    slower = _runs(accuracy, bytes_per_step=bytes_per_step, peak_bytes=peak,
                   time_s={**time, "streaming H=50": 12.0})  # fmt: skip
    assert {c.key: c.verdict for c in study.verdicts(slower)}["streaming"] == "not supported"
    # A gap inside the seed noise decides nothing.
    close = dict(accuracy, **{"fedavg H=50": [0.775, 0.805, 0.835]})  # +0.5, 2 SE 3.7
    noisy = _runs(close, bytes_per_step=bytes_per_step, peak_bytes=peak, time_s=time)
    assert {c.key: c.verdict for c in study.verdicts(noisy)}["nesterov-vs-fedavg"] == (
        "inconclusive"
    )


def test_the_study_table_reads_bytes_peaks_and_times_from_the_metrics():
    from scaledl_lab.studies.low_communication import study

    cfg = ExperimentConfig(strategy="streaming-diloco", runtime="sim", sync_period=6,
                           fragments=3, name="streaming H=6 · seed 0", **BASE)  # fmt: skip
    res = study.run_study(configs=[cfg])
    (row,) = study.table(res.frame).itertuples()
    train = res.frame.query("kind == 'train'")
    assert (row.what, row.seed) == ("streaming H=6", 0)
    assert row.bytes_per_step == train.query("rank == 0").bytes_sent.sum() / 20
    assert row.peak_bytes == train.query("step < 20").bytes_sent.max()  # not the closing round
    assert row.peak_bytes < train.bytes_sent.max()
    assert row.time_s == res.frame.time.max()
    renamed = res.frame.assign(run="streaming on the wan")
    (row,) = study.table(renamed).itertuples()
    assert (row.what, row.seed) == ("streaming on the wan", None)


def test_the_study_curves_put_each_evaluation_at_its_bytes_and_time():
    from matplotlib.figure import Figure

    from scaledl_lab.studies.low_communication import study

    cfg = ExperimentConfig(strategy="diloco", runtime="sim", sync_period=5,
                           name="diloco H=5", **{**BASE, "epochs": 2})  # fmt: skip
    res = study.run_study(configs=[cfg])
    points = study.curves(res.frame)
    tests = res.frame.query("kind == 'test'")
    train = res.frame.query("kind == 'train' and rank == 0").sort_values("step")
    assert list(points.epoch) == sorted(tests.epoch.unique())  # the start and every epoch
    assert points.bytes_sent.iloc[0] == 0 and points.bytes_sent.is_monotonic_increasing
    assert points.bytes_sent.iloc[-1] == train.bytes_sent.sum()  # the workers send alike
    assert list(points.time) == list(tests.groupby("epoch").time.max())
    assert (points.lo == points.accuracy).all()  # one global model evaluated
    ax = Figure().subplots()
    study.plot_curves(points, "bytes_sent", ax)
    assert ax.get_xscale() == "log" and len(ax.get_lines()[0].get_xdata()) == len(points) - 1


def test_the_committed_study_summary_renders_from_its_runs():
    from pathlib import Path

    from scaledl_lab.studies.low_communication import study

    out = Path(__file__).resolve().parents[1] / "results" / "diloco"
    runs = pd.read_csv(out / "runs.csv")
    assert sorted(runs.seed.unique()) == list(study.SEEDS)
    assert len(runs) == len(study.study_configs())
    text = (out / "summary.md").read_text()
    assert text[text.index("## Verdicts") :] == "\n".join(study.verdict_section(runs)) + "\n"
