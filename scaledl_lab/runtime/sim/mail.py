"""Messages sent but not yet received, per (sender, receiver): in memory up to a budget, on disk
beyond it.

In virtual time a message lives from its send to its receive, and every virtual worker lives in
this one process, so the simulator holds all the cluster's messages in flight at once. Most
strategies have a few; unbounded NNT with a straggler has thousands: the straggler's fast
neighbours flood the workers two hops away, which fall behind (2,518 gradients of the MLP,
6.7 GB, at the peak of ``reproduce --quick``'s straggler run, where a real cluster spreads them
over 16 machines). Past ``SPILL_AFTER_BYTES`` a message is written to a file, byte for byte, and
read back when it is received: the same numbers, a little disk time, bounded memory. The file is
one per run, unlinked as soon as it is opened (nothing is left behind, whatever ends the run),
its slots reused as messages are read: rewriting a slot costs ~0.3 ms per MLP gradient here,
where a file per message cost ~7 ms to create and ~1 ms to remove (the straggler run of
``reproduce --quick`` spills ~4,600 of them).

A message sent to several neighbours (NNT's gradient, to 2 on a ring and 4 on a torus) is copied
once (:class:`Sent`), not once per receiver: each receiver but the last takes its own copy only
when it reads the message, so the queued messages of a send cost one gradient, not the degree's.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections import defaultdict, deque
from dataclasses import dataclass

import torch

from ..base import tensor_bytes

SPILL_AFTER_BYTES = 256 << 20  # in-flight messages kept in memory; later ones go to disk


class Sent:
    """One private copy of a sent tensor, for every receiver of that send (``readers``).

    A receiver may change what it reads (a gradient clipped in place), so each reader but the
    last gets a copy of its own when it reads; the last one gets this copy."""

    def __init__(self, tensor: torch.Tensor, *, private: bool = False, readers: int = 0) -> None:
        self.tensor: torch.Tensor | None = tensor if private else tensor.detach().clone()
        self.nbytes = tensor_bytes(tensor)
        self.shape, self.dtype = tensor.shape, tensor.dtype
        self.readers = readers
        self.in_mail = 0  # entries of the mail that hold this copy in memory

    def take(self) -> torch.Tensor:
        """The message for one reader, to keep."""
        assert self.tensor is not None, "every reader of this message has taken it"
        self.readers -= 1
        if self.readers > 0:
            return self.tensor.clone()
        tensor, self.tensor = self.tensor, None
        return tensor

    def read_into(self, buffer: torch.Tensor) -> None:
        """The message, copied into a receiver's buffer."""
        assert self.tensor is not None, "every reader of this message has taken it"
        buffer.copy_(self.tensor)
        self.release()

    def release(self) -> None:
        """One reader is done with this copy (it read it, or holds it elsewhere)."""
        self.readers -= 1
        if self.readers == 0:
            self.tensor = None


class Copies:
    """Each sender's last :class:`Sent`: the same tensor sent again, unchanged (its version
    counter the same), to another receiver shares that copy. The tensor is referenced weakly:
    a sender's buffer lives no longer for it."""

    def __init__(self) -> None:
        self._last: dict[int, tuple[weakref.ref[torch.Tensor], int, Sent]] = {}

    def of(self, src: int, tensor: torch.Tensor) -> Sent:
        """The copy of ``tensor`` for one more receiver."""
        last = self._last.get(src)
        if (
            last is not None
            and last[0]() is tensor
            and last[1] == tensor._version
            and last[2].tensor is not None
        ):
            sent = last[2]
        else:
            sent = Sent(tensor)
            self._last[src] = (weakref.ref(tensor), tensor._version, sent)
        sent.readers += 1
        return sent


