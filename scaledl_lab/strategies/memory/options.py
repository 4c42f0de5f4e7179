"""The memory family's option on every strategy: activation recomputation (:mod:`.recompute`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...families import option


@dataclass(frozen=True)
class MemoryOptions:
    recompute: bool | str = field(
        default=False,
        metadata=option(
            "every strategy: keep each layer's input only, its forward again in backward; "
            "'selective' (gpt-tiny): attention's core only, softmax(QKᵀ)·V",
            metavar="selective",
            parse=str,
            const=True,
        ),
    )
