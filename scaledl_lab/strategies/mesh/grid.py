"""The device mesh: ranks laid out on a grid of named dimensions, as ``torch.distributed``'s
``DeviceMesh`` and picotron's process-group grid lay them out, and each dimension's groups.

``dp=2,tp=2,pp=2`` puts 8 ranks on a 2 × 2 × 2 grid; the last name is the innermost (adjacent
ranks differ in it: rank = Σ coordinate · stride, the last stride 1), so ``tp`` last keeps a
tensor-parallel group on neighbouring ranks, inside one node. A rank's group along a dimension is
the ranks that differ from it in that coordinate only, sorted, so a member's place in its group
is its coordinate (stage k of a pipeline is the k-th member of its ``pp`` group). Pure functions
of the text and the rank: every rank computes every group alike, with no communication.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ...errors import ConfigError

# data (ZeRO), tensor/sequence, pipeline, context, expert (gpt-tiny-moe's experts on data ranks)
DIMENSIONS = ("dp", "tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class Mesh:
    """Named dimensions and their sizes, outermost first (a name not given has size 1)."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> Mesh:
        """``"dp=2,tp=2,pp=2"`` → the mesh; a ConfigError names what is wrong with the text."""
        if not isinstance(text, str) or not text.strip():
            raise ConfigError(
                f"mesh={text!r} must name the dimensions and their sizes, e.g. 'dp=2,tp=2,pp=2'"
            )
        names: list[str] = []
        sizes: list[int] = []
        for part in text.split(","):
            name, _, size = part.strip().partition("=")
            name = name.strip()
            if name not in DIMENSIONS:
                raise ConfigError(
                    f"mesh={text!r}: unknown dimension {name!r}; the mesh's dimensions are "
                    f"{', '.join(DIMENSIONS)} (as dp=2,tp=2,pp=2)"
                )
            if name in names:
                raise ConfigError(f"mesh={text!r} names {name!r} twice; name each dimension once")
            if not size.strip().isdigit() or int(size) < 1:
                raise ConfigError(
                    f"mesh={text!r}: {name}={size.strip()!r} must be a positive integer"
                )
            names.append(name)
            sizes.append(int(size))
        return cls(tuple(names), tuple(sizes))

    @property
    def world_size(self) -> int:
        return math.prod(self.sizes)

    def size(self, name: str) -> int:
        return self.sizes[self.names.index(name)] if name in self.names else 1

    def _stride(self, name: str) -> int:
        return math.prod(self.sizes[self.names.index(name) + 1 :])

    def coordinate(self, rank: int, name: str) -> int:
        """``rank``'s place along ``name`` (0 for a dimension of size 1)."""
        if name not in self.names:
            return 0
        return rank // self._stride(name) % self.size(name)

    def group_of(self, rank: int, name: str) -> tuple[int, ...]:
        """The ranks that differ from ``rank`` along ``name`` only, in coordinate order."""
        if name not in self.names:
            return (rank,)
        stride = self._stride(name)
        first = rank - self.coordinate(rank, name) * stride
        return tuple(first + k * stride for k in range(self.size(name)))

    def groups(self, name: str) -> list[tuple[int, ...]]:
        """Every group along ``name``, each once, in the order of their smallest rank."""
        return list(_groups(self, name))

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.names, self.sizes, strict=True))


@functools.cache
def _groups(mesh: Mesh, name: str) -> tuple[tuple[int, ...], ...]:
    """:meth:`Mesh.groups`, computed once per mesh: every rank asks for every group."""
    seen: dict[tuple[int, ...], None] = {}
    for rank in range(mesh.world_size):
        seen.setdefault(mesh.group_of(rank, name), None)
    return tuple(seen)
