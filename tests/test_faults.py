"""Injected faults (``faults="kill:RANK:STEP"``): decentralised runs go on with the survivors,
synchronous ones stop with a clear error; bad fault specs are refused before any work."""

from __future__ import annotations

import ast
from pathlib import Path

import pandas as pd
import pytest
import torch
from common import SMALL, partial_of

import scaledl_lab.strategies as strategies
from scaledl_lab import ConfigError, ExperimentConfig, WorkerLostError, run
from scaledl_lab.cli import main
from scaledl_lab.experiment import total_steps
from scaledl_lab.runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile, Stragglers
from scaledl_lab.runtime.sim.scheduler import SimWorld
from scaledl_lab.strategies.decentralised.gossip import gossip_average

FAULTY = dict(SMALL, runtime="sim", workers=4, model="mlp", faults="kill:1:3")


@pytest.mark.parametrize("strategy", ["dpsgd", "nnt", "adpsgd", "nnt-lockstep"])
def test_decentralised_runs_finish_with_the_survivors(strategy):
    cfg = ExperimentConfig(strategy=strategy, **FAULTY)
    res = run(cfg, progress=False)
    frame, steps = res.frame, total_steps(cfg)
    train = frame[frame.kind == "train"]
    last = train.groupby("rank").step.max().to_dict()
    assert last == {0: steps, 1: 3, 2: steps, 3: steps}  # the killed rank's rows end at step 3
    lost = frame[frame.kind == "worker-lost"]
    assert lost[["rank", "step"]].values.tolist() == [[1, 3]]
    assert lost.samples.item() == SMALL["train_subset"] // 4  # its shard, recorded as lost
    outputs = res.outputs[res.configs[0].label]
    assert outputs[1] == {}
    assert outputs[0]["best_rank"] != 1
    assert torch.isnan(torch.tensor(outputs[0]["worker_test_accuracy"][1]))
    assert frame[(frame.kind == "test") & (frame["rank"] == 1)].empty  # never evaluated again


def test_async_easgd_goes_on_and_the_first_survivor_reports():
    cfg = ExperimentConfig(strategy="easgd", elastic_async=True, **{**FAULTY, "faults": "kill:0:5"})
    frame, steps = run(cfg, progress=False).frame, total_steps(cfg)
    assert frame[frame.kind == "train"].groupby("rank").step.max().tolist() == [5] + [steps] * 3
    assert frame[frame.kind == "consensus"]["rank"].tolist() == [1]


def test_a_fault_run_is_deterministic():
    cfg = ExperimentConfig(strategy="nnt", **FAULTY)
    first, second = run(cfg, progress=False).frame, run(cfg, progress=False).frame
    assert first.equals(second)


def test_mixing_weights_renormalise_over_the_survivors():
    """Ring of 4, rank 1 dies after one round: rank 0 then mixes itself and rank 3 only,
    with W's weights 1/3 and 1/3 renormalised to 1/2 and 1/2."""
    start = torch.arange(4 * 3, dtype=torch.float64).reshape(4, 3)
    after: dict[int, torch.Tensor] = {}

    async def program(comm):
        x = await gossip_average(comm, start[comm.rank].clone(), "ring")
        if comm.rank == 1:
            comm.die(1)
        after[comm.rank] = x.clone()
        after[comm.rank + 10] = await gossip_average(comm, x, "ring")

    cost = CostModel(ComputeProfile("t", 0.0, 1e-9), NetworkProfile("t", 1e-6, 1e9), "ring",
                     Stragglers())  # fmt: skip
    SimWorld(4, cost, tolerates_worker_loss=True).run([program] * 4)
    assert torch.allclose(after[10], (after[0] + after[3]) / 2, rtol=0, atol=1e-12)
    assert torch.allclose(after[12], (after[2] + after[3]) / 2, rtol=0, atol=1e-12)
    assert torch.allclose(after[13], (after[0] + after[2] + after[3]) / 3, rtol=0, atol=1e-12)


@pytest.mark.parametrize("strategy", ["allreduce", "ps-sync", "easgd"])
def test_synchronous_runs_stop_with_a_clear_error(strategy, tmp_path):
    cfg = ExperimentConfig(strategy=strategy, **FAULTY)
    with pytest.raises(WorkerLostError, match=r"rank 1 died after step 3 .*synchronous run "
                       r"cannot continue.*metrics so far are in"):  # fmt: skip
        run(cfg, out=tmp_path / "r", progress=False, figures=False)
    saved = pd.read_csv(partial_of(tmp_path / "r") / "metrics.csv")
    train = saved[saved.kind == "train"]
    assert train[train["rank"] == 1].step.tolist() == [1, 2, 3]  # every row up to the kill
    assert train.groupby("rank").step.max().min() >= 2


