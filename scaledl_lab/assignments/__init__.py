"""Graded assignments: what a student writes, run for real on both runtimes and scored against
its sequential twin (:mod:`.ring_allreduce`: a ring allreduce from send/recv, then synchronous
SGD on it). The notebooks live in ``notebooks/assignment/``."""

from .grading import Check, Report

__all__ = ["Check", "Report"]
