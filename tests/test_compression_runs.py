"""Compression inside the strategies: sending everything changes nothing (bit for bit), the
metrics count exactly the bytes sent, the simulator and Dask agree, bad configs fail early."""

from __future__ import annotations

import json
import math

import pytest
import torch
from common import max_diff, small_for

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.config import ConfigError
from scaledl_lab.metrics import compression_ratio
from scaledl_lab.models import build_model
from scaledl_lab.runtime.sim.cost import allgather_bytes, ring_allreduce_bytes
from scaledl_lab.strategies.compression import QSGD, OneBit, PowerSGD, layout_of, payload_bytes
from scaledl_lab.training.plan import make_optimizer
from scaledl_lab.viz.plots import summary_markdown, summary_table

# Six steps of 32 on four workers (768 samples), evaluations on 64: the comparisons are of
# bits and bytes, which differ from the first step where they differ at all.
SIM = dict(small_for(6, workers=4), runtime="sim", workers=4, model="mlp", lr=0.02)


def _model_layout():
    return layout_of(build_model("mlp", (1, 28, 28), 10, seed=0).parameters())


def _final(results):
    return results.outputs[results.configs[0].label]


@pytest.mark.parametrize(
    "options",
    [
        dict(strategy="allreduce"),
        dict(strategy="allreduce-naive"),
        dict(strategy="ps-sync", servers=2),
        dict(strategy="ps-async", workers=1),
        dict(strategy="nnt-lockstep", topology="ring"),
    ],
)
def test_sending_every_entry_reproduces_the_uncompressed_run_bit_for_bit(options):
    # topk:1.0 sends every entry through the compressed path (allgather, payload push,
    # packed messages): the weights and every metric but the new column stay identical.
    # (Its messages are twice as large, values and indices: where the order of events depends
    # on message times, asynchronous PS with several workers and NNT without lock-step, the
    # runs differ as they would on any slower network.)
    plain = run(ExperimentConfig(**dict(SIM, **options)), progress=False)
    full = run(ExperimentConfig(**dict(SIM, **options), compress="topk:1.0"), progress=False)
    for a, b in zip(_final(plain), _final(full), strict=True):
        assert max_diff(a["state_dict"], b["state_dict"]) == 0.0
    columns = ["rank", "kind", "epoch", "step", "loss", "accuracy", "staleness", "lr"]
    assert plain.frame[columns].equals(full.frame[columns])
    assert plain.frame["bytes_uncompressed"].isna().all()
    train = full.frame[full.frame["kind"] == "train"]
    assert train["bytes_uncompressed"].notna().all()


def test_compressed_dpsgd_that_sends_everything_is_dpsgd():
    # The public copies are rebuilt from the sent changes: equal up to float32 rounding.
    plain = run(ExperimentConfig(**SIM, strategy="dpsgd"), progress=False)
    full = run(ExperimentConfig(**SIM, strategy="dpsgd", compress="topk:1.0"), progress=False)
    for a, b in zip(_final(plain), _final(full), strict=True):
        assert max_diff(a["state_dict"], b["state_dict"]) < 1e-5


def test_none_is_the_uncompressed_run_whatever_error_feedback_says():
    a = run(ExperimentConfig(**SIM, strategy="ps-async"), progress=False)
    b = run(ExperimentConfig(**SIM, strategy="ps-async", error_feedback=False), progress=False)
    assert a.frame.equals(b.frame)


def test_allreduce_rows_count_the_allgathered_payloads_exactly():
    n = sum(math.prod(s) for s in _model_layout())
    k = math.ceil(0.01 * n)
    res = run(ExperimentConfig(**SIM, strategy="allreduce", compress="topk:0.01"), progress=False)
    train = res.frame[res.frame["kind"] == "train"]
    stats = ring_allreduce_bytes(8, 4)  # the step's loss, summed with the gradients
    assert (train["bytes_sent"] == allgather_bytes(k * 8, 4) + stats).all()
    assert (train["bytes_uncompressed"] == ring_allreduce_bytes(4 * n, 4) + stats).all()
    ratio = compression_ratio(train)
    assert ratio == pytest.approx((ring_allreduce_bytes(4 * n, 4) + stats) / (3 * k * 8 + stats))
    assert summary_table(res.frame)["compression_ratio"].iloc[0] == pytest.approx(ratio)
    assert f"×{ratio:.1f}" in summary_markdown(res.frame)


def test_powersgd_rows_count_p_and_q():
    layout = _model_layout()
    psgd = PowerSGD(layout, 2)
    p = sum(s.rows * s.rank for s in psgd.matrices) + sum(s.numel for s in psgd.raw)
    q = sum(s.cols * s.rank for s in psgd.matrices)
    res = run(ExperimentConfig(**SIM, strategy="allreduce", compress="powersgd:2"), progress=False)
    train = res.frame[res.frame["kind"] == "train"]
    expected = sum(ring_allreduce_bytes(4 * m, 4) for m in (p, q, 2))  # P + raw, Q, the loss
    assert (train["bytes_sent"] == expected).all()


