"""Activation recomputation on every strategy (``recompute=True``; Chen et al. 2016, "Training
Deep Nets with Sublinear Memory Cost"): the model's segments, and the model whose forward
checkpoints each of them (:func:`prepare_model`, the memory family's change to every worker's
model). ``recompute='selective'`` (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", §5) recomputes attention's core only, softmax(QKᵀ)·V: the
activations quadratic in the sequence for 4·S²·h FLOPs per layer and sequence, keeping every
Linear's output; each attention layer of the model checkpoints its core
(:func:`recompute_core`), so every program that runs the model's layers recomputes it.

Segments. A model's ordered layers (:func:`~scaledl_lab.strategies.model_parallel.partition.
layers`, whose composition is its forward) grouped into blocks, each one layer with parameters
and the parameter-free layers after it (:func:`.flat.blocks`, what ZeRO shards and FSDP wraps):

- MLP: [flatten, Linear(784, 512), ReLU], [Linear(512, 512), ReLU], [Linear(512, 10)];
- CNN: [conv 3x3, ReLU], [conv 3x3, ReLU, max-pool], [flatten, Linear, ReLU], [Linear];
- MNIST-1D ConvBase: each [conv, ReLU], then [flatten, Linear];
- ResNet-18: the stem, each of the eight residual blocks, [BN, ReLU, pool, flatten], the head.

With recomputation the model's forward runs segment by segment, each through
:func:`~scaledl_lab.training.recompute.checkpoint`: forward keeps each segment's input (the
checkpoints, Chen et al.'s "sqrt(n) segments" taken per layer), and backward runs each
segment's forward again just before its backward, so what is saved at any moment is the
checkpoints plus one segment's activations, for one more forward per step (4/3 of a step's
compute, one forward being a third). Every strategy that calls the model's forward gets it;
the pipelines (a stage keeps its inputs, GPipe's re-materialisation), ZeRO's stages 2 and 3
(block by block, the same blocks) and tensor parallelism (its block) recompute in their own
programs, which call the layers themselves. The parameters and their names are the model's:
state_dicts, checkpoints and the sequential twins see the same model (a twin asked for
recomputation recomputes: the same numbers).

Recomputation reads the parameters as they are at backward. Every strategy's forward and
backward run with no update between them, except Hogwild! on real processes, where another
worker may write the shared weights in between: the recomputed forward then reads the newer
ones (the simulator runs a step without interruption).
"""

from __future__ import annotations

import functools
import types
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...data import sample_shape
from ...gpt import SelfAttention, attention_core
from ...models import build_model, model_flops
from ...training.ledger import SavedTensors
from ...training.recompute import buffers_kept, checkpoint, checkpoint_function
from ..model_parallel.partition import boundary_shapes, layers
from .flat import blocks


def segments(model: nn.Module) -> list[nn.Module]:
    """The model's segments, in forward order (they share its parameters)."""
    return blocks(layers(model))


def segment_inputs(model: nn.Module, sample: torch.Tensor) -> list[torch.Size]:
    """Each segment's input shape for ``sample`` (eval mode: no statistic moves), then the
    model's output shape."""
    return [sample.shape, *boundary_shapes(segments(model), sample)]


@functools.lru_cache(maxsize=32)
def forward_shares(model: str, input_shape: tuple[int, ...], num_classes: int) -> tuple[float, ...]:
    """Each segment's part of one forward of ``model`` by its FLOPs (the simulator's charge for
    running it again)."""
    net = build_model(model, input_shape, num_classes, seed=0)
    # A model that reads token ids says so (gpt-tiny's ``input_dtype``): its sample is ids.
    sample = torch.zeros(1, *input_shape, dtype=getattr(net, "input_dtype", torch.float32))
    shapes = segment_inputs(net, sample)
    flops = [model_flops(s, shapes[i][1:], num_classes) for i, s in enumerate(segments(net))]
    total = sum(flops)
    return tuple(f / total if total else 1 / len(flops) for f in flops)


def _forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The model's forward, one checkpointed segment after another."""
    for segment, share in zip(self.recompute_segments, self.recompute_shares, strict=True):
        x = checkpoint(segment, segment, x, share)
    return x


@functools.lru_cache(maxsize=32)
def core_shares(model: str, input_shape: tuple[int, ...], num_classes: int) -> tuple[float, ...]:
    """Each attention core's part of one forward of ``model`` by FLOPs (QKᵀ and the product
    with V, 4·S²·h per sequence), one per attention layer (none without attention): what
    selective recomputation runs again."""
    net = build_model(model, input_shape, num_classes, seed=0)
    total = model_flops(net, input_shape, num_classes)
    cores = [m for m in net.modules() if isinstance(m, SelfAttention)]
    out = [torch.empty(1, input_shape[0], m.proj.in_features) for m in cores]
    return tuple(2 * m.matmul_macs(o) / total for m, o in zip(cores, out, strict=True))


