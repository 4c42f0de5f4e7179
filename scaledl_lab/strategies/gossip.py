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

Helpers shared by the decentralised family (NNT, local SGD) live here too: a model's weights as
one flat vector, the consensus distance, and the per-worker evaluation.

Rows: ``kind="train"`` per worker per step (``bytes_sent`` of that step); at each epoch boundary
``kind="consensus"`` on rank 0 with the consensus distance (1/N) Σ_i ||x_i − x̄||² in the
``loss`` column, and ``kind="val"``/``"test"`` from every worker for its own model.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import topology
from ..config import ConfigError
from ..runtime.base import Comm, Incoming, Pending, Row
from ..worker import WorkerContext, check_finite
from . import Strategy, register

# -- the model as one flat vector -------------------------------------------------------------


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Parameters, then floating-point buffers (BatchNorm statistics): what gets averaged."""
    tensors = [p.data for p in model.parameters()]
    tensors += [b for b in model.buffers() if b.is_floating_point()]
    return tensors


def state_vector(model: nn.Module) -> torch.Tensor:
    """A private flat copy of the model's weights (parameters and floating buffers)."""
    return torch.cat([t.reshape(-1) for t in _state_tensors(model)])


def load_state_vector(model: nn.Module, flat: torch.Tensor) -> None:
    """Write ``flat`` (from :func:`state_vector`) back into the model, in place."""
    offset = 0
    for t in _state_tensors(model):
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def total_steps(ctx: WorkerContext) -> int:
    """Steps every worker takes: all shards have the same length, so this is the same on all."""
    steps = ctx.config.epochs * ctx.steps_per_epoch
    return min(steps, ctx.config.max_steps) if ctx.config.max_steps is not None else steps


def local_batches(
    ctx: WorkerContext, last: int
) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(epoch, x, y)`` of this worker's first ``last`` mini-batches, epoch after epoch."""
    taken = 0
    for epoch in range(ctx.config.epochs):
        for x, y in ctx.batches(epoch):
            if taken >= last:
                return
            taken += 1
            yield epoch, x, y


def is_boundary(ctx: WorkerContext, step: int, last: int) -> bool:
    return step % ctx.steps_per_epoch == 0 or step == last


# -- gossip averaging -----------------------------------------------------------------------


class GossipRound:
    """One round of x_i ← Σ_j W_ij x_j, started now (sends posted) and finished later."""

    def __init__(self, comm: Comm, flat: torch.Tensor, spec: str) -> None:
        self.comm = comm
        self.neighbours = topology.neighbours(spec, comm.world_size, comm.rank)
        row = topology.mixing_matrix(spec, comm.world_size)[comm.rank]
        self.weights = [float(row[comm.rank])] + [float(row[j]) for j in self.neighbours]
        self.sent = flat.detach().clone()  # private: the sends read it until waited
        self.buffers = [torch.empty_like(self.sent) for _ in self.neighbours]
        # Receives first, then sends: every worker's sends find their peer's receive posted.
        self.incoming: list[Incoming] = [
            comm.irecv(b, j) for b, j in zip(self.buffers, self.neighbours, strict=True)
        ]
        self.sends: list[Pending] = [comm.isend(self.sent, j) for j in self.neighbours]

    async def finish(self) -> torch.Tensor:
        """The mixed vector: own weight first, then the neighbours in topology order."""
        out = self.sent * self.weights[0]
        for w, incoming in zip(self.weights[1:], self.incoming, strict=True):
            out.add_(await incoming.wait(), alpha=w)
        for pending in self.sends:
            await pending.wait()
        return out


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
    from ..cost import ComputeProfile, CostModel, NetworkProfile, Stragglers
    from ..runtime.sim import SimWorld

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


async def consensus_distance(comm: Comm, flat: torch.Tensor) -> float:
    """(1/N) Σ_i ||x_i − x̄||²: how far the workers' weights are from their average (collective)."""
    mean = flat.detach().to(torch.float64).clone()
    await comm.allreduce(mean)
    mean /= comm.world_size
    distance = ((flat.detach().to(torch.float64) - mean) ** 2).sum().reshape(1)
    await comm.allreduce(distance)
    return distance.item() / comm.world_size


# -- shared pieces of a decentralised worker ---------------------------------------------------


async def local_gradient(
    ctx: WorkerContext,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epoch: int,
    step: int,
    apply: bool,
) -> tuple[float, int]:
    """Forward and backward on this worker's batch (and the local update when ``apply``)."""
    async with ctx.comm.compute(len(y)):
        optimizer.zero_grad()
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        if apply:
            optimizer.step()
    value = loss.item()
    check_finite(value, rank=ctx.rank, epoch=epoch, step=step)
    return value, int((out.argmax(1) == y).sum().item())


