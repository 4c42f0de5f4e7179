"""The licenses corpus: the free-software licence texts every Debian system ships, as
character-level next-token sequences for gpt-tiny.

Why this corpus: Debian's ``base-files`` package is essential (it cannot be removed), and it
installs ``/usr/share/common-licenses/``: about 240 kB of English prose (GPL, LGPL, GFDL, Apache,
MPL, Artistic, BSD, CC0), the same files on every Debian or Ubuntu machine, with no download
and no licence question of its own. That is enough text for a 100k-parameter model to learn
words and phrases in seconds, and small enough to hold in memory on every worker.

Tokens: one per character, over a fixed vocabulary (newline and printable ASCII, 96 symbols),
so that ids mean the same on every machine; tabs and form feeds read as a space, any other
character (none in these files today) as ``?``. A sample is a window of ``SEQUENCE`` characters
``x`` and the next character of each position ``y`` (``x`` shifted by one); windows do not
overlap. The split is fixed: in each file, the last tenth of its windows is the test split and
the rest is training (the lab's validation split is then drawn from the training windows).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from .base import Dataset, RawData

NAME = "licenses"
SYSTEM_DIR = Path("/usr/share/common-licenses")
# The files read, in this order; all are in base-files since Debian 9 (2017).
FILES = (
    "Apache-2.0",
    "Artistic",
    "BSD",
    "CC0-1.0",
    "GFDL-1.2",
    "GFDL-1.3",
    "GPL-1",
    "GPL-2",
    "GPL-3",
    "LGPL-2",
    "LGPL-2.1",
    "LGPL-3",
    "MPL-1.1",
    "MPL-2.0",
)
SEQUENCE = 32  # characters per sample (the model's context)
TEST_FRACTION = 10  # the last 1/10 of each file's windows
VOCABULARY = "\n" + "".join(chr(c) for c in range(32, 127))
_IDS = {ch: i for i, ch in enumerate(VOCABULARY)}
_SPACE, _UNKNOWN = _IDS[" "], _IDS["?"]
PROMPT = "This License"  # the summary's fixed prompt for a greedy sample


def encode(text: str) -> list[int]:
    """Token ids of ``text`` (tabs and form feeds as spaces, other unknown characters as ?)."""
    return [_IDS.get(ch, _SPACE if ch in "\t\x0c" else _UNKNOWN) for ch in text]


def decode(ids: list[int]) -> str:
    return "".join(VOCABULARY[i] for i in ids)


def missing_files(d: Path) -> list[str]:
    return [f for f in FILES if not (d / f).is_file()]


def _windows(text: str) -> np.ndarray:
    """Non-overlapping windows of ``SEQUENCE + 1`` tokens (x is [:-1], y is [1:])."""
    ids = np.asarray(encode(text), dtype=np.int64)
    count = (len(ids) - 1) // SEQUENCE
    starts = np.arange(count)[:, None] * SEQUENCE
    return ids[starts + np.arange(SEQUENCE + 1)[None, :]]


@functools.lru_cache(maxsize=4)
def _read(folder: str) -> tuple[np.ndarray, np.ndarray]:
    train, test = [], []
    for name in FILES:
        windows = _windows((Path(folder) / name).read_text(encoding="utf-8", errors="replace"))
        held = -(-len(windows) // TEST_FRACTION)
        train.append(windows[:-held])
        test.append(windows[-held:])
    return np.concatenate(train), np.concatenate(test)


def read_raw(folder: Path) -> RawData:
    """The windows of the files in ``folder``: train and test, x and y."""
    train, test = _read(str(folder))
    return RawData(train[:, :-1], train[:, 1:], test[:, :-1], test[:, 1:])


def sizes(folder: Path) -> tuple[int, int]:
    """(training windows, test windows) of the files in ``folder``."""
    train, test = _read(str(folder))
    return len(train), len(test)


def to_dataset(x: np.ndarray, y: np.ndarray) -> Dataset:
    return Dataset(NAME, torch.from_numpy(x.copy()), torch.from_numpy(y.copy()), len(VOCABULARY))
