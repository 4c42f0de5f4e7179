"""Every mesh of N GPUs for a transformer and a global batch (``scaledl-lab plan --search``):
each valid combination of dp (with its ZeRO stage), tp (within a node, dividing the heads), pp
(dividing the layers, with its schedule and virtual stages), the micro-batch size and
recomputation, planned by :mod:`.mesh_plan`; those that fit the GPU's memory ranked by
predicted step time (at a fixed global batch, the same order as MFU), those that do not with
what they need. Sequence parallelism is on wherever tp > 1 (the same bytes as tensor
parallelism's allreduces, the activations divided by tp); the mesh is written dp, pp, tp, so tp
is innermost (adjacent ranks, one node). Context parallelism (cp of :data:`CONTEXT_SIZES`
dividing the sequence, ring attention and, where cp divides each tp rank's heads, Ulysses) and,
for a model with experts, expert parallelism (every ep dividing them) join the mesh as
dp, pp, ep, cp, tp (:mod:`.mesh_parts`); ZeRO-3 is left out with either."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product

from ...errors import ConfigError
from ...runtime.sim.gpus import GPU
from .mesh_plan import RECOMPUTE, MeshPlan, MeshSetup, plan_mesh
from .transformer import Transformer

MICRO_BATCH_SIZES = (1, 2, 4, 8)
CONTEXT_SIZES = (1, 2, 4, 8)
VIRTUAL_STAGES = (2, 4)


@dataclass(frozen=True)
class Candidate:
    setup: MeshSetup
    plan: MeshPlan
    fits: bool

    @property
    def dims(self) -> tuple[int, int, int, int, int]:
        """(dp, tp, pp, cp, ep)."""
        sizes = dict(part.split("=") for part in self.setup.mesh.split(","))
        return tuple(int(sizes.get(d, 1)) for d in ("dp", "tp", "pp", "cp", "ep"))  # type: ignore[return-value]

    @property
    def micro_batch_size(self) -> int:
        dp, ep = self.dims[0], self.dims[4]
        return self.setup.global_batch_size // (dp * ep * self.setup.micro_batches)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _splits(m: Transformer, workers: int, gpus_per_node: int, experts: int):
    """(tp, pp, cp, ep, dp, cp's methods) of every mesh of ``workers`` GPUs."""
    for tp in (t for t in _divisors(workers) if t <= gpus_per_node and m.heads % t == 0):
        for pp in (p for p in _divisors(workers // tp) if m.layers % p == 0):
            rest = workers // (tp * pp)
            for cp in (c for c in CONTEXT_SIZES if rest % c == 0 and m.sequence % c == 0):
                methods = ("ring", "ulysses") if cp > 1 and (m.heads // tp) % cp == 0 else ("ring",)
                for ep in _divisors(rest // cp) if experts else (1,):
                    if experts % ep == 0:
                        yield tp, pp, cp, ep, rest // (cp * ep), methods


def setups(m: Transformer, workers: int, batch: int, gpus_per_node: int, experts: int = 0,
           top_k: int = 1) -> Iterator[MeshSetup]:  # fmt: skip
    """Every valid setup (the checks of :func:`.mesh_plan.check` hold for each)."""
    for tp, pp, cp, ep, dp, methods in _splits(m, workers, gpus_per_node, experts):
        if batch % (dp * ep):
            continue
        per_replica = batch // (dp * ep)
        mesh = f"dp={dp},pp={pp}" + (f",ep={ep}" if ep > 1 else "")
        mesh += (f",cp={cp}" if cp > 1 else "") + f",tp={tp}"
        zeros = (0,) if dp == 1 else (0, 1, 2) if cp * ep > 1 else range(4)
        for b in (b for b in MICRO_BATCH_SIZES if per_replica % b == 0):
            micro = per_replica // b
            schedules = [("1f1b", 1)]
            if pp > 1:
                schedules += [("gpipe", 1), ("zb-h1", 1)]
                schedules += [("interleaved-1f1b", v) for v in VIRTUAL_STAGES
                              if m.layers % (pp * v) == 0 and micro % pp == 0]  # fmt: skip
            for schedule, v in schedules:
                for recompute, zero, method in product(RECOMPUTE, zeros, methods):
                    yield MeshSetup(
                        mesh=mesh, global_batch_size=batch, micro_batches=micro,
                        schedule=schedule, virtual_stages=v, recompute=recompute,
                        sequence_parallel=tp > 1, zero_stage=zero,
                        gpus_per_node=gpus_per_node, cp_method=method, experts=experts,
                        top_k=top_k if experts else 1,
                    )  # fmt: skip


def search(m: Transformer, workers: int, batch: int, gpu: GPU, room: float | None = None,
           gpus_per_node: int | None = None, experts: int = 0,
           top_k: int = 1) -> list[Candidate]:  # fmt: skip
    """Every valid setup planned, the fastest first, those that fit before those that do not
    (the least memory first among them). ``room``: bytes per GPU (default: the GPU's)."""
    room = gpu.memory_bytes if room is None else room
    nodes = gpus_per_node or gpu.gpus_per_node
    found = []
    for setup in setups(m, workers, batch, nodes, experts, top_k):
        p = plan_mesh(m, setup, gpu, workers)
        found.append(Candidate(setup, p, p.memory <= room))
    if not found:
        raise ConfigError(
            f"no mesh of {workers} GPUs can run this transformer with a global batch of {batch}: "
            f"no tp (≤ {nodes} per node) divides its {m.heads} heads, with a pp dividing its "
            f"{m.layers} layers, a cp of {CONTEXT_SIZES[1:]} dividing its sequence of {m.sequence} "
            "or none, and a dp dividing the batch"
        )
    return sorted(found, key=lambda c: (not c.fits, c.plan.step_s if c.fits else c.plan.memory))


def best_per_mesh(found: list[Candidate]) -> list[Candidate]:
    """The fastest fitting setup of each (dp, tp, pp), fastest first."""
    seen: dict[tuple[int, int, int], Candidate] = {}
    for c in found:
        if c.fits and c.dims not in seen:
            seen[c.dims] = c
    return list(seen.values())


def refusal(found: list[Candidate], workers: int, gpu: GPU, room: float) -> str:
    """What the setup that needs the least memory needs, when none fits."""
    least = min(found, key=lambda c: c.plan.memory)
    p, s = least.plan, least.setup
    return (
        f"no mesh of {workers} {gpu.name} fits in {room / 1e9:.3f} GB per GPU: the least "
        f"memory, {p.memory / 1e9:.3f} GB ({(p.memory - room) / 1e9:.3f} GB over), is mesh "
        f"{s.mesh}, ZeRO stage {s.zero_stage}, recompute {s.recompute}, micro-batches of "
        f"{least.micro_batch_size}: parameters {p.params / 1e9:.3f}, gradients "
        f"{p.grads / 1e9:.3f}, optimiser state {p.optim / 1e9:.3f}, activations "
        f"{p.activations / 1e9:.3f} GB"
    )
