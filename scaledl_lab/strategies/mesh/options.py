"""The mesh's options: its dimensions (``--mesh dp=2,tp=2,pp=2,cp=2``; ``ep=E`` for
gpt-tiny-moe), data parallelism's ZeRO stage, the pipeline's schedule and context parallelism's
attention. Micro-batches, virtual stages and sequence parallelism are the model-parallel
family's options, recomputation the memory family's: the mesh reads them for its ``pp`` and
``tp`` dimensions; gpt-tiny-moe's options are the moe family's."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...families import option

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1")
CP_METHODS = ("ring", "ulysses")
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class MeshOptions:
    mesh: str | None = field(
        default=None,
        metadata=option(
            "mesh: its dimensions dp=D,tp=T,pp=P,cp=C,ep=E (product = workers, the last "
            "innermost; ep: gpt-tiny-moe's experts)",
            metavar="dp=D,tp=T,pp=P,cp=C,ep=E",
        ),
    )
    zero_stage: int = field(
        default=0,
        metadata=option("mesh: ZeRO stage of the dp dimension", choices=("0", "1", "2", "3")),
    )
    pipeline_schedule: str = field(
        default="1f1b", metadata=option("mesh: the pp dimension's schedule", choices=SCHEDULES)
    )
    cp_method: str = field(
        default="ring",
        metadata=option(
            "mesh: the cp dimension's attention: ring (zig-zag split) or ulysses (all-to-all)",
            choices=CP_METHODS,
        ),
    )
