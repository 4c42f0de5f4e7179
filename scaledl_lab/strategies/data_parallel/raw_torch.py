"""The data-parallel step in plain PyTorch, beside the lab: ``torch.distributed`` directly.

What PyTorch's own DDP tutorial writes (Li et al. 2020, "PyTorch Distributed"): N processes
started with ``torch.multiprocessing``, a gloo process group, and in every step each process's
gradients summed with ``all_reduce`` and divided by N before the optimiser steps. Nothing of the
lab's runtime, Comm or strategies is used; only the data and the initial weights come from the
lab, so that the processes read the very batches a lab run reads. With the same config, the
parameters equal those of the lab's ``allreduce`` on two Dask workers bit for bit in float32:
the same gradients, summed a + b by gloo, halved, stepped by the same SGD.
"""

from __future__ import annotations

import datetime
import socket
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...config import ExperimentConfig
from ...data.sharding import epoch_batches, shard_indices
from ...errors import ConfigError
from ...models import build_model
from ...runtime.processes import run_processes
from ...training.worker import load_for, total_steps


def train_rank(
    rank: int, world_size: int, address: str, cfg: ExperimentConfig
) -> dict[str, Any] | None:
    """Process ``rank`` of ``world_size``: join the group at ``address``, train; rank 0 returns
    the final parameters."""
    torch.set_num_threads(1)  # one core per process, as each Dask worker of the lab
    timeout = datetime.timedelta(seconds=cfg.timeout_s)
    dist.init_process_group(
        "gloo", init_method=address, rank=rank, world_size=world_size, timeout=timeout
    )
    try:
        splits = load_for(cfg)  # the lab's data, and below its initial weights: the same run
        data = splits.train
        model = build_model(cfg.model, splits.input_shape, splits.num_classes, seed=cfg.seed)
        model = model.to(cfg.dtype)
        optimizer = torch.optim.SGD(
            model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
        shard = shard_indices(data.y, world_size, rank, scheme=cfg.sharding, seed=cfg.seed)
        steps, epoch = 0, 0
        while steps < total_steps(cfg):
            for idx in epoch_batches(shard, cfg.batch_size, seed=cfg.seed, epoch=epoch, rank=rank):
                if steps == total_steps(cfg):
                    break
                optimizer.zero_grad()
                loss = F.cross_entropy(model(data.x[idx].to(cfg.dtype)), data.y[idx])
                loss.backward()
                for p in model.parameters():  # the allreduce: sum, then the mean
                    dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
                    p.grad /= world_size
                optimizer.step()
                steps += 1
            epoch += 1
        dist.barrier()  # no rank leaves the group while another still needs it
        return model.state_dict() if rank == 0 else None
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world_size: int, address: str, cfg: ExperimentConfig, out: str) -> None:
    state = train_rank(rank, world_size, address, cfg)
    if state is not None:
        torch.save(state, Path(out) / "rank0.pt")


def check_raw(cfg: ExperimentConfig) -> None:
    """What the plain loop implements: synchronous SGD, no options of the lab's families."""
    plain = cfg.optimizer == "sgd" and cfg.accumulate == 1 and cfg.compress == "none"
    if cfg.strategy not in ("allreduce", "allreduce-naive") or not plain:
        raise ConfigError(
            "the plain torch.distributed loop is synchronous SGD with a gradient allreduce: it "
            f"takes strategy allreduce or allreduce-naive, optimizer sgd, accumulate 1 and no "
            f"compression (got {cfg.strategy}, {cfg.optimizer}, accumulate {cfg.accumulate}, "
            f"compress {cfg.compress})"
        )
    if cfg.lr_schedule != "constant" or cfg.warmup_epochs or cfg.lr_scaling != "none":
        raise ConfigError("the plain torch.distributed loop keeps the learning rate constant")


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def run_raw(cfg: ExperimentConfig, client: Any = None) -> dict[str, Any]:
    """Train ``cfg`` with :func:`train_rank` on ``cfg.workers`` processes; rank 0's final
    parameters. The processes: fresh ones from ``torch.multiprocessing``, or, given a Dask
    ``client``, its workers (one task pinned to each, as dask-pytorch-ddp does): they have
    imported torch already, so the run starts sooner."""
    check_raw(cfg)
    if client is not None:
        return _on_dask(cfg, client)
    with tempfile.TemporaryDirectory() as out:
        # Each process loads the data itself, as a Dask worker does: only the config travels.
        run_processes(_spawned, (cfg.workers, _free_address(), cfg, out), cfg.workers)
        return torch.load(Path(out) / "rank0.pt", weights_only=True)


def _on_dask(cfg: ExperimentConfig, client: Any) -> dict[str, Any]:
    from ...runtime.dask.driver import worker_addresses
    from ...runtime.dask.rendezvous import free_port

    addresses = worker_addresses(client)[: cfg.workers]
    if len(addresses) < cfg.workers:
        raise ConfigError(f"workers={cfg.workers} but the cluster has {len(addresses)} worker(s)")
    host = urlparse(addresses[0]).hostname  # the rendezvous: on rank 0's worker
    port = client.submit(free_port, workers=[addresses[0]], pure=False).result()
    ranks = [
        client.submit(
            train_rank,
            rank,
            cfg.workers,
            f"tcp://{host}:{port}",
            cfg,
            workers=[a],
            allow_other_workers=False,
            pure=False,
        )
        for rank, a in enumerate(addresses)
    ]
    return client.gather(ranks)[0]
