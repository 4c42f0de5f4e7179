"""Find, fetch and load the lab's datasets by name, with a seeded validation split."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import cifar10, fashion_mnist, licenses, mnist1d
from .base import (
    ChecksumError,
    Dataset,
    DatasetNotFoundError,
    DataSplits,
    RawData,
    download,
    verify_sha256,
)
from .shared import shared_split

DATASETS: tuple[str, ...] = ("fashion-mnist", "mnist1d", "cifar10", "licenses")
_ALIASES = {
    "fashion_mnist": "fashion-mnist",
    "fashionmnist": "fashion-mnist",
    "fmnist": "fashion-mnist",
    "mnist-1d": "mnist1d",
    "mnist_1d": "mnist1d",
    "cifar-10": "cifar10",
    "cifar_10": "cifar10",
    "common-licenses": "licenses",
}
ENV_DATA_DIR = "SCALEDL_DATA_DIR"
# Set to 1 to search only data_dir and $SCALEDL_DATA_DIR (tests, or to pin one copy on a cluster).
ENV_NO_DEFAULTS = "SCALEDL_DATA_NO_DEFAULTS"
REPO_DATA_DIR = Path(__file__).resolve().parents[2] / "data"

# Sub-folders tried under each search root, in order ("." is the root itself).
_SUBDIRS = {
    "fashion-mnist": ("fashion-mnist", "FashionMNIST/raw", "."),
    "mnist1d": ("mnist1d", "."),
    "cifar10": (cifar10.FOLDER, f"cifar10/{cifar10.FOLDER}", "."),
    "licenses": ("licenses", "common-licenses", "."),
}
_FETCH = "scaledl-lab data fetch {name}   (or in Python: scaledl_lab.data.fetch({name!r}))"
HOW_TO_GET = {
    "fashion-mnist": (
        "sudo apt-get install dataset-fashion-mnist   (Debian/Ubuntu: installs the four files "
        f"in {fashion_mnist.SYSTEM_DIR})\n"
        f"  or: {_FETCH.format(name='fashion-mnist')}, ~30 MB from {fashion_mnist.BASE_URL}\n"
        f"  or: put the four *-ubyte.gz files in a folder and set {ENV_DATA_DIR}=that/folder"
    ),
    "mnist1d": (
        "generated locally (pip package mnist1d) the first time load_dataset('mnist1d') runs, "
        f"or ahead of time: {_FETCH.format(name='mnist1d')}"
    ),
    "cifar10": (
        f"{_FETCH.format(name='cifar10')}, 163 MB from {cifar10.TARBALL_URL}\n"
        f"  or: extract cifar-10-python.tar.gz so that {cifar10.FOLDER}/ lies in data/ or in "
        f"${ENV_DATA_DIR}"
    ),
    "licenses": (
        f"installed by Debian's essential base-files package in {licenses.SYSTEM_DIR}; "
        "elsewhere copy those files\n"
        f"  ({', '.join(licenses.FILES)}) into a folder and set {ENV_DATA_DIR}=that/folder"
    ),
}
_SIZES = {  # train (before the val split), test, per-sample shape, download size
    "fashion-mnist": (60000, 10000, (1, 28, 28), 30),
    "mnist1d": (16000, 4000, (1, 40), 0),
    "cifar10": (50000, 10000, (3, 32, 32), 163),
    # this machine's base-files; standard_sizes reads the files where they are found
    "licenses": (6663, 746, (licenses.SEQUENCE,), 0),
}
_CLASSES = {"licenses": len(licenses.VOCABULARY)}  # the others: 10


def standard_sizes(name: str) -> tuple[int, int]:
    """(training samples before the validation split, test samples) of a dataset as published."""
    name = _canonical(name)
    if name == "licenses":
        try:
            return licenses.sizes(locate(name))
        except DatasetNotFoundError:
            pass
    n_train, n_test, _, _ = _SIZES[name]
    return n_train, n_test


def num_classes(name: str) -> int:
    """Classes of a dataset (a text corpus's: its vocabulary)."""
    return _CLASSES.get(_canonical(name), 10)


def sample_shape(name: str) -> tuple[int, ...]:
    """One sample's shape (channels first, no batch dimension)."""
    return _SIZES[_canonical(name)][2]


def _canonical(name: str) -> str:
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {DATASETS}")
    return key


def _user_cache_dir() -> Path:
    return Path.home() / ".cache" / "scaledl_lab"


def _use_defaults() -> bool:
    return os.environ.get(ENV_NO_DEFAULTS, "").strip().lower() not in ("1", "true", "yes")


def search_dirs(name: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Where ``name``'s files are looked for, in order: ``data_dir``, ``$SCALEDL_DATA_DIR``,
    the repository's ``data/``, ``./data``, for Fashion-MNIST the Debian package's folder,
    and ``~/.cache/scaledl_lab``; each root with the dataset's usual sub-folders.

    With ``$SCALEDL_DATA_NO_DEFAULTS=1`` only the first two are searched.
    """
    name = _canonical(name)

    def expand(roots: list[Path]) -> list[Path]:
        return [root / sub if sub != "." else root for root in roots for sub in _SUBDIRS[name]]

    roots = [Path(data_dir).expanduser()] if data_dir is not None else []
    if os.environ.get(ENV_DATA_DIR):
        roots.append(Path(os.environ[ENV_DATA_DIR]).expanduser())
    dirs = expand(roots)
    if _use_defaults():
        dirs += expand([REPO_DATA_DIR, Path.cwd() / "data"])
        if name == "fashion-mnist":
            dirs.append(fashion_mnist.SYSTEM_DIR)
        if name == "licenses":
            dirs.append(licenses.SYSTEM_DIR)
        dirs += expand([_user_cache_dir()])
    unique: dict[str, Path] = {}
    for d in dirs:
        unique.setdefault(os.path.abspath(d), d)
    return list(unique.values())


_NUM_FILES = {
    "fashion-mnist": len(fashion_mnist.FILES),
    "mnist1d": 1,
    "cifar10": len(cifar10.BATCHES),
    "licenses": len(licenses.FILES),
}


def _missing(name: str, d: Path) -> list[str]:
    if name == "fashion-mnist":
        return fashion_mnist.missing_files(d)
    if name == "cifar10":
        return cifar10.missing_files(d)
    if name == "licenses":
        return licenses.missing_files(d)
    cache = mnist1d.cache_filename()
    return [] if (d / cache).is_file() else [cache]


def locate(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """The first searched directory that holds all of ``name``'s files.

    Raises ``DatasetNotFoundError`` saying where it looked and how to get the data.
    """
    name = _canonical(name)
    dirs = search_dirs(name, data_dir)
    partial = []
    for d in dirs:
        missing = _missing(name, d)
        if not missing:
            return d
        if d.is_dir() and len(missing) < _NUM_FILES[name]:
            partial.append(f"{d} (has some files but lacks {', '.join(missing)})")
    looked = "\n".join(f"  - {d}" for d in dirs)
    incomplete = (
        "\nIncomplete copies:\n" + "\n".join(f"  - {p}" for p in partial) if partial else ""
    )
    raise DatasetNotFoundError(
        f"{name} not found. Looked in:\n{looked}{incomplete}\nTo get it:\n  {HOW_TO_GET[name]}"
    )


def _split(
    name: str,
    raw: RawData,
    to_dataset: Callable[[np.ndarray, np.ndarray], Dataset],
    val_size: int,
    train_subset: int | None,
    test_subset: int | None,
    seed: int,
) -> DataSplits:
    n, n_test = len(raw.y_train), len(raw.y_test)
    if not 0 <= val_size < n:
        raise ValueError(f"val_size={val_size} must be in [0, {n}) for {name}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    val_idx, train_idx = perm[:val_size], perm[val_size:]
    if train_subset is not None:
        if not 0 < train_subset <= len(train_idx):
            raise ValueError(
                f"train_subset={train_subset} must be in [1, {len(train_idx)}]: {name} has {n} "
                f"training samples and val_size={val_size} of them are held out"
            )
        train_idx = train_idx[:train_subset]  # a prefix of one seeded order: subsets nest
    test_idx = torch.arange(n_test)
    if test_subset is not None:
        if not 0 < test_subset <= n_test:
            raise ValueError(f"test_subset={test_subset} must be in [1, {n_test}] for {name}")
        test_gen = torch.Generator().manual_seed(seed)
        test_idx = torch.randperm(n_test, generator=test_gen)[:test_subset]

    def take(x: np.ndarray, y: np.ndarray, idx: torch.Tensor) -> Dataset:
        # Sorted, so a split keeps the files' order; cut from the stored (e.g. uint8) arrays so
        # only the kept samples are converted to float; a large split is one file that every
        # process maps (:mod:`.shared`).
        i = idx.sort().values.numpy()
        return shared_split(name, x[i], y[i], to_dataset)

    return DataSplits(
        train=take(raw.x_train, raw.y_train, train_idx),
        val=take(raw.x_train, raw.y_train, val_idx),
        test=take(raw.x_test, raw.y_test, test_idx),
    )


def load_dataset(
    name: str,
    *,
    data_dir: str | os.PathLike | None = None,
    val_size: int = 5000,
    train_subset: int | None = None,
    test_subset: int | None = None,
    seed: int = 0,
    verify: bool = True,
) -> DataSplits:
    """Load ``name`` into memory as train / val / test.

    ``val`` is a seeded random ``val_size`` of the training files, disjoint from ``train``
    (never the test split). ``train_subset`` then keeps a seeded random part of the rest and
    ``test_subset`` a seeded random part of the test files. ``verify`` checks the
    Fashion-MNIST archives' SHA-256 (cached per file); MNIST-1D is generated on first use.
    """
    name = _canonical(name)
    if name == "mnist1d":
        cached = mnist1d.find_cached(search_dirs(name, data_dir))
        if cached is not None:
            path = cached / mnist1d.cache_filename()
        else:
            path = mnist1d.generate(_mnist1d_cache_dir(data_dir))
        raw, to_dataset = mnist1d.read_raw(path), mnist1d.to_dataset
    elif name == "fashion-mnist":
        raw = fashion_mnist.read_raw(locate(name, data_dir), verify_files=verify)
        to_dataset = fashion_mnist.to_dataset
    elif name == "licenses":
        raw, to_dataset = licenses.read_raw(locate(name, data_dir)), licenses.to_dataset
    else:
        raw, to_dataset = cifar10.read_raw(locate(name, data_dir)), cifar10.to_dataset
    return _split(name, raw, to_dataset, val_size, train_subset, test_subset, seed)


def _mnist1d_cache_dir(data_dir: str | os.PathLike | None) -> Path:
    if data_dir is not None:
        return Path(data_dir).expanduser() / "mnist1d"
    if os.environ.get(ENV_DATA_DIR):
        return Path(os.environ[ENV_DATA_DIR]).expanduser() / "mnist1d"
    return _user_cache_dir() / "mnist1d"


def _default_fetch_root() -> Path:
    if os.environ.get(ENV_DATA_DIR):
        return Path(os.environ[ENV_DATA_DIR]).expanduser()
    if (REPO_DATA_DIR.parent / "pyproject.toml").is_file():  # running from a source checkout
        return REPO_DATA_DIR
    return _user_cache_dir()


def _have(path: Path, sha256: str | tuple[str, ...]) -> bool:
    try:
        return path.is_file() and bool(verify_sha256(path, sha256))
    except ChecksumError:
        return False


def fetch(name: str, dest: str | os.PathLike | None = None) -> Path:
    """Put ``name``'s files under ``dest`` (default ``$SCALEDL_DATA_DIR``, else the checkout's
    ``data/``, else ``~/.cache/scaledl_lab``); return the folder holding them.

    Fashion-MNIST and CIFAR-10 are downloaded from upstream and checked against their
    published digests; MNIST-1D is generated locally. Files already present and valid are kept.
    """
    name = _canonical(name)
    base = Path(dest).expanduser() if dest is not None else _default_fetch_root()
    if name == "mnist1d":
        return mnist1d.generate(base / "mnist1d").parent
    if name == "licenses":  # nothing to download: a copy of the system's files
        source, folder = locate(name), base / "licenses"
        folder.mkdir(parents=True, exist_ok=True)
        for f in licenses.FILES:
            shutil.copyfile(source / f, folder / f)
        return folder
    if name == "fashion-mnist":
        folder = base / "fashion-mnist"
        for f in fashion_mnist.FILES:
            if not _have(folder / f, fashion_mnist.SHA256[f]):
                download(fashion_mnist.BASE_URL + f, folder / f, fashion_mnist.SHA256[f])
        return folder
    folder = base / cifar10.FOLDER
    if not cifar10.missing_files(folder):
        return folder
    tarball = base / "cifar-10-python.tar.gz"
    if not _have(tarball, cifar10.TARBALL_SHA256):
        download(cifar10.TARBALL_URL, tarball, cifar10.TARBALL_SHA256, md5=cifar10.TARBALL_MD5)
    cifar10.extract_tarball(tarball, base)
    tarball.unlink()  # the extracted batches are all the loader reads
    return folder


def dataset_info(data_dir: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """One row per dataset: whether and where it was found, how to get it, and its size."""
    rows = []
    for name in DATASETS:
        try:
            path: Path | None = locate(name, data_dir)
        except DatasetNotFoundError:
            path = None
        n_train, n_test, shape, mb = _SIZES[name]
        rows.append(
            {
                "name": name,
                "found": path is not None,
                "path": str(path) if path is not None else None,
                "how_to_get": HOW_TO_GET[name],
                "train_size": n_train,
                "test_size": n_test,
                "input_shape": shape,
                "num_classes": num_classes(name),
                "download_mb": mb,
            }
        )
    return rows
