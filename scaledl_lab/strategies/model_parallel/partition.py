"""Splitting a model for model parallelism: its ordered layers, and how many go to each stage.

Every model of the lab is an ordered list of layers (``layers``) whose composition is the
model's forward pass, so a pipeline stage is a contiguous run of them (torchgpipe's
``nn.Sequential`` view). ``balance`` chooses the runs: given counts (``"2,3,1"``), equal
parameter counts (``"params"``) or equal measured time (``"time"``, as torchgpipe's
balance-by-time), both by the linear-partition dynamic programme that minimises the largest
stage. ``boundary_shapes`` is the dry run that gives every stage its receive-buffer shapes.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from ... import families, gpt
from ...data import sample_shape
from ...errors import ConfigError, choices
from ...gpt import GPT
from ...models import CNN, CNN1D, MLP, PreActResNet, build_model

BALANCES = ("params", "time")  # or explicit counts "2,3,1"


class _BNReLU(nn.Module):
    """ResNet's final pre-activation, relu(bn(x)), as a layer of its own."""

    def __init__(self, bn: nn.BatchNorm2d) -> None:
        super().__init__()
        self.bn = bn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(x))


def layers(model: nn.Module) -> list[nn.Module]:
    """The model's ordered layers (sharing its parameters); in turn they are its forward."""
    if isinstance(model, (MLP, CNN1D)):
        return list(model.net)
    if isinstance(model, CNN):
        return list(model.features) + list(model.classifier)
    if isinstance(model, PreActResNet):
        return [model.stem, *model.layers, _BNReLU(model.bn), model.pool, nn.Flatten(), model.fc]
    if isinstance(model, GPT):
        return [model.embed, *model.blocks, model.head]
    raise TypeError(f"no layer list for {type(model).__name__}")


@functools.lru_cache(maxsize=16)
def layer_count(model: str, input_shape: tuple[int, ...], num_classes: int = 10) -> int:
    return len(layers(build_model(model, input_shape, num_classes, seed=0)))


def parameter_names(model: nn.Module, owned: Sequence[nn.Module]) -> list[str]:
    """Names (in ``model.state_dict()``) of the parameters and buffers the ``owned`` layers hold."""
    ids = {id(t) for layer in owned for t in [*layer.parameters(), *layer.buffers()]}
    named = [*model.named_parameters(), *model.named_buffers()]
    return [name for name, t in named if id(t) in ids]


def split_evenly(weights: Sequence[float], parts: int) -> list[int]:
    """Counts of contiguous, non-empty runs of ``weights`` whose largest sum is smallest
    (ties: the smallest sum of squares, i.e. the most even; then the earliest boundaries)."""
    n = len(weights)
    if not 1 <= parts <= n:
        raise ValueError(f"cannot split {n} layers into {parts} non-empty stages")
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + float(w))
    inf = (float("inf"), float("inf"))
    # best[k][i]: (largest run, sum of squared runs) over the first i layers cut into k runs.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                run = prefix[i] - prefix[j]
                cost = (max(best[k - 1][j][0], run), best[k - 1][j][1] + run * run)
                if cost < best[k][i]:
                    best[k][i], cut[k][i] = cost, j
    counts, i = [], n
    for k in range(parts, 0, -1):
        counts.append(i - cut[k][i])
        i = cut[k][i]
    return counts[::-1]


def parse_balance(balance: str, layer_total: int, stages: int) -> list[int] | None:
    """Explicit counts ``"2,3,1"`` checked against the model, or None for a named rule."""
    if balance in BALANCES:
        if stages > layer_total:
            raise ConfigError(
                f"stages={stages} exceeds the model's {layer_total} layers: every stage needs one"
            )
        return None
    try:
        counts = [int(c) for c in balance.split(",")]
    except ValueError:
        raise ConfigError(
            f"balance={balance!r} is unknown; allowed: 'params', 'time' or layer counts per "
            "stage such as '2,3,1'"
        ) from None
    if len(counts) != stages or sum(counts) != layer_total or min(counts) < 1:
        raise ConfigError(
            f"balance={balance!r} must give {stages} positive layer counts (one per stage) "
            f"summing to the model's {layer_total} layers"
        )
    return counts


