"""The sequential twin of DiLoCo and Streaming DiLoCo: one process holds the k workers'
replicas and inner optimisers and the global model, whose outer optimiser is
``torch.optim.SGD`` itself (``nesterov=True`` for DiLoCo's), stepped on the averaged outer
gradient set as the global parameters' ``.grad``.

Each worker's batches are its own shard's, in its per-epoch order (as its ``WorkerContext``
draws them). The schedule is the programs': fragment f's round starts after the steps t with
(t − offset_f) mod H = 0, its outer step lands τ steps later and is merged with α; the last
step waits for what is in flight and ends with one round of every fragment. A worker killed
after its step k (``faults``) takes part in the rounds up to k and in none after. Written with
torch's optimiser and the model's own parameter lists, apart from the workers' code, so that
agreeing to rounding checks both.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F

from ...config import ExperimentConfig
from ...data import DataSplits
from ...models import build_model
from ...objective import model_input
from ...training.faults import parse_faults
from ...training.reference import _plan, worker_batches
from ...training.schedule import set_lr
from ...training.worker import make_optimizer
from ..large_batch.recipe import prepare_model
from ..model_parallel.partition import layers, split_evenly
from .fragments import offsets, syncs_at
from .streaming import mixing_alpha


def _fragment_params(model: torch.nn.Module, count: int) -> list[list[torch.nn.Parameter]]:
    held = [list(layer.parameters()) for layer in layers(model)]
    held = [ps for ps in held if ps]
    sizes = split_evenly([sum(p.numel() for p in ps) for ps in held], count)
    out, start = [], 0
    for n in sizes:
        out.append([p for ps in held[start : start + n] for p in ps])
        start += n
    return out


def train_diloco_sequential(cfg: ExperimentConfig, data: DataSplits) -> dict[str, Any]:
    """DiLoCo (``fragments=1``, ``overlap_steps=0``) or Streaming DiLoCo on ``cfg.workers``
    replicas in one process; returns the final global state_dict (every worker's)."""
    torch.set_num_threads(1)
    base = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    base = prepare_model(cfg, base).to(cfg.dtype)
    if any(b.is_floating_point() for b in base.buffers()):
        raise ValueError(f"the DiLoCo twin holds no buffers; model={cfg.model!r} has some")
    k, period, tau = cfg.workers, cfg.sync_period, cfg.overlap_steps
    streaming = cfg.strategy == "streaming-diloco"
    count = cfg.fragments if streaming else 1
    alpha = mixing_alpha(cfg) if streaming else 0.0
    glob = copy.deepcopy(base)
    outer = torch.optim.SGD(glob.parameters(), lr=cfg.outer_lr, momentum=cfg.outer_momentum,
                            nesterov=cfg.outer_optimizer == "nesterov")  # fmt: skip
    replicas = [copy.deepcopy(base) for _ in range(k)]
    inners = [make_optimizer(cfg, m.parameters()) for m in replicas]
    glob_parts = _fragment_params(glob, count)
    local_parts = [_fragment_params(m, count) for m in replicas]
    plan = _plan(cfg, data)
    steps = plan.total_steps
    batches = [list(worker_batches(cfg, data, r, epochs=cfg.epochs))[:steps] for r in range(k)]
    starts = offsets(period, count)
    killed = {kill.rank: kill.step for kill in parse_faults(cfg.faults, k)}
    alive = list(range(k))

    def outer_gradients(f: int) -> dict[int, list[torch.Tensor]]:
        """θ_f − θ_{i,f} of every worker alive, parameter by parameter."""
        pairs = {i: zip(glob_parts[f], local_parts[i][f], strict=True) for i in alive}
        return {i: [g.detach() - mine.detach() for g, mine in pairs[i]] for i in alive}

    def average(deltas: dict[int, list[torch.Tensor]]) -> list[torch.Tensor]:
        """(1/k') Σ_i over the k' workers still alive when the round lands (a worker that died
        with a round in flight never joined its allreduce, as on the simulator)."""
        rows = [deltas[i] for i in alive]
        return [sum(parts) / len(rows) for parts in zip(*rows, strict=True)]

    @torch.no_grad()
    def land(f: int, delta: list[torch.Tensor], mix: float) -> None:
        for p in glob.parameters():
            p.grad = None
        for g, d in zip(glob_parts[f], delta, strict=True):
            g.grad = d.clone()
        outer.step()  # only fragment f has gradients: the others stay as they are
        for i in alive:
            for local, g in zip(local_parts[i][f], glob_parts[f], strict=True):
                local.copy_(mix * local + (1 - mix) * g)

    in_flight: dict[int, tuple[int, dict[int, list[torch.Tensor]]]] = {}
    for t in range(steps):
        for i in alive:
            model, inner, mine = replicas[i], inners[i], batches[i]
            set_lr(inner, plan.lr(t))
            inner.zero_grad()
            x = model_input(data.train.x[mine[t]], None, cfg.dtype)
            F.cross_entropy(model(x), data.train.y[mine[t]]).backward()
            inner.step()
        step = t + 1
        last = step == steps
        for f in sorted(in_flight):
            due, delta = in_flight[f]
            if due == step or last:
                del in_flight[f]
                land(f, average(delta), alpha)
        for f in range(count):
            if last:
                land(f, average(outer_gradients(f)), 0.0)
            elif syncs_at(step, starts[f], period):
                if tau == 0:
                    land(f, average(outer_gradients(f)), alpha)
                else:
                    in_flight[f] = (step + tau, outer_gradients(f))
        alive = [i for i in alive if killed.get(i) != step]  # they die after this step
    return {k_: v.detach().clone() for k_, v in glob.state_dict().items()}
