"""Parameter servers and Hogwild!: the workers' side of every variant (:mod:`.workers`:
``ps-sync``, ``ps-async``, ``downpour``, ``staleness-aware``, ``dc-asgd``, ``backup-workers``),
the server and its update rules (:mod:`.server`), and lock-free SGD on parameters shared in
memory (:mod:`.hogwild`)."""

from . import hogwild, server, workers

__all__ = ["hogwild", "server", "workers"]
