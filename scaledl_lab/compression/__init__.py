"""Gradient compression as small composable objects: a compressor (what is sent), a memory
(error feedback, DGC's momentum correction) and a wire format (one byte buffer per message).

Pure tensor code: the strategies decide how the payloads travel
(:mod:`scaledl_lab.strategies.compressed`).
"""

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
from .powersgd import PowerSGD
from .spec import CompressionSpec, check_config, momentum_correction, parse
from .wire import Layout, Payload, layout_of, pack, payload_bytes, shard_layouts, unpack

__all__ = [
    "DGC",
    "QSGD",
    "CompressionSpec",
    "Compressor",
    "DGCMemory",
    "ErrorFeedback",
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
