"""Gossip SGD: D-PSGD (Lian et al. 2017) and asynchronous pairwise gossip (AD-PSGD, 2018).

``dpsgd``: every step each worker sends its weights to its neighbours and takes the weighted
average with the topology's mixing matrix W, minus its own gradient computed at the old point:
x_i ← Σ_j W_ij x_j − lr·∇F_i(x_i). The exchange overlaps the gradient computation.
``gossip_average`` is that averaging alone, usable on any tensors (the tests check it keeps
the mean, equals the allreduce mean on a complete graph and shrinks the disagreement by W's
second eigenvalue per round).

``adpsgd``: the bipartite active/passive scheme of Lian et al. 2018. The topology is coloured in
two (ring with an even number of workers, torus with even sides); an *active* worker picks one
neighbour per step (seeded RNG), sends it its weights and, while it computes its gradient,
waits for that neighbour's reply; both then hold the pair's average (x_a + x_p) / 2, an atomic
pairwise averaging that keeps the global mean. A *passive* worker never waits during an epoch:
after computing its gradient it serves the requests that have arrived, then steps. The request
schedule is a pure function of (seed, rank), so a passive worker knows how many requests each
neighbour will send; at an epoch boundary it serves, in (step, rank) order, the requests of
steps before the boundary. Blocking waits therefore only ever point from a request to an
earlier one, so no cycle of waits (no deadlock) can form on gloo's rendezvous sends.

Rows: ``kind="train"`` per worker per step (``bytes_sent`` of that step), and the consensus and
evaluation rows of every decentralised method (:mod:`.replicas`).
"""

from __future__ import annotations

import torch
from torch import nn

from ... import topology
from ...errors import PeerLostError
from ...params import load_state_vector, state_vector
from ...runtime.base import Comm, Incoming, Pending
from ...training.snapshots import save_if_due, start_or_resume
from ...training.worker import WorkerContext, lr_of
from ..compression.gossip import CompressedGossip
from ..compression.messages import spec_of
from ..registry import register
from .replicas import finish, finish_step, local_gradient

# -- gossip averaging -----------------------------------------------------------------------


class GossipRound:
    """One round of x_i ← Σ_j W_ij x_j, started now (sends posted) and finished later.

    Neighbours known to have died are left out, and so is one found dead while waiting for its
    weights; the row of W is then renormalised over the survivors (it sums to 1 again).
    ``owned``: ``flat`` is the round's and nobody changes it until :meth:`finish` (no copy)."""

    def __init__(self, comm: Comm, flat: torch.Tensor, spec: str, *, owned: bool = False) -> None:
        self.comm = comm
        everyone = topology.neighbours(spec, comm.world_size, comm.rank)
        lost = comm.lost_peers()
        self.neighbours = [j for j in everyone if j not in lost]
        self.dropped = len(self.neighbours) < len(everyone)
        row = topology.mixing_matrix(spec, comm.world_size)[comm.rank]
        self.weights = [float(row[comm.rank])] + [float(row[j]) for j in self.neighbours]
        # Private (the sends read it until waited): a copy, unless the caller gives it away.
        self.sent = flat.detach() if owned else flat.detach().clone()
        self.buffers = [torch.empty_like(self.sent) for _ in self.neighbours]
        # Receives first, then sends: every worker's sends find their peer's receive posted.
        self.incoming: list[Incoming] = [
            comm.irecv(b, j) for b, j in zip(self.buffers, self.neighbours, strict=True)
        ]
        self.sends: list[Pending] = [comm.isend(self.sent, j) for j in self.neighbours]

    async def finish(self) -> torch.Tensor:
        """The mixed vector: own weight first, then the neighbours in topology order."""
        out = self.sent * self.weights[0]
        total = self.weights[0]
        for w, incoming in zip(self.weights[1:], self.incoming, strict=True):
            try:
                out.add_(await incoming.wait(), alpha=w)
                total += w
            except PeerLostError:
                self.dropped = True
        for pending in self.sends:
            await pending.wait()
        return out / total if self.dropped else out


