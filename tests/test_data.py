"""Tests for scaledl_lab.data: loaders on real files or real-format fixtures, and sharding."""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from scaledl_lab.data import (
    DATASETS,
    ChecksumError,
    Dataset,
    DatasetNotFoundError,
    dataset_info,
    epoch_batches,
    fetch,
    load_dataset,
    locate,
    search_dirs,
    sha256_file,
    shard_indices,
    steps_per_epoch,
    verify_sha256,
    write_cifar10_fixture,
)
from scaledl_lab.data import cifar10 as cifar_mod
from scaledl_lab.data import fashion_mnist as fm
from scaledl_lab.data import mnist1d as m1d
from scaledl_lab.data.base import download

HAVE_FMNIST = not fm.missing_files(fm.SYSTEM_DIR)
needs_fmnist = pytest.mark.skipif(
    not HAVE_FMNIST, reason="needs the Debian package dataset-fashion-mnist"
)


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Search only the data_dir argument: no env dir, repo data/, ./data, cache or /usr/share."""
    monkeypatch.delenv("SCALEDL_DATA_DIR", raising=False)
    monkeypatch.setenv("SCALEDL_DATA_NO_DEFAULTS", "1")


def _idx_gz(path: Path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(d.to_bytes(4, "big") for d in arr.shape)
    path.write_bytes(gzip.compress(header + arr.astype(np.uint8).tobytes()))


def _fake_fashion(root: Path, n_train: int = 60, n_test: int = 20) -> Path:
    rng = np.random.default_rng(0)
    for images, labels, n in [
        (fm.TRAIN_IMAGES, fm.TRAIN_LABELS, n_train),
        (fm.TEST_IMAGES, fm.TEST_LABELS, n_test),
    ]:
        _idx_gz(root / images, rng.integers(0, 256, (n, 28, 28)))
        _idx_gz(root / labels, rng.integers(0, 10, n))
    return root


def _fingerprints(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    # A random projection of each sample plus its label: equal multisets of fingerprints
    # mean equal multisets of samples (up to float collisions, negligible here).
    proj = torch.randn(
        x[0].numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float64
    )
    return (x.reshape(len(x), -1).double() @ proj + 1000.0 * y.double()).sort().values


# --- Fashion-MNIST -----------------------------------------------------------------------


@needs_fmnist
def test_fashion_mnist_from_debian_dir() -> None:
    s = load_dataset("fashion-mnist", data_dir=fm.SYSTEM_DIR)
    assert (len(s.train), len(s.val), len(s.test)) == (55000, 5000, 10000)
    assert s.input_shape == (1, 28, 28) and s.num_classes == 10
    assert s.train.x.dtype == torch.float32 and s.train.y.dtype == torch.int64
    assert abs(s.train.x.mean().item()) < 0.01 and abs(s.train.x.std().item() - 1) < 0.01
    assert set(s.test.y.tolist()) == set(range(10))
    # val is held out from the training files: train + val is exactly the 60k training set.
    full_train, full_test = fm.load_fashion_mnist(fm.SYSTEM_DIR)
    both = Dataset("fm", torch.cat([s.train.x, s.val.x]), torch.cat([s.train.y, s.val.y]), 10)
    assert torch.equal(_fingerprints(both.x, both.y), _fingerprints(full_train.x, full_train.y))
    assert torch.equal(s.test.x, full_test.x)


@needs_fmnist
def test_fashion_mnist_subsets_are_seeded_and_nested() -> None:
    a = load_dataset("fashion-mnist", train_subset=1000, test_subset=300, val_size=500)
    b = load_dataset("fashion-mnist", train_subset=400, test_subset=300, val_size=500)
    c = load_dataset("fashion-mnist", train_subset=400, val_size=500, seed=1)
    assert (len(a.train), len(a.val), len(a.test)) == (1000, 500, 300)
    assert torch.equal(a.val.x, b.val.x) and torch.equal(a.test.y, b.test.y)
    fp_a = set(_fingerprints(a.train.x, a.train.y).tolist())
    assert set(_fingerprints(b.train.x, b.train.y).tolist()) <= fp_a
    assert not torch.equal(b.train.x, c.train.x)
    assert fp_a.isdisjoint(_fingerprints(a.val.x, a.val.y).tolist())


def test_fake_fashion_dir_loads_unverified_and_fails_verification(tmp_path: Path) -> None:
    _fake_fashion(tmp_path)
    s = load_dataset("fashion-mnist", data_dir=tmp_path, val_size=10, verify=False)
    assert (len(s.train), len(s.val), len(s.test)) == (50, 10, 20)
    assert s.train.x.shape == (50, 1, 28, 28)
    with pytest.raises(ChecksumError, match=r"train-images-idx3-ubyte\.gz.*expected sha256"):
        load_dataset("fashion-mnist", data_dir=tmp_path, val_size=10)


@needs_fmnist
def test_corrupted_copy_raises_checksum_error(tmp_path: Path) -> None:
    for f in fm.FILES:
        shutil.copy(fm.SYSTEM_DIR / f, tmp_path / f)
    labels = tmp_path / fm.TRAIN_LABELS
    data = bytearray(labels.read_bytes())
    data[len(data) // 2] ^= 0xFF
    labels.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match=r"train-labels-idx1-ubyte\.gz") as info:
        load_dataset("fashion-mnist", data_dir=tmp_path)
    assert info.value.actual not in fm.SHA256[fm.TRAIN_LABELS]
    assert set(info.value.expected) == set(fm.SHA256[fm.TRAIN_LABELS])


def test_verify_sha256_mismatch_and_cache_invalidation(tmp_path: Path) -> None:
    f = tmp_path / "file.bin"
    f.write_bytes(b"hello")
    good = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    assert verify_sha256(f, good) == good
    f.write_bytes(b"jello")  # same size; the new mtime must defeat the digest cache
    with pytest.raises(ChecksumError, match=rf"file\.bin: expected sha256 {good}, actual sha256"):
        verify_sha256(f, good)
    err = pickle.loads(pickle.dumps(ChecksumError(f, good, "abc")))  # Dask ships errors pickled
    assert isinstance(err, ChecksumError) and err.actual == "abc"


def test_idx_parse_errors(tmp_path: Path) -> None:
    good = bytes([0, 0, 8, 1]) + (3).to_bytes(4, "big") + b"\x01\x02\x03"
    assert fm.parse_idx(good).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="bad IDX magic number 0x00000d01"):
        fm.parse_idx(bytes([0, 0, 0x0D, 1]) + good[4:])
    with pytest.raises(ValueError, match="header truncated"):
        fm.parse_idx(good[:6])
    with pytest.raises(ValueError, match=r"declares shape \(3,\).*holds 2"):
        fm.parse_idx(good[:-1])
    (tmp_path / "plain").write_bytes(good)
    with pytest.raises(ValueError, match="not a valid gzip file"):
        fm.read_idx_gz(tmp_path / "plain", shape=(None,))
    _idx_gz(tmp_path / "labels.gz", np.zeros(5))
    with pytest.raises(ValueError, match=r"expected IDX data of shape \('N', 28, 28\)"):
        fm.read_idx_gz(tmp_path / "labels.gz", shape=(None, 28, 28))


# --- search, errors, registry --------------------------------------------------------------


def test_not_found_message_says_where_and_how(tmp_path: Path, isolated: None) -> None:
    assert search_dirs("fashion-mnist", tmp_path) == [
        tmp_path / "fashion-mnist",
        tmp_path / "FashionMNIST/raw",
        tmp_path,
    ]
    with pytest.raises(DatasetNotFoundError, match="sudo apt-get install dataset-fashion-mnist"):
        load_dataset("fashion-mnist", data_dir=tmp_path)
    with pytest.raises(DatasetNotFoundError) as info:
        locate("fashion-mnist", tmp_path)
    msg = str(info.value)
    assert str(tmp_path / "FashionMNIST/raw") in msg
    assert "scaledl-lab data fetch fashion-mnist" in msg and "SCALEDL_DATA_DIR" in msg
    _fake_fashion(tmp_path)
    (tmp_path / fm.TEST_LABELS).unlink()
    with pytest.raises(DatasetNotFoundError, match=r"Incomplete(.|\n)*lacks t10k-labels"):
        locate("fashion-mnist", tmp_path)


def test_default_search_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEDL_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.delenv("SCALEDL_DATA_NO_DEFAULTS", raising=False)
    dirs = search_dirs("fashion_mnist", tmp_path / "arg")  # aliases accepted
    assert dirs[0] == tmp_path / "arg/fashion-mnist" and dirs[3] == tmp_path / "env/fashion-mnist"
    assert fm.SYSTEM_DIR in dirs
    assert Path(__file__).resolve().parents[1] / "data" / "fashion-mnist" in dirs
    assert fm.SYSTEM_DIR not in search_dirs("cifar10")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"unknown dataset 'imagenet'.*fashion-mnist.*cifar10"):
        load_dataset("imagenet")
    with pytest.raises(ValueError, match="unknown dataset"):
        fetch("svhn")
    assert DATASETS == ("fashion-mnist", "mnist1d", "cifar10", "licenses")


def test_dataset_info(tmp_path: Path, isolated: None) -> None:
    write_cifar10_fixture(tmp_path, n_per_batch=2)
    info = {row["name"]: row for row in dataset_info(tmp_path)}
    assert list(info) == list(DATASETS)
    assert info["cifar10"]["found"] and info["cifar10"]["path"] == str(tmp_path / cifar_mod.FOLDER)
    assert not info["fashion-mnist"]["found"] and info["fashion-mnist"]["path"] is None
    assert "apt-get install dataset-fashion-mnist" in info["fashion-mnist"]["how_to_get"]
    assert info["cifar10"]["input_shape"] == (3, 32, 32) and info["mnist1d"]["train_size"] > 0


def test_dataset_type_checks() -> None:
    d = Dataset("t", torch.zeros(4, 1, 3), torch.arange(4), 4)
    assert len(d) == 4 and d.input_shape == (1, 3)
    assert d.subset(torch.tensor([3, 1])).y.tolist() == [3, 1]
    with pytest.raises(ValueError, match="y must be a 1-D int64"):
        Dataset("t", torch.zeros(4, 1), torch.zeros(4), 2)
    with pytest.raises(ValueError, match="x has 4 samples, y 3"):
        Dataset("t", torch.zeros(4, 1), torch.arange(3), 2)


# --- MNIST-1D ------------------------------------------------------------------------------


def test_mnist1d_generates_caches_and_reuses(
    tmp_path: Path, isolated: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(m1d, "NUM_SAMPLES", 1000)  # 800 train / 200 test: fast to generate
    np_state = np.random.get_state()[1].copy()
    s = load_dataset("mnist1d", data_dir=tmp_path, val_size=100)
    assert np.array_equal(np.random.get_state()[1], np_state)  # global RNG left alone
    assert (len(s.train), len(s.val), len(s.test)) == (700, 100, 200)
    assert s.input_shape == (1, 40) and s.num_classes == 10
    train_x = torch.cat([s.train.x, s.val.x])
    assert abs(train_x.mean().item()) < 1e-4 and abs(train_x.std().item() - 1) < 1e-2
    cache = locate("mnist1d", tmp_path) / m1d.cache_filename()
    mtime = cache.stat().st_mtime_ns

    def no_generation(*args: object) -> None:
        raise AssertionError("should have reused the cache")

    monkeypatch.setattr("mnist1d.data.make_dataset", no_generation)
    again = load_dataset("mnist1d", data_dir=tmp_path, val_size=100)
    assert torch.equal(again.train.x, s.train.x) and cache.stat().st_mtime_ns == mtime
    assert not list(cache.parent.glob("*.tmp"))


def test_mnist1d_fetch_is_deterministic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(m1d, "NUM_SAMPLES", 500)
    folder = fetch("mnist1d", dest=tmp_path / "a")
    assert folder == tmp_path / "a" / "mnist1d"
    other = m1d.generate(tmp_path / "b")
    a, b = m1d.read_raw(folder / m1d.cache_filename()), m1d.read_raw(other)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))


# --- CIFAR-10 ------------------------------------------------------------------------------


def test_cifar10_fixture_round_trip(tmp_path: Path, isolated: None) -> None:
    folder = write_cifar10_fixture(tmp_path, n_per_batch=20, seed=3)
    assert locate("cifar10", tmp_path) == folder
    s = load_dataset("cifar10", data_dir=tmp_path, val_size=10, test_subset=5)
    assert (len(s.train), len(s.val), len(s.test)) == (90, 10, 5)
    assert s.input_shape == (3, 32, 32)
    train, test = cifar_mod.load_cifar10(folder)
    with open(folder / "data_batch_1", "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    assert train.y[:20].tolist() == batch[b"labels"] and len(test) == 20
    pixel = batch[b"data"][7].reshape(3, 32, 32)[2, 5, 9] / 255.0  # blue channel, row 5, col 9
    expected = (pixel - cifar_mod.MEAN[2]) / cifar_mod.STD[2]
    assert train.x[7, 2, 5, 9].item() == pytest.approx(expected, abs=1e-5)


def test_cifar10_truncated_missing_and_unsafe_batches(tmp_path: Path, isolated: None) -> None:
    folder = write_cifar10_fixture(tmp_path)
    batch = folder / "data_batch_3"
    batch.write_bytes(batch.read_bytes()[:500])
    with pytest.raises(ValueError, match=r"data_batch_3: not a readable CIFAR-10 batch"):
        load_dataset("cifar10", data_dir=tmp_path, val_size=10)
    (folder / "test_batch").unlink()
    with pytest.raises(DatasetNotFoundError, match=r"lacks test_batch"):
        locate("cifar10", tmp_path)
    with pytest.raises(
        DatasetNotFoundError, match=r"missing CIFAR-10 batch files \['test_batch'\]"
    ):
        cifar_mod.load_cifar10(folder)
    evil = folder / "evil"
    evil.write_bytes(pickle.dumps(shutil.rmtree))  # any global outside numpy's arrays
    with pytest.raises(ValueError, match="shutil.rmtree is not allowed"):
        cifar_mod.read_batch(evil)


def test_cifar10_extract_only_known_members(tmp_path: Path) -> None:
    src = write_cifar10_fixture(tmp_path / "src", n_per_batch=3)
    (tmp_path / "evil.txt").write_text("outside")
    tarball = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(src, arcname=cifar_mod.FOLDER)
        tar.add(tmp_path / "evil.txt", arcname="../evil.txt")
    folder = cifar_mod.extract_tarball(tarball, tmp_path / "out")
    assert not cifar_mod.missing_files(folder) and not (tmp_path / "out" / "evil.txt").exists()
    assert len(cifar_mod.load_cifar10(folder)[0]) == 15


# --- fetch, with file:// URLs standing in for the upstream servers (no network) -------------


def test_download_checks_digest_and_leaves_nothing_behind(tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"hello")
    good = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    assert download(src.as_uri(), tmp_path / "out" / "a.bin", good).read_bytes() == b"hello"
    with pytest.raises(ChecksumError, match="src.bin: expected sha256 0+, actual sha256 2cf24"):
        download(src.as_uri(), tmp_path / "out" / "b.bin", "0" * 64)
    with pytest.raises(OSError, match="could not download"):
        download((tmp_path / "absent").as_uri(), tmp_path / "out" / "c.bin", good)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.bin"]


@needs_fmnist
def test_fetch_fashion_mnist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fm, "BASE_URL", fm.SYSTEM_DIR.as_uri() + "/")
    folder = fetch("fashion-mnist", dest=tmp_path)
    assert folder == tmp_path / "fashion-mnist" and not fm.missing_files(folder)
    fm.verify(folder)


def test_fetch_cifar10(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated: None) -> None:
    src = write_cifar10_fixture(tmp_path / "src", n_per_batch=2)
    tarball = tmp_path / "fixture.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(src, arcname=cifar_mod.FOLDER)
    monkeypatch.setattr(cifar_mod, "TARBALL_URL", tarball.as_uri())
    monkeypatch.setattr(cifar_mod, "TARBALL_SHA256", sha256_file(tarball))
    monkeypatch.setattr(cifar_mod, "TARBALL_MD5", hashlib.md5(tarball.read_bytes()).hexdigest())
    folder = fetch("cifar10", dest=tmp_path / "data")
    assert locate("cifar10", tmp_path / "data") == folder
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [cifar_mod.FOLDER]


# --- sharding ------------------------------------------------------------------------------


def test_iid_shards_disjoint_equal_and_covering() -> None:
    labels = torch.arange(103) % 10
    shards = [shard_indices(labels, 4, r, seed=1) for r in range(4)]
    assert all(len(s) == 103 // 4 for s in shards)
    union = torch.cat(shards)
    assert len(set(union.tolist())) == len(union) == 100 and union.max() < 103
    even = torch.cat([shard_indices(labels[:100], 4, r) for r in range(4)])
    assert sorted(even.tolist()) == list(range(100))
    assert torch.equal(shards[0], shard_indices(labels, 4, 0, seed=1))
    assert not torch.equal(shards[0], shard_indices(labels, 4, 0, seed=2))


@pytest.mark.parametrize("n, bound", [(1000, 2), (1003, 4)])  # exact classes, then ragged
def test_label_skew_limits_classes(n: int, bound: int) -> None:
    labels = torch.randperm(n, generator=torch.Generator().manual_seed(0)) % 10
    shards = [
        shard_indices(labels, 5, r, scheme="label-skew", seed=3, classes_per_worker=2)
        for r in range(5)
    ]
    assert len({len(s) for s in shards}) == 1
    union = torch.cat(shards)
    assert len(set(union.tolist())) == len(union) == 10 * (n // 10)
    assert all(len(labels[s].unique()) <= bound for s in shards)
    again = shard_indices(labels, 5, 2, scheme="label-skew", seed=3, classes_per_worker=2)
    assert torch.equal(shards[2], again)


def test_shard_errors() -> None:
    labels = torch.arange(10)
    with pytest.raises(
        ValueError, match=r"unknown sharding scheme 'dirichlet'.*'iid'.*'label-skew'"
    ):
        shard_indices(labels, 2, 0, scheme="dirichlet")
    with pytest.raises(ValueError, match="world_size=11 exceeds the 10 samples"):
        shard_indices(labels, 11, 0)
    with pytest.raises(ValueError, match="rank=2 out of range for world_size=2"):
        shard_indices(labels, 2, 2)
    with pytest.raises(ValueError, match="needs world_size.classes_per_worker=12 chunks"):
        shard_indices(labels, 4, 0, scheme="label-skew", classes_per_worker=3)


def test_epoch_batches_order() -> None:
    shard = torch.arange(100, 203)
    batches = epoch_batches(shard, 10, seed=0, epoch=0, rank=0)
    assert len(batches) == steps_per_epoch(103, 10) == 10
    assert all(len(b) == 10 for b in batches)
    flat = torch.cat(batches)
    assert len(set(flat.tolist())) == 100 and set(flat.tolist()) <= set(shard.tolist())
    assert torch.equal(flat, torch.cat(epoch_batches(shard, 10, seed=0, epoch=0, rank=0)))
    for seed, epoch, rank in [(1, 0, 0), (0, 1, 0), (0, 0, 1)]:
        other = epoch_batches(shard, 10, seed=seed, epoch=epoch, rank=rank)
        assert not torch.equal(flat, torch.cat(other))
    assert epoch_batches(shard, 200, seed=0, epoch=0, rank=0) == []
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        epoch_batches(shard, 0, seed=0, epoch=0, rank=0)


def test_sharding_same_in_another_process() -> None:
    code = (
        "import torch; from scaledl_lab.data import shard_indices, epoch_batches\n"
        "s = shard_indices(torch.arange(50) % 5, 3, 1, scheme='label-skew', seed=7)\n"
        "print(torch.cat(epoch_batches(s, 4, seed=7, epoch=2, rank=1)).tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123", "PYTHONPATH": str(Path(__file__).parents[1])},
    ).stdout
    s = shard_indices(torch.arange(50) % 5, 3, 1, scheme="label-skew", seed=7)
    assert out.strip() == str(torch.cat(epoch_batches(s, 4, seed=7, epoch=2, rank=1)).tolist())
