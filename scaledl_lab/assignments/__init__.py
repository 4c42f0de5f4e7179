"""Graded assignments: what a student writes, run for real on both runtimes and scored against
its sequential twin (:mod:`.ring_allreduce`: a ring allreduce from send/recv, then synchronous
SGD on it). The notebooks live in ``notebooks/assignment/``.

Also :mod:`.tensor_parallel_mlp` (Megatron's MLP block: its shards, f and g, scored against the
unsplit block) and :mod:`.one_f_one_b` (a 1F1B schedule, scored by the lab's schedule checks)."""

from .grading import Check, Report

__all__ = ["Check", "Report"]
