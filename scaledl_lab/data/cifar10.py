"""CIFAR-10 (Krizhevsky 2009) from the python-pickle batches in ``cifar-10-batches-py/``."""

from __future__ import annotations

import os
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .base import Dataset, DatasetNotFoundError, RawData

NAME = "cifar10"
NUM_CLASSES = 10
CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
MEAN = (0.4914, 0.4822, 0.4465)
STD = (0.2470, 0.2435, 0.2616)
FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
BATCHES = (*TRAIN_BATCHES, TEST_BATCH)
TARBALL_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TARBALL_MD5 = "c58f30108f718f92721af3b95e74349a"
TARBALL_SHA256 = "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce"
_PIXELS = 3 * 32 * 32

# Unpickling can run arbitrary code, so a batch may only name the few globals that a dict
# of bytes, lists and one numpy array needs.
_ALLOWED_GLOBALS = {
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
}


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        # numpy 2 renamed numpy.core (named in the original Python-2 batches) to numpy._core.
        if module.startswith("numpy.core"):
            module = "numpy._core" + module[len("numpy.core") :]
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR batch")
        return super().find_class(module, name)


def read_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """``(data, labels)`` of one batch file: uint8 ``(N, 3072)`` and int64 ``(N,)``."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            batch = _BatchUnpickler(f, encoding="bytes").load()
    except (EOFError, pickle.UnpicklingError, ValueError, TypeError) as e:
        raise ValueError(
            f"{path}: not a readable CIFAR-10 batch, truncated or corrupt ({e})"
        ) from e
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise ValueError(f"{path}: a CIFAR-10 batch is a dict with keys b'data' and b'labels'")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise ValueError(
            f"{path}: b'data' must be uint8 (N, {_PIXELS}), got {data.dtype} {data.shape}"
        )
    if labels.shape != (data.shape[0],):
        raise ValueError(f"{path}: {data.shape[0]} images but {labels.size} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(f"{path}: labels must lie in 0..9")
    return data, labels


def missing_files(root: str | os.PathLike) -> list[str]:
    """The batch files absent from ``root`` (the ``cifar-10-batches-py`` folder)."""
    return [b for b in BATCHES if not (Path(root) / b).is_file()]


def to_dataset(data: np.ndarray, labels: np.ndarray) -> Dataset:
    """Rows of uint8 ``(N, 3072)`` as per-channel normalised float32 ``(N, 3, 32, 32)``."""
    # Rows are stored channel-major (1024 red, 1024 green, 1024 blue), i.e. already CHW.
    x = torch.from_numpy(data.reshape(-1, 3, 32, 32).astype(np.float32))
    scale = torch.tensor([1.0 / (255.0 * s) for s in STD]).view(1, 3, 1, 1)
    shift = torch.tensor([m / s for m, s in zip(MEAN, STD, strict=True)]).view(1, 3, 1, 1)
    x.mul_(scale).sub_(shift)  # (x/255 - mean)/std, in place
    return Dataset(NAME, x, torch.from_numpy(labels.astype(np.int64)), NUM_CLASSES)


def read_raw(root: str | os.PathLike) -> RawData:
    """The uint8 rows and labels of batches 1-5 (train, in order) and the test batch."""
    root = Path(root)
    missing = missing_files(root)
    if missing:
        raise DatasetNotFoundError(
            f"{root} is missing CIFAR-10 batch files {missing}; the folder is incomplete. "
            "Fetch it again: scaledl-lab data fetch cifar10"
        )
    train = [read_batch(root / b) for b in TRAIN_BATCHES]
    return RawData(
        np.concatenate([d for d, _ in train]),
        np.concatenate([y for _, y in train]),
        *read_batch(root / TEST_BATCH),
    )


def load_cifar10(root: str | os.PathLike) -> tuple[Dataset, Dataset]:
    """The 50k training set (batches 1-5 in order) and the 10k test set from ``root``."""
    raw = read_raw(root)
    return to_dataset(raw.x_train, raw.y_train), to_dataset(raw.x_test, raw.y_test)


def extract_tarball(tarball: str | os.PathLike, dest: str | os.PathLike) -> Path:
    """Extract the batch files of ``cifar-10-python.tar.gz`` into ``dest``; return the folder."""
    dest = Path(dest)
    wanted = {f"{FOLDER}/{b}" for b in (*BATCHES, "batches.meta", "readme.html")}
    with tarfile.open(tarball, "r:gz") as tar:
        # Only the known members: a tarball may name paths outside dest.
        members = [m for m in tar.getmembers() if m.name in wanted and m.isfile()]
        for m in members:
            src = tar.extractfile(m)
            assert src is not None
            out = dest / m.name
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(src.read())
    return dest / FOLDER


def write_cifar10_fixture(root: str | os.PathLike, n_per_batch: int = 20, seed: int = 0) -> Path:
    """Write a tiny CIFAR-10 in the real on-disk format under ``root``; return the batch folder.

    Six batch files of ``n_per_batch`` random images each plus ``batches.meta``, pickled
    (protocol 2) as dicts with bytes keys and a uint8 ``(N, 3072)`` array, as the originals
    are. For tests: ``load_dataset("cifar10", data_dir=root)`` then finds them.
    """
    folder = Path(root) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i, name in enumerate(BATCHES):
        labels = rng.integers(0, NUM_CLASSES, size=n_per_batch)
        batch = {
            b"batch_label": f"fixture batch {i + 1} of 6".encode(),
            b"labels": [int(v) for v in labels],
            b"data": rng.integers(0, 256, size=(n_per_batch, _PIXELS), dtype=np.uint8),
            b"filenames": [f"fixture_{i}_{j}.png".encode() for j in range(n_per_batch)],
        }
        with open(folder / name, "wb") as f:
            pickle.dump(batch, f, protocol=2)
    meta = {
        b"label_names": [c.encode() for c in CLASSES],
        b"num_cases_per_batch": n_per_batch,
        b"num_vis": _PIXELS,
    }
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump(meta, f, protocol=2)
    return folder
