"""`reproduce` in full mode, end to end, on a tiny CIFAR-10 in the real on-disk format.

Full mode is the paper's setting (CIFAR-10, ResNet-18, batch 128 per worker, NNT with AdaGrad),
too big to run in a test. This test goes through the path `scaledl-lab reproduce` (no
``--quick``) takes — ``reproduce(is_quick=False)`` asks :func:`paper_configs` for the full
comparison with its seeds and learning-rate grid — checks those configs are the paper's, then
runs two of its simulated methods shrunk to seconds: NNT on a ring and allreduce, ResNet-18
with AdaGrad, 2 simulated workers, one epoch of 64 fixture images in batches of 16 per worker
(overriding FULL's 128 and 100 epochs), and checks the report written from them.
"""

from __future__ import annotations

import pandas as pd
import pytest

from scaledl_lab.data import write_cifar10_fixture
from scaledl_lab.studies import reproduce as rp

TINY = dict(workers=2, epochs=1, batch_size=16, train_subset=64, val_size=20, test_subset=20)
CHOSEN = ("nnt-ring · sim · 16w · lr×1", "allreduce · sim · 16w · same optimiser")


def test_full_mode_runs_the_papers_settings_end_to_end(tmp_path, monkeypatch):
    monkeypatch.delenv("SCALEDL_QUICK", raising=False)
    data_dir = tmp_path / "cifar10"
    write_cifar10_fixture(data_dir, n_per_batch=40)  # 200 training and 40 test images
    asked: list[tuple[bool, dict]] = []
    full_configs = rp.paper_configs

    def shrunk(is_quick, setting=None, **grid):
        asked.append((is_quick, grid))
        configs = full_configs(is_quick, setting, **grid)
        chosen = [c for c in configs if c.label in CHOSEN]
        assert len(chosen) == len(CHOSEN), [c.label for c in configs]
        return [
            c.replace(name=c.label.replace("16w", "2w"), data_dir=str(data_dir), **TINY)
            for c in chosen
        ]

    monkeypatch.setattr(rp, "paper_configs", shrunk)
    out = tmp_path / "out"
    results = rp.reproduce(is_quick=False, out=out, traffic=[], progress=False)

    # The path asked for the full comparison, with its seeds and learning-rate grid ...
    assert asked == [(False, dict(seeds=rp.QUICK_SEEDS, lr_factors=rp.LR_GRID))]
    configs = full_configs(False, seeds=rp.QUICK_SEEDS, lr_factors=rp.LR_GRID)
    # ... which is the paper's setting: CIFAR-10, ResNet-18, batch 128 per worker, 100 epochs,
    # 16 real workers (one per device) and 16 simulated ones on the 4×4 torus.
    assert {(c.dataset, c.model, c.batch_size, c.epochs) for c in configs} == {
        ("cifar10", "resnet18", 128, 100)
    }
    assert {c.workers for c in configs if c.runtime == "dask" and "1w" not in c.label} == {16}
    assert {c.workers for c in configs if c.runtime == "sim"} == {rp.SIM_WORKERS}
    assert {c.topology for c in configs if c.strategy == "nnt"} == {"ring", rp.TORUS}
    assert not any(c.train_subset or c.test_subset for c in configs)  # the whole data set
    assert {c.lr for c in configs if c.label.startswith("nnt-torus · sim · 16w · lr")} == {
        0.01 * f for f in rp.LR_GRID
    }
    nnt = next(c for c in configs if c.label == CHOSEN[0])
    assert (nnt.optimizer, nnt.lr, nnt.weight_decay) == ("adagrad", 0.01, 1e-4)
    same = next(c for c in configs if c.label == CHOSEN[1])
    assert (same.strategy, same.optimizer, same.lr) == ("allreduce", "adagrad", 0.01)

    # The two runs, tiny, and the report written from them.
    frame = results.frame
    labels = [label.replace("16w", "2w") for label in CHOSEN]
    assert set(frame["run"]) == set(labels)
    assert set(frame["world_size"]) == {2}
    assert (frame.query("kind == 'test'")["samples"] == 20).all()
    table = pd.read_csv(out / "comparison.csv")
    assert table["run"].tolist() == labels
    assert set(table["optimizer"]) == {"adagrad"}
    assert table["test_acc_best_worker"].between(0, 1).all()
    assert (table["time_per_epoch_s"] > 0).all()
    summary = (out / "summary.md").read_text()
    assert "## The paper comparison" in summary
    for label in labels:
        assert f"| {label} | adagrad | 0.01 |" in summary
    # No 16-worker torus, no straggler, no sweep here: no claim can be decided, and it says so.
    assert "None decided" in summary
    config = (out / "config.json").read_text()
    assert '"model": "resnet18"' in config and '"dataset": "cifar10"' in config
    assert not (out / "traffic").exists()


@pytest.mark.parametrize("is_quick", [True, False])
def test_each_mode_runs_its_own_setting(is_quick):
    setting = rp.QUICK if is_quick else rp.FULL
    configs = rp.paper_configs(is_quick)
    assert {(c.dataset, c.model) for c in configs} == {(setting.dataset, setting.model)}
    assert {c.batch_size for c in configs} == {setting.batch_size}
