"""`reproduce --long`: its two phases, rates chosen on validation, time to a target accuracy,
seed bands, runs shared out between processes (on a tiny config)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scaledl_lab import ExperimentConfig
from scaledl_lab.experiment import compare
from scaledl_lab.studies import claims, long_run, reproduce, side_by_side
from scaledl_lab.studies.reproduce import LR_GRID, Setting


def test_the_long_comparison_is_simulated_full_data_twenty_epochs_and_seeds():
    configs = long_run.long_configs()
    assert {c.runtime for c in configs} == {"sim"} and {c.workers for c in configs} == {16}
    assert {c.epochs for c in configs} == {20} and {c.train_subset for c in configs} == {None}
    assert {c.seed for c in configs} == {0, 1, 2}
    assert len(configs) == len(long_run.LONG_METHODS) * 3  # methods × seeds
    torus = [c for c in configs if c.strategy == "nnt" and c.topology == "torus:4x4"]
    assert {(c.optimizer, c.lr, c.weight_decay) for c in torus} == {("adagrad", 0.01, 1e-4)}
    baseline = [c for c in configs if c.strategy in ("allreduce", "ps-async")]
    assert {(c.optimizer, c.clip_gradient) for c in baseline} == {("adam", 10.0)}


def test_the_tuning_phase_tries_every_rate_of_the_grid_once():
    configs = long_run.tune_configs()
    assert len(configs) == len(long_run.LONG_METHODS) * len(LR_GRID)
    assert {c.epochs for c in configs} == {long_run.TUNE_EPOCHS} and {c.seed for c in configs} == {
        0
    }
    torus = sorted(c.lr for c in configs if c.strategy == "nnt" and c.topology == "torus:4x4")
    assert torus == pytest.approx([0.01 / 3, 0.01, 0.03])


def test_rates_are_chosen_on_validation_and_used_by_every_seed():
    tuning = pd.DataFrame(
        dict(
            run=["a · lr×1/3", "a · lr×1", "a · lr×3", "b · lr×1/3", "b · lr×1", "b · lr×3"],
            lr=[1.0, 3.0, 9.0, 0.1, 0.3, 0.9],
            # test accuracy would pick other rates: the choice must ignore it
            val_acc_best_worker=[0.5, 0.7, 0.6, 0.9, 0.2, 0.1],
            test_acc_best_worker=[0.9, 0.1, 0.1, 0.1, 0.9, 0.9],
            test_acc_spread=[0.0] * 6,
        )
    )
    assert long_run.choose_rates(tuning) == {"a": 3.0, "b": 0.1}
    rates = {"nnt-torus · sim · 16w": 0.0033}
    configs = long_run.long_configs(rates=rates)
    assert {c.lr for c in configs if c.strategy == "nnt" and c.topology == "torus:4x4"} == {0.0033}
    assert {c.lr for c in configs if c.strategy == "allreduce"} == {1e-3}  # not tuned: base rate


def test_time_to_target_is_the_first_evaluation_that_reaches_it():
    frame = pd.DataFrame(
        [
            dict(run="a", kind="test", rank=r, epoch=e, time=t + r, accuracy=acc)
            for e, t, accs in ((1, 1.0, (0.5, 0.7)), (2, 2.0, (0.8, 0.9)), (3, 3.0, (0.9, 0.9)))
            for r, acc in enumerate(accs)
        ]
    )
    assert long_run.time_to_target(frame, "a", 0.6) == 2.0  # mean 0.6 at epoch 1, rank 1's time
    assert long_run.time_to_target(frame, "a", 0.85) == 3.0
    assert math.isnan(long_run.time_to_target(frame, "a", 0.95))


def test_the_costliest_runs_start_first(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(side_by_side, "ProcessPoolExecutor", _InOrder)
    monkeypatch.setattr(side_by_side, "_run_one", lambda cfg, out: started.append(cfg))
    configs = long_run.long_configs()
    with pytest.raises(FileNotFoundError):  # nothing ran, so there is nothing to read back
        side_by_side._simulated(configs, 2, tmp_path)
    assert sorted(c.name for c in started) == sorted(c.name for c in configs)
    costs = [side_by_side._cost(c) for c in started]
    assert costs == sorted(costs, reverse=True)
    assert costs[0] > costs[-1]  # NNT before allreduce


class _InOrder:
    """A pool that runs each task at once, in the order it is given."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def submit(self, fn, *args):
        from concurrent.futures import Future

        future = Future()
        future.set_result(fn(*args))
        return future


TINY = Setting("fashion-mnist", "mlp", 2, 32, "adam", 1e-3, 0.0, 1600, 0)


def _tiny(configs):
    return [
        c.replace(test_subset=200, val_size=200, workers=9, topology=c.topology and "torus:3x3")
        for c in configs
        if c.strategy == "allreduce" or c.topology == "torus:4x4"
    ]


