"""The decentralised strategies' options: local SGD's and EASGD's periods, EASGD's moving rate
and centre, NNT's staging and lead bound (checked in :mod:`.checks`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from ...families import option


def parse_max_lead(text: str) -> int | None:
    """``--nnt-max-lead``: a non-negative step count, or ``unbounded`` (FAST: never wait)."""
    if text.strip().lower() in ("unbounded", "none"):
        return None
    try:
        lead = int(text)
    except ValueError:
        lead = -1
    if lead < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a non-negative integer nor 'unbounded'"
        )
    return lead


@dataclass(frozen=True)
class DecentralisedOptions:
    sync_period: int = field(
        default=4,
        metadata=option(
            "local-sgd, easgd: local steps between averagings; diloco: inner steps (H)"
        ),
    )
    elastic_alpha: float | None = field(
        default=None, metadata=option("easgd moving rate (default 0.9 / workers)")
    )
    elastic_async: bool = field(
        default=False, metadata=option("easgd: centre on a server, asynchronous")
    )
    stage_epochs: int = field(
        default=1, metadata=option("nnt-staged: restart everyone from the best every k epochs")
    )
    # None: unbounded, as FAST (a worker never waits for a neighbour)
    nnt_max_lead: int | None = field(
        default=None,
        metadata=option(
            "nnt, nnt-staged: steps a worker may run ahead of a neighbour's gradients "
            "(default unbounded: never wait, as FAST)",
            metavar="N|unbounded",
            parse=parse_max_lead,
        ),
    )
