"""The package's error classes. Imports nothing from the package, so every layer may raise them."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field and the allowed values."""


class RunError(RuntimeError):
    """A run stopped before finishing; the message says why and where the partial metrics are."""


class DivergenceError(RunError):
    """The training loss became NaN or infinite."""


class WorkerLostError(RunError):
    """A worker process died during a run."""


class ServerLostError(RunError):
    """A parameter server (or another hosted server object) stopped answering."""


def choices(values: tuple[str, ...]) -> str:
    """The allowed values of a field, as error messages list them."""
    return ", ".join(repr(v) for v in values)
