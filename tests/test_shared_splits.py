"""A large split is one file every process maps: the same numbers, one copy in memory."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from scaledl_lab.data import load_dataset
from scaledl_lab.data import shared as shared_module
from scaledl_lab.data.base import Dataset
from scaledl_lab.data.shared import ENV_SPLITS_DIR, shared_split, split_key


def _convert(x: np.ndarray, y: np.ndarray) -> Dataset:
    xt = torch.from_numpy(x.astype(np.float32)).unsqueeze(1).mul_(1 / 255)
    return Dataset("toy", xt, torch.from_numpy(y.astype(np.int64)), 10)


def _toy(n: int = 4096, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n)


@pytest.fixture
def splits(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_SPLITS_DIR, str(tmp_path / "splits"))
    monkeypatch.setattr(shared_module, "SHARE_FROM_BYTES", 1 << 20)
    return tmp_path / "splits"


def test_a_split_is_written_once_then_mapped_with_the_same_numbers(splits):
    x, y = _toy()
    first = shared_split("toy", x, y, _convert)
    files = sorted(p.name for p in splits.iterdir())
    assert len(files) == 3 and all(f.startswith(split_key("toy", x, y)) for f in files)
    again = shared_split("toy", x, y, lambda *_: pytest.fail("converted a split already cut"))
    expected = _convert(x, y)
    for data in (first, again):
        assert torch.equal(data.x, expected.x) and torch.equal(data.y, expected.y)
        assert (data.name, data.num_classes, data.x.dtype) == ("toy", 10, torch.float32)
    assert _mapped_file(again.x.data_ptr()).endswith(".x.npy")  # the file's pages, not a copy


def _mapped_file(address: int) -> str:
    """The file mapped at ``address`` in this process ('' for anonymous memory)."""
    with open("/proc/self/maps") as fh:
        for line in fh:
            parts = line.split()
            low, high = (int(a, 16) for a in parts[0].split("-"))
            if low <= address < high:
                return parts[5] if len(parts) > 5 else ""
    return ""


def test_writing_to_a_mapped_split_changes_neither_the_file_nor_the_next_load(splits):
    x, y = _toy()
    shared_split("toy", x, y, _convert)
    mine = shared_split("toy", x, y, _convert)
    mine.x.zero_()  # copy-on-write: this process's pages only
    assert torch.equal(shared_split("toy", x, y, _convert).x, _convert(x, y).x)


def test_other_samples_other_file_and_small_splits_stay_in_memory(splits):
    x, y = _toy()
    shared_split("toy", x, y, _convert)
    shared_split("toy", x[1:], y[1:], _convert)  # one sample fewer: another split
    assert len(list(splits.glob("*.json"))) == 2
    small = shared_split("toy", x[:10], y[:10], _convert)
    assert len(list(splits.glob("*.json"))) == 2 and torch.equal(
        small.x, _convert(x[:10], y[:10]).x
    )


def test_sharing_off_or_a_folder_that_cannot_be_written_keeps_the_split_in_memory(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(shared_module, "SHARE_FROM_BYTES", 1 << 20)
    x, y = _toy()
    monkeypatch.setenv(ENV_SPLITS_DIR, "off")
    assert torch.equal(shared_split("toy", x, y, _convert).x, _convert(x, y).x)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(ENV_SPLITS_DIR, str(blocker / "splits"))
    assert torch.equal(shared_split("toy", x, y, _convert).x, _convert(x, y).x)


def test_the_least_recently_used_splits_go_beyond_the_folder_budget(splits, monkeypatch):
    monkeypatch.setattr(shared_module, "KEEP_BYTES", 3 * 4096 * 784 * 4)  # room for ~3
    keys = []
    for seed in range(5):
        x, y = _toy(seed=seed)
        shared_split("toy", x, y, _convert)
        keys.append(split_key("toy", x, y))
    kept = {p.stem for p in splits.glob("*.json")}
    assert kept == set(keys[-2:]) or kept == set(keys[-3:])
    assert not any(p.name.endswith(".tmp") for p in splits.iterdir())


def test_processes_that_load_the_same_split_share_its_pages(tmp_path, monkeypatch):
    """Two processes with Fashion-MNIST's quick split loaded: their inputs are one copy, so the
    pages each holds count half in its proportional set size."""
    code = (
        "import sys, time\n"
        "from scaledl_lab.data import load_dataset\n"
        "d = load_dataset('fashion-mnist')\n"
        "float(d.train.x.sum())\n"  # every page read
        "print('ready', flush=True); sys.stdin.readline()\n"
    )
    monkeypatch.setenv(ENV_SPLITS_DIR, str(tmp_path / "splits"))
    load_dataset("fashion-mnist")  # the files are made before the processes start
    env = dict(os.environ)
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]  # fmt: skip
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        rollups = [_rollup(p.pid) for p in procs]
    finally:
        for p in procs:
            p.communicate("\n", timeout=60)
    train = 55000 * 784 * 4
    for rss, pss, private in rollups:
        assert private < rss - 0.9 * train  # the split is not among its private pages
        assert pss < rss - 0.4 * train  # and counts about half in each


def _rollup(pid: int) -> tuple[int, int, int]:
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                fields[parts[0].rstrip(":")] = int(parts[1]) * 1024
    private = fields["Private_Clean"] + fields["Private_Dirty"]
    return fields["Rss"], fields["Pss"], private
