"""`plan` for the lab's own gpt-tiny meshes (#50): each rank's ledger equals what a simulated
run records, to the byte, and its step the run's step on the simulator's clock, to 1e-9 of it,
over a table of meshes (dp×tp, tp×pp, dp×pp with each schedule, dp×cp with each attention, every
ZeRO stage, sequence parallelism, recomputation, 16 bits, a two-tier network) and the named
strategies that split gpt-tiny along one dimension.

What the plan cannot predict yet, and refuses (test_the_plan_refuses_what_it_cannot_predict):
float16 (dynamic loss scaling: a skipped step and whether Adam's state exists depend on the
gradients' values), stragglers and faults (one step is not the next). Columns it never
predicts: loss, accuracy, ``loss_scale`` and ``skipped`` (the data's). A run of gpipe, 1f1b,
interleaved-1f1b or zb-h1 records no ledger (its ``mem_*`` columns are empty), and neither does
their plan: only their step and bytes are held against the run. The mesh's own limits stay its
checks' (cp with dp and tp only; no ep dimension yet), refused before the dry run starts.
"""

from __future__ import annotations

import json
import math

import pytest

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.strategies.sim_plan import LEDGER, STEPS, sim_plan

TEXT = dict(
    runtime="sim", dataset="licenses", model="gpt-tiny", train_subset=160, val_size=4,
    test_subset=4, batch_size=8, epochs=1, lr=0.05, momentum=0.9, seed=1, micro_batches=2,
)  # fmt: skip
ADAM = dict(optimizer="adam", lr=1e-3, momentum=0.0)
H100 = dict(network="h100-node", compute_profile="h100", gpus_per_node=2)

MESHES = [  # (mesh, options): each schedule, each ZeRO stage, each attention of cp
    ("dp=2,tp=2", dict(sequence_parallel=True)),
    ("dp=2,tp=2", dict(zero_stage=2, **ADAM, **H100)),
    ("pp=2,tp=2", dict(recompute=True, precision="bfloat16")),
    ("dp=2,pp=2", dict(pipeline_schedule="gpipe", zero_stage=1)),
    ("dp=2,pp=2", dict(pipeline_schedule="1f1b", zero_stage=3, **ADAM)),
    ("dp=2,pp=2", dict(pipeline_schedule="interleaved-1f1b", virtual_stages=2, **H100)),
    ("dp=2,pp=2", dict(pipeline_schedule="zb-h1", **ADAM)),
    ("dp=2,cp=2", dict(cp_method="ring")),
    ("dp=2,cp=2", dict(cp_method="ulysses", **ADAM)),
]
NAMED = [  # the strategies that are gpt-tiny split along one dimension
    dict(strategy="tensor-parallel", workers=2, micro_batches=1, sequence_parallel=True),
    dict(strategy="gpipe", workers=2, stages=2),
    dict(strategy="1f1b", workers=2, stages=2),
    dict(strategy="interleaved-1f1b", workers=2, stages=2, virtual_stages=2),
    dict(strategy="zb-h1", workers=2, stages=2),
]


def _mesh(mesh: str, options: dict) -> ExperimentConfig:
    workers = math.prod(int(part.split("=")[1]) for part in mesh.split(","))
    return ExperimentConfig(**{**TEXT, **options}, strategy="mesh", mesh=mesh, workers=workers)


