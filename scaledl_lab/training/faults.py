"""Injected faults: ``kill:RANK:STEP`` ends worker RANK right after its train row of step STEP.

The simulator stops that worker's program there (deterministically, so a notebook shows the
same recovery to every student); a Dask run makes the worker's process exit abruptly, so the
cluster really loses it. Decentralised and asynchronous strategies go on with the survivors;
synchronous ones stop with a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import families
from ..errors import ConfigError

SPELLING = "kill:RANK:STEP (commas between several)"


@dataclass(frozen=True)
class Kill:
    """Worker ``rank`` dies right after logging its step ``step`` (1-based, as train rows)."""

    rank: int
    step: int


@families.register_check
def check_run(cfg: Any) -> None:
    """The config's check of ``faults`` (registered: the config asks the records)."""
    parse_faults(cfg.faults, cfg.workers)


def parse_faults(spec: str | None, workers: int) -> tuple[Kill, ...]:
    """The kills of ``spec``; ConfigError naming the bad part (a rank outside the run,
    a step below 1, one rank killed twice, every worker killed)."""
    if spec is None or not spec.strip():
        return ()
    kills: list[Kill] = []
    for part in spec.split(","):
        fields = part.strip().split(":")
        if len(fields) != 3 or fields[0] != "kill":
            raise ConfigError(f"faults={spec!r}: {part.strip()!r} is not {SPELLING}")
        try:
            rank, step = int(fields[1]), int(fields[2])
        except ValueError:
            raise ConfigError(
                f"faults={spec!r}: {part.strip()!r} needs integers, as in {SPELLING}"
            ) from None
        if not 0 <= rank < workers:
            raise ConfigError(
                f"faults={spec!r} kills rank {rank}, but the run has workers={workers} "
                f"(ranks 0 to {workers - 1})"
            )
        if step < 1:
            raise ConfigError(
                f"faults={spec!r} kills rank {rank} after step {step}; steps count from 1"
            )
        if any(k.rank == rank for k in kills):
            raise ConfigError(f"faults={spec!r} kills rank {rank} twice")
        kills.append(Kill(rank, step))
    if len(kills) >= workers:
        raise ConfigError(f"faults={spec!r} kills every worker: at least one must survive")
    return tuple(kills)


def check_fault_steps(spec: str | None, workers: int, total_steps: int) -> None:
    """Every kill falls within the run's ``total_steps`` steps per worker."""
    for kill in parse_faults(spec, workers):
        if kill.step > total_steps:
            raise ConfigError(
                f"faults={spec!r} kills rank {kill.rank} after step {kill.step}, but each "
                f"worker takes only {total_steps} steps in this run"
            )


def kill_step(spec: str | None, workers: int, rank: int) -> int | None:
    """The step after which ``rank`` dies, or None."""
    return next((k.step for k in parse_faults(spec, workers) if k.rank == rank), None)