def test_neighbour_messages_and_server_pushes_count_their_payloads():
    layout = _model_layout()
    n = sum(math.prod(s) for s in layout)
    x = torch.zeros(n)
    res = run(ExperimentConfig(**SIM, strategy="nnt-lockstep", compress="qsgd:4"), progress=False)
    train = res.frame[res.frame["kind"] == "train"]
    assert (train["bytes_sent"] == 2 * payload_bytes(QSGD(layout, 4).encode(x))).all()  # ring
    assert (train["bytes_uncompressed"] == 2 * 4 * n).all()

    res = run(ExperimentConfig(**SIM, strategy="ps-async", compress="onebit"), progress=False)
    train = res.frame[res.frame["kind"] == "train"]
    args = 3 * 8  # rank, version and steps travel with the push
    assert (train["bytes_sent"] == args + payload_bytes(OneBit(layout).encode(x))).all()
    assert (train["bytes_uncompressed"] == args + 4 * n).all()


def test_error_feedback_changes_the_trajectory_of_a_biased_compressor():
    with_ef = run(
        ExperimentConfig(**SIM, strategy="allreduce", compress="topk:0.01"), progress=False
    )
    without = run(
        ExperimentConfig(**SIM, strategy="allreduce", compress="topk:0.01", error_feedback=False),
        progress=False,
    )
    assert max_diff(_final(with_ef)[0]["state_dict"], _final(without)[0]["state_dict"]) > 1e-4


def test_dgc_moves_the_momentum_out_of_the_optimiser_where_it_corrects_it():
    params = [torch.nn.Parameter(torch.zeros(2))]
    dgc = ExperimentConfig(**SIM, strategy="allreduce", compress="dgc:0.01")
    assert make_optimizer(dgc, params).param_groups[0]["momentum"] == 0.0
    ps = dgc.replace(strategy="ps-sync")
    assert make_optimizer(ps, params).param_groups[0]["momentum"] == 0.0
    nnt = dgc.replace(strategy="nnt", optimizer="sgd")  # neighbours step with their own
    assert make_optimizer(nnt, params).param_groups[0]["momentum"] == 0.9
    topk = dgc.replace(compress="topk:0.01")
    assert make_optimizer(topk, params).param_groups[0]["momentum"] == 0.9


@pytest.mark.parametrize(
    "options",
    [
        dict(strategy="allreduce", compress="powersgd:2"),
        dict(strategy="allreduce", compress="dgc:0.01"),
        dict(strategy="nnt-lockstep", compress="qsgd:4"),
        dict(strategy="ps-sync", compress="topk:0.05"),
    ],
)
def test_two_dask_workers_compute_what_the_simulator_does(client, options):
    cfg = ExperimentConfig(**dict(SIM, workers=2), **options)
    sim = run(cfg, progress=False)
    real = run(cfg.replace(runtime="dask"), client=client, progress=False)
    for a, b in zip(_final(sim), _final(real), strict=True):
        assert max_diff(a["state_dict"], b["state_dict"]) == 0.0
    columns = ["rank", "step", "bytes_sent", "bytes_uncompressed"]
    trains = [
        r.frame[r.frame["kind"] == "train"][columns].sort_values(
            ["rank", "step"], ignore_index=True
        )
        for r in (sim, real)
    ]
    assert trains[0].equals(trains[1])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(compress="zip"), r"compress='zip' is unknown; allowed: none, onebit, qsgd:LEVELS"),
        (dict(compress="topk"), r"needs its parameter: topk:RATIO"),
        (dict(compress="topk:0"), r"ratio .* must lie in \(0, 1\]"),
        (dict(compress="topk:1.5"), r"ratio .* must lie in \(0, 1\]"),
        (dict(compress="dgc:-0.1"), r"ratio .* must lie in \(0, 1\]"),
        (dict(compress="topk:abc"), r"ratio .* must lie in \(0, 1\]"),
        (dict(compress="powersgd:0"), r"rank must be a positive integer"),
        (dict(compress="qsgd:0"), r"levels must be an integer from 1 to 32767"),
        (dict(compress="qsgd:40000"), r"levels must be an integer from 1 to 32767"),
        (dict(compress="onebit:2"), r"onebit takes no parameter"),
        (dict(error_feedback="yes"), r"error_feedback='yes' must be True or False"),
        (dict(compress="onebit", strategy="hogwild"), r"does not apply to strategy='hogwild'"),
        (dict(compress="topk:0.1", strategy="model-parallel", workers=2), r"'model-parallel'"),
        (dict(compress="topk:0.1", strategy="tensor-parallel", workers=2), r"no gradients"),
        (dict(compress="qsgd:4", strategy="easgd"), r"does not apply to strategy='easgd'"),
    ],
)
def test_bad_compression_settings_fail_before_work_starts(options, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**dict(SIM, **options))


def test_the_cli_reads_the_compression_options(tmp_path, capsys):
    assert main(["list"]) == 0
    assert (
        "compressors (--compress): none, onebit, qsgd:LEVELS, topk:RATIO" in capsys.readouterr().out
    )
    assert main(["run", "--runtime", "sim", "--compress", "topk:2", "--out", "/nonexistent"]) == 1
    assert "must lie in (0, 1]" in capsys.readouterr().err
    out = tmp_path / "res"
    argv = [
        "run", "--runtime", "sim", "--workers", "2", "--model", "mlp", "--batch-size", "32",
        "--train-subset", "1200", "--test-subset", "300", "--max-steps", "4",
        "--compress", "qsgd:8", "--no-error-feedback", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    cfg = json.loads((out / "config.json").read_text())["runs"][0]
    assert (cfg["compress"], cfg["error_feedback"]) == ("qsgd:8", False)
    assert "| compression |" in (out / "summary.md").read_text().splitlines()[2]
