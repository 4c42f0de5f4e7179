"""Bytes one worker sends in a collective: the formulas the Comm implementations count with
and the simulator's cost model prices (ring allreduce, reduce-scatter, all-gather, allgather,
all-to-all)."""

from __future__ import annotations

import math

import torch

from ..errors import RunError


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


def all_to_all_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one worker sends in an all-to-all of ``nbytes``: every chunk of n/p but its own,
    (p-1)/p · n (Ulysses' and expert parallelism's exchange)."""
    return ring_reduce_scatter_bytes(nbytes, world_size)


def check_all_to_all(tensor: torch.Tensor, size: int) -> None:
    """A RunError unless ``tensor``'s first dimension splits into ``size`` equal chunks."""
    if tensor.dim() == 0 or tensor.shape[0] % size:
        raise RunError(
            f"all_to_all splits a tensor's first dimension into one chunk per member: got shape "
            f"{tuple(tensor.shape)} over {size} members (the first size must divide by {size})"
        )


def shard_numel(numel: int, world_size: int) -> int:
    """Elements of each member's chunk when ``numel`` elements are sharded over ``world_size``:
    the flat tensor is padded with zeros at its end to world_size × this (the last chunks hold
    the padding), as FSDP and ZeRO pad their flat buffers."""
    return -(-numel // world_size)


def check_shardable(what: str, tensor: torch.Tensor, size: int) -> int:
    """The chunk size of a flat ``tensor`` split over ``size`` members, or a RunError."""
    if tensor.dim() != 1 or tensor.numel() % size:
        raise RunError(
            f"{what} needs a flat tensor whose size divides by the group's {size} members; got "
            f"shape {tuple(tensor.shape)}: flatten it and pad it with zeros to "
            f"{size * shard_numel(tensor.numel(), size)} elements (runtime.base.shard_numel)"
        )
    return tensor.numel() // size


def check_gather(out: torch.Tensor, shard: torch.Tensor, size: int) -> None:
    """A RunError unless ``out`` is flat and holds exactly ``size`` flat ``shard``-sized chunks."""
    if shard.dim() != 1 or out.dim() != 1 or out.numel() != size * shard.numel():
        raise RunError(
            f"all_gather_into needs a flat out of {size} × the shard's size; got out "
            f"{tuple(out.shape)} for shards {tuple(shard.shape)} over {size} members"
        )
