"""In-memory dataset types, the loaders' errors, and SHA-256-checked file reads and downloads."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import families
from ..errors import ConfigError


# eq=False: the generated __eq__ would compare tensors elementwise and fail in a bool context.
@dataclass(frozen=True, eq=False)
class Dataset:
    """A whole split held in memory: normalised float32 inputs and int64 labels, or for a
    text corpus int64 token ids ``x`` and their next tokens ``y``, both ``(N, S)``."""

    name: str
    x: torch.Tensor
    y: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        if self.is_sequence:
            if self.x.dtype != torch.int64 or self.x.shape != self.y.shape:
                raise ValueError(
                    f"Dataset {self.name!r}: sequences need int64 token ids x shaped as their "
                    f"next tokens y {tuple(self.y.shape)}, got {self.x.dtype} {tuple(self.x.shape)}"
                )
            return
        if self.x.dtype != torch.float32:
            raise ValueError(f"Dataset {self.name!r}: x must be float32, got {self.x.dtype}")
        if self.y.dtype != torch.int64 or self.y.dim() != 1:
            raise ValueError(
                f"Dataset {self.name!r}: y must be a 1-D int64 tensor, "
                f"got {self.y.dtype} with shape {tuple(self.y.shape)}"
            )
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(
                f"Dataset {self.name!r}: x has {self.x.shape[0]} samples, y {self.y.shape[0]}"
            )

    def __len__(self) -> int:
        return int(self.y.shape[0])

    @property
    def is_sequence(self) -> bool:
        """Next-token data: a target per position, ``y`` of shape ``(N, S)``."""
        return self.y.dtype == torch.int64 and self.y.dim() == 2

    def subset(self, idx: torch.Tensor) -> Dataset:
        """The samples at positions ``idx`` (a 1-D integer tensor), in that order."""
        idx = torch.as_tensor(idx, dtype=torch.int64)
        return Dataset(self.name, self.x[idx], self.y[idx], self.num_classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, e.g. ``(1, 28, 28)``."""
        return tuple(self.x.shape[1:])

    def __repr__(self) -> str:
        # The default repr would print whole tensors.
        return (
            f"Dataset(name={self.name!r}, n={len(self)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes})"
        )


@dataclass(frozen=True, eq=False)
class DataSplits:
    """Train, validation and test sets; ``val`` is carved out of the training files."""

    train: Dataset
    val: Dataset
    test: Dataset

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.train.input_shape

    @property
    def num_classes(self) -> int:
        return self.train.num_classes

    def to(self, device: torch.device) -> DataSplits:
        """The splits on ``device``: a GPU worker copies its data there once, not every batch."""
        if self.train.x.device == device:
            return self
        splits = (self.train, self.val, self.test)
        return DataSplits(
            *(Dataset(d.name, d.x.to(device), d.y.to(device), d.num_classes) for d in splits)
        )


class RawData(NamedTuple):
    """Train and test arrays as stored on disk (e.g. uint8 pixels), before normalisation.

    Loaders return these so that the val split and subsets are cut from the small stored
    arrays and only the kept samples are converted to float32.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray


class DatasetNotFoundError(FileNotFoundError):
    """The dataset's files are in none of the searched directories."""


@families.register_check
def check_data_dir(cfg: Any) -> None:
    """A config's ``data_dir`` is a folder: the search never falls back silently from one that
    is not (a typo) to the usual places."""
    if cfg.data_dir is not None and not Path(cfg.data_dir).expanduser().is_dir():
        raise ConfigError(
            f"data_dir={cfg.data_dir!r} is not a folder; give the folder that holds the "
            "dataset, or leave data_dir out to search the usual places (`scaledl-lab data info`)"
        )


class ChecksumError(ValueError):
    """A data file's SHA-256 digest is not the published one."""

    def __init__(self, path: str | os.PathLike, expected: str | Collection[str], actual: str):
        self.path = path
        self.expected = (expected,) if isinstance(expected, str) else tuple(expected)
        self.actual = actual
        super().__init__(
            f"checksum mismatch for {self.path}: expected sha256 "
            f"{' or '.join(self.expected)}, actual sha256 {actual}. The file is corrupt or "
            "truncated; delete it and fetch it again."
        )

    def __reduce__(self):  # type: ignore[override]
        # Exceptions pickle by re-calling __init__ with self.args; ours takes other arguments,
        # and Dask ships worker exceptions back to the client by pickling them.
        return (type(self), (self.path, self.expected, self.actual))


def sha256_file(path: str | os.PathLike, chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 digest of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


# Digest of each file already hashed in this process, keyed by (path, mtime, size), so that
# loading the same files again (every experiment in a notebook does) skips the hashing.
_DIGEST_CACHE: dict[tuple[str, int, int], str] = {}


def verify_sha256(path: str | os.PathLike, expected: str | Collection[str]) -> str:
    """Check that ``path`` hashes to ``expected`` (one digest or a set); return the digest.

    Raises ``ChecksumError`` naming the file, the expected and the actual digest.
    """
    path = Path(path)
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size)
    actual = _DIGEST_CACHE.get(key)
    if actual is None:
        actual = sha256_file(path)
        _DIGEST_CACHE[key] = actual
    accepted = {expected} if isinstance(expected, str) else set(expected)
    if actual not in accepted:
        raise ChecksumError(path, sorted(accepted), actual)
    return actual


def download(url: str, path: Path, sha256: str | tuple[str, ...], md5: str | None = None) -> Path:
    """Download ``url`` to ``path``, checking SHA-256 (and MD5) before moving it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".part")
    digest, md5_digest = hashlib.sha256(), hashlib.md5(usedforsecurity=False)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
            while chunk := resp.read(1 << 20):
                out.write(chunk)
                digest.update(chunk)
                md5_digest.update(chunk)
        if digest.hexdigest() not in ((sha256,) if isinstance(sha256, str) else sha256):
            raise ChecksumError(url, sha256, digest.hexdigest())
        if md5 is not None and md5_digest.hexdigest() != md5:
            raise ChecksumError(url, sha256, f"{digest.hexdigest()} (md5 {md5_digest.hexdigest()})")
        os.replace(tmp, path)
    except urllib.error.URLError as e:
        raise OSError(f"could not download {url} ({e}); is this machine offline?") from e
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path
