"""Sizing a GPT-style transformer from its sizes alone (``scaledl-lab plan --transformer``):
parameters, the ZeRO model states per worker, activations and the cost model's step.

The model: learned token and position embeddings (the output head tied to the first), then L
pre-LayerNorm blocks of causal self-attention (QKV in one Linear, a output projection) and a
4h GELU MLP, then a final LayerNorm: Ψ = V·h + S·h + L·(12h² + 13h) + 2h.

Activations saved for backward per block, float32, no dropout, counted as the ledger counts
them (each storage once): the block's input and LN1's output (4sbh each), the QKV output that
Q, K and V are views of (12sbh), the softmax's output (4as²b: the softmax and the product with
V both keep it), the attention output (4sbh), the residual sum and LN2's output (4sbh each),
GELU's input and output (16sbh each): 64sbh + 4as²b bytes — Korthikanti et al. 2022's
34sbh + 5as²b, derived again for 4-byte activations without dropout masks — and once, the final
LayerNorm's input and output (8sbh) and log-softmax's output (4sbV). Left out: the LayerNorm
statistics (8sb bytes per norm), the token ids and the causal mask, under 1% at any useful size.
In 16 bits (``precision`` bfloat16 or float16) every saved activation takes 2 bytes, half of
the above, but for log-softmax's output (the logits are cast to float32 for the loss); the model
states take 2 bytes per parameter and gradient and K = 4 + the optimiser's float32 state (the
master weights, :mod:`scaledl_lab.training.precision`).
It assumes attention on views of the QKV output, as Megatron's sequence-first layout computes it
(a batch-first ``matmul`` copies Q, K and V).
Forward FLOPs per sequence: 2·Ψ_blocks·s + 4·L·s²·h (Kaplan et al. 2020).

With ``recompute`` each block is a segment, and the final LayerNorm with the tied head one
more (:mod:`.recompute`, as the lab's models): forward keeps each segment's input, 4sbh bytes
(Korthikanti et al.'s 2sbh per layer of full recomputation, in 16-bit), and backward runs
each segment again before its backward. The most alive at once is the larger of: the end of
forward, every checkpoint and log-softmax's output, (L + 1)·4sbh + 4sbV; the head run again,
every checkpoint and LN's output, (L + 2)·4sbh; the last block run again, the L blocks' inputs
(the head's has gone with its backward) and what the block saves besides its input,
L·4sbh + 60sbh + 4as²b — one layer's activations (34sbh + 5as²b in Korthikanti et al.'s
16-bit count) on top of the checkpoints. Compute is 4/3 of a step (one more forward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...config import ExperimentConfig
from ...errors import ConfigError
from ...runtime.sim.cost import (
    DEVICES,
    build_cost_model,
    reduce_scatter_time,
    ring_reduce_scatter_bytes,
)
from ...training.ledger import StepMemory
from ...training.precision import element_bytes
from .plan import STATE_TENSORS, Plan
from .zero import STAGES


@dataclass(frozen=True)
class Transformer:
    layers: int
    hidden: int
    heads: int
    sequence: int
    vocabulary: int

    @classmethod
    def parse(cls, spec: str) -> Transformer:
        """``L,H,A,S,V``: layers, hidden width, heads, sequence length, vocabulary."""
        try:
            sizes = [int(v) for v in spec.split(",")]
            model = cls(*sizes)
        except (TypeError, ValueError):
            raise ConfigError(
                f"transformer={spec!r}: give LAYERS,HIDDEN,HEADS,SEQUENCE,VOCABULARY as five "
                "positive integers, e.g. 32,4096,32,2048,50257"
            ) from None
        if min(sizes) < 1 or model.hidden % model.heads:
            raise ConfigError(f"transformer={spec!r}: sizes must be positive, heads divide hidden")
        return model

    @property
    def block_parameters(self) -> int:
        h = self.hidden
        return 12 * h * h + 13 * h

    @property
    def parameters(self) -> int:
        h = self.hidden
        return (self.vocabulary + self.sequence) * h + self.layers * self.block_parameters + 2 * h

    def activation_bytes(self, batch: int, element: int = 4) -> int:
        """Bytes saved for backward with ``element``-byte activations (float32 log-softmax)."""
        s, b, h, a = self.sequence, batch, self.hidden, self.heads
        blocks = self.layers * (16 * s * b * h + a * s * s * b) * element
        return blocks + 2 * s * b * h * element + 4 * s * b * self.vocabulary

    def recomputed_activation_bytes(self, batch: int, element: int = 4) -> int:
        """What recomputation keeps at its worst moment (the module's docstring), with
        ``element``-byte activations: the checkpoints of every segment, and the block or the
        head run again (float32 log-softmax)."""
        s, b, h, a, layers = self.sequence, batch, self.hidden, self.heads, self.layers
        checkpoint = element * s * b * h  # a segment's input
        forward_end = (layers + 1) * checkpoint + 4 * s * b * self.vocabulary
        head = (layers + 2) * checkpoint
        block = layers * checkpoint + (15 * s * b * h + a * s * s * b) * element
        return max(forward_end, head, block)

    def forward_flops(self) -> int:
        s, h = self.sequence, self.hidden
        return 2 * self.layers * self.block_parameters * s + 4 * self.layers * s * s * h


def plan_transformer(cfg: ExperimentConfig, model: Transformer) -> Plan:
    """One worker's ledger and step for ``model`` trained as ``cfg`` says (its strategy,
    workers, per-worker batch of sequences, optimiser, a device's FLOP rate and network);
    float32. Each block, and the embeddings with the final LayerNorm, is one flat unit padded
    to the workers as the ZeRO stages pad; data parallelism allreduces the same units."""
    if cfg.strategy not in ("allreduce", *STAGES):
        raise ConfigError(f"a transformer plan is for allreduce or zero1-3, not {cfg.strategy!r}")
    if cfg.compute_profile not in DEVICES:
        raise ConfigError(
            f"a transformer plan takes its compute time from a device's FLOP rate "
            f"({', '.join(DEVICES)}), not from compute_profile={cfg.compute_profile!r}"
        )
    if cfg.recompute not in (False, True):
        raise ConfigError(
            f"recompute={cfg.recompute!r}: a transformer plan without --gpu recomputes whole "
            "layers or nothing; selective recomputation is planned on GPUs (--gpu)"
        )
    n, stage = cfg.workers, STAGES.get(cfg.strategy, 0)
    size, master, state = element_bytes(cfg.precision)
    units = [model.block_parameters] * model.layers
    units.append((model.vocabulary + model.sequence) * model.hidden + 2 * model.hidden)
    psi = model.parameters
    padded = sum(-(-u // n) * n for u in units)
    shard = padded // n
    # another optimiser's state (LARS, LAMB, AdamW): not predicted, as plan() says
    plain_sgd = cfg.optimizer == "sgd" and cfg.momentum == 0
    tensors = 0 if plain_sgd else STATE_TENSORS.get(cfg.optimizer, math.nan)
    k = master + tensors * state
    memory = StepMemory(
        params={0: psi, 1: padded, 2: padded, 3: shard}[stage] * size,
        grads={0: psi, 1: padded, 2: shard, 3: shard}[stage] * size,
        optim=(psi if stage == 0 else shard) * k,
        activations=model.recomputed_activation_bytes(cfg.batch_size, size)
        if cfg.recompute
        else model.activation_bytes(cfg.batch_size, size),
        buffers=math.nan,
    )
    cost = build_cost_model(cfg, model.forward_flops())
    seconds = cost.compute.step_time(cfg.batch_size) * (4 / 3 if cfg.recompute else 1)
    # An allreduce is a reduce-scatter and an all-gather; stage 3 all-gathers twice.
    passes = 3 if stage == 3 else 2
    unit_bytes = [(-(-u // n) * n if stage else u) * size for u in units]
    net, algorithm = cost.link(range(n)), cost.allreduce  # between nodes once n spans several
    seconds += passes * sum(reduce_scatter_time(b, n, net, algorithm) for b in unit_bytes)
    sent = passes * sum(ring_reduce_scatter_bytes(b, n) for b in unit_bytes)
    return Plan(memory, seconds, sent)
