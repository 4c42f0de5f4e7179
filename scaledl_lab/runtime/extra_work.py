"""Computation a compute block does beyond the share it declares: a forward run again during
backward (activation recomputation, :mod:`scaledl_lab.training.recompute`).

Whoever runs such a forward notes it here as a fraction of one forward of the whole model
(:func:`note_forward`); the simulator takes the count at the end of the block and charges it
on top of the block's share, a forward being a third of a training step
(:meth:`scaledl_lab.runtime.sim.comm.SimComm.compute`). Wall-clock runtimes need nothing: the
time is spent for real. One count per process, not per thread: autograd runs a GPU backward on
a thread of its own (the caller waits for it). On the simulator every worker runs on one
thread and a block never spans an ``await``, so the count between a block's start and end is
that block's.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_count = [0.0]


def note_forward(fraction: float) -> None:
    """``fraction`` of one forward of the model ran again (a recomputed segment)."""
    with _lock:
        _count[0] += fraction


def take() -> float:
    """The forward fractions noted since the last call, and a fresh count."""
    with _lock:
        value, _count[0] = _count[0], 0.0
    return value
