"""The same training with PyTorch's own ZeRO, to compare parameters with: stage 1 as
``torch.distributed.optim.ZeroRedundancyOptimizer`` (gradients averaged by an allreduce, each
rank stepping the whole parameters it owns, then broadcasting them) and stage 3 as FSDP2's
``torch.distributed.fsdp.fully_shard`` on every layer and the root. Each runs on a gloo group
of ``cfg.workers`` CPU processes, one thread each, with the lab's data order, initial
weights and optimiser (:func:`train_with_pytorch`).

With ``precision="bfloat16"`` FSDP2 runs its own mixed precision (``MixedPrecisionPolicy``:
float32 shards stepped by the optimiser, each layer gathered, computed and its gradients
reduce-scattered in bfloat16, the output cast to float32 for the loss), the lab's master-weight
scheme (:mod:`scaledl_lab.training.precision`); its state is returned as the lab's is, the
masters rounded to bfloat16. ``ZeroRedundancyOptimizer`` keeps no master weights, and float16
would need FSDP's sharded gradient scaler: both are refused.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from datetime import timedelta
from itertools import islice
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...config import ExperimentConfig
from ...errors import ConfigError
from ...objective import model_input
from ...runtime.processes import run_processes
from ...training.ledger import nbytes
from ...training.precision import is_low
from ...training.reference import worker_batches
from ...training.worker import load_for, make_optimizer, total_steps
from ..model_parallel.partition import layers

KINDS = ("zero-redundancy", "fully-shard")


def train_with_pytorch(cfg: ExperimentConfig, kind: str) -> dict[str, torch.Tensor]:
    """Rank 0's final state_dict after ``cfg``'s steps trained by PyTorch's ``kind``."""
    return run_pytorch(cfg, kind)["state"]


def run_pytorch(cfg: ExperimentConfig, kind: str) -> dict[str, Any]:
    """Rank 0's ``state`` (final state_dict), ``step_s`` (each step's seconds, wall-clock) and
    ``memory`` (bytes it held after its last step: params, grads, optim, as the ledger counts
    them, of the local shards) after ``cfg``'s steps trained by PyTorch's ``kind``."""
    if kind not in KINDS:
        raise ConfigError(f"kind={kind!r} is unknown; allowed: {', '.join(KINDS)}")
    if cfg.optimizer not in _CLASSES or cfg.lr_schedule != "constant":
        raise ConfigError("the PyTorch comparison runs SGD, Adam or AdaGrad at a constant rate")
    if cfg.precision == "float16" or (cfg.precision == "bfloat16" and kind != "fully-shard"):
        raise ConfigError(
            f"precision={cfg.precision!r} has no PyTorch twin here: mixed precision is compared "
            "in bfloat16 with kind='fully-shard' (FSDP2's MixedPrecisionPolicy); "
            "ZeroRedundancyOptimizer keeps no float32 master weights"
        )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        run_processes(_rank, (cfg, kind, port, tmp), cfg.workers)
        return torch.load(Path(tmp) / "rank0.pt", weights_only=True)


def _local(t: Any) -> Any:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor: this rank's shard


def _held(model: torch.nn.Module, optimizer: Any, kind: str) -> dict[str, int]:
    """The bytes this rank holds, counted as the ledger counts them (its local shards)."""
    params = list(model.parameters())
    inner = optimizer.optim if kind == "zero-redundancy" else optimizer
    optim = 0
    for p, state in inner.state.items():
        for v in state.values():
            v = _local(v)
            if isinstance(v, torch.Tensor) and v.shape == _local(p).shape and v.dim() > 0:
                optim += v.numel() * v.element_size()
    return {
        "params": nbytes(_local(p) for p in params),
        "grads": nbytes(_local(p.grad) for p in params),
        "optim": optim,
    }


def _policy(dtype: torch.dtype) -> Any:
    """FSDP2's mixed precision as the lab's: compute and reduce in ``dtype``, the output (the
    logits) cast to float32 for the loss."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype, output_dtype=torch.float32)


_CLASSES = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}


def _defaults(cfg: ExperimentConfig) -> dict[str, Any]:
    """The keyword arguments ``make_optimizer`` gives the optimiser, for PyTorch to build it."""
    out: dict[str, Any] = dict(lr=cfg.lr, weight_decay=cfg.weight_decay, foreach=True)
    if cfg.optimizer == "sgd":
        out["momentum"] = cfg.momentum
    return out


def _rank(rank: int, cfg: ExperimentConfig, kind: str, port: int, out_dir: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)  # as a lab worker: the same kernels, the same bits
    world = cfg.workers
    dist.init_process_group(
        "gloo", rank=rank, world_size=world, timeout=timedelta(seconds=cfg.timeout_s)
    )
    try:
        from ...models import build_model
        from ..large_batch.recipe import prepare_model

        data = load_for(cfg)
        model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        model = prepare_model(cfg, model).to(cfg.dtype)
        mixed = is_low(cfg.precision)
        if mixed:  # FSDP2 keeps float32 shards, the masters: the lab's start from 16 bits
            model = model.to(torch.float32)
        if kind == "zero-redundancy":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            optimizer: Any = ZeroRedundancyOptimizer(
                model.parameters(), optimizer_class=_CLASSES[cfg.optimizer], **_defaults(cfg)
            )
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            policy = _policy(cfg.dtype) if mixed else None
            extra = {"mp_policy": policy} if policy is not None else {}
            for layer in layers(model):
                if any(True for _ in layer.parameters()):
                    fully_shard(layer, mesh=mesh, **extra)
            fully_shard(model, mesh=mesh, **extra)
            optimizer = make_optimizer(cfg, model.parameters())
        batches = worker_batches(cfg, data, rank, epochs=cfg.epochs)
        times = []
        for idx in islice(batches, total_steps(cfg)):
            started = time.perf_counter()
            optimizer.zero_grad()
            x, y = model_input(data.train.x[idx], None, cfg.dtype), data.train.y[idx]
            F.cross_entropy(model(x), y).backward()
            if kind == "zero-redundancy":  # its partner in PyTorch is DDP: average first
                for p in model.parameters():
                    dist.all_reduce(p.grad)
                    p.grad.div_(world)
            optimizer.step()
            times.append(time.perf_counter() - started)
        memory = _held(model, optimizer, kind)
        state = {
            k: getattr(v, "full_tensor", lambda v=v: v)() for k, v in model.state_dict().items()
        }
        if mixed:  # the lab's model holds the masters rounded to 16 bits
            state = {k: v.to(cfg.dtype) if v.is_floating_point() else v for k, v in state.items()}
        if rank == 0:
            state = {k: v.detach().clone() for k, v in state.items()}
            saved = {"state": state, "step_s": times, "memory": memory}
            torch.save(saved, Path(out_dir) / "rank0.pt")
        dist.barrier()  # no rank tears its group down while another still talks to it
    finally:
        dist.destroy_process_group()
    # Done, and rank 0's result is on disk: leave without the interpreter's teardown, where a
    # thread torch left joinable aborts the process now and then ("terminate called without
    # an active exception", SIGABRT: seen on rank 1 of the ZeroRedundancyOptimizer run).
    os._exit(0)