@dataclass(frozen=True)
class Spilled:
    """A message waiting in the spill file: where its raw bytes are, and what they were."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


class Mail:
    """FIFO queues of undelivered messages, one per (src, dst) pair."""

    def __init__(self, spill_after: int | None = None) -> None:
        self.spill_after = SPILL_AFTER_BYTES if spill_after is None else spill_after
        self._boxes: dict[tuple[int, int], deque[tuple[float, Sent | Spilled]]] = defaultdict(deque)
        self.held = 0  # bytes of the messages in memory (a copy shared by receivers once)
        self.spilled = 0  # messages written to disk so far
        self._fd: int | None = None  # the spill file, unlinked: it lives as long as this fd
        self._end = 0  # the file's size
        self._free: dict[int, list[int]] = defaultdict(list)  # slot size -> free offsets

    def __contains__(self, pair: tuple[int, int]) -> bool:
        return bool(self._boxes.get(pair))

    def put(self, src: int, dst: int, arrival: float, sent: Sent) -> None:
        """Keep one reader's share of ``sent`` until ``dst`` takes it."""
        size = 0 if sent.in_mail else sent.nbytes  # already in memory here: no more bytes
        if self.held + size <= self.spill_after:
            self.held += size
            sent.in_mail += 1
            self._boxes[(src, dst)].append((arrival, sent))
        else:
            assert sent.tensor is not None
            spilled = self._spill(sent.tensor)
            sent.release()  # this reader's share is the file now
            self._boxes[(src, dst)].append((arrival, spilled))

    def take(self, src: int, dst: int) -> tuple[float, Sent]:
        """The oldest message from ``src`` to ``dst`` (there must be one), to be read once."""
        arrival, stored = self._boxes[(src, dst)].popleft()
        if isinstance(stored, Spilled):
            return arrival, Sent(self._read(stored), private=True, readers=1)
        stored.in_mail -= 1
        if not stored.in_mail:
            self.held -= stored.nbytes
        return arrival, stored

    def close(self) -> None:
        """Let go of the spill file (a run's end, normal or not)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._end = 0
            self._free.clear()

    def _spill(self, tensor: torch.Tensor) -> Spilled:
        if self._fd is None:
            fd, path = tempfile.mkstemp(prefix="scaledl-sim-mail-")
            os.unlink(path)  # the data stays reachable through fd until close()
            self._fd = fd
        raw = memoryview(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        free = self._free[len(raw)]
        if free:
            offset = free.pop()
        else:
            offset, self._end = self._end, self._end + len(raw)
        done = 0
        while done < len(raw):  # a write may be cut short (signals, > 2 GiB)
            done += os.pwrite(self._fd, raw[done:], offset + done)
        self.spilled += 1
        return Spilled(offset, len(raw), tensor.dtype, tuple(tensor.shape))

    def _read(self, stored: Spilled) -> torch.Tensor:
        assert self._fd is not None, "a spilled message outlived its run's spill file"
        raw = torch.empty(stored.nbytes, dtype=torch.uint8)
        view = memoryview(raw.numpy())
        done = 0
        while done < stored.nbytes:
            got = os.preadv(self._fd, [view[done:]], stored.offset + done)
            if got == 0:
                raise OSError(f"spill file ended {stored.nbytes - done} bytes early")
            done += got
        self._free[stored.nbytes].append(stored.offset)  # the slot takes the next one this size
        return raw.view(stored.dtype).reshape(stored.shape)


# One never-written storage per (dtype, bytes) that every posted receive buffer points at
# until its message arrives. In virtual time every worker's posted buffers live in this one
# process (NNT with a lead bound posts lead + 1 per neighbour: 20 gradients a worker on a
# torus at a lead of 4), where a real cluster spreads them over its machines; a buffer waiting
# for a message holds no memory of its own here.
_PLACEHOLDERS: dict[tuple[torch.dtype, int], torch.UntypedStorage] = {}


def lend(tensor: torch.Tensor) -> bool:
    """Point a posted receive buffer at the shared placeholder, if nothing else can see its
    storage: a whole, contiguous tensor of its own (not a view, not aliased, no autograd),
    which the receiver reads only once the receive completes. Returns whether it did."""
    if (
        tensor.device.type != "cpu"
        or tensor.requires_grad
        or tensor._base is not None
        or not tensor.is_contiguous()
        or tensor.storage_offset() != 0
        or tensor.numel() == 0
    ):
        return False
    storage = tensor.untyped_storage()
    nbytes = tensor.numel() * tensor.element_size()
    # This tensor and ``storage`` here: no third holder (another view, a kept reference).
    if storage.nbytes() != nbytes or torch._C._storage_Use_Count(storage._cdata) > 2:
        return False
    key = (tensor.dtype, nbytes)
    placeholder = _PLACEHOLDERS.get(key)
    if placeholder is None:
        placeholder = _PLACEHOLDERS[key] = torch.empty(
            tensor.numel(), dtype=tensor.dtype
        ).untyped_storage()
    tensor.set_(placeholder, 0, tensor.shape, tensor.stride())
    return True
