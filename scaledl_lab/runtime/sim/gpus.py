"""GPU profiles for planning a published transformer (``scaledl-lab plan --gpu``): the
datasheet rates of one data file, ``gpus.json`` beside this module, each with its source, and
the few constants a datasheet does not give (the achieved fraction of peak in the matmuls, the
bytes an optimiser step moves), each with what it was fitted on."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from .network import CostModelError, NetworkProfile

PROFILES = Path(__file__).with_name("gpus.json")


@dataclass(frozen=True)
class GPU:
    """One GPU type: peak dense 16-bit FLOP/s, memory (bytes, bytes/s), NVLink and InfiniBand
    per GPU and per direction (bytes/s), GPUs per node; and its calibration."""

    key: str
    name: str
    peak_flops: float
    memory_bytes: int
    memory_bandwidth_Bps: float
    nvlink_Bps: float
    infiniband_Bps: float
    gpus_per_node: int
    matmul_efficiency: float
    optimizer_bytes_per_parameter: int
    nvlink_latency_s: float
    infiniband_latency_s: float

    @property
    def network(self) -> NetworkProfile:
        """The two-tier network of its nodes: NVLink inside, InfiniBand between."""
        return NetworkProfile(
            f"{self.key}-node", self.nvlink_latency_s, self.nvlink_Bps,
            self.infiniband_latency_s, self.infiniband_Bps,
        )  # fmt: skip

    @property
    def achieved_flops(self) -> float:
        """The rate a matmul-bound step runs at: peak × the calibrated efficiency."""
        return self.peak_flops * self.matmul_efficiency


@functools.cache
def profiles_file() -> dict:
    """The data file, as read (sources included)."""
    return json.loads(PROFILES.read_text())


def gpu_profile(key: str) -> GPU:
    """The GPU named ``key`` (``a100``, ``h100``) with its calibration."""
    body = profiles_file()
    gpus = body["gpus"]
    if key not in gpus:
        raise CostModelError(f"gpu {key!r} is unknown; the GPU profiles are {', '.join(gpus)}")
    g, cal, lat = gpus[key], body["calibration"], body["latency_s"]
    return GPU(
        key=key, name=g["name"], peak_flops=float(g["peak_flops"]),
        memory_bytes=int(g["memory_bytes"]),
        memory_bandwidth_Bps=float(g["memory_bandwidth_Bps"]),
        nvlink_Bps=float(g["nvlink_Bps"]), infiniband_Bps=float(g["infiniband_Bps"]),
        gpus_per_node=int(g["gpus_per_node"]),
        matmul_efficiency=float(cal["matmul_efficiency"][key]["value"]),
        optimizer_bytes_per_parameter=int(cal["optimizer_bytes_per_parameter"]["value"]),
        nvlink_latency_s=float(lat["nvlink"]), infiniband_latency_s=float(lat["infiniband"]),
    )  # fmt: skip


GPUS: tuple[str, ...] = tuple(profiles_file()["gpus"])
