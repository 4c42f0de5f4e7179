"""Config errors of the parameter servers' options (shards, Downpour's periods, backup
workers, DC-ASGD's λ), each one line naming the field, before any cluster starts."""

from __future__ import annotations

from typing import Any

from ...errors import ConfigError


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_config(cfg: Any) -> None:
    """Raise ConfigError for the first invalid parameter-server field."""
    for name in ("servers", "n_fetch", "n_push"):
        value = getattr(cfg, name)
        if not _is_positive_int(value):
            raise ConfigError(f"{name}={value!r} must be a positive integer")
    if not isinstance(cfg.backup_workers, int) or cfg.backup_workers < 0:
        raise ConfigError(f"backup_workers={cfg.backup_workers!r} must be a non-negative integer")
    if cfg.strategy == "backup-workers" and cfg.backup_workers >= cfg.workers:
        raise ConfigError(
            f"backup_workers={cfg.backup_workers} must be below workers={cfg.workers}: each "
            "step needs the gradient of at least one worker"
        )
    if not isinstance(cfg.dc_lambda, (int, float)) or cfg.dc_lambda < 0:
        raise ConfigError(f"dc_lambda={cfg.dc_lambda!r} must be a non-negative number")