async def gossip_average(comm: Comm, flat: torch.Tensor, spec: str) -> torch.Tensor:
    """One synchronous gossip round with the mixing matrix of ``spec``; returns a new tensor.

    Every worker must call it the same number of times (it is a neighbourhood collective).
    """
    return await GossipRound(comm, flat, spec).finish()


def simulate_gossip(
    spec: str, workers: int, rounds: int, *, numel: int = 32, seed: int = 0
) -> list[torch.Tensor]:
    """Gossip rounds alone, on seeded random float64 vectors, on the simulated runtime.

    Returns the workers' stacked vectors (workers × numel) before each round and after the
    last: the disagreement ``(X − mean).norm()`` shrinks by W's second eigenvalue per round.
    """
    from ...runtime.sim.cost import ComputeProfile, CostModel, NetworkProfile, Stragglers
    from ...runtime.sim.scheduler import SimWorld

    gen = torch.Generator().manual_seed(seed)
    start = torch.randn(workers, numel, generator=gen, dtype=torch.float64)
    history: list[list[torch.Tensor]] = [[] for _ in range(rounds + 1)]

    async def program(comm: Comm) -> None:
        x = start[comm.rank].clone()
        history[0].append(x)
        for k in range(rounds):
            x = await gossip_average(comm, x, spec)
            history[k + 1].append(x)

    cost = CostModel(
        ComputeProfile("gossip", 0.0, 1e-9),
        NetworkProfile("gossip", 1e-6, 1e9),
        "ring",
        Stragglers(),
    )
    SimWorld(workers, cost).run([program] * workers)
    return [torch.stack(h) for h in history]


# -- D-PSGD ---------------------------------------------------------------------------------


@register(
    "dpsgd",
    "decentralised SGD: gossip-average weights with the topology's mixing matrix each step",
    # Compressed rounds keep public copies of every neighbour: no renormalising those yet.
    tolerates_worker_loss=lambda cfg: cfg.compress == "none",
)
async def train_dpsgd(ctx: WorkerContext) -> None:
    """D-PSGD (Lian et al. 2017, Algorithm 1), one worker."""
    cfg, comm = ctx.config, ctx.comm
    spec = cfg.resolved_topology
    model, optimizer, step = await start_or_resume(ctx)  # step > 0: a resumed run
    compression = spec_of(cfg)  # compressed: the changes of x_i travel (compressed_gossip)
    compressed = CompressedGossip(ctx, model, compression) if compression else None
    scores: dict[str, float] = ctx.resume["extra"]["scores"] if ctx.resume else {}
    for x, y in ctx.local_batches(step):
        sent_before = comm.bytes_sent
        # Send x_i to the neighbours, and compute ∇F_i(x_i) while the weights travel.
        flat = state_vector(model)
        exchange = (
            compressed.start(flat) if compressed else GossipRound(comm, flat, spec, owned=True)
        )
        stats = await local_gradient(ctx, model, optimizer, x, y, step=step, apply=False)
        load_state_vector(model, await exchange.finish())
        optimizer.step()  # x_i ← Σ_j W_ij x_j − lr·∇F_i(x_i, old)
        step += 1
        scores = await finish_step(ctx, model, step, stats, scores, sent_before, lr_of(optimizer))
        await save_if_due(ctx, step, model, optimizer, extra={"scores": scores})
    await finish(ctx, model, scores)


# -- AD-PSGD (bipartite active/passive) ----------------------------------------------------