def measure_layer_times(
    model_layers: Sequence[nn.Module], sample: torch.Tensor, repeats: int = 5
) -> list[float]:
    """Median seconds of forward + backward of each layer on ``sample`` (balance by time).

    Each layer runs once untimed first (a kernel's first call pays its set-up: a one-off
    of several forwards would otherwise decide the split), then ``repeats`` timed runs. The
    first layer's input needs no gradient, as on a pipeline's first stage."""
    times = []
    x = sample
    for i, layer in enumerate(model_layers):
        runs = []
        for _ in range(repeats + 1):
            inp = x.detach().requires_grad_(i > 0 and x.is_floating_point())
            start = time.perf_counter()
            out = layer(inp)
            if out.requires_grad:
                out.backward(torch.ones_like(out))
            runs.append(time.perf_counter() - start)
        layer.zero_grad(set_to_none=True)
        runs = sorted(runs[1:])
        times.append(runs[len(runs) // 2])
        with torch.no_grad():
            x = layer(x)
    return times


def stage_counts(
    balance: str,
    model_layers: Sequence[nn.Module],
    stages: int,
    sample: torch.Tensor | None = None,
) -> list[int]:
    """Layers per stage under ``balance`` (``sample``: a micro-batch, for ``"time"``)."""
    explicit = parse_balance(balance, len(model_layers), stages)
    if explicit is not None:
        return explicit
    if balance == "params":
        weights = [sum(p.numel() for p in layer.parameters()) for layer in model_layers]
    else:
        if sample is None:
            raise ValueError("balance='time' needs a sample micro-batch to time the layers on")
        weights = measure_layer_times(model_layers, sample)
    return split_evenly(weights, stages)


def boundary_shapes(model_layers: Sequence[nn.Module], sample: torch.Tensor) -> list[torch.Size]:
    """The activation shape after every layer for ``sample`` (eval mode: no statistic moves)."""
    shapes = []
    modes = [layer.training for layer in model_layers]
    try:
        with torch.no_grad():
            x = sample
            for layer in model_layers:
                layer.eval()
                x = layer(x)
                shapes.append(x.shape)
    finally:
        for layer, mode in zip(model_layers, modes, strict=True):
            layer.train(mode)
    return shapes


def check_model_parallel(cfg: Any) -> None:
    """Config errors of the model-parallel strategies (stages, micro-batches, balance,
    tensor-parallel degree), each one line naming the field, before any cluster starts."""
    name = cfg.strategy
    if families.has(name, "mesh"):
        return  # the mesh reads these options for its dimensions, and checks them itself
    _check_virtual_stages(cfg)
    if cfg.sequence_parallel and name != "tensor-parallel":
        raise ConfigError(
            f"sequence_parallel=True applies only to strategy='tensor-parallel' (it splits the "
            f"regions tensor parallelism replicates), not to strategy={name!r}"
        )
    if not families.has(name, "pipeline"):
        for option, default in (("stages", None), ("micro_batches", 1)):
            if getattr(cfg, option) != default:
                raise ConfigError(
                    f"{option}={getattr(cfg, option)!r} applies only to the pipeline strategies "
                    f"({choices(families.with_capability('pipeline'))}), not to strategy={name!r}"
                )
    if not families.has(name, "splits_model"):
        return
    if cfg.workers < 2:
        raise ConfigError(
            f"strategy={name!r} splits the model over workers, but workers=1; use at least 2 "
            "(or strategy='allreduce' for one worker)"
        )
    if cfg.stages is not None and (not isinstance(cfg.stages, int) or cfg.stages < 2):
        raise ConfigError(f"stages={cfg.stages!r} must be an integer of at least 2")
    if cfg.workers % cfg.model_parallel_size:
        raise ConfigError(
            f"workers={cfg.workers} is not divisible by stages={cfg.stages}: every pipeline "
            "replica needs one worker per stage"
        )
    if not isinstance(cfg.micro_batches, int) or cfg.micro_batches < 1:
        raise ConfigError(f"micro_batches={cfg.micro_batches!r} must be a positive integer")
    if name == "model-parallel" and cfg.micro_batches != 1:
        raise ConfigError(
            f"micro_batches={cfg.micro_batches} does not apply to the naive split "
            "(strategy='model-parallel' runs one micro-batch); use strategy='gpipe' or '1f1b'"
        )
    if name == "zb-h1" and cfg.recompute:
        raise ConfigError(
            f"recompute={cfg.recompute!r} is not supported by strategy='zb-h1': its weight "
            "gradient W runs after B on the graph B keeps, the memory recomputation would free "
            "(selective: W would run attention's core a second time); use '1f1b' or "
            "'interleaved-1f1b' with recompute"
        )
    p, v = cfg.model_parallel_size, cfg.virtual_stages
    if v > 1 and cfg.micro_batches % p:
        raise ConfigError(
            f"micro_batches={cfg.micro_batches} is not a multiple of stages={p}: interleaved "
            f"1F1B with virtual_stages={v} sends micro-batches through the chunks in groups of "
            f"{p}; choose a multiple of {p}"
        )
    if cfg.batch_size % cfg.micro_batches:
        raise ConfigError(
            f"micro_batches={cfg.micro_batches} does not divide the per-replica "
            f"batch_size={cfg.batch_size}; choose a divisor of {cfg.batch_size}"
        )
    _check_split(cfg, sample_shape(cfg.dataset))


def _check_virtual_stages(cfg: Any) -> None:
    """``virtual_stages``: a positive integer, other than 1 only for interleaved 1F1B."""
    v = cfg.virtual_stages
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ConfigError(f"virtual_stages={v!r} must be a positive integer")
    if v != 1 and not families.has(cfg.strategy, "interleaves"):
        names = ", ".join(repr(n) for n in families.with_capability("interleaves"))
        raise ConfigError(
            f"virtual_stages={v} applies only to strategy={names} (model chunks per worker), "
            f"not to strategy={cfg.strategy!r}"
        )


def _check_split(cfg: Any, input_shape: tuple[int, ...]) -> None:
    if families.has(cfg.strategy, "pipeline"):
        stages, v = cfg.model_parallel_size, cfg.virtual_stages
        total = layer_count(cfg.model, input_shape)
        if v > 1 and stages * v > total:
            raise ConfigError(
                f"virtual_stages={v} × stages={stages} = {stages * v} virtual stages exceed the "
                f"model's {total} layers (cfg.model={cfg.model!r}): every virtual stage needs "
                f"one; use at most virtual_stages={total // stages}"
            )
        parse_balance(cfg.balance, total, stages * v)
    elif cfg.strategy == "tensor-parallel" and cfg.model == "gpt-tiny":
        _check_transformer_split(cfg, input_shape[0])
    elif cfg.strategy == "tensor-parallel":
        if cfg.model != "mlp":
            raise ConfigError(
                f"tensor-parallel splits the MLP's hidden layers or gpt-tiny's blocks; "
                f"model={cfg.model!r} is not supported, use model='mlp' or 'gpt-tiny'"
            )
        if cfg.sequence_parallel:
            raise ConfigError(
                "sequence_parallel=True splits a transformer's LayerNorm regions along the "
                "sequence; model='mlp' has none, use model='gpt-tiny'"
            )
        hidden = MLP(1, 1).net[1].out_features
        if hidden % cfg.workers:
            raise ConfigError(
                f"the tensor-parallel degree workers={cfg.workers} does not divide the MLP's "
                f"hidden width {hidden}; choose a divisor of {hidden}"
            )


def _check_transformer_split(cfg: Any, sequence: int) -> None:
    """gpt-tiny's heads, hidden width (and MLP width), and with sequence parallelism its
    sequence, must divide by the tensor-parallel degree."""
    p = cfg.workers
    for what, size in (("attention heads", gpt.HEADS), ("hidden width", gpt.HIDDEN)):
        if size % p:
            raise ConfigError(
                f"the tensor-parallel degree workers={p} does not divide gpt-tiny's {size} "
                f"{what}; choose a divisor of {math.gcd(gpt.HEADS, gpt.HIDDEN)}"
            )
    if cfg.sequence_parallel and sequence % p:
        raise ConfigError(
            f"sequence_parallel=True splits the sequence of {sequence} positions over "
            f"workers={p}, which does not divide it; choose a divisor of {sequence}"
        )
