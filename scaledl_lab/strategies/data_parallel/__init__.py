"""Synchronous data parallelism: every worker holds a replica and the gradients are averaged by
an allreduce every step (:mod:`.sync_sgd`: ``allreduce``, ``allreduce-naive``)."""

from . import sync_sgd

__all__ = ["sync_sgd"]
