"""Runtimes: the communication interface and its implementations (dask: real; sim: virtual)."""

from .base import (
    Comm,
    DivergenceError,
    Pending,
    Row,
    RunError,
    WorkerLostError,
    ring_allreduce_bytes,
)

__all__ = [
    "Comm",
    "DivergenceError",
    "Pending",
    "Row",
    "RunError",
    "WorkerLostError",
    "ring_allreduce_bytes",
]