def _same(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def _held_against_the_run(cfg: ExperimentConfig) -> None:
    """Every step of a run after its first (which also waits for the evaluation before it),
    rank by rank: its ledger, its length on the clock and the bytes it sent."""
    steps = STEPS + 2  # more than the dry run takes: the plan's step is every later step's
    frame = run(cfg.replace(max_steps=steps), progress=False, log=None).frame
    train = frame[frame.kind == "train"]
    plans = sim_plan(cfg)
    assert [p.rank for p in plans] == list(range(cfg.workers))
    for p in plans:
        mine = train[train["rank"] == p.rank].set_index("step")
        for step in range(2, steps + 1):
            row = mine.loc[step]
            recorded = {k: float(row[k]) if k in mine else math.nan for k in LEDGER}
            assert all(_same(p.memory[k], recorded[k]) for k in LEDGER), (p.memory, recorded)
            step_s = row["time"] - mine.loc[step - 1, "time"]
            assert p.step_s == pytest.approx(step_s, rel=1e-9, abs=0)
            assert p.bytes_per_step == row["bytes_sent"]


@pytest.mark.parametrize(("mesh", "options"), MESHES, ids=lambda v: str(v))
def test_the_plan_of_a_mesh_is_what_its_run_records(mesh, options):
    cfg = _mesh(mesh, options)
    _held_against_the_run(cfg)
    if mesh.startswith("dp=2,pp=2") and options.get("zero_stage") == 3:
        # the comparison has power: ZeRO-3 holds half the parameters of ZeRO-0's replica
        p0, p3 = sim_plan(cfg.replace(zero_stage=0))[0], sim_plan(cfg)[0]
        assert p3.memory["mem_params"] < 0.6 * p0.memory["mem_params"]


@pytest.mark.parametrize("options", NAMED, ids=lambda o: o["strategy"])
def test_the_plan_of_a_named_strategy_is_what_its_run_records(options):
    _held_against_the_run(ExperimentConfig(**{**TEXT, **options}))


LOCAL_SGD = dict(TEXT, strategy="local-sgd", workers=2, micro_batches=1)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        (_mesh("dp=2,tp=2", dict(precision="float16")),
         "the plan cannot predict dynamic loss scaling"),
        (_mesh("dp=2,tp=2", dict(stragglers="hiccup:0.5:0.01")),
         "the plan predicts a step without stragglers"),
        (_mesh("dp=2,tp=2", dict(faults="kill:1:2")), "the plan predicts a step, not a failure"),
        (ExperimentConfig(**LOCAL_SGD), "a dry-run plan is for mesh, tensor-parallel, gpipe"),
    ],
)  # fmt: skip
def test_the_plan_refuses_what_it_cannot_predict(cfg, message):
    with pytest.raises(ConfigError, match=message):
        sim_plan(cfg)


MESH_ARGS = ["plan", "--strategy", "mesh", "--mesh", "dp=2,pp=2", "--model", "gpt-tiny",
             "--dataset", "licenses", "--workers", "4", "--batch-size", "8", "--micro-batches",
             "2", "--zero-stage", "1", "--pipeline-schedule", "zb-h1"]  # fmt: skip


def test_the_command_prints_each_ranks_plan_and_its_json(capsys, tmp_path):
    cfg = ExperimentConfig(
        strategy="mesh",
        mesh="dp=2,pp=2",
        model="gpt-tiny",
        dataset="licenses",
        workers=4,
        batch_size=8,
        micro_batches=2,
        zero_stage=1,
        pipeline_schedule="zb-h1",
    )  # the flags given above
    plans = sim_plan(cfg)
    out = tmp_path / "plan.json"
    assert main([*MESH_ARGS, "--json", "--out", str(out)]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body == json.loads(out.read_text())
    assert [r["step_s"] for r in body["ranks"]] == [p.step_s for p in plans]
    assert [r["bytes"] for r in body["ranks"]] == [p.memory for p in plans]
    assert main([*MESH_ARGS, "--device-memory-gb", "1"]) == 0
    text = capsys.readouterr().out
    assert "a dry run on zeros" in text and "in 1 GB per worker: fits" in text
    # a line per stage: the ranks of one stage hold and send the same
    assert [line.split()[-1] for line in text.splitlines()[2:4]] == ["0,2", "1,3"]
    assert main([*MESH_ARGS, "--device-memory-gb", "1e-6"]) == 1
    assert "does not fit" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*MESH_ARGS[:4], "dp=2,ep=2", *MESH_ARGS[5:]], "ep=2 spreads the experts of "
         "model='gpt-tiny-moe'; model='gpt-tiny' has none"),
        ([*MESH_ARGS, "--precision", "float16"], "the plan cannot predict dynamic loss scaling"),
        (["plan", "--strategy", "allreduce", "--model", "mlp", "--json"], "--json prints a "
         "transformer's plan on GPUs (--transformer, --gpu) or a dry run's (mesh, "),
    ],
)  # fmt: skip
def test_the_command_refuses_with_a_clear_message(argv, message, capsys):
    assert main(argv) == 1
    assert message in " ".join(capsys.readouterr().err.split())


def test_the_dry_run_reads_no_data_file(tmp_path):
    """Batches of zeros of the dataset's sample shape: an empty data folder is enough."""
    cfg = ExperimentConfig(
        strategy="gpipe", model="cnn", dataset="fashion-mnist", workers=2, stages=2,
        micro_batches=2, batch_size=16, data_dir=str(tmp_path),
    )  # fmt: skip
    plans = sim_plan(cfg)
    assert plans[0].step_s > 0 and plans[0].bytes_per_step > 0
    assert not list(tmp_path.iterdir())
