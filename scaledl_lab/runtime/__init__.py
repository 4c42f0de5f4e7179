"""Runtimes: the communication interface and its implementations (dask: real; sim: virtual).

A runtime runs a program it is given (a :class:`Launch`) and imports nothing above it.
"""

from .base import NOT_READY, Comm, Incoming, Launch, Outcome, Pending, RankProgram

__all__ = ["NOT_READY", "Comm", "Incoming", "Launch", "Outcome", "Pending", "RankProgram"]
