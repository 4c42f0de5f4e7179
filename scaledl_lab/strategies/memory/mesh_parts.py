"""Context and expert parallelism in the GPU plan (:mod:`.mesh_plan`): their bytes, their
time on the link their group crosses, and the groups the gradients are reduced over.

Context parallelism (``cp=C``) splits every sequence into C parts, one per member. Ring
attention (Liu et al. 2023) passes the key/value blocks round the ring: C − 1 blocks forward,
the C − 1 again and C travelling (dK, dV) backward (:func:`ring_bytes`), each block a message
on the cp group's link; the plan assumes each block travels while the attention core of the
block in hand runs (forward and backward: Narayanan et al.'s 12bs²h FLOPs a layer and
micro-batch, divided by C·T), so only what the transfers take beyond that compute is on the
critical path. Ulysses (Jacobs et al. 2023) runs four all-to-alls forward and four backward
(:func:`ulysses_bytes`), which nothing overlaps. Full recomputation runs the forward's
transfers again.

Expert parallelism (``ep=E``): each block's MLP is ``experts`` experts, ``top_k`` per token; an
``ep`` rank holds experts/ep of them, and each MoE layer runs two all-to-alls forward (dispatch
and combine) and two backward of the tokens' k copies (16-bit, h values each; a tp rank's
S/(C·T) positions with sequence parallelism, its S/C without), on the ep
group's link, not overlapped; full recomputation runs the forward's two again. As in the lab's
gpt-tiny-moe (:func:`scaledl_lab.strategies.mesh.experts.held_parameters`), every rank is a
data rank: the non-expert weights' gradients are reduced over dp × cp × ep, the experts' over
dp × cp.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...runtime.sim.cost import NetworkProfile, all_to_all_time
from ..mesh.grid import Mesh

CP_METHODS = ("ring", "ulysses")


def ring_bytes(batch: int, heads: int, sequence: int, members: int, d: int, size: int) -> int:
    """Bytes one member of ring attention sends in a forward and a backward: C − 1 key/value
    blocks forward; backward the C − 1 blocks again and C travelling (dK, dV), each block
    2·B·H·(S/C)·d elements."""
    block = 2 * batch * heads * (sequence // members) * d * size
    return (members - 1 + 2 * members - 1) * block if members > 1 else 0


def ulysses_bytes(batch: int, heads: int, sequence: int, members: int, d: int, size: int) -> int:
    """Bytes one member of Ulysses sends in a forward and a backward: four all-to-alls of
    B·H·(S/C)·d (Q, K, V stacked as three, the output as one) forward and four backward, each
    member keeping 1/C of each (:func:`~scaledl_lab.runtime.collectives.all_to_all_bytes`)."""
    mine = batch * heads * (sequence // members) * d * size
    return 8 * mine * (members - 1) // members


def context_layer_time(
    method: str, b: int, heads: int, s: int, cp: int, d: int, size: int,
    link: NetworkProfile, attention_s: float, full_recompute: bool,
) -> float:  # fmt: skip
    """The seconds one layer's context-parallel traffic adds to a micro-batch on one GPU (of
    ``heads`` heads of width ``d``): ring attention's blocks beyond the ``attention_s`` they
    hide behind, or Ulysses' eight all-to-alls (twelve with full recomputation)."""
    if cp <= 1:
        return 0.0
    if method == "ring":
        sent = ring_bytes(b, heads, s, cp, d, size)
        messages = 3 * cp - 2
        if full_recompute:  # the forward's C − 1 blocks again
            sent, messages = sent * (4 * cp - 3) // messages, 4 * cp - 3
        transfer = sent / link.bandwidth_Bps + messages * link.latency_s
        return max(0.0, transfer - attention_s)
    rounds = 12 if full_recompute else 8
    return rounds * all_to_all_time(b * heads * (s // cp) * d * size, cp, link)


def expert_layer_time(tokens: int, h: int, ep: int, size: int, link: NetworkProfile,
                      full_recompute: bool) -> float:  # fmt: skip
    """One MoE layer's all-to-alls for a micro-batch: ``tokens`` token copies (k per token)
    of h values each, two forward and two backward (six with full recomputation)."""
    rounds = 6 if full_recompute else 4
    return rounds * all_to_all_time(tokens * h * size, ep, link)


def group_over(mesh: Mesh, rank: int, names: Iterable[str]) -> tuple[int, ...]:
    """The ranks that differ from ``rank`` along ``names`` only (the product of their groups)."""
    ranks = {rank}
    for name in names:
        ranks = {r for q in ranks for r in mesh.group_of(q, name)}
    return tuple(sorted(ranks))
