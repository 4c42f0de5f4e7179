"""The same gpt-tiny trained by PyTorch's own composition of tensor and data parallelism, to
compare parameters with: ``torch.distributed.tensor.parallel.parallelize_module`` over the "tp"
dimension of a 2-D ``DeviceMesh`` (dp, tp), then FSDP2's ``fully_shard`` on every block and the
root over its "dp" dimension, in the order torchtitan's ``parallelize`` applies them.

Tensor parallelism follows the lab's Megatron layout (:mod:`.parallel_transformer`): in each
block the QKV Linear column-wise and the attention projection row-wise (each rank attends with
its own heads), the MLP's first Linear column-wise and its second row-wise (``ColwiseParallel``,
``RowwiseParallel``: the weights DTensors of the "tp" mesh, the row-wise outputs' partial sums
allreduced, their biases added once); the LayerNorms, embeddings and head stay replicated. One
thing the plan cannot say by itself: gpt-tiny's fused QKV weight holds its rows as [Q | K | V],
so a column-wise split over tp=2 would hand rank 0 all of Q and half of K. Before the plan the
rows are put in Megatron's order, head by head [q₀ k₀ v₀ | q₁ k₁ v₁ | …], and the attention
reads its local output as (heads it holds, q/k/v, d), counting its heads from the local width
as torchtitan's ``view(…, -1, head_dim)`` does, so no head count is rewritten per rank; the
trained rows go back to gpt-tiny's order. ``megatron_qkv=False`` splits the rows as they lie
and reads them as gpt-tiny does: it runs, and trains something else (the tests notice).

Each of the dp·tp ranks is a gloo CPU process of its own with one thread, rank ``d·tp + t`` at
(dp ``d``, tp ``t``), as ``init_device_mesh`` lays them out (the last dimension innermost, as
the lab's ``--mesh``). Every tp rank of data-parallel replica ``d`` trains replica ``d``'s
batches in the lab's data order (its shard of the training set, shuffled per epoch, as
:func:`scaledl_lab.data.epoch_batches` gives a replica), from the lab's initial weights, with
the lab's optimiser. FSDP2 reduce-scatters the gradients over dp (gloo has the collective in
this torch, added for FSDP on CPU: pytorch/pytorch#112144); in float64 it divides each by dp
first and sums, ``ReduceOp.AVG`` being its path for float32 and bfloat16 only. The result is
the whole model by gpt-tiny's own names (each DTensor's ``full_tensor()``).

What it equals: single-process training of the whole gpt-tiny on the combined batch (replica
0's batch, then replica 1's: :func:`scaledl_lab.training.reference.train_sequential` of ``cfg``
as data parallelism over dp replicas), which the lab's tensor-parallel and mesh runs equal by
their twins. Close, not bit for bit: a row-wise Linear adds tp partial products, and FSDP2
adds the dp replicas' gradients (each summed over its own samples), which one matmul over the
combined batch sums in another order, about one unit in the last place per sum; after 30 steps of
float64 the tests measure 3.3e-16 (SGD with momentum) and 1.9e-14 (Adam, whose step divides
by √v̂) and assert 1e-12. Only float32 and float64 are compared: 16-bit precisions are refused.
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import warnings
from datetime import timedelta
from itertools import count, islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...config import ExperimentConfig
from ...data import epoch_batches, shard_indices
from ...errors import ConfigError
from ...gpt import GPT, HEADS, SelfAttention, causal_attention
from ...objective import model_input
from ...runtime.processes import run_processes
from ...training.worker import load_for, make_optimizer

PRECISIONS = ("float32", "float64")
OPTIMISERS = ("sgd", "adam", "adagrad")  # what make_optimizer builds from torch.optim alone


def train_with_pytorch_mesh(
    cfg: ExperimentConfig, dp: int, tp: int, steps: int, *, megatron_qkv: bool = True
) -> dict[str, torch.Tensor]:
    """gpt-tiny's whole state_dict after ``steps`` steps of ``cfg``'s training by PyTorch's TP
    and FSDP2 on a (dp, tp) mesh; ``cfg.batch_size`` is each data-parallel replica's batch (past
    an epoch, the next epoch's order follows, as the lab's; ``cfg.max_steps`` is not read)."""
    _check(cfg, dp, tp, steps)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        args = (cfg, dp, tp, steps, megatron_qkv, port, tmp)
        run_processes(_rank, args, dp * tp)
        return torch.load(Path(tmp) / "rank0.pt", weights_only=True)


def _check(cfg: ExperimentConfig, dp: int, tp: int, steps: int) -> None:
    if cfg.model != "gpt-tiny":
        raise ConfigError(f"model={cfg.model!r}: PyTorch's mesh comparison trains gpt-tiny")
    if cfg.precision not in PRECISIONS:
        raise ConfigError(
            f"precision={cfg.precision!r} has no PyTorch mesh twin here: compare in float32 or "
            "float64 (a 16-bit run would need FSDP2's MixedPrecisionPolicy against the lab's "
            "master weights)"
        )
    if cfg.optimizer not in OPTIMISERS or cfg.lr_schedule != "constant" or cfg.accumulate != 1:
        raise ConfigError(
            "the PyTorch mesh comparison runs SGD, Adam or AdaGrad at a constant rate, "
            "one batch a step (accumulate=1)"
        )
    if min(dp, tp, steps) < 1:
        raise ConfigError(f"dp={dp}, tp={tp} and steps={steps} must each be at least 1")
    if HEADS % tp:
        raise ConfigError(f"tp={tp} does not divide gpt-tiny's {HEADS} attention heads")


class MegatronAttention(nn.Module):
    """gpt-tiny's attention with its QKV rows in Megatron's order, head by head [q k v], so that
    a column-wise split of them gives each rank whole heads. ``megatron_qkv=False``: the rows as
    they lie, [Q | K | V], read as gpt-tiny reads them (the first third of the output Q, ...):
    whole, the same attention; split column-wise, rank 0's "Q" is half of Q, its "K" the other
    half and its "V" half of K."""

    def __init__(self, attn: SelfAttention, megatron_qkv: bool = True) -> None:
        super().__init__()
        h = attn.qkv.in_features
        self.d, self.megatron_qkv = h // attn.heads, megatron_qkv
        self.order = qkv_order(h, attn.heads) if megatron_qkv else torch.arange(3 * h)
        self.qkv, self.proj = attn.qkv, attn.proj
        with torch.no_grad():
            self.qkv.weight.copy_(self.qkv.weight[self.order])
            self.qkv.bias.copy_(self.qkv.bias[self.order])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, s, _ = x.shape
        out = self.qkv(x)  # under tensor parallelism: this rank's rows only
        if self.megatron_qkv:  # -1: the heads this rank holds
            q, k, v = out.view(n, s, -1, 3, self.d).unbind(3)
        else:
            q, k, v = (t.view(n, s, -1, self.d) for t in out.chunk(3, dim=2))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        return self.proj(causal_attention(q, k, v).transpose(1, 2).reshape(n, s, -1))


def qkv_order(hidden: int, heads: int) -> torch.Tensor:
    """Row ``i`` of the Megatron-ordered QKV weight is row ``order[i]`` of gpt-tiny's: for each
    head j, its d rows of Q, then of K, then of V."""
    d = hidden // heads
    return torch.tensor(
        [part * hidden + j * d + i for j in range(heads) for part in range(3) for i in range(d)]
    )


def _parallelize(model: GPT, mesh: Any, megatron_qkv: bool) -> None:
    """Tensor parallelism on the "tp" dimension, then FSDP2 on "dp" (torchtitan's order)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for block in model.blocks:
        block.attn = MegatronAttention(block.attn, megatron_qkv)
        plan = {
            "attn.qkv": ColwiseParallel(),
            "attn.proj": RowwiseParallel(),
            "mlp.0": ColwiseParallel(),
            "mlp.2": RowwiseParallel(),
        }
        parallelize_module(block, mesh["tp"], plan)
    for block in model.blocks:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])


