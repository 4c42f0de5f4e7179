"""One device per worker: which GPU each Dask worker trains on, checked before any work starts.

dask-cuda (``LocalCUDACluster``, ``dask cuda worker``) starts every worker with its own GPU first
in ``CUDA_VISIBLE_DEVICES`` (``1,2,3,0`` for the second of four), as Slurm's GPU binding does, so
a worker that has that variable trains on ``cuda:0``, its own GPU. A worker that sees several GPUs
without it (plain ``dask worker --nworkers 4`` on a 4-GPU node) takes the GPU of its position
among the run's workers on the same host. Never ``rank % device_count``: ranks are spread over
hosts, so two ranks of one host could share a GPU while another sits idle.
"""

from __future__ import annotations

import os
import socket
from typing import Any
from urllib.parse import urlparse

import torch

from ...errors import ConfigError


def probe() -> dict[str, Any]:
    """What a worker sees (run on the worker, as a task pinned to it)."""
    from distributed import get_worker

    try:
        worker = get_worker()
        address, name = worker.address, str(worker.name)
    except ValueError:  # called outside a worker (tests, the driver)
        address, name = "", ""
    return {
        "address": address,
        "name": name,
        "host": socket.gethostname(),
        "cuda_devices": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def describe(seen: dict[str, Any]) -> str:
    """``worker NAME (ADDRESS) on HOST``: how an error names a worker."""
    name = f" {seen['name']}" if seen.get("name") and seen["name"] != seen["address"] else ""
    return f"worker{name} ({seen['address']}) on {seen['host']}"


def plan_devices(choice: str, probes: list[dict[str, Any]]) -> list[str]:
    """Each rank's device (``"cpu"`` or ``"cuda:I"``) from what its worker sees.

    ``choice``: ``"cpu"``, ``"cuda"`` (every worker must have a GPU: the error names those that
    have none) or ``"auto"`` (GPUs when every worker has one, the CPU when none has; a mix is an
    error, since NCCL and gloo ranks cannot form one group).
    """
    if choice == "cpu":
        return ["cpu"] * len(probes)
    without = [p for p in probes if p["cuda_devices"] == 0]
    if choice == "cuda" and without:
        raise ConfigError(
            "device='cuda' was asked for, but "
            + "; ".join(f"{describe(p)} sees no CUDA device" for p in without)
            + " (CUDA_VISIBLE_DEVICES="
            + ", ".join(repr(p["visible"]) for p in without)
            + "); start GPU workers (e.g. dask_cuda.LocalCUDACluster) or use device='cpu'"
        )
    if choice == "auto" and without:
        if len(without) == len(probes):
            return ["cpu"] * len(probes)
        have = [p for p in probes if p["cuda_devices"] > 0]
        raise ConfigError(
            f"device='auto' found GPUs on {len(have)} of the run's {len(probes)} workers "
            f"(none on {', '.join(describe(p) for p in without)}); one process group cannot mix "
            "NCCL and gloo: pass device='cpu', or run on GPU workers only"
        )
    devices, seen_on_host = [], {}
    for p in probes:
        host = p["host"] or urlparse(p["address"]).hostname
        position = seen_on_host.get(host, 0)
        seen_on_host[host] = position + 1
        index = 0 if p["visible"] else position % p["cuda_devices"]
        devices.append(f"cuda:{index}")
    return devices


def use_device(spec: str) -> torch.device:
    """On the worker: the planned device, made current (NCCL and ``barrier`` use it)."""
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available() or device.index >= torch.cuda.device_count():
            raise ConfigError(f"{describe(probe())} has no {spec}, which the run planned for it")
        torch.cuda.set_device(device)
    return device
