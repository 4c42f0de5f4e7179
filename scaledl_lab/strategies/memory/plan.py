"""What a run will hold and how long its steps take, from sizes alone (no data, no training):
the memory ledger of one worker (:mod:`scaledl_lab.training.ledger`) and the simulator's step
time and bytes, for ``allreduce``, ``allreduce-naive`` and the ZeRO stages on the lab's models.

Model states follow ZeRO's accounting of the flat units (:mod:`.flat`); activations come from
one forward on a batch of zeros under the ledger's ``saved_tensors_hooks`` (no backward, no
data file: a dataset's sample shape is known), and with ``recompute`` from each segment's
forward (:mod:`.recompute`: the checkpoints and the worst segment run again), with
``'selective'`` from the forward of the model whose attention cores keep their input only;
compute is 4/3 of a step with ``recompute`` (one more forward), 1 + c/3 with ``'selective'``
(c: the cores' share of a forward); communication buffers replay the order in which
each strategy makes and drops them; time is the cost model's compute plus its collectives, one
after another as the simulator runs them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...config import ExperimentConfig
from ...data import num_classes, sample_shape
from ...errors import ConfigError
from ...models import build_model, model_flops
from ...runtime.base import shard_numel
from ...runtime.sim.cost import build_cost_model, reduce_scatter_time, ring_reduce_scatter_bytes
from ...training.ledger import SavedTensors, StepMemory
from ...training.precision import Precision, element_bytes
from ..model_parallel.partition import layers
from .flat import blocks
from .recompute import prepare_model, recomputed_bytes, recomputed_forwards
from .zero import STAGES

PLANNED = ("allreduce", "allreduce-naive", *STAGES)
STATE_TENSORS = {"sgd": 1, "adam": 2, "adagrad": 1}  # per element, as the optimisers keep them


@dataclass(frozen=True)
class Plan:
    """One worker's ledger and the simulated step: seconds and bytes sent."""

    memory: StepMemory
    step_s: float
    bytes_per_step: int


def plan(cfg: ExperimentConfig) -> Plan:
    """Predict ``cfg``'s ledger and simulated step (the per-worker batch, no stragglers)."""
    if cfg.strategy not in PLANNED:
        from ..sim_plan import PLANNED as DRY_RUN

        raise ConfigError(
            f"plan predicts {', '.join(PLANNED)} (and by a dry run on the simulator: "
            f"{', '.join(DRY_RUN)}); not strategy={cfg.strategy!r}"
        )
    shape = sample_shape(cfg.dataset)
    model = build_model(cfg.model, shape, num_classes(cfg.dataset), seed=cfg.seed).to(cfg.dtype)
    precision = Precision.of(cfg)  # 16 bits: the logits cast to float32, as a run's
    model = model if precision is None else precision.attach(model)
    size, master, state = element_bytes(cfg.precision)  # bytes per parameter
    n, stage = cfg.workers, STAGES.get(cfg.strategy, 0)
    units = [sum(p.numel() for p in b.parameters()) for b in blocks(layers(model))]
    units = [u for u in units if u]
    chunks = [shard_numel(u, n) for u in units]
    psi, padded, shard = sum(units), sum(c * n for c in chunks), sum(chunks)
    # K, ZeRO's optimiser bytes per parameter: its state tensors, and the float32 master
    # weights in 16 bits (Adam: 4 + 8 = 12)
    k = STATE_TENSORS.get(cfg.optimizer, math.nan) * state
    if cfg.optimizer == "sgd" and cfg.momentum == 0:
        k = 0
    k += master
    params = {0: psi, 1: padded, 2: padded, 3: shard}[stage] * size
    grads = {0: psi, 1: padded, 2: shard, 3: shard}[stage] * size
    optim = (psi if stage == 0 else shard) * k
    memory = StepMemory(params, grads, optim, _activations(cfg, model, shape), math.nan)
    memory.buffers = _buffers(cfg, model, [u * size for u in units], [c * size for c in chunks])
    step_s, sent = _step(cfg, model, shape, [c * n * size for c in chunks], psi * size)
    return Plan(memory, step_s, sent)


def _checks_overflow(cfg: ExperimentConfig) -> bool:
    precision = Precision.of(cfg)
    return precision is not None and precision.checks_overflow


