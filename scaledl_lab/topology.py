"""Communication topologies as pure functions: ring, 2-D torus, complete graph.

The paper's nearest-neighbour training (NNT) connects workers in a ring (left and right
neighbours) or a 2-D torus (height × width, up/down/left/right, wrapping around). Gossip methods
(D-PSGD) average with the mixing matrix derived from the same graph; asynchronous pairwise
gossip (AD-PSGD) needs a two-colouring of it and a request schedule, both pure functions here.
"""

from __future__ import annotations

import re

import torch

from .errors import ConfigError

TOPOLOGIES = ("ring", "torus:HxW", "complete")
_TORUS = re.compile(r"^torus:(\d+)x(\d+)$")


def parse(spec: str, workers: int) -> tuple[str, int, int]:
    """``(kind, height, width)`` of ``spec`` for ``workers``, or a ConfigError that says why not.

    A ring is ``1 × workers``; a complete graph is ``1 × workers`` too.
    """
    if spec == "ring":
        return "ring", 1, workers
    if spec == "complete":
        return "complete", 1, workers
    match = _TORUS.match(spec or "")
    if not match:
        raise ConfigError(
            f"topology={spec!r} is unknown; allowed: 'ring', 'torus:HxW' (e.g. 'torus:4x4'), "
            "'complete'"
        )
    h, w = int(match.group(1)), int(match.group(2))
    if h * w != workers:
        raise ConfigError(
            f"topology={spec!r} has {h}x{w}={h * w} positions but workers={workers}; "
            f"choose height x width = {workers}"
        )
    if min(h, w) < 3:
        raise ConfigError(
            f"topology={spec!r}: a torus needs height and width of at least 3 (with "
            f"{min(h, w)}, a worker's two neighbours along that side are one and the same "
            "worker); use topology='ring' instead"
        )
    return "torus", h, w


def neighbours(spec: str, workers: int, rank: int) -> list[int]:
    """The ranks that ``rank`` talks to, without duplicates, in a fixed order."""
    kind, h, w = parse(spec, workers)
    if kind == "complete":
        return [r for r in range(workers) if r != rank]
    if kind == "ring":
        out = [(rank - 1) % workers, (rank + 1) % workers]
    else:
        row, col = divmod(rank, w)
        out = [
            ((row - 1) % h) * w + col,  # up
            ((row + 1) % h) * w + col,  # down
            row * w + (col - 1) % w,  # left
            row * w + (col + 1) % w,  # right
        ]
    seen: list[int] = []
    for r in out:
        if r != rank and r not in seen:
            seen.append(r)
    return seen


def adjacency(spec: str, workers: int) -> torch.Tensor:
    a = torch.zeros(workers, workers, dtype=torch.float64)
    for r in range(workers):
        for n in neighbours(spec, workers, r):
            a[r, n] = 1.0
    return a


def mixing_matrix(spec: str, workers: int) -> torch.Tensor:
    """Metropolis–Hastings weights W[i, j] = 1 / (1 + max(deg i, deg j)) on each edge.

    Symmetric and doubly stochastic, so gossip preserves the mean; on a regular graph
    (ring, torus, complete) every worker weighs itself and each neighbour 1 / (degree + 1).
    """
    a = adjacency(spec, workers)
    deg = a.sum(1)
    m = a / (1 + torch.maximum(deg[:, None], deg[None, :]))
    m += torch.diag(1 - m.sum(1))
    return m


def second_eigenvalue(matrix: torch.Tensor) -> float:
    """The second largest eigenvalue modulus: gossip's consensus error shrinks by it per round."""
    values = torch.linalg.eigvalsh(matrix).abs().sort(descending=True).values
    return float(values[1]) if len(values) > 1 else 0.0


def diameter(spec: str, workers: int) -> int:
    """Hops for information to reach every worker from any other (breadth-first search)."""
    best = 0
    for start in range(workers):
        dist = {start: 0}
        frontier = [start]
        while frontier:
            nxt = []
            for r in frontier:
                for n in neighbours(spec, workers, r):
                    if n not in dist:
                        dist[n] = dist[r] + 1
                        nxt.append(n)
            frontier = nxt
        best = max(best, max(dist.values()))
    return best


def colouring(spec: str, workers: int) -> list[int]:
    """A two-colouring (0 = active, 1 = passive) of the topology, or a ConfigError."""
    kind, h, w = parse(spec, workers)
    if workers == 1:
        return [0]
    colours = [(r // w + r % w) % 2 for r in range(workers)]
    ok = all(colours[r] != colours[n] for r in range(workers) for n in neighbours(spec, workers, r))
    if not ok:
        raise ConfigError(
            f"adpsgd needs a bipartite topology (active and passive workers alternate), but "
            f"topology={spec!r} with workers={workers} is not: use a ring with an even number "
            "of workers or a torus with even height and width"
        )
    return colours


def request_schedule(spec: str, workers: int, rank: int, steps: int, seed: int) -> list[int]:
    """The neighbour an active worker asks at each step: a pure function of (seed, rank)."""
    options = neighbours(spec, workers, rank)
    if not options:
        return []
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    return [options[i] for i in torch.randint(len(options), (steps,), generator=gen).tolist()]


def reachability(spec: str, workers: int, hops: int, source: int = 0) -> list[int]:
    """How many workers an update from ``source`` has reached after 1, 2, …, ``hops`` steps
    (``source`` included), if every step passes what a worker holds to its neighbours: the
    nonzero entries of row ``source`` of (I + A)^k, A the adjacency matrix."""
    reach = torch.eye(workers, dtype=torch.float64) + adjacency(spec, workers)
    power, reached = torch.eye(workers, dtype=torch.float64), []
    for _ in range(hops):
        power = (power @ reach).clamp(max=1.0)
        reached.append(int((power[source] > 0).sum()))
    return reached
