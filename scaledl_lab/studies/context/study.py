"""The measurements behind context parallelism's claims, each read from runs on the simulator.

- :func:`memory_table`: gpt-tiny on a ``cp=C`` mesh, the memory ledger of one rank per C and
  method (what falls as 1/C: the activations; what does not: the weights, their gradients and
  the optimiser's state, whole on every member, the position embedding's S rows among them).
- :func:`overlap_table`: ring attention's forward alone, C members on one link, its compute
  charged per unmasked score at a device's rate, the step timed on the link and on a free one:
  a transfer hides behind the block in hand when the block's attention takes longer
  (compute(block) ≥ transfer(block), Liu et al. 2023), and the time then is the compute's.
- :func:`traffic_table`: ring attention and Ulysses, forward and backward, at (S, C) growing
  together: the bytes each member sent, as its ``Comm`` recorded them, beside the formulas
  (:func:`ring_bytes`, :func:`ulysses_bytes`), and the attention scores each member computed
  on the zig-zag and the plain split (the causal work, ``saved["scores"]``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from ...config import ExperimentConfig
from ...experiment import run
from ...runtime.sim.cost import DEVICES, ComputeProfile, CostModel, NetworkProfile
from ...runtime.sim.network import NETWORKS
from ...runtime.sim.scheduler import SimWorld
from ...strategies.memory.mesh_parts import ring_bytes, ulysses_bytes
from ...strategies.mesh.context import (
    Split,
    attention,
    causal_mask,
    scores,
    ulysses_attention,
    ulysses_backward,
)
from ...strategies.mesh.ring import ring_attention, ring_backward
from ...strategies.mesh.view import GroupComm

# gpt-tiny on the licenses corpus, as the mesh's tests train it (float32: the ledger's bytes)
GPT_TINY = dict(
    strategy="mesh", runtime="sim", dataset="licenses", model="gpt-tiny", train_subset=64,
    val_size=8, test_subset=8, batch_size=8, epochs=1, max_steps=1, lr=0.05, momentum=0.9,
    precision="float32", seed=1,
)  # fmt: skip
METHODS = ("ring", "ulysses")
POINTS = ((32, 2), (64, 4), (128, 8))  # (S, C): the sequence grows with the members
DEVICE = "h100"  # the compute rate ring attention's blocks are charged at (DEVICES)
# an H100 node's two links: NVLink inside the node, InfiniBand between nodes
LINKS = (NETWORKS["h100-node"].intra, NETWORKS["h100-node"].inter)
FREE = NetworkProfile("free", 0.0, 1e18)
BYTES = 4  # float32


def gpt_tiny_config(method: str, cp: int, **extra: Any) -> ExperimentConfig:
    """gpt-tiny on a ``cp=C`` mesh of the study (:data:`GPT_TINY`)."""
    return ExperimentConfig(**{**GPT_TINY, **extra}, mesh=f"cp={cp}", workers=cp, cp_method=method)


def memory_table(cps: Sequence[int] = (1, 2, 4), methods: Sequence[str] = METHODS) -> pd.DataFrame:
    """One row per method and C: rank 0's ledger after a step of gpt-tiny (bytes), and each
    part against the unsplit mesh's times C (1 where it falls as 1/C, C where it does not);
    the bytes it sent in the step (the metrics' ``bytes_sent``)."""
    rows = []
    for method in methods:
        for cp in cps:
            train = run(gpt_tiny_config(method, cp), progress=False, log=None).frame
            last = train[(train["kind"] == "train") & (train["rank"] == 0)].iloc[-1]
            rows.append({"method": method, "cp": cp, "params": last.mem_params,
                         "grads": last.mem_grads, "optim": last.mem_optim,
                         "activations": last.mem_activations,
                         "bytes_sent": last.bytes_sent})  # fmt: skip
    table = pd.DataFrame(rows)
    for part in ("params", "grads", "optim", "activations"):
        whole = table.groupby("method")[part].transform(lambda s: s.iloc[0])
        table[f"{part}_times_c"] = table[part] * table["cp"] / whole
    return table


def attention_run(
    method: str, sequence: int, members: int, *, zigzag: bool = True, heads: int = 8, d: int = 8,
    backward: bool = True, cost: CostModel | None = None, charge_per_score: bool = False,
) -> list[dict[str, float]]:  # fmt: skip
    """Causal attention over ``members`` simulated ranks (batch 1, float32, seeded): per rank
    the bytes it sent, the scores it computed and its clock at the end of the forward and of
    the backward. ``charge_per_score``: the ring's blocks charged one compute sample a score."""
    cost = cost or CostModel(ComputeProfile("free", 0.0, 1e-30), FREE)
    split, found = Split(sequence, members, zigzag), {}
    gen = torch.Generator().manual_seed(0)
    qkv = torch.randn(3, 1, heads, sequence, d, generator=gen)
    grad = torch.randn(1, heads, sequence, d, generator=gen)

    async def program(comm: Any) -> None:
        group = GroupComm(comm, tuple(range(members)))
        q, k, v = (split.take(t, group.rank, 2) for t in qkv)
        extra = {"charge": lambda n: comm.compute(n, 1.0)} if charge_per_score else {}
        if method == "ring":
            out, saved = await ring_attention(group, q, k, v, split, True, **extra)
        else:
            out, saved = await ulysses_attention(group, q, k, v, split, True)
        forward_s, forward_b = comm.now(), comm.bytes_sent
        if backward:
            g = split.take(grad, group.rank, 2)
            if method == "ring":
                await ring_backward(group, saved, g, split, True, **extra)
            else:
                await ulysses_backward(group, saved, g, split)
        found[comm.rank] = {"forward_s": forward_s, "forward_bytes": forward_b,
                            "step_s": comm.now(), "bytes_sent": comm.bytes_sent,
                            "scores": saved["scores"]}  # fmt: skip

    SimWorld(members, cost).run([program] * members)
    return [found[r] for r in range(members)]


def split_against_full(
    method: str, sequence: int, members: int, heads: int = 4, d: int = 4, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of one seeded batch (float64) over ``members`` simulated ranks, the
    members' outputs put back in sequence order, and full attention on one process."""
    split, found = Split(sequence, members, zigzag=method == "ring"), {}
    gen = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, 1, heads, sequence, d, generator=gen, dtype=torch.float64)
    attend = ring_attention if method == "ring" else ulysses_attention

    async def program(comm: Any) -> None:
        group = GroupComm(comm, tuple(range(members)))
        mine = (split.take(t, group.rank, 2) for t in (q, k, v))
        found[comm.rank] = (await attend(group, *mine, split, True))[0]

    SimWorld(members, CostModel(ComputeProfile("free", 0.0, 1e-30), FREE)).run([program] * members)
    joined = torch.cat([found[r] for r in range(members)], dim=2)
    everything = torch.arange(sequence)
    full = attention(q, k, v, causal_mask(everything, everything))
    return joined.index_select(2, split.order()), full


def traffic_table(points: Sequence[tuple[int, int]] = POINTS, heads: int = 8, d: int = 8):
    """Per (S, C) and method: the bytes member 0 sent in a forward and backward of causal
    attention, the formula's, and both per 2·B·H·(S/C)·d·4 (one key/value block)."""
    rows = []
    for sequence, members in points:
        for method, formula in (("ring", ring_bytes), ("ulysses", ulysses_bytes)):
            got = attention_run(method, sequence, members, heads=heads, d=d)
            sent, block = [r["bytes_sent"] for r in got], 2 * heads * (sequence // members) * d
            predicted = formula(1, heads, sequence, members, d, BYTES)
            rows.append({"method": method, "sequence": sequence, "cp": members,
                         "bytes_sent": sent[0], "formula": predicted,
                         "ranks_alike": len(set(sent)) == 1,
                         "per_block": sent[0] / (block * BYTES)})  # fmt: skip
    return pd.DataFrame(rows)


def work_table(points: Sequence[tuple[int, int]] = POINTS, heads: int = 8, d: int = 8):
    """Per (S, C), split and member: the causal attention scores ring attention computed (the
    ring's own count), and the max/min over the members against 2C − 1."""
    rows = []
    for sequence, members in points:
        for zigzag in (True, False):
            got = attention_run("ring", sequence, members, zigzag=zigzag, heads=heads, d=d,
                                 backward=False)  # fmt: skip
            counted = [int(r["scores"]) for r in got]
            for rank, n in enumerate(counted):
                rows.append({"sequence": sequence, "cp": members,
                             "split": "zig-zag" if zigzag else "plain", "rank": rank,
                             "scores": n, "max_over_min": max(counted) / min(counted),
                             "two_c_minus_one": 2 * members - 1})  # fmt: skip
    return pd.DataFrame(rows)


def step_costs(per_member: int, members: int, link: NetworkProfile, heads: int, d: int):
    """(compute of each of the ring's C steps, transfer) in seconds for member 0 on the
    zig-zag split: each block's unmasked scores at :data:`DEVICE`'s rate (4d FLOPs a score:
    QKᵀ and P·V; step 0 its own block, then the others' as they come round), and one
    key/value block on ``link`` (its latency included)."""
    split = Split(per_member * members, members)
    mine = split.positions(0)
    computes = [scores(mine, split.positions(-t % members), True) * heads * 4 * d / DEVICES[DEVICE]
                for t in range(members)]  # fmt: skip
    transfer = 2 * heads * per_member * d * BYTES / link.bandwidth_Bps + link.latency_s
    return computes, transfer


def overlap_table(
    per_member: Sequence[int] = (256, 1024, 4096), members: int = 4,
    links: Sequence[NetworkProfile] = LINKS, heads: int = 1, d: int = 128,
) -> pd.DataFrame:  # fmt: skip
    """Per S/C and link: ring attention's forward timed on the simulator on the link and on a
    free one; the off-diagonal block's compute and transfer (:func:`step_costs`), and the
    forward's time if the transfers overlap the blocks (each of the C − 1 steps that send takes
    the longer of its block and the transfer) and if none did (serial: the blocks, then the
    transfers). The backward timed too, on the link and on the free one (``backward_*``), and
    against the free link's time plus one transfer (``backward_beyond_home``): the last hop of
    the key/value gradients home, which no block's work is left to hide."""
    compute = ComputeProfile(f"{DEVICE}:attention", 0.0, 4 * d / DEVICES[DEVICE])
    rows = []
    for n in per_member:
        sequence = n * members

        def timed(link: NetworkProfile, sequence: int = sequence) -> tuple[float, float]:
            got = attention_run("ring", sequence, members, heads=heads, d=d,
                                cost=CostModel(compute, link), charge_per_score=True)  # fmt: skip
            forward = max(r["forward_s"] for r in got)
            return forward, max(r["step_s"] for r in got) - forward

        free, free_back = timed(FREE)
        for link in links:
            xs, t = step_costs(n, members, link, heads, d)
            x = min(xs[:-1])  # the smallest block that has a transfer to hide
            measured, back = timed(link)
            rows.append({"per_member": n, "sequence": sequence, "cp": members, "link": link.name,
                         "compute_block_s": x, "transfer_block_s": t, "hidden_by_rule": x >= t,
                         "free_s": free, "measured_s": measured,
                         "overlapped_s": sum(max(c, t) for c in xs[:-1]) + xs[-1],
                         "serial_s": sum(xs) + (members - 1) * t,
                         "backward_free_s": free_back, "backward_measured_s": back})  # fmt: skip
    table = pd.DataFrame(rows)
    table["exposed"] = table["measured_s"] / table["free_s"] - 1
    table["backward_exposed"] = table["backward_measured_s"] / table["backward_free_s"] - 1
    home = table["backward_free_s"] + table["transfer_block_s"]
    table["backward_beyond_home"] = table["backward_measured_s"] / home - 1
    return table