def log_train(
    ctx: WorkerContext,
    *,
    step: int,
    loss: float,
    correct: int,
    samples: int,
    sent: int,
    lr: float,
    staleness: float = math.nan,
) -> None:
    ctx.log(
        Row(
            kind="train",
            epoch=ctx.progress(step),
            step=step,
            time=ctx.comm.now(),
            loss=loss,
            accuracy=correct / samples,
            samples=samples,
            bytes_sent=sent,
            staleness=staleness,
            lr=lr,
        )
    )


async def log_consensus(ctx: WorkerContext, model: nn.Module, step: int) -> float:
    """Collective: the consensus distance, recorded by rank 0 as a ``kind="consensus"`` row."""
    sent_before = ctx.comm.bytes_sent
    distance = await consensus_distance(ctx.comm, state_vector(model))
    if ctx.comm.is_root:
        ctx.log(
            Row(
                kind="consensus",
                epoch=ctx.progress(step),
                step=step,
                time=ctx.comm.now(),
                loss=distance,
                accuracy=math.nan,
                samples=0,
                bytes_sent=ctx.comm.bytes_sent - sent_before,
            )
        )
    return distance


async def gather_scores(comm: Comm, value: float) -> list[float]:
    """Every worker's ``value`` (collective: a one-hot vector summed by an allreduce)."""
    vec = torch.zeros(comm.world_size, dtype=torch.float64)
    vec[comm.rank] = value
    await comm.allreduce(vec)
    return vec.tolist()


async def finish_decentralised(ctx: WorkerContext, model: nn.Module, scores: dict[str, float]):
    """Final bookkeeping: every worker's val/test accuracy, the best-on-val worker, the spread.

    ``scores`` is this worker's final ``evaluate_local`` result. The best worker is chosen on
    the validation split (FAST chose on the test split; we keep test for reporting).
    """
    val = await gather_scores(ctx.comm, scores.get("val", math.nan))
    test = await gather_scores(ctx.comm, scores.get("test", math.nan))
    ctx.result.update(summarise_workers(val, test))
    ctx.result["val_accuracy"] = scores.get("val", math.nan)
    ctx.result["test_accuracy"] = scores.get("test", math.nan)
    ctx.result["state_dict"] = {k: v.detach().cpu() for k, v in model.state_dict().items()}


def summarise_workers(val: list[float], test: list[float]) -> dict[str, Any]:
    """Best worker on validation (lowest rank on ties), its test accuracy, and the spread."""
    ranked = [v if not math.isnan(v) else -math.inf for v in val]
    best = max(range(len(val)), key=lambda r: (ranked[r], -r))
    t = torch.tensor(test, dtype=torch.float64)
    return {
        "worker_val_accuracy": list(val),
        "worker_test_accuracy": list(test),
        "best_rank": best,
        "best_test_accuracy": test[best],
        "mean_test_accuracy": float(t.mean()),
        "std_test_accuracy": float(t.std(unbiased=False)),
        "min_test_accuracy": float(t.min()),
        "max_test_accuracy": float(t.max()),
    }


async def epoch_end(ctx: WorkerContext, model: nn.Module, step: int) -> dict[str, float]:
    """At an epoch boundary (all workers at the same step count): consensus, then each
    worker scores its own model on val and test (rows with its rank)."""
    await log_consensus(ctx, model, step)
    return await ctx.evaluate_local(model, epoch=ctx.progress(step), step=step)


# -- D-PSGD ---------------------------------------------------------------------------------


async def train_dpsgd(ctx: WorkerContext) -> None:
    """D-PSGD (Lian et al. 2017, Algorithm 1), one worker."""
    cfg, comm = ctx.config, ctx.comm
    spec = cfg.resolved_topology
    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    last = total_steps(ctx)
    await ctx.evaluate_shared(model, epoch=0.0, step=0)
    scores: dict[str, float] = {}
    step = 0
    for epoch, x, y in local_batches(ctx, last):
        sent_before = comm.bytes_sent
        # Send x_i to the neighbours, and compute ∇F_i(x_i) while the weights travel.
        exchange = GossipRound(comm, state_vector(model), spec)
        loss, correct = await local_gradient(
            ctx, model, optimizer, x, y, epoch=epoch, step=step, apply=False
        )
        load_state_vector(model, await exchange.finish())
        optimizer.step()  # x_i ← Σ_j W_ij x_j − lr·∇F_i(x_i, old)
        step += 1
        log_train(
            ctx,
            step=step,
            loss=loss,
            correct=correct,
            samples=len(y),
            sent=comm.bytes_sent - sent_before,
            lr=optimizer.param_groups[0]["lr"],
        )
        if is_boundary(ctx, step, last):
            scores = await epoch_end(ctx, model, step)
    await finish_decentralised(ctx, model, scores)


