"""Config checks of the cost-model fields (allreduce algorithm, network and gpus_per_node,
compute profile, stragglers), registered with the families' records, so that
:func:`scaledl_lab.config.validate` runs them before any cluster starts."""

from __future__ import annotations

from typing import Any

from ... import families
from .cost import (
    ALLREDUCE_ALGORITHMS,
    DEVICES,
    CostModelError,
    Stragglers,
    compute_profile,
    network_profile,
)
from .network import CUSTOM_TWO_TIER, TWO_TIER, NetworkProfile


def _check_stragglers(cfg: Any, stragglers: Stragglers) -> None:
    """Stragglers name ranks of this run (on real workers a sleep after each compute block):
    said before any work, not found missing from the results."""
    if not cfg.stragglers:
        return
    bad = sorted(r for r in stragglers.slow if not 0 <= r < cfg.workers)
    if bad:
        raise CostModelError(
            f"stragglers={cfg.stragglers!r}: "
            + (f"ranks {bad} are not workers" if len(bad) > 1 else f"rank {bad[0]} is not a worker")
            + f" of this run (workers={cfg.workers}: ranks 0 to {cfg.workers - 1})"
        )


def _check_placement(cfg: Any, network: NetworkProfile) -> None:
    """``gpus_per_node`` places ranks on the nodes of a two-tier network, whole nodes each."""
    per_node = cfg.gpus_per_node
    if per_node is None:
        return
    if network.tiers == 1:
        raise CostModelError(
            f"gpus_per_node={per_node} places ranks on nodes, but network={cfg.network!r} has "
            "one link for every pair of ranks, so the placement would change nothing; choose a "
            f"two-tier network ({', '.join(TWO_TIER)} or {CUSTOM_TWO_TIER}), or "
            "leave gpus_per_node out"
        )
    if cfg.workers > per_node and cfg.workers % per_node:
        raise CostModelError(
            f"workers={cfg.workers} spans nodes of gpus_per_node={per_node} but does not fill "
            f"them (rank r lives on node r // {per_node}); choose workers a multiple of "
            f"{per_node}, or gpus_per_node dividing {cfg.workers}"
        )


@families.register_check
def check_config(cfg: Any) -> None:
    """Config errors of the cost-model fields (a ConfigError naming the field)."""
    from ...errors import ConfigError, choices

    if cfg.allreduce_algorithm not in ALLREDUCE_ALGORITHMS:
        raise ConfigError(
            f"allreduce_algorithm={cfg.allreduce_algorithm!r} is unknown; "
            f"allowed: {choices(ALLREDUCE_ALGORITHMS)}"
        )
    try:
        _check_placement(cfg, network_profile(cfg.network))
        _check_stragglers(cfg, Stragglers.parse(cfg.stragglers))
        if cfg.compute_profile not in DEVICES:
            if not cfg.compute_profile.endswith(".json"):
                raise CostModelError(
                    f"compute_profile={cfg.compute_profile!r} is unknown; allowed: "
                    f"{choices(tuple(DEVICES))} or a calibration .json file"
                )
            compute_profile(cfg.compute_profile, cfg.model, flops_per_sample=0)
    except CostModelError as exc:
        raise ConfigError(str(exc)) from None