@pytest.mark.parametrize(
    "faults,message",
    [
        ("kill:4:3", r"kills rank 4, but the run has workers=4 \(ranks 0 to 3\)"),
        ("kill:1:0", r"steps count from 1"),
        ("kill:one:3", r"needs integers"),
        ("stop:1:3", r"is not kill:RANK:STEP"),
        ("kill:0:1,kill:0:2", r"kills rank 0 twice"),
        ("kill:0:1,kill:1:1,kill:2:1,kill:3:1", r"kills every worker"),
    ],
)
def test_bad_faults_are_refused(faults, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(strategy="dpsgd", **{**FAULTY, "faults": faults})


def test_a_fault_after_the_last_step_is_refused_before_any_work():
    steps = total_steps(ExperimentConfig(strategy="dpsgd", **FAULTY))
    cfg = ExperimentConfig(strategy="dpsgd", **{**FAULTY, "faults": f"kill:2:{steps + 1}"})
    with pytest.raises(ConfigError, match=rf"after step {steps + 1}, but each worker takes only "
                       rf"{steps} steps"):  # fmt: skip
        run(cfg, progress=False)


def test_cli_names_the_bad_rank(capsys):
    code = main(["run", "--strategy", "nnt", "--runtime", "sim", "--workers", "2",
                 "--faults", "kill:9:2"])  # fmt: skip
    assert code == 1
    assert "kills rank 9, but the run has workers=2" in capsys.readouterr().err


# -- real Dask workers: the rank's process exits at its fault --------------------------------


def _dask_run(strategy: str, workers: int, tmp_path):
    from scaledl_lab.runtime.dask.cluster import connect

    options = {**SMALL, "max_steps": 12}
    cfg = ExperimentConfig(strategy=strategy, workers=workers, model="mlp", oversubscribe=True,
                           faults="kill:1:4", **options)  # fmt: skip
    with connect(workers, dashboard=False, log=None) as client:
        try:
            return run(
                cfg, client=client, out=tmp_path / "r", progress=False, figures=False, log=None
            )
        finally:  # a finished run's folder, or a stopped one's partial folder
            done = tmp_path / "r"
            saved = pd.read_csv((done if done.exists() else partial_of(done)) / "metrics.csv")
            train = saved[saved.kind == "train"]
            assert train[train["rank"] == 1].step.tolist() == [1, 2, 3, 4]  # nothing lost


def test_dask_decentralised_run_goes_on_when_a_worker_process_exits(tmp_path):
    frame = _dask_run("dpsgd", 3, tmp_path).frame
    train = frame[frame.kind == "train"]
    assert train.groupby("rank").step.max().to_dict() == {0: 12, 1: 4, 2: 12}
    lost = frame[frame.kind == "worker-lost"]
    # The fault's own row (after step 4, the lost shard: a third of 2400 samples) and the
    # driver's when it saw the worker gone (step -1); no other rank is reported lost.
    rows = sorted(lost[["rank", "step", "samples"]].values.tolist())
    assert rows == [[1, -1, 0], [1, 4, 800]]
    assert frame[frame.kind == "consensus"]["rank"].tolist() == [0]  # among the survivors


def test_dask_synchronous_run_stops_when_a_worker_process_exits(tmp_path):
    with pytest.raises(WorkerLostError, match=r"\(rank 1\) died during run 'allreduce-dask-2w'"):
        _dask_run("allreduce", 2, tmp_path)


def test_every_train_row_is_followed_by_the_explicit_fault_point():
    """A strategy's loop ends a killed worker where it says so: ``ctx.die_if_killed(step)``
    as the statement right after each ``ctx.log_train(step, ...)``."""
    missing, sites = [], 0
    for path in sorted(Path(strategies.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            body = getattr(node, "body", None)
            if not isinstance(body, list):
                continue
            for stmt, after in zip(body, body[1:] + [None], strict=True):
                if not _calls(stmt, "log_train"):
                    continue
                sites += 1
                step = ast.unparse(stmt.value.args[0])
                if after is None or not _calls(after, "die_if_killed", step):
                    missing.append(f"{path.name}:{stmt.lineno}")
    assert sites >= 8 and not missing, missing


def _calls(stmt, method, first=None):
    call = stmt.value if isinstance(stmt, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == method
        and (first is None or ast.unparse(call.args[0]) == first)
    )