class _Passive:
    """A passive worker's side: the requests it will get, served now (ready) or in order."""

    def __init__(
        self, ctx: WorkerContext, model: nn.Module, spec: str, colours: list[int], last: int
    ) -> None:
        comm = ctx.comm
        self.comm, self.model = comm, model
        self.expected: list[tuple[int, int]] = []  # (step, active rank), in serving order
        for a in topology.neighbours(spec, comm.world_size, comm.rank):
            if colours[a] == 0:
                schedule = topology.request_schedule(
                    spec, comm.world_size, a, last, ctx.config.seed
                )
                self.expected += [(k, a) for k, p in enumerate(schedule) if p == comm.rank]
        self.expected.sort()
        self.served: set[tuple[int, int]] = set()
        self.todo: dict[int, list[int]] = {}  # active rank -> its request steps, in order
        for k, a in self.expected:
            self.todo.setdefault(a, []).append(k)
        size = state_vector(model).numel()
        dtype = next(model.parameters()).dtype
        self.buffers = {a: torch.empty(size, dtype=dtype) for a in self.todo}
        self.gone: set[int] = set()  # active neighbours that died: no more requests from them
        self.posted: dict[int, Incoming] = {a: comm.irecv(self.buffers[a], a) for a in self.todo}
        self.replies: list[Pending] = []

    def _serve(self, a: int) -> None:
        """Reply with the current weights and take the pair's average (x_a + x_p) / 2."""
        mine = state_vector(self.model)
        self.replies.append(self.comm.isend(mine, a))
        load_state_vector(self.model, (mine + self.buffers[a]) / 2)
        self.served.add((self.todo[a].pop(0), a))
        if self.todo[a]:
            self.posted[a] = self.comm.irecv(self.buffers[a], a)

    def serve_ready(self) -> None:
        for a in self.todo:
            while self.todo[a] and self.posted[a].ready():
                self._serve(a)

    async def serve_until(self, boundary: int) -> None:
        """Serve every request of a step before ``boundary``, in (step, rank) order."""
        for k, a in self.expected:
            if k >= boundary:
                break
            if (k, a) not in self.served and a not in self.gone:
                # a's requests arrive in order and (k, a) is a's earliest unserved one.
                try:
                    await self.posted[a].wait()
                except PeerLostError:
                    self.gone.add(a)
                    self.todo[a] = []
                    continue
                self._serve(a)
        for pending in self.replies:  # each active posted its receive before asking
            await pending.wait()
        self.replies.clear()


@register(
    "adpsgd",
    "asynchronous pairwise gossip (bipartite active/passive AD-PSGD)",
    tolerates_worker_loss=True,
)
async def train_adpsgd(ctx: WorkerContext) -> None:
    """AD-PSGD (Lian et al. 2018), bipartite active/passive variant, one worker."""
    cfg, comm = ctx.config, ctx.comm
    spec = cfg.resolved_topology
    colours = topology.colouring(spec, comm.world_size)
    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    last = ctx.total_steps
    active = colours[comm.rank] == 0
    schedule = topology.request_schedule(spec, comm.world_size, comm.rank, last, cfg.seed)
    passive = None if active else _Passive(ctx, model, spec, colours, last)
    await ctx.evaluate_shared(model, epoch=0.0, step=0)
    scores: dict[str, float] = {}
    step = 0
    for x, y in ctx.local_batches():
        sent_before = comm.bytes_sent
        if active and schedule:
            partner = schedule[step]
            mine = state_vector(model)
            reply = torch.empty_like(mine)
            alive = partner not in comm.lost_peers()
            incoming = comm.irecv(reply, partner) if alive else None  # posted before asking
            request = comm.isend(mine, partner) if alive else None
            stats = await local_gradient(ctx, model, optimizer, x, y, step=step, apply=False)
            if incoming is not None and request is not None:
                try:  # a partner that died keeps no pair: this worker goes on alone
                    load_state_vector(model, (mine + await incoming.wait()) / 2)
                except PeerLostError:
                    pass
                await request.wait()
        else:
            stats = await local_gradient(ctx, model, optimizer, x, y, step=step, apply=False)
            if passive is not None:
                passive.serve_ready()
        optimizer.step()  # the gradient taken at the weights before averaging
        step += 1
        if passive is not None and ctx.is_boundary(step):
            await passive.serve_until(step)  # before the collectives of the boundary
        scores = await finish_step(ctx, model, step, stats, scores, sent_before, lr_of(optimizer))
    await finish(ctx, model, scores)
