"""Config errors of the decentralised options (topology, averaging periods, NNT's lead,
EASGD's moving rate), each one line naming the field, before any cluster starts."""

from __future__ import annotations

from typing import Any

from ... import families
from ...errors import ConfigError, choices
from ...topology import colouring, parse


def check_config(cfg: Any) -> None:
    """Raise ConfigError for the first invalid decentralised field."""
    if cfg.topology is not None:
        if not families.has(cfg.strategy, "takes_topology"):
            takes = families.with_capability("takes_topology")
            raise ConfigError(
                f"topology={cfg.topology!r} does not apply to strategy={cfg.strategy!r}: "
                f"only the decentralised strategies take a topology ({choices(takes)})"
            )
        parse(cfg.topology, cfg.workers)
    if cfg.strategy == "adpsgd" and cfg.workers > 1:
        colouring(cfg.resolved_topology, cfg.workers)  # active/passive needs a bipartite graph
    for name in ("sync_period", "stage_epochs"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{name}={value!r} must be a positive integer")
    lead = cfg.nnt_max_lead
    if lead is not None and (not isinstance(lead, int) or isinstance(lead, bool) or lead < 0):
        raise ConfigError(
            f"nnt_max_lead={lead!r} must be a non-negative integer, or None for unbounded "
            "(FAST's never-waiting NNT)"
        )
    if cfg.elastic_alpha is not None and not 0 < cfg.elastic_alpha < 1:
        raise ConfigError(f"elastic_alpha={cfg.elastic_alpha!r} must lie strictly between 0 and 1")
