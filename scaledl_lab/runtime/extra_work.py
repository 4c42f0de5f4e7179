"""Computation a compute block does beyond the share it declares: a forward run again during
backward (activation recomputation, :mod:`scaledl_lab.training.recompute`).

Whoever runs such a forward notes it here as a fraction of one forward of the whole model
(:func:`note_forward`); the simulator takes the count at the end of the block and charges it
on top of the block's share, a forward being a third of a training step
(:meth:`scaledl_lab.runtime.sim.comm.SimComm.compute`). Wall-clock runtimes need nothing: the
time is spent for real. One count per thread, as autograd runs a CPU backward on the thread
that calls it; a block never spans an ``await``, so on the simulator (every worker on one
thread) the count between a block's start and end is that block's.
"""

from __future__ import annotations

import threading

_count = threading.local()


def note_forward(fraction: float) -> None:
    """``fraction`` of one forward of the model ran again (a recomputed segment)."""
    _count.value = getattr(_count, "value", 0.0) + fraction


def take() -> float:
    """The forward fractions noted since the last call, and a fresh count."""
    value = getattr(_count, "value", 0.0)
    _count.value = 0.0
    return value