def _full_state(model: GPT) -> dict[str, torch.Tensor]:
    """The whole model by gpt-tiny's names, its QKV rows back in gpt-tiny's order."""
    state = {
        k: getattr(v, "full_tensor", lambda v=v: v)().detach().clone()
        for k, v in model.state_dict().items()
    }
    for i, block in enumerate(model.blocks):
        back = torch.argsort(block.attn.order)
        for name in ("weight", "bias"):
            key = f"blocks.{i}.attn.qkv.{name}"
            state[key] = state[key][back]
    return state


def _rank(
    rank: int, cfg: ExperimentConfig, dp: int, tp: int, steps: int, megatron_qkv: bool,
    port: int, out_dir: str,
) -> None:  # fmt: skip
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    # gpt-tiny returns its logits as a transposed view, which FSDP2 warns of (nothing writes
    # into it); full_tensor() of a 2-D shard warns it takes two all-gathers (exact, no sums).
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    torch.set_num_threads(1)  # as a lab worker: the same kernels, the same bits
    timeout = timedelta(seconds=cfg.timeout_s)
    dist.init_process_group("gloo", rank=rank, world_size=dp * tp, timeout=timeout)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        from ...models import build_model

        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        replica = mesh.get_coordinate()[0]  # rank // tp
        data = load_for(cfg)
        model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        model = model.to(cfg.dtype)
        _parallelize(model, mesh, megatron_qkv)
        optimizer = make_optimizer(cfg, model.parameters())
        y = data.train.y
        shard = shard_indices(y, dp, replica, scheme=cfg.sharding, seed=cfg.seed)
        batches = (
            idx
            for epoch in count()  # epoch after epoch, as many as the steps need
            for idx in epoch_batches(
                shard, cfg.batch_size, seed=cfg.seed, epoch=epoch, rank=replica
            )
        )
        for idx in islice(batches, steps):
            optimizer.zero_grad()
            x = model_input(data.train.x[idx], None, cfg.dtype)
            F.cross_entropy(model(x), y[idx]).backward()
            optimizer.step()
        state = _full_state(model)  # every rank takes part in the gathers
        if rank == 0:
            torch.save(state, Path(out_dir) / "rank0.pt")
        dist.barrier()  # no rank tears its group down while another still talks to it
    finally:
        dist.destroy_process_group()
    os._exit(0)  # as memory.pytorch: skip the interpreter's teardown (a joinable torch thread)
