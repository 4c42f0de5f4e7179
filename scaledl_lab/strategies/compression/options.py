"""Compression's options, on every strategy whose messages carry gradients (checked in
:mod:`.spec`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...families import option


@dataclass(frozen=True)
class CompressionOptions:
    compress: str = field(
        default="none",
        metadata=option("none | onebit | qsgd:LEVELS | topk:RATIO | dgc:RATIO | powersgd:RANK"),
    )
    error_feedback: bool = field(
        default=True,
        metadata=option("carry what was not sent to the next step", flag="--no-error-feedback"),
    )
