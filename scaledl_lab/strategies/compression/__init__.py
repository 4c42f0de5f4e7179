"""Gradient compression as small composable objects: a compressor (what is sent), a memory
(error feedback, DGC's momentum correction) and a wire format (one byte buffer per message).

What this package exports is pure tensor code. How the payloads travel in each family is in
:mod:`.messages` (the compressed allreduce, NNT's and the parameter servers' messages) and
:mod:`.gossip` (D-PSGD with compressed messages); neither is imported here. The study and its
report run experiments and read their tables, above the strategies: they are
:mod:`scaledl_lab.studies.compression`. The family's record registers no strategy: ``compress``
is an option on the strategies whose messages carry gradients.
"""

from ...families import Family, register_family
from .compressors import (
    DGC,
    QSGD,
    Compressor,
    NoCompression,
    OneBit,
    TopK,
    dgc_density,
    qsgd_bits,
    topk_count,
)
from .feedback import DGCMemory, ErrorFeedback
from .options import CompressionOptions
from .powersgd import PowerSGD
from .spec import CompressionSpec, check_config, momentum_correction, optimiser_changes, parse
from .wire import Layout, Payload, layout_of, pack, payload_bytes, shard_layouts, unpack

FAMILY = register_family(
    Family(
        name="compression",
        summary="options on the others' strategies: compressed gradient messages "
        "(compress=..., error feedback)",
        strategies={},
        check=check_config,
        options=CompressionOptions,
        optimiser_changes=optimiser_changes,
    )
)

__all__ = [
    "DGC",
    "QSGD",
    "CompressionOptions",
    "CompressionSpec",
    "Compressor",
    "DGCMemory",
    "ErrorFeedback",
    "FAMILY",
    "Layout",
    "NoCompression",
    "OneBit",
    "Payload",
    "PowerSGD",
    "TopK",
    "check_config",
    "dgc_density",
    "layout_of",
    "momentum_correction",
    "pack",
    "parse",
    "payload_bytes",
    "qsgd_bits",
    "shard_layouts",
    "topk_count",
    "unpack",
]
