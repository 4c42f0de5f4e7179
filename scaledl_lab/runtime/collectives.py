"""Bytes one worker sends in a collective: the formulas the Comm implementations count with
and the simulator's cost model prices (ring allreduce, reduce-scatter, all-gather, allgather)."""

from __future__ import annotations

import math


def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one worker sends in a ring allreduce: reduce-scatter then all-gather, 2(p-1)/p · n."""
    if world_size <= 1:
        return 0
    return int(math.ceil(2 * (world_size - 1) * nbytes / world_size))


def allgather_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one worker sends in an allgather of ``nbytes`` each: its piece to p − 1 workers."""
    return max(0, world_size - 1) * nbytes


def ring_reduce_scatter_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one worker sends in a ring reduce-scatter of ``nbytes`` (or an all-gather whose
    result is ``nbytes``): p − 1 chunks of n/p, (p-1)/p · n, half an allreduce."""
    return int(math.ceil((world_size - 1) * nbytes / world_size)) if world_size > 1 else 0


ring_all_gather_bytes = ring_reduce_scatter_bytes
