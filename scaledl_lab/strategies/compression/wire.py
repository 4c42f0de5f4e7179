"""The wire format of compressed gradients: a payload (named tensors) packed into one byte buffer.

A compressor's output is a :data:`Payload`, a dict of tensors (values, indices, packed bits,
scales, P and Q). Collectives and point-to-point messages move one tensor, so a payload travels
as a single ``uint8`` buffer (:func:`pack`); the receiver knows the payload's structure (the
same compressor on the same layout) and views the bytes back (:func:`unpack`). Its size is the
sum of the parts: what the metrics count is exactly what the compressor produced.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import torch

Payload = dict[str, torch.Tensor]
Layout = tuple[tuple[int, ...], ...]  # the shapes of the segments of a flat vector, in order


def layout_of(tensors: Iterable[torch.Tensor]) -> Layout:
    """The layout of the flat vector that concatenates ``tensors`` (parameters, gradients)."""
    return tuple(tuple(t.shape) for t in tensors)


def numel_of(layout: Layout) -> int:
    return sum(math.prod(shape) for shape in layout)


def shard_layouts(layout: Layout, shards: int) -> list[Layout]:
    """The layouts of ``torch.tensor_split(flat, shards)``'s pieces: a segment cut by a shard
    boundary becomes flat pieces (one per shard it spans); whole segments keep their shape."""
    total = numel_of(layout)
    bounds = [len(t) for t in torch.tensor_split(torch.empty(total, dtype=torch.uint8), shards)]
    out: list[list[tuple[int, ...]]] = [[] for _ in range(shards)]
    shard, room = 0, bounds[0] if bounds else 0
    for shape in layout:
        size = math.prod(shape)
        while room == 0 and shard + 1 < shards:
            shard += 1
            room = bounds[shard]
        if size == 0:
            out[shard].append(shape)
            continue
        whole = size <= room
        while size > 0:
            while room == 0:
                shard += 1
                room = bounds[shard]
            take = min(size, room)
            out[shard].append(shape if whole else (take,))
            size -= take
            room -= take
    return [tuple(s) for s in out]


def payload_bytes(payload: Payload) -> int:
    """Bytes of a payload: what a message carrying it sends."""
    return sum(t.numel() * t.element_size() for t in payload.values())


def pack(payload: Payload) -> torch.Tensor:
    """The payload as one contiguous ``uint8`` buffer (its parts' bytes, in key order)."""
    parts = [t.detach().contiguous().reshape(-1).view(torch.uint8) for t in payload.values()]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)


def unpack(buffer: torch.Tensor, like: Payload) -> Payload:
    """The payload packed in ``buffer``, with the keys, dtypes and shapes of ``like``."""
    out: Payload = {}
    offset = 0
    for key, t in like.items():
        nbytes = t.numel() * t.element_size()
        raw = buffer[offset : offset + nbytes].clone()  # aligned, private storage
        out[key] = raw.view(t.dtype).reshape(t.shape)
        offset += nbytes
    if offset != buffer.numel():
        raise ValueError(f"a packed payload of {buffer.numel()} bytes, expected {offset}")
    return out


# -- bit packing: b-bit unsigned codes, 8/b per byte ------------------------------------------


def pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned integer codes below 2**bits (bits in 1, 2, 4, 8) into ``uint8`` bytes,
    the first code in the lowest bits."""
    if bits == 8:
        return codes.to(torch.uint8)
    per_byte = 8 // bits
    padded = torch.zeros(math.ceil(codes.numel() / per_byte) * per_byte, dtype=torch.uint8)
    padded[: codes.numel()] = codes
    packed = padded[0::per_byte].clone()
    for i in range(1, per_byte):
        packed |= padded[i::per_byte] << (i * bits)
    return packed


def unpack_bits(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first ``count`` codes of :func:`pack_bits` (as uint8)."""
    if bits == 8:
        return packed[:count]
    return torch.index_select(_code_table(bits), 0, packed.long()).reshape(-1)[:count]


@functools.cache
def _code_table(bits: int) -> torch.Tensor:
    """Row b: the 8/bits codes packed in byte b, lowest bits first."""
    shifts = torch.arange(0, 8, bits)
    return ((torch.arange(256).view(-1, 1) >> shifts) & ((1 << bits) - 1)).to(torch.uint8)