def recomputed_forwards(cfg: Any, num_classes: int) -> float:
    """The forwards of the model run again per step, a fraction of one: 1 with whole layers,
    the attention cores' share with ``'selective'``, else 0 (what the simulator charges, a
    third of a step each, and what HFU counts beside MFU)."""
    if cfg.recompute == "selective":
        return sum(core_shares(cfg.model, sample_shape(cfg.dataset), num_classes))
    return 1.0 if cfg.recompute is True else 0.0


def recompute_core(qkv: torch.Tensor, heads: int, share: float) -> torch.Tensor:
    """:func:`~scaledl_lab.gpt.attention_core`, keeping only its input (the QKV Linear's
    output) and run again in backward; ``share``: its part of one forward (the simulator's)."""
    return checkpoint_function(functools.partial(attention_core, heads=heads), qkv, share)


def prepare_model(cfg: Any, model: nn.Module) -> nn.Module:
    """With ``cfg.recompute``, ``model`` whose forward checkpoints every segment (the same
    module, parameters and state_dict; a deep copy recomputes as well); with ``'selective'``,
    whose attention layers checkpoint their core (:func:`recompute_core`); else ``model``."""
    if not cfg.recompute:
        return model
    classes = [m for m in model.modules() if isinstance(m, nn.Linear)][-1].out_features
    if cfg.recompute == "selective":
        shares = core_shares(cfg.model, sample_shape(cfg.dataset), classes)
        cores = [m for m in model.modules() if isinstance(m, SelfAttention)]
        for m, share in zip(cores, shares, strict=True):
            m.recomputed_core = functools.partial(recompute_core, share=share)
        return model
    model.recompute_segments = segments(model)
    model.recompute_shares = forward_shares(cfg.model, sample_shape(cfg.dataset), classes)
    model.forward = types.MethodType(_forward, model)
    return model


# -- what recomputation keeps, from sizes alone (scaledl-lab plan) -------------------------


@dataclass(frozen=True)
class SegmentBytes:
    """Bytes of a step on one batch, segment by segment, as the memory ledger counts them:
    each segment's input (its checkpoint), what it saves besides its input when it runs with
    autograd, and what the loss saves."""

    inputs: tuple[int, ...]
    own: tuple[int, ...]
    loss: int

    @property
    def checkpoints(self) -> int:
        return sum(self.inputs)

    @property
    def recomputed(self) -> int:
        """The most alive at once with recomputation: at the end of forward, every checkpoint
        and the loss's; while segment i runs again for its backward, the checkpoints of
        segments 0..i (the later ones have gone with their backward) and its own."""
        again = (sum(self.inputs[: i + 1]) + own for i, own in enumerate(self.own))
        return max(self.checkpoints + self.loss, *again)


def segment_bytes(model: nn.Module, x: torch.Tensor) -> SegmentBytes:
    """:class:`SegmentBytes` of ``model`` on the batch ``x`` (zeros do: sizes only)."""
    tokens = x.dtype == torch.int64  # next-token data: a target per position, as x
    y = torch.zeros(x.shape if tokens else (len(x),), dtype=torch.long)
    parts = segments(model)
    with torch.no_grad(), buffers_kept(model):
        inputs = [x]
        for segment in parts:
            inputs.append(segment(inputs[-1]))
    logits = inputs.pop()
    own = []
    for i, (segment, inp) in enumerate(zip(parts, inputs, strict=True)):
        x_i = inp.detach().requires_grad_(i > 0)  # the data needs no gradient, the rest do

        def run(segment: nn.Module = segment, x_i: torch.Tensor = x_i) -> torch.Tensor:
            return segment(x_i)

        with buffers_kept(segment):  # sizing moves no running statistic
            own.append(_saved(model, run, held=x_i))
    loss = _saved(model, lambda: F.cross_entropy(logits.detach().requires_grad_(True), y))
    kept = tuple(t.untyped_storage().nbytes() for t in inputs)
    return SegmentBytes(inputs=kept, own=tuple(own), loss=loss)


def recomputed_bytes(model: nn.Module, x: torch.Tensor) -> int:
    """The most bytes autograd keeps at once in a recomputing step of ``model`` on ``x``."""
    return segment_bytes(model, x).recomputed


def _saved(model: nn.Module, run: Any, held: torch.Tensor | None = None) -> int:
    """Bytes autograd saves while ``run()`` builds its graph, besides ``held``'s storage (a
    checkpoint, counted among the checkpoints)."""
    saved = SavedTensors()
    with saved.counting(model):
        holder = saved.keep(held) if held is not None else None
        out = run()
    base = held.untyped_storage().nbytes() if held is not None else 0
    peak = saved.bytes.peak - base
    del out, holder
    return int(peak)
