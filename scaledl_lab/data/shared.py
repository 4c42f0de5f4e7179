"""One copy of a large split for every process on a machine: written once, then mapped.

Every process that trains loads its data: the driver or notebook kernel, each Dask worker, each
of ``reproduce``'s simulator processes. A full Fashion-MNIST split is ~220 MB of float32, the
same bytes in each of them. Here a split whose inputs reach ``SHARE_FROM_BYTES`` is written, the
first time it is cut, to a file named by what it is made of (the dataset, the exact stored
samples it keeps, the code version), and every load maps that file copy-on-write
(``np.memmap`` mode ``"c"``): the pages are the kernel's page cache, counted once for all the
processes that read them (the proportional set size splits them), and a process that writes to
its inputs gets a private copy of the pages it changes, never a changed file. The numbers are
the ones the conversion gives, byte for byte; loading a cut split again skips the conversion.

The files live in ``$SCALEDL_SPLITS_DIR`` (default ``~/.cache/scaledl_lab/splits``); the
oldest beyond ``KEEP_BYTES`` in all are removed as new ones come (a mapped file stays readable
by the processes that have it open). ``SCALEDL_SPLITS_DIR=off``, or a folder that cannot be
written, keeps every split in each process's memory, as before.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from .base import Dataset

ENV_SPLITS_DIR = "SCALEDL_SPLITS_DIR"
SHARE_FROM_BYTES = 8 << 20  # inputs below this stay in memory: tests' subsets leave no files
KEEP_BYTES = 2 << 30  # the folder's size, oldest files removed first
VERSION = 1  # of the conversions (normalisation constants, layouts): a change gets new files


def splits_dir() -> Path | None:
    """The folder of shared splits, or None when sharing is off."""
    value = os.environ.get(ENV_SPLITS_DIR, "").strip()
    if value.lower() in ("off", "0", "false", "no"):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "scaledl_lab" / "splits"


def split_key(name: str, x: np.ndarray, y: np.ndarray) -> str:
    """A name for the split made of the stored samples ``x``, ``y`` of dataset ``name``."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{name}|{VERSION}|{x.dtype}|{x.shape}|{y.dtype}|{y.shape}|".encode())
    digest.update(np.ascontiguousarray(x).data)
    digest.update(np.ascontiguousarray(y).data)
    return f"{name}-{digest.hexdigest()}"


def shared_split(
    name: str, x: np.ndarray, y: np.ndarray, convert: Callable[[np.ndarray, np.ndarray], Dataset]
) -> Dataset:
    """``convert(x, y)``, its inputs mapped from the shared file when they are large enough
    (made by this call when absent); the converted split itself when sharing is off."""
    folder = splits_dir()
    if folder is None or x.nbytes * 4 < SHARE_FROM_BYTES:  # float32 from (at most) uint8
        return convert(x, y)
    key = split_key(name, x, y)
    found = _open(folder, key)
    if found is not None:
        return found
    data = convert(x, y)
    if data.x.numel() * data.x.element_size() < SHARE_FROM_BYTES or not _write(folder, key, data):
        return data
    return _open(folder, key) or data


def _open(folder: Path, key: str) -> Dataset | None:
    meta = folder / f"{key}.json"
    try:
        info = json.loads(meta.read_text())
        x = np.load(folder / f"{key}.x.npy", mmap_mode="c")
        y = np.load(folder / f"{key}.y.npy")
        os.utime(meta)  # recently used: removed last
    except (OSError, ValueError):
        return None
    return Dataset(info["name"], torch.from_numpy(x), torch.from_numpy(y), info["num_classes"])


def _write(folder: Path, key: str, data: Dataset) -> bool:
    """Write the split's files (the .json last: a split is there once its .json is); False
    when the folder cannot be written."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for part, tensor in (("x", data.x), ("y", data.y)):
            _atomic(folder / f"{key}.{part}.npy", lambda f, t=tensor: np.save(f, t.numpy()))
        info = {"name": data.name, "num_classes": data.num_classes}
        _atomic(folder / f"{key}.json", lambda f: f.write(json.dumps(info).encode()))
    except OSError:
        return False
    _prune(folder)
    return True


def _atomic(path: Path, write: Callable) -> None:
    """Write ``path`` under a temporary name, then link it in unless another process was first:
    readers never see half a file, and processes that cut the same split at once all end up
    mapping the one file that won (the same bytes: the split is a function of its key)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        Path(tmp).unlink(missing_ok=True)


def _prune(folder: Path) -> None:
    """Remove the least recently used splits until the folder holds ``KEEP_BYTES`` at most."""
    splits = []
    for meta in folder.glob("*.json"):
        files = [meta, folder / f"{meta.stem}.x.npy", folder / f"{meta.stem}.y.npy"]
        try:
            size = sum(f.stat().st_size for f in files if f.exists())
            splits.append((meta.stat().st_mtime, size, files))
        except OSError:
            continue
    total = sum(size for _, size, _ in splits)
    for _, size, files in sorted(splits, key=lambda s: s[0]):
        if total <= KEEP_BYTES:
            break
        for f in files:
            f.unlink(missing_ok=True)
        total -= size