def _activations(cfg: ExperimentConfig, model: torch.nn.Module, shape: tuple[int, ...]) -> float:
    """Bytes saved for backward by one forward of the per-worker batch (zeros: sizes only);
    with recomputation, the checkpoints and the worst segment's recomputed activations
    (:func:`.recompute.recomputed_bytes`)."""
    tokens = getattr(model, "input_dtype", None) == torch.int64  # next-token data: y as x
    x = torch.zeros(cfg.batch_size, *shape, dtype=torch.int64 if tokens else cfg.dtype)
    if cfg.recompute is True:
        return float(recomputed_bytes(model, x))
    if cfg.recompute == "selective":  # attention's cores keep their input only
        model = prepare_model(cfg, model)
    y = torch.zeros(cfg.batch_size, *(shape if tokens else ()), dtype=torch.long)
    saved = SavedTensors()
    with saved.counting(model):
        loss = F.cross_entropy(model(x), y)
    peak = saved.bytes.peak
    del loss
    return float(peak)


def _buffers(cfg: ExperimentConfig, model: torch.nn.Module, full: list[int], chunk: list[int]):
    """The most communication-buffer bytes alive at once, replaying each strategy's order."""
    if cfg.strategy == "allreduce-naive":
        return float(sum(full) + torch.finfo(cfg.dtype).bits // 8)  # the loss rides along
    if cfg.strategy == "allreduce":  # flat buckets; one parameter's bucket is its gradient
        return float(sum(b for b, count in _buckets(cfg, model) if count > 1))
    stage, events = STAGES[cfg.strategy], []  # +bytes made, -bytes dropped, in order
    if stage == 1:  # every layer's reduce-scatter at once, after backward
        events += [c for c in chunk]
    if stage == 3:  # forward: each layer gathered (its buffer, the shard's copy), then freed
        for f, c in zip(full, chunk, strict=True):
            events += [f, c, -c, -f]
    pending: list[int] = []
    for f, c in reversed(list(zip(full, chunk, strict=True))):  # backward, last layer first
        if stage == 3:
            events += [f, c, -c, -f]
        if stage > 1:
            pending.append(f + c)  # the flat gradient and its chunk's sum, in flight
            events.append(f + c)
            if len(pending) > 1:
                events.append(-pending.pop(0))
    now = peak = 0
    for e in events:
        now += e
        peak = max(peak, now)
    return float(peak)


def _buckets(cfg: ExperimentConfig, model: torch.nn.Module) -> list[tuple[int, int]]:
    """The allreduce's buckets as backward fills them: (bytes, parameters), as BucketedAllreduce
    groups them."""
    limit, out, size, count = int(cfg.bucket_mb * 2**20), [], 0, 0
    for p in [p for p in model.parameters() if p.requires_grad][::-1]:
        b = p.numel() * p.element_size()
        if count and size + b > limit:
            out.append((size, count))
            size = count = 0
        size, count = size + b, count + 1
    return [*out, (size, count)] if count else out


def _step(cfg, model, shape, padded: list[int], whole: int) -> tuple[float, int]:
    """The simulator's seconds and bytes for one step: compute, then each collective."""
    cost = build_cost_model(cfg, model_flops(model, shape, num_classes(cfg.dataset)))
    # every worker's group: the link its ring crosses (between nodes once it spans several)
    n, net, algo = cfg.workers, cost.link(range(cfg.workers)), cost.allreduce
    again = recomputed_forwards(cfg, num_classes(cfg.dataset))  # a third of a step each
    compute = cost.step_time(0, n, 0, cfg.batch_size) * (1 + again / 3)
    # The loss (float64), and with dynamic loss scaling at a ZeRO stage the overflow verdict
    stats = 16 if cfg.strategy in STAGES and _checks_overflow(cfg) else 8
    loss_s, loss_b = cost.allreduce_time(stats, n), cost.allreduce_bytes(stats, n)
    if cfg.strategy in STAGES:
        passes = 3 if STAGES[cfg.strategy] == 3 else 2
        seconds = passes * sum(reduce_scatter_time(b, n, net, algo) for b in padded)
        sent = passes * sum(ring_reduce_scatter_bytes(b, n) for b in padded)
        return compute + seconds + loss_s, sent + loss_b
    if cfg.strategy == "allreduce-naive":
        total = whole + torch.finfo(cfg.dtype).bits // 8
        return compute + cost.allreduce_time(total, n), cost.allreduce_bytes(total, n)
    sizes = [b for b, _ in _buckets(cfg, model)]
    seconds = sum(cost.allreduce_time(b, n) for b in sizes) + loss_s
    return compute + seconds, sum(cost.allreduce_bytes(b, n) for b in sizes) + loss_b
