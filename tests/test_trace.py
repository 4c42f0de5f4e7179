"""``profile_step``: one training step as a Chrome trace, from the simulator's timeline and from
``torch.profiler`` on real Dask ranks (scaledl_lab.viz.trace, scaledl_lab.training.profile)."""

from __future__ import annotations

import json

import pytest
from common import small_for

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.strategies.data_parallel.sync_sgd import bucket_params
from scaledl_lab.viz.trace import profiler_bars, run_traces, step_timeline, step_window

BASE = dict(strategy="allreduce", workers=2, model="mlp", bucket_mb=0.5, **small_for(2))
# The MLP's 2.6 MB of gradients in 0.5 MiB buckets (4): as many allreduces from backward.
MLP = [p for p in build_model("mlp", (1, 28, 28), 10).parameters()][::-1]
BUCKETS = len(bucket_params(MLP, int(BASE["bucket_mb"] * 2**20)))


def test_a_simulated_step_exported_as_a_chrome_trace():
    """Step 2 of a 2-rank run: one process per rank, the worker's bars on thread 0 filling the
    step's window exactly, the transfers hidden behind backward on thread 1, as the timeline."""
    cfg = ExperimentConfig(runtime="sim", network="10gbe", profile_step=2, **BASE)
    res = run(cfg, progress=False, log=None)
    (trace,) = run_traces(res).values()
    assert list(run_traces(res)) == ["trace-allreduce-sim-2w.json"]  # Results.save's file
    trace = json.loads(json.dumps(trace))  # what the file holds
    bars = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in bars} == {0, 1}
    tl, frame = res.timeline(), res.frame
    for rank in (0, 1):
        start, end = step_window(frame, 2, rank)
        before = frame.query(f"kind == 'train' and step == 1 and rank == {rank}")["time"]
        assert start == before.item()
        worker = [e for e in bars if e["pid"] == rank and e["tid"] == 0]
        assert sum(e["dur"] for e in worker) == pytest.approx((end - start) * 1e6, rel=1e-9)
        assert {e["name"] for e in worker} == {"compute", "comm"}
        hidden = [e for e in bars if e["pid"] == rank and e["tid"] == 1]
        assert {e["name"] for e in hidden} == {"overlapped"} and len(hidden) >= 2
        mine = tl[(tl["rank"] == rank) & (tl["kind"] == "overlapped")]
        mine = mine[(mine["start"] >= start) & (mine["end"] <= end)]
        assert sum(e["dur"] for e in hidden) == pytest.approx(
            (mine["end"] - mine["start"]).sum() * 1e6, rel=1e-9
        )
        (compute,) = [e for e in worker if e["name"] == "compute"]  # backward hides them
        compute_end = compute["ts"] + compute["dur"] + 1e-6
        assert all(compute["ts"] < e["ts"] and e["ts"] + e["dur"] <= compute_end for e in hidden)
    assert step_timeline(tl, frame, 2)["start"].min() == 0.0


def test_a_step_outside_the_run_is_refused_by_name():
    outside = r"profile_step=3 is outside the run: .* takes 2 training step\(s\) per worker; "
    with pytest.raises(ConfigError, match=outside + "choose a step from 1 to 2"):
        run(ExperimentConfig(runtime="sim", profile_step=3, **BASE), progress=False, log=None)
    with pytest.raises(ConfigError, match="profile_step=0 must be a positive integer or None"):
        ExperimentConfig(runtime="sim", profile_step=0, **BASE)
    res = run(ExperimentConfig(runtime="sim", **BASE), progress=False, log=None)
    unknown = "step 5 is not a training step of this run: rank 0 took steps 1 to 2"
    with pytest.raises(ValueError, match=unknown):
        step_window(res.frame, 5, 0)
    assert run_traces(res) == {}  # nothing asked, nothing recorded


def test_a_dask_rank_profiles_exactly_the_step_asked(client, tmp_path):
    """Step 2 of 2 real ranks with torch.profiler: each rank's trace comes back to the results
    folder, and holds that one step: its bucket allreduces and the loss's, one optimiser step,
    gloo's transfers on their own threads beside the step's operators."""
    run(
        ExperimentConfig(runtime="dask", profile_step=2, **BASE),
        client=client, progress=False, log=None, out=tmp_path / "run",
    )  # fmt: skip
    for rank in (0, 1):
        text = (tmp_path / "run" / f"trace-allreduce-dask-2w-rank{rank}.json").read_text()
        events = [e for e in json.loads(text)["traceEvents"] if e.get("ph") == "X"]
        names = [e["name"] for e in events]
        assert names.count("c10d::allreduce_") == BUCKETS + 1
        assert sum(n.startswith("Optimizer.step#") for n in names) == 1
        assert names.count("gloo:all_reduce") == BUCKETS + 1
        gloo = {e["tid"] for e in events if e["name"] == "gloo:all_reduce"}
        step = {e["tid"] for e in events if e["name"] == "c10d::allreduce_"}
        assert gloo.isdisjoint(step)
        bars = profiler_bars(text, rank)
        # Whether a transfer shows as exposed ("comm") or hidden ("overlapped") depends on how
        # gloo's thread and the step shared the cores in that run: one of the two, always.
        assert "compute" in set(bars["kind"]) and set(bars["kind"]) & {"comm", "overlapped"}
