"""Messages sent but not yet received, per (sender, receiver): in memory up to a budget, on disk
beyond it.

In virtual time a message lives from its send to its receive, and every virtual worker lives in
this one process, so the simulator holds all the cluster's messages in flight at once. Most
strategies have a few; unbounded NNT with a straggler has thousands: the straggler's fast
neighbours flood the workers two hops away, which fall behind (2,518 gradients of the MLP,
6.7 GB, at the peak of ``reproduce --quick``'s straggler run, where a real cluster spreads them
over 16 machines). Past ``SPILL_AFTER_BYTES`` a message is written to a file, byte for byte, and
read back when it is received: the same numbers, a little disk time, bounded memory.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..base import tensor_bytes

SPILL_AFTER_BYTES = 512 << 20  # in-flight messages kept in memory; later ones go to disk


@dataclass(frozen=True)
class Spilled:
    """A message waiting in a file: its raw bytes, and what they were."""

    path: Path
    dtype: torch.dtype
    shape: tuple[int, ...]


class Mail:
    """FIFO queues of undelivered messages, one per (src, dst) pair."""

    def __init__(self, spill_after: int | None = None) -> None:
        self.spill_after = SPILL_AFTER_BYTES if spill_after is None else spill_after
        self._boxes: dict[tuple[int, int], deque[tuple[float, torch.Tensor | Spilled]]] = (
            defaultdict(deque)
        )
        self.held = 0  # bytes of the messages in memory
        self.spilled = 0  # messages written to disk so far
        self._dir: Path | None = None

    def __contains__(self, pair: tuple[int, int]) -> bool:
        return bool(self._boxes.get(pair))

    def put(self, src: int, dst: int, arrival: float, tensor: torch.Tensor) -> None:
        """Keep a private copy of ``tensor`` (the sender may reuse its buffer)."""
        size = tensor_bytes(tensor)
        if self.held + size <= self.spill_after:
            self.held += size
            self._boxes[(src, dst)].append((arrival, tensor.detach().clone()))
        else:
            self._boxes[(src, dst)].append((arrival, self._spill(tensor)))

    def take(self, src: int, dst: int) -> tuple[float, torch.Tensor]:
        """The oldest message from ``src`` to ``dst`` (there must be one)."""
        arrival, stored = self._boxes[(src, dst)].popleft()
        if isinstance(stored, Spilled):
            return arrival, self._read(stored)
        self.held -= tensor_bytes(stored)
        return arrival, stored

    def close(self) -> None:
        """Remove the spill files (a run's end, normal or not)."""
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _spill(self, tensor: torch.Tensor) -> Spilled:
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="scaledl-sim-mail-"))
        path = self._dir / f"{self.spilled}.bin"
        self.spilled += 1
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        raw.numpy().tofile(path)
        return Spilled(path, tensor.dtype, tuple(tensor.shape))

    def _read(self, stored: Spilled) -> torch.Tensor:
        raw = torch.from_numpy(np.fromfile(stored.path, dtype=np.uint8))
        stored.path.unlink()
        return raw.view(stored.dtype).reshape(stored.shape)