@pytest.mark.slow  # the long study twice, at one and two jobs: ~30 s
def test_two_processes_give_the_numbers_of_one(tmp_path):
    configs = _tiny(long_run.long_configs(TINY, seeds=(0,)))
    # A real run among them runs first and alone; its rows keep their place in the table.
    real = configs[0].replace(runtime="dask", workers=2, topology=None, name="real", max_steps=3)
    configs = [configs[0], real, *configs[1:]]
    one = compare(configs, out=tmp_path / "one", progress=False, log=None).frame
    two = side_by_side.compare_side_by_side(configs, out=tmp_path / "two", jobs=2).frame
    assert list(dict.fromkeys(two["run"])) == [c.label for c in configs]
    simulated = one["runtime"] == "sim"
    pd.testing.assert_frame_equal(
        one[simulated].reset_index(drop=True),
        two[two["runtime"] == "sim"].reset_index(drop=True),
        check_dtype=False,
    )
    assert (two["run"] == "real").sum() == (one["run"] == "real").sum()
    assert (tmp_path / "two" / "metrics.csv").is_file() and not (
        tmp_path / "two" / "parts"
    ).exists()


@pytest.fixture(scope="module")
def tiny_long_run(tmp_path_factory):
    """One tiny long comparison (allreduce and the torus, two seeds, two rates), shared by the
    tests that read its folder: the report's and the rewritten report's."""
    out = tmp_path_factory.mktemp("long") / "runs"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(long_run, "_sim_methods", _tiny_methods)
        long_run.reproduce_long(
            out=out, setting=TINY, seeds=(0, 1), lr_factors=(1.0, 3.0), tune_epochs=1,
            jobs=1, progress=False,
        )  # fmt: skip
    return out


def test_a_tiny_long_run_writes_its_table_bands_and_verdicts(tiny_long_run):
    tmp_path = tiny_long_run
    tuning = pd.read_csv(tmp_path / "tuning.csv")
    assert len(tuning) == 2 * 2  # two methods × two rates
    table = pd.read_csv(tmp_path / "comparison.csv")
    assert "time_to_target_s" in table and len(table) == 2 * 2  # two methods × two seeds
    assert (tmp_path / "seed_bands_vs_epoch.png").is_file()
    assert (tmp_path / "seed_bands_vs_time.png").is_file()
    curves = pd.read_csv(tmp_path / "curves.csv")
    assert set(curves["kind"]) == {"val", "test"} and set(curves["run"]) == set(table["run"])
    summary = (tmp_path / "summary.md").read_text()
    assert "## The long comparison (simulated, seeds and learning-rate grid)" in summary
    assert "Learning rates, chosen on validation after 1 epochs (seed 0)" in summary
    decided = claims.verdicts(table)
    assert [c.key for c in decided] == ["accuracy"]  # allreduce and the torus only
    assert claims.markdown_line(decided[0]) in summary.splitlines()


_real_methods = long_run._sim_methods


def _tiny_methods(setting):
    return [
        (
            label,
            cfg.replace(
                test_subset=200, val_size=200, workers=9, topology=cfg.topology and "torus:3x3"
            ),
        )  # fmt: skip
        for label, cfg in _real_methods(setting)
        if label in ("allreduce", "nnt-torus")
    ]


def test_a_report_is_rewritten_from_a_finished_run_without_repeating_it(
    tiny_long_run, tmp_path, monkeypatch
):
    runs = tiny_long_run
    before = pd.read_csv(runs / "comparison.csv")
    summary = (runs / "summary.md").read_text()
    monkeypatch.setattr(long_run, "compare_side_by_side", None)  # nothing may run again
    long_run.rewrite_report(runs, tmp_path / "again", tune_epochs=1)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "again" / "comparison.csv"), before)
    again = (tmp_path / "again" / "summary.md").read_text()
    assert again == summary
    assert (tmp_path / "again" / "tuning.csv").is_file()


def test_replicas_in_memory_at_once_are_bounded():
    """A 64-worker run never starts beside a 16-worker one, nor beside another 64; any run may
    run alone; among those that fit, the costliest waiting one starts."""
    sixteen = ExperimentConfig(runtime="sim", workers=16)
    configs = [sixteen.replace(workers=n) for n in (64, 64, 16, 4)]
    assert side_by_side.REPLICAS_AT_ONCE < 64 + 16
    assert side_by_side._next([0, 1, 2, 3], [], configs) == 0  # alone: the first waiting
    assert side_by_side._next([1, 2, 3], [configs[0]], configs) == 3  # only the 4 fits
    assert side_by_side._next([0, 1, 3], [configs[2]], configs) == 3
    assert side_by_side._next([0, 1], [configs[2]], configs) is None  # wait for the 16 to end
    assert side_by_side._next([2, 3], [configs[2]], configs) == 2  # two 16s side by side


def test_a_run_costs_its_worker_steps():
    """The traffic sweep's two-step runs are cheap, though they have 64 workers: they come last."""
    runs = reproduce.paper_configs(True) + reproduce.traffic_configs(True)
    runs = [c for c in runs if c.runtime == "sim"]
    order = sorted(runs, key=lambda c: -side_by_side._cost(c))
    first_traffic = next(i for i, c in enumerate(order) if c.name.startswith("traffic"))
    assert all(c.name.startswith("traffic") for c in order[first_traffic:])
    assert order[0].stragglers  # an NNT run with a straggler leads
