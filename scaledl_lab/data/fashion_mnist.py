"""Fashion-MNIST (Xiao, Rasul & Vollgraf 2017) from its four IDX ``.gz`` files, read with numpy."""

from __future__ import annotations

import functools
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import torch

from .base import Dataset, RawData, verify_sha256

NAME = "fashion-mnist"
NUM_CLASSES = 10
CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
MEAN, STD = 0.2860, 0.3530
BASE_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian package dataset-fashion-mnist

TRAIN_IMAGES = "train-images-idx3-ubyte.gz"
TRAIN_LABELS = "train-labels-idx1-ubyte.gz"
TEST_IMAGES = "t10k-images-idx3-ubyte.gz"
TEST_LABELS = "t10k-labels-idx1-ubyte.gz"
FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

# Accepted SHA-256 per archive: (upstream archive, Debian copy). Debian re-gzipped the files,
# so its archives hash differently, but they decompress to byte-identical IDX data: the MD5s
# of the decompressed files equal those torchvision publishes for the upstream ones.
SHA256 = {
    TRAIN_IMAGES: (
        "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    ),
    TRAIN_LABELS: (
        "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    ),
    TEST_IMAGES: (
        "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    ),
    TEST_LABELS: (
        "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
    ),
}

_UBYTE = 0x08  # IDX type code for unsigned bytes, the only one Fashion-MNIST uses


def parse_idx(data: bytes, *, source: str = "<bytes>") -> np.ndarray:
    """Decode an uncompressed IDX file of unsigned bytes into a read-only uint8 array.

    Layout (LeCun's MNIST page): two zero bytes, a type code, the number of dimensions, one
    big-endian uint32 per dimension, then the values in C order.
    """
    if len(data) < 4:
        raise ValueError(f"{source}: not an IDX file (only {len(data)} bytes)")
    magic = int.from_bytes(data[:4], "big")
    ndim = data[3]
    if data[:2] != b"\x00\x00" or data[2] != _UBYTE or ndim == 0:
        raise ValueError(
            f"{source}: bad IDX magic number 0x{magic:08x}; expected 0x0000080N "
            "(unsigned-byte data with N dimensions)"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{source}: IDX header truncated ({len(data)} of {header} bytes)")
    dims = struct.unpack(f">{ndim}I", data[4:header])
    size = math.prod(dims)
    if len(data) - header != size:
        raise ValueError(
            f"{source}: IDX header declares shape {dims} ({size} bytes of data) but the file "
            f"holds {len(data) - header}; it is truncated or corrupt"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(dims)


def read_idx_gz(path: str | os.PathLike, *, shape: tuple[int | None, ...]) -> np.ndarray:
    """Read a gzipped IDX file and check its shape (``None`` matches any length)."""
    path = Path(path)
    try:
        # wbits=16+MAX_WBITS: gzip framing; faster than gzip.open's chunked reads.
        data = zlib.decompress(path.read_bytes(), 16 + zlib.MAX_WBITS)
    except zlib.error as e:
        raise ValueError(f"{path}: not a valid gzip file, or truncated ({e})") from e
    arr = parse_idx(data, source=str(path))
    if arr.ndim != len(shape) or any(
        s is not None and s != d for s, d in zip(shape, arr.shape, strict=True)
    ):
        want = tuple("N" if s is None else s for s in shape)
        raise ValueError(f"{path}: expected IDX data of shape {want}, got {arr.shape}")
    return arr


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int, shape: tuple[int | None, ...]) -> np.ndarray:
    # Keyed by mtime and size so a replaced file is read again; the array is read-only.
    del mtime_ns, size
    return read_idx_gz(path, shape=shape)


def _read(path: Path, shape: tuple[int | None, ...]) -> np.ndarray:
    st = path.stat()
    return _read_cached(str(path.resolve()), st.st_mtime_ns, st.st_size, shape)


def _read_pair(root: Path, images: str, labels: str) -> tuple[np.ndarray, np.ndarray]:
    x = _read(root / images, (None, 28, 28))
    y = _read(root / labels, (None,))
    if len(x) != len(y):
        raise ValueError(f"{root}: {images} holds {len(x)} images but {labels} {len(y)} labels")
    if y.size and int(y.max()) >= NUM_CLASSES:
        raise ValueError(f"{root / labels}: label {int(y.max())} is not in 0..9")
    return x, y


def to_dataset(x: np.ndarray, y: np.ndarray) -> Dataset:
    """uint8 images ``(N, 28, 28)`` as ``(x/255 - MEAN)/STD``, shape ``(N, 1, 28, 28)``."""
    xt = torch.from_numpy(x.astype(np.float32)).unsqueeze(1)
    # One in-place multiply and subtract: this runs on every worker's load.
    xt.mul_(1.0 / (255.0 * STD)).sub_(MEAN / STD)
    return Dataset(NAME, xt, torch.from_numpy(y.astype(np.int64)), NUM_CLASSES)


def missing_files(root: str | os.PathLike) -> list[str]:
    """The Fashion-MNIST archives absent from ``root``."""
    return [f for f in FILES if not (Path(root) / f).is_file()]


def verify(root: str | os.PathLike) -> None:
    """Check every archive in ``root`` against the published SHA-256 (cached per file)."""
    for f in FILES:
        verify_sha256(Path(root) / f, SHA256[f])


def read_raw(root: str | os.PathLike, *, verify_files: bool = True) -> RawData:
    """The uint8 images and labels of both splits in ``root`` (read-only, cached per file)."""
    root = Path(root)
    if verify_files:
        verify(root)
    return RawData(
        *_read_pair(root, TRAIN_IMAGES, TRAIN_LABELS), *_read_pair(root, TEST_IMAGES, TEST_LABELS)
    )


def load_fashion_mnist(
    root: str | os.PathLike, *, verify_files: bool = True
) -> tuple[Dataset, Dataset]:
    """The official 60k training and 10k test sets from the four archives in ``root``."""
    raw = read_raw(root, verify_files=verify_files)
    return to_dataset(raw.x_train, raw.y_train), to_dataset(raw.x_test, raw.y_test)
