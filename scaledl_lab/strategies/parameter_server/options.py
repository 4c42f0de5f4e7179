"""The parameter servers' options: shards, Downpour's periods, backup workers, DC-ASGD's λ
(checked in :mod:`.checks`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...families import option


@dataclass(frozen=True)
class ParameterServerOptions:
    servers: int = field(default=1, metadata=option("PS shards (ps-*, downpour, ..., backup)"))
    backup_workers: int = field(
        default=1, metadata=option("backup-workers: a step uses the first workers - b gradients")
    )
    n_fetch: int = field(default=1, metadata=option("downpour: pull every n_fetch steps"))
    n_push: int = field(default=1, metadata=option("downpour: push every n_push steps"))
    dc_lambda: float = field(
        default=0.04, metadata=option("dc-asgd: weight of the delay compensation (λ0 if adaptive)")
    )
    dc_adaptive: bool = field(default=False, metadata=option("dc-asgd: λ0/√(mean g²) (DC-ASGD-a)"))