# -- AD-PSGD (bipartite active/passive) ----------------------------------------------------


def colouring(spec: str, workers: int) -> list[int]:
    """A two-colouring (0 = active, 1 = passive) of the topology, or a ConfigError."""
    kind, h, w = topology.parse(spec, workers)
    if workers == 1:
        return [0]
    colours = [(r // w + r % w) % 2 for r in range(workers)]
    ok = all(
        colours[r] != colours[n]
        for r in range(workers)
        for n in topology.neighbours(spec, workers, r)
    )
    if not ok:
        raise ConfigError(
            f"adpsgd needs a bipartite topology (active and passive workers alternate), but "
            f"topology={spec!r} with workers={workers} is not: use a ring with an even number "
            "of workers or a torus with even height and width"
        )
    return colours


def request_schedule(spec: str, workers: int, rank: int, steps: int, seed: int) -> list[int]:
    """The neighbour an active worker asks at each step: a pure function of (seed, rank)."""
    options = topology.neighbours(spec, workers, rank)
    if not options:
        return []
    gen = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    return [options[i] for i in torch.randint(len(options), (steps,), generator=gen).tolist()]


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
                schedule = request_schedule(spec, comm.world_size, a, last, ctx.config.seed)
                self.expected += [(k, a) for k, p in enumerate(schedule) if p == comm.rank]
        self.expected.sort()
        self.served: set[tuple[int, int]] = set()
        self.todo: dict[int, list[int]] = {}  # active rank -> its request steps, in order
        for k, a in self.expected:
            self.todo.setdefault(a, []).append(k)
        size = state_vector(model).numel()
        dtype = next(model.parameters()).dtype
        self.buffers = {a: torch.empty(size, dtype=dtype) for a in self.todo}
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
            if (k, a) not in self.served:
                # a's requests arrive in order and (k, a) is a's earliest unserved one.
                await self.posted[a].wait()
                self._serve(a)
        for pending in self.replies:  # each active posted its receive before asking
            await pending.wait()
        self.replies.clear()


async def train_adpsgd(ctx: WorkerContext) -> None:
    """AD-PSGD (Lian et al. 2018), bipartite active/passive variant, one worker."""
    cfg, comm = ctx.config, ctx.comm
    spec = cfg.resolved_topology
    colours = colouring(spec, comm.world_size)
    model = ctx.build_model()
    optimizer = ctx.build_optimizer(model)
    last = total_steps(ctx)
    active = colours[comm.rank] == 0
    schedule = request_schedule(spec, comm.world_size, comm.rank, last, cfg.seed)
    passive = None if active else _Passive(ctx, model, spec, colours, last)
    await ctx.evaluate_shared(model, epoch=0.0, step=0)
    scores: dict[str, float] = {}
    step = 0
    for epoch, x, y in local_batches(ctx, last):
        sent_before = comm.bytes_sent
        if active and schedule:
            partner = schedule[step]
            mine = state_vector(model)
            reply = torch.empty_like(mine)
            incoming = comm.irecv(reply, partner)  # posted before asking
            request = comm.isend(mine, partner)
            loss, correct = await local_gradient(
                ctx, model, optimizer, x, y, epoch=epoch, step=step, apply=False
            )
            load_state_vector(model, (mine + await incoming.wait()) / 2)
            await request.wait()
        else:
            loss, correct = await local_gradient(
                ctx, model, optimizer, x, y, epoch=epoch, step=step, apply=False
            )
            if passive is not None:
                passive.serve_ready()
        optimizer.step()  # the gradient taken at the weights before averaging
        step += 1
        if passive is not None and is_boundary(ctx, step, last):
            await passive.serve_until(step)  # before the collectives of the boundary
        log_train(
            ctx,
            step=step,
            loss=loss,
            correct=correct,
            samples=len(y),
            sent=comm.bytes_sent - sent_before,
            lr=optimizer.param_groups[0]["lr"],
        )
        if is_boundary(ctx, step, last):
            scores = await epoch_end(ctx, model, step)
    await finish_decentralised(ctx, model, scores)


register(
    Strategy(
        "dpsgd",
        train_dpsgd,
        "decentralised SGD: gossip-average weights with the topology's mixing matrix each step",
    )
)
register(
    Strategy(
        "adpsgd",
        train_adpsgd,
        "asynchronous pairwise gossip (bipartite active/passive AD-PSGD)",
    )
)
