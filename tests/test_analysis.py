"""The analysis of results tables and the paper's verdicts, on small tables built by hand.

No cluster and no training: every number below is chosen so that the expected value can be
worked out on paper, and each verdict is shown flipping when the numbers that decide it flip.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from scaledl_lab import analysis, topology
from scaledl_lab.config import ExperimentConfig
from scaledl_lab.metrics import to_frame
from scaledl_lab.studies import claims

MIB = 2**20

# -- metrics tables ----------------------------------------------------------------------------


def _row(run="r", world_size=1, **values):
    base = dict(run=run, strategy="s", runtime="sim", world_size=world_size, samples=1)
    return {**base, "bytes_sent": 0, **values}


def _evals(run, val, test, step=10, world_size=None):
    """val/test rows of each rank (``val[i]`` is rank i's), at ``step``."""
    n = world_size or len(val)
    rows = []
    for rank, (v, t) in enumerate(zip(val, test, strict=True)):
        for kind, acc in (("val", v), ("test", t)):
            rows.append(_row(run, n, rank=rank, kind=kind, epoch=1.0, step=step, time=step,
                             accuracy=acc))  # fmt: skip
    return rows


def test_best_worker_is_best_on_validation_and_a_nan_never_wins():
    frame = to_frame(_evals("r", val=[0.5, math.nan, 0.7, 0.7], test=[0.1, 0.9, 0.3, 0.4]))
    s = analysis.best_worker(frame)
    assert s["best_rank"] == 2  # the NaN (diverged) worker is never best; ties: lowest rank
    assert s["best_test_accuracy"] == 0.3
    assert s["mean_test_accuracy"] == pytest.approx(0.425)
    scores = analysis.final_scores(frame)
    assert scores["best"] == 0.3 and scores["spread"] == pytest.approx(0.8)


def test_best_worker_reads_each_ranks_last_evaluation_and_keeps_its_rank_number():
    early = _evals("r", val=[0.9, 0.1, 0.1], test=[0.9, 0.1, 0.1], step=5)
    late = _evals("r", val=[0.2, 0.6, math.nan], test=[0.2, 0.6, 0.5], step=10)
    s = analysis.best_worker(to_frame(early + late))
    assert s["worker_val_accuracy"][:2] == [0.2, 0.6] and math.isnan(s["worker_val_accuracy"][2])
    assert s["best_rank"] == 1 and s["best_test_accuracy"] == 0.6
    # Rank 1 was lost: the survivors are ranks 0 and 2, and the best is rank 2, not position 1.
    survivors = _evals("r", val=[0.2, 0.0, 0.8], test=[0.2, 0.0, 0.7])
    s = analysis.best_worker(to_frame([r for r in survivors if r["rank"] != 1]))
    assert s["ranks"] == [0, 2] and s["best_rank"] == 2 and s["best_test_accuracy"] == 0.7
    # A worker with a validation row but no test row counts as NaN in the test accuracies.
    s = analysis.best_worker(to_frame(survivors[:-1]))
    assert s["best_rank"] == 2 and math.isnan(s["best_test_accuracy"])


def test_no_validation_split_gives_nan_scores_and_a_clear_error():
    frame = to_frame([_row(rank=0, kind="test", epoch=1.0, step=3, time=1.0, accuracy=0.5)])
    assert all(math.isnan(v) for v in analysis.final_scores(frame).values())
    with pytest.raises(ValueError, match="val_size > 0"):
        analysis.best_worker(frame)


def _sync_train(run="sync", workers=2, steps_per_epoch=4, epochs=2, step_s=0.5, start=3.0,
                slow=None):  # fmt: skip
    """Local progress: rank r's k-th step ends at start + k·step_s (× its slowdown)."""
    rows = []
    for rank in range(workers):
        dt = step_s * (slow.get(rank, 1.0) if slow else 1.0)
        for k in range(1, epochs * steps_per_epoch + 1):
            rows.append(_row(run, workers, rank=rank, kind="train", epoch=k / steps_per_epoch,
                             step=k, time=start + k * dt, bytes_sent=100))  # fmt: skip
    return rows


def test_time_per_epoch_is_steady_state_from_the_first_step_on():
    # 8 steps of 0.5 s after a 3 s start-up: first row at 3.5 s (epoch 0.25), last at 7 s.
    frame = to_frame(_sync_train())
    assert not analysis.has_global_progress(frame)
    assert analysis.time_per_epoch(frame) == pytest.approx((7.0 - 3.5) / (2 - 0.25))  # = 2.0
    # The start-up does not count: the same run starting at 0 has the same time per epoch.
    assert analysis.time_per_epoch(to_frame(_sync_train(start=0.0))) == pytest.approx(2.0)


def test_time_per_epoch_waits_for_the_last_rank_of_a_local_progress_run():
    frame = to_frame(_sync_train(slow={1: 3.0}))  # rank 1: 1.5 s per step, from 4.5 s to 15 s
    assert analysis.time_per_epoch(frame) == pytest.approx((15.0 - 4.5) / 1.75)  # = 3 × 2.0


def _async_train(workers=2, per_epoch=4, epochs=2, step_s=0.5):
    """Global progress: the servers apply one push every step_s / workers seconds; rows carry
    it in ``epoch`` (capped at the end). After the end, each other rank logs a dropped push."""
    rows, target = [], epochs * per_epoch
    steps = dict.fromkeys(range(workers), 0)
    for g in range(1, target + 1):
        rank = (g - 1) % workers
        steps[rank] += 1
        rows.append(_row("async", workers, rank=rank, kind="train", epoch=g / per_epoch,
                         step=steps[rank], time=g * step_s / workers,
                         staleness=1.0))  # fmt: skip
    for rank in range(workers):
        if rank != (target - 1) % workers:  # its push in flight at the end is dropped
            steps[rank] += 1
            rows.append(_row("async", workers, rank=rank, kind="train", epoch=float(epochs),
                             step=steps[rank], time=target * step_s / workers + 10.0,
                             staleness=math.nan))  # fmt: skip
    return rows


def test_time_per_epoch_of_global_progress_ignores_dropped_pushes():
    frame = to_frame(_async_train())
    assert analysis.has_global_progress(frame)
    # 8 pushes, one per 0.25 s: the end (epoch 2) at 2.0 s; the first row at 0.25 s, epoch 0.25;
    # the dropped push logged 10 s later does not count.
    assert analysis.time_per_epoch(frame) == pytest.approx((2.0 - 0.25) / (2 - 0.25))


def test_traffic_per_worker_step_and_per_round_at_the_busiest_server():
    rows = _sync_train(run="ps", workers=4, steps_per_epoch=2, epochs=1)  # 8 steps, 2 rounds
    for i, (out, into) in enumerate([(300, 500), (1000, 600)]):
        rows.append(_row("ps", 4, rank=4 + i, kind="server", epoch=1.0, step=9, time=9.0,
                         bytes_sent=out, bytes_received=into))  # fmt: skip
    frame = to_frame(rows)
    assert analysis.bytes_per_worker_step(frame) == 100
    assert analysis.server_bytes_per_round(frame) == pytest.approx(1600 / 2)
    assert analysis.servers_of(frame) == 2
    assert math.isnan(analysis.server_bytes_per_round(to_frame(_sync_train())))


def test_speedup_and_time_per_epoch_agree_and_the_straggler_pairs_with_its_twin():
    cfg = ExperimentConfig(strategy="allreduce", runtime="dask", workers=1, model="mlp")
    one = cfg.replace(name="one")
    two = cfg.replace(workers=2, name="two")
    sim = cfg.replace(runtime="sim", workers=2, name="sim")
    slow = sim.replace(stragglers="slow:1:3", name="sim slow")
    rows = _sync_train("one", workers=1, steps_per_epoch=8, step_s=0.5, start=1.0)
    rows += _sync_train("two", step_s=0.6, start=0.01)
    rows += _sync_train("sim", step_s=0.4) + _sync_train("sim slow", step_s=0.4, slow={1: 3.0})
    for run in ("one", "two", "sim", "sim slow"):
        rows += _evals(run, val=[0.5], test=[0.5], world_size=2)
    results = SimpleNamespace(frame=to_frame(rows), configs=[one, two, sim, slow])
    table = analysis.comparison_table(results, one_worker_time=lambda c: 3.2).set_index("run")
    t = table["time_per_epoch_s"]
    assert t["one"] == pytest.approx(4.0) and t["two"] == pytest.approx(2.4)
    assert t["sim"] == pytest.approx(1.6) and t["sim slow"] == pytest.approx(4.8)
    # One worker's time per epoch over the run's: measured on Dask, modelled on the simulator.
    speed = table["speedup_vs_1_worker"]
    assert speed["one"] == 1.0 and speed["two"] == pytest.approx(4.0 / 2.4)
    assert speed["sim"] == pytest.approx(3.2 / 1.6) and speed["sim slow"] == pytest.approx(
        3.2 / 4.8
    )
    assert table["straggler_slowdown"]["sim slow"] == pytest.approx(3.0)
    assert math.isnan(table["straggler_slowdown"]["sim"])
    assert table.loc["sim slow", "stragglers"] == "slow:1:3"
    assert math.isnan(analysis.comparison_table(results).loc[2, "speedup_vs_1_worker"])


def test_traffic_table_names_each_method_by_strategy_and_topology():
    cfgs = [
        ExperimentConfig(strategy="nnt", runtime="sim", workers=9, topology="torus:3x3",
                         name="traffic · nnt torus · 9w"),
        ExperimentConfig(strategy="ps-sync", runtime="sim", workers=4,
                         name="traffic · ps-sync · 4w"),
        ExperimentConfig(strategy="allreduce", runtime="sim", workers=4, name="not traffic"),
    ]  # fmt: skip
    rows = _sync_train("traffic · nnt torus · 9w", workers=9) + _sync_train(
        "traffic · ps-sync · 4w", workers=4
    )
    table = analysis.traffic_table(SimpleNamespace(frame=to_frame(rows), configs=cfgs))
    assert list(table["method"]) == ["nnt torus", "ps-sync"]
    assert list(table["workers"]) == [9, 4]
    assert analysis.method_label(ExperimentConfig(strategy="nnt", workers=8)) == "nnt ring"


def test_reachability_counts_the_workers_an_update_has_reached():
    assert topology.reachability("ring", 16, 6) == [3, 5, 7, 9, 11, 13]
    assert topology.reachability("torus:4x4", 16, 4) == [5, 11, 15, 16]
    assert topology.reachability("complete", 16, 2) == [16, 16]


# -- verdicts on synthetic comparison tables -------------------------------------------------

SPEC = {"allreduce": None, "ps-sync": None, "ps-async": None, "nnt ring": "ring"}


def _table(workers=16, torus="torus:4x4", straggler="slow:5:4", **changes):
    """A comparison table as reproduce builds it; ``changes`` maps "method.column" to values."""
    base = dict(runtime="sim", workers=workers, stragglers=None, straggler=False,
                test_acc_best_worker=0.80, test_acc_spread=0.0, time_per_epoch_s=1.0,
                staleness=math.nan, straggler_slowdown=math.nan)  # fmt: skip
    rows = {
        "allreduce": dict(strategy="allreduce", topology=None),
        "ps-sync": dict(strategy="ps-sync", topology=None),
        "ps-async": dict(
            strategy="ps-async", topology=None, staleness=13.6, test_acc_best_worker=0.50
        ),  # fmt: skip
        "nnt-ring": dict(strategy="nnt", topology="ring", test_acc_spread=0.20),
        "nnt-torus": dict(
            strategy="nnt", topology=torus, test_acc_spread=0.10, time_per_epoch_s=1.2
        ),  # fmt: skip
        "allreduce-straggler": dict(strategy="allreduce", topology=None, straggler_slowdown=3.0),
        "ps-async-straggler": dict(strategy="ps-async", topology=None, straggler_slowdown=1.0),
        "nnt-torus-straggler": dict(strategy="nnt", topology=torus, straggler_slowdown=1.5),
    }
    records = []
    for name, values in rows.items():
        record = {**base, "run": name, **values}
        if name.endswith("straggler"):
            record.update(straggler=True, stragglers=straggler)
        for key, value in changes.items():
            method, column = key.split(".")
            if method == name:
                record[column] = value
        records.append(record)
    return pd.DataFrame(records)


def _claims(table, traffic=None):
    """The claims decided on the tables, by key."""
    return {c.key: c for c in claims.verdicts(table, traffic)}


def _claim(table, key, traffic=None):
    decided = _claims(table, traffic)
    assert key in decided, list(decided)
    return decided[key]


def test_accuracy_verdict_flips_with_the_gap():
    c = _claim(_table(**{"nnt-torus.test_acc_best_worker": 0.785}), "accuracy")
    assert c.verdict == "supported"
    assert c.figures == {
        "nnt_torus_acc": 0.785,
        "allreduce_acc": 0.80,
        "gap_points": pytest.approx(1.5),
    }
    c = _claim(_table(**{"nnt-torus.test_acc_best_worker": 0.497}), "accuracy")
    assert c.verdict == "not supported" and c.figures["gap_points"] == pytest.approx(30.3)
    c = _claim(_table(**{"nnt-torus.test_acc_best_worker": 0.83}), "accuracy")
    assert c.verdict == "supported" and c.figures["gap_points"] == pytest.approx(-3.0)
    assert _claim(_table(), "accuracy").figures["gap_points"] == 0.0


def test_a_claim_renders_as_the_summaries_print_it():
    claim, quote = claims.CLAIMS["accuracy"]
    lead = (
        f"- {claim} (our reading of the paper; docs/PAPER.md, our summary in our words: "
        f"*“{quote}”*). Tested: NNT reaches the accuracy of synchronous SGD (best worker "
    )
    for acc, end in (
        (0.785, "**supported** — torus 78.50%, 1.5 points behind allreduce (80.00%)."),
        (0.497, "**not supported** — torus 49.70%, 30.3 points behind allreduce (80.00%)."),
        (0.83, "**supported** — torus 83.00%, 3.0 points ahead of allreduce (80.00%)."),
        (0.80, "**supported** — torus 80.00%, level with allreduce (80.00%)."),
    ):
        c = _claim(_table(**{"nnt-torus.test_acc_best_worker": acc}), "accuracy")
        assert claims.markdown_line(c) == f"{lead}within 2 points, same epochs): {end}"
    accs = {"allreduce": [0.79, 0.80, 0.81], "nnt-torus": [0.76, 0.77, 0.78]}
    c = _claim(_seeded(accs), "accuracy")
    assert c.reason == "torus 77.00% ± 1.0, 3.0 points behind allreduce (80.00% ± 1.0)"


def test_faster_per_epoch_verdict_flips_with_the_times_and_names_the_worker_count():
    c = _claim(_table(), "time")
    assert c.verdict == "not supported"
    assert c.figures == {"nnt_torus_s": 1.2, "allreduce_s": 1.0, "ps_sync_s": 1.0, "workers": 16}
    c = _claim(_table(workers=9, torus="torus:3x3", **{"nnt-torus.time_per_epoch_s": 0.9}), "time")
    assert c.verdict == "supported" and c.figures["workers"] == 9
    c = _claim(_table(**{"nnt-torus.time_per_epoch_s": 0.96}), "time")  # inside the margin
    assert c.verdict == "not supported"


def test_straggler_verdict_flips_and_reads_the_slowdown_from_the_setting():
    c = _claim(_table(), "straggler run")
    assert c.verdict == "supported"
    assert c.figures == {"rank_5_slower": 4.0, "allreduce_slowdown": 3.0,
                         "nnt_torus_slowdown": 1.5, "ps_async_slowdown": 1.0,
                         "degree": 4}  # fmt: skip
    assert "straggler" not in _claims(_table())  # no step rates measured: no rate claim
    c = _claim(
        _table(straggler="slow:3:2.5", **{"nnt-torus-straggler.straggler_slowdown": 3.0}),
        "straggler run",
    )
    assert c.verdict == "not supported"
    assert c.figures["rank_3_slower"] == 2.5 and c.figures["nnt_torus_slowdown"] == 3.0
    assert c.reason.endswith("the straggler itself applies 1 + 4 gradients per step (its own "
                             "and one per neighbour) at its slow pace")  # fmt: skip


def test_staleness_verdict_flips_with_the_accuracy_gap():
    c = _claim(_table(), "staleness")
    assert c.verdict == "supported"
    assert c.figures == {"ps_async_acc": 0.5, "allreduce_acc": 0.8,
                         "gap_points": pytest.approx(30.0), "staleness": 13.6}  # fmt: skip
    c = _claim(_table(**{"ps-async.test_acc_best_worker": 0.81}), "staleness")
    assert c.verdict == "not supported" and c.figures["gap_points"] == pytest.approx(-1.0)


def test_torus_vs_ring_verdict_flips_with_the_spread_and_computes_the_diameters():
    hops = ("torus_diameter", "ring_diameter", "workers")
    c = _claim(_table(), "topology")
    assert c.verdict == "supported"
    assert [c.figures[k] for k in hops] == [4, 8, 16]
    assert (c.figures["torus_spread_points"], c.figures["ring_spread_points"]) == (10.0, 20.0)
    table = _table(workers=9, torus="torus:3x3", **{"nnt-torus.test_acc_spread": 0.3})
    c = _claim(table, "topology")
    assert c.verdict == "not supported" and [c.figures[k] for k in hops] == [2, 4, 9]


def _traffic(nnt_growth=1.0, server_growth=None, allreduce=False):
    """NNT sends degree × 1 MiB per step (× nnt_growth per 4× workers); the server moves
    4 MiB per round at N = 4, growing ∝ N (or by ``server_growth`` per 4× workers); with
    ``allreduce``, a ring allreduce's 2(N − 1)/N MiB per worker too."""
    rows = []
    for n in (4, 16, 64):
        k = math.log(n / 4, 4)  # 0, 1, 2
        if allreduce:
            rows.append(dict(method="allreduce", strategy="allreduce", topology=None, workers=n,
                             servers=0, model_bytes=MIB, bytes_per_worker_step=2 * (n - 1) / n
                             * MIB, server_bytes_per_round=math.nan))  # fmt: skip
        for method, degree in (("nnt ring", 2), ("nnt torus", 4)):
            if method == "nnt torus" and n == 4:
                continue
            side = math.isqrt(n)
            spec = "ring" if method == "nnt ring" else f"torus:{side}x{side}"
            rows.append(dict(method=method, strategy="nnt", topology=spec,
                             workers=n, servers=0, model_bytes=MIB,
                             bytes_per_worker_step=degree * MIB * nnt_growth**k,
                             server_bytes_per_round=math.nan))  # fmt: skip
        growth = (n / 4) if server_growth is None else server_growth**k
        rows.append(dict(method="ps-sync", strategy="ps-sync", topology=None, workers=n,
                         servers=1, model_bytes=MIB, bytes_per_worker_step=MIB,
                         server_bytes_per_round=4 * MIB * growth))  # fmt: skip
    return pd.DataFrame(rows)


def test_traffic_verdict_is_decided_by_the_sweep():
    c = _claim(_table(), "traffic", _traffic())
    assert c.verdict == "supported"
    sent = {k: v / MIB for k, v in c.figures.items() if "bytes" in k}
    assert sent == {
        "nnt ring bytes_per_worker_step @4w": 2.0,
        "nnt ring bytes_per_worker_step @16w": 2.0,
        "nnt ring bytes_per_worker_step @64w": 2.0,
        "nnt torus bytes_per_worker_step @16w": 4.0,
        "nnt torus bytes_per_worker_step @64w": 4.0,
        "server_bytes_per_round @4w": 4.0,
        "server_bytes_per_round @16w": 16.0,
        "server_bytes_per_round @64w": 64.0,
    }
    assert (c.figures["server_growth"], c.figures["workers_growth"]) == (16.0, 16.0)
    assert _claim(_table(), "traffic", _traffic(nnt_growth=1.5)).verdict == "not supported"
    # A worker that sent two gradients per neighbour would send more than NNT's messages.
    doubled = _traffic().assign(model_bytes=MIB / 2)
    assert _claim(_table(), "traffic", doubled).verdict == "not supported"
    assert _claim(_table(), "traffic", _traffic(server_growth=1.0)).verdict == "not supported"
    assert "traffic" not in _claims(_table())  # no sweep, no verdict


def test_the_traffic_verdict_sets_nnt_beside_allreduce_where_the_sweep_has_it():
    c = _claim(_table(), "traffic", _traffic(allreduce=True))
    assert c.verdict == "supported"
    ring = [c.figures[f"allreduce bytes_per_worker_step @{n}w"] / MIB for n in (4, 16, 64)]
    assert ring == pytest.approx([1.5, 1.875, 126 / 64])  # bounded by 2 gradients, not constant
    assert c.figures["nnt torus over allreduce @64w"] == pytest.approx(4 / (126 / 64))
    assert "allreduce 1.50, 1.88, 1.97 MiB at N = 4, 16, 64: bounded per worker too" in c.reason
    assert "every step a global collective" in c.reason
    assert "allreduce" not in _claim(_table(), "traffic", _traffic()).reason


def test_claims_without_their_runs_are_left_out():
    table = _table()
    assert list(_claims(table)) == ["accuracy", "time", "straggler run", "staleness", "topology"]
    no_torus = table[table["topology"].fillna("") != "torus:4x4"]
    assert list(_claims(no_torus)) == ["staleness"]


def _seeded(accs: dict[str, list[float]], **changes):
    """``_table`` with each method of ``accs`` run once per listed accuracy (one seed each)."""
    table = _table(**changes)
    rows = []
    for r in table.to_dict("records"):
        for seed, acc in enumerate(accs.get(r["run"], [r["test_acc_best_worker"]])):
            rows.append({**r, "run": f"{r['run']} · seed {seed}", "test_acc_best_worker": acc})
    return pd.DataFrame(rows)


def test_decide_says_inconclusive_inside_the_seed_spread():
    assert claims.decide(True, distance=-3.0, spread=1.0) == "supported"
    assert claims.decide(False, distance=3.0, spread=1.0) == "not supported"
    assert claims.decide(True, distance=-0.5, spread=1.0) == "inconclusive"
    assert claims.decide(False, distance=0.5, spread=0.0) == "not supported"  # one seed
    assert claims.decide(True, distance=0.0, spread=math.nan) == "supported"


def test_seeds_are_averaged_and_a_gap_inside_their_spread_is_inconclusive():
    # allreduce 80 ± 1, torus 77 ± 1 (3 seeds): a 3-point gap, 1 point beyond the 2-point
    # threshold, inside the 2-point spread (the two sds added): inconclusive.
    accs = {"allreduce": [0.79, 0.80, 0.81], "nnt-torus": [0.76, 0.77, 0.78]}
    c = _claim(_seeded(accs), "accuracy")
    assert c.verdict == "inconclusive"
    assert c.figures == pytest.approx({"nnt_torus_acc": 0.77, "nnt_torus_acc_sd": 0.01,
                                       "allreduce_acc": 0.80, "allreduce_acc_sd": 0.01,
                                       "gap_points": 3.0})  # fmt: skip
    tight = {"allreduce": [0.80, 0.80, 0.80], "nnt-torus": [0.77, 0.77, 0.77]}
    c = _claim(_seeded(tight), "accuracy")
    assert c.verdict == "not supported" and c.figures["nnt_torus_acc_sd"] == pytest.approx(0.0)
    wide_async = {"allreduce": [0.78, 0.80, 0.82], "ps-async": [0.77, 0.79, 0.81]}
    c = _claim(_seeded(wide_async), "staleness")
    assert c.verdict == "inconclusive"
    assert (c.figures["ps_async_acc"], c.figures["ps_async_acc_sd"]) == pytest.approx((0.79, 0.02))
    assert c.figures["gap_points"] == pytest.approx(1.0)


def test_the_learning_rate_is_chosen_on_validation_per_method():
    table = _table()
    rows = []
    for r in table.to_dict("records"):
        for factor, val, test in (("1/3", 0.70, 0.71), ("1", 0.80, 0.79), ("3", 0.75, 0.90)):
            name = f"{r['run']} · lr×{factor}"
            rows.append(
                {**r, "run": name, "val_acc_best_worker": val, "test_acc_best_worker": test}
            )
    chosen = claims.by_method(pd.DataFrame(rows))
    assert len(chosen) == len(table)
    assert chosen["run"].str.endswith(" · lr×1").all()  # best on val, not on test
    assert (chosen["test_acc_best_worker"] == 0.79).all()


def test_straggler_verdict_reads_the_other_workers_step_rates_where_measured():
    table = _table(**{"nnt-torus-straggler.others_rate_kept": 0.98,
                      "allreduce-straggler.others_rate_kept": 0.397})  # fmt: skip
    lead = table[table["run"] == "nnt-torus-straggler"].assign(
        run="nnt-torus-straggler · lead 4", others_rate_kept=0.57
    )
    both = pd.concat([table, lead], ignore_index=True)
    c = _claim(both, "straggler")
    assert c.verdict == "supported"
    assert c.figures["nnt_torus_rate_kept"] == 0.98
    assert c.figures["nnt-torus-straggler · lead 4 rate_kept"] == 0.57
    assert c.figures["allreduce_rate_kept"] == 0.397
    assert c.test.endswith("keep at least 90% of their step rate on average, where synchronous "
                           "SGD's do not")  # fmt: skip
    assert _claim(both, "straggler run").verdict == "supported"  # ×1.5 against ×3.0
    table = _table(**{"nnt-torus-straggler.others_rate_kept": 0.6,
                      "allreduce-straggler.others_rate_kept": 0.4})  # fmt: skip
    assert _claim(table, "straggler").verdict == "not supported"


def test_workers_that_never_wait_do_not_make_a_run_that_a_straggler_spares():
    # The committed case: the others keep their pace, the whole run is slowed more.
    table = _table(**{"nnt-torus-straggler.others_rate_kept": 0.909,
                      "allreduce-straggler.others_rate_kept": 0.397,
                      "nnt-torus-straggler.straggler_slowdown": 4.5,
                      "allreduce-straggler.straggler_slowdown": 2.52})  # fmt: skip
    decided = _claims(table)
    assert decided["straggler"].verdict == "supported"
    assert decided["straggler run"].verdict == "not supported"
    assert "×4.50 as long for NNT torus, ×2.52 for allreduce" in decided["straggler run"].reason


# -- the paper's words beside each verdict -----------------------------------------------------

# The project's account of the paper, kept in the repository (docs/PAPER.md); the original sits
# beside the repository (../shared/PAPER.md) where the project is developed.
PAPER_MD = Path(__file__).resolve().parents[1] / "docs" / "PAPER.md"
SHARED_PAPER_MD = Path(__file__).resolve().parents[1].parent / "shared" / "PAPER.md"


def test_every_claim_says_whose_words_and_quotes_only_its_own_sentence_of_paper_md():
    decided = claims.verdicts(
        _table(**{"nnt-torus-straggler.others_rate_kept": 0.98,
                  "allreduce-straggler.others_rate_kept": 0.4}), _traffic()
    )  # fmt: skip
    assert [c.key for c in decided] == list(claims.CLAIMS)
    for c in decided:
        assert (c.claim, c.quote) == claims.CLAIMS[c.key]
        assert c.source == "docs/PAPER.md" and c.in_our_words  # our summary, our words
        line = claims.markdown_line(c)
        assert line.startswith(
            f"- {c.claim} (our reading of the paper; docs/PAPER.md, our summary in our words: "
            f"*“{c.quote}”*). Tested: {c.test}: **{c.verdict}** — "
        )
        assert c.claim != c.quote  # the claim tested, not a sentence that describes a setup


def test_each_quote_occurs_verbatim_in_paper_md_and_none_only_describes_the_experiments():
    # Verbatim, except that a quote reads the file's line breaks (and their indent) as spaces.
    paper = " ".join(PAPER_MD.read_text().split())
    for key, quote in claims.QUOTES.items():
        assert quote in paper, key
        assert "results against" not in quote, key  # the setup of the experiments is no claim
    if SHARED_PAPER_MD.is_file():  # where the original is at hand, the copy must be the same
        assert PAPER_MD.read_text() == SHARED_PAPER_MD.read_text()


def test_no_two_claims_read_the_same_sentence():
    quotes = list(claims.QUOTES.values())
    for key, quote in claims.QUOTES.items():
        others = [q for q in quotes if q != quote]
        assert quotes.count(quote) == 1, f"{key}: {quote!r} is quoted by another claim too"
        assert not any(quote in q or q in quote for q in others), key


def _drift(**values) -> pd.DataFrame:
    row = {"case": "c", "run": "r", "metric": "test_acc", "mean": 0.72, "sd": 0.01,
           "min": 0.70, "max": 0.74}  # fmt: skip
    return pd.DataFrame([{**row, **values}])


def test_drift_band_is_the_mean_of_the_draws_plus_or_minus_four_standard_deviations():
    assert analysis.drift_band(_drift(), "c", "r") == pytest.approx((0.68, 0.76))
    wide = analysis.drift_band(_drift(sd=0.05), "c", "r")  # a chaotic run: as wide as its cloud
    assert wide == pytest.approx((0.52, 0.92))


def test_drift_band_of_a_run_the_study_did_not_measure_is_a_clear_error():
    with pytest.raises(KeyError, match="no 'test_acc' for run 'other' of case 'c'"):
        analysis.drift_band(_drift(), "c", "other")


def test_the_committed_drift_study_covers_every_run_the_notebooks_check():
    """Notebooks 03 and 04 assert their accuracies inside these bands (``drift_band``)."""
    root = Path(__file__).resolve().parents[1] / "results" / "kernel-drift"
    drift = pd.read_csv(root / "drift.csv")
    runs = pd.read_csv(root / "runs.csv")
    assert runs["kernel"].nunique() >= 2 and runs["seed"].nunique() >= 3
    # every kernel set really ran other kernels (the variable took effect)
    assert runs.groupby("kernel")["capability"].nunique().eq(1).all()
    assert runs["capability"].nunique() == runs["kernel"].nunique()
    wanted = {"03 §3": {"ps-sync", "ps-async", "staleness-aware", "dc-asgd-a", "hogwild"},
              "03 downpour": {"ps-async", "downpour"},
              "04 §5": {"allreduce", "nnt ring", "nnt torus 4x4", "nnt-staged torus 4x4",
                        "dpsgd torus 4x4"},
              "04 §7": {"allreduce", "local-sgd", "easgd", "adpsgd ring"}}  # fmt: skip
    for case, names in wanted.items():
        assert set(drift[drift["case"] == case]["run"]) == names, case
        for name in names:
            lo, hi = analysis.drift_band(drift, case, name)
            row = drift[(drift.case == case) & (drift.run == name) & (drift.metric == "test_acc")]
            assert lo <= row["min"].item() <= row["max"].item() <= hi, (case, name)
