"""Cost models for the simulated runtime: compute time, messages (α–β), allreduce, stragglers.

Times follow the latency–bandwidth (Hockney) model: a message of n bytes costs α + n/β. The
ring allreduce costs 2(p−1)/p · n/β + 2(p−1)·α (Patarasuk & Yuan 2009; Thakur et al. 2005);
recursive doubling costs ⌈log2 p⌉·(α + n/β). Compute time per step is a + b·samples, either
calibrated on this machine (``scaledl-lab calibrate``) or derived from a device's FLOP rate.
On a two-tier network (:mod:`.network`) each collective is priced on the slowest link its
group's ring crosses.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# The byte counts are the runtime layer's (every Comm counts with them); priced here.
from ..collectives import allgather_bytes as allgather_bytes
from ..collectives import ring_all_gather_bytes as ring_all_gather_bytes
from ..collectives import ring_allreduce_bytes as ring_allreduce_bytes
from ..collectives import ring_reduce_scatter_bytes as ring_reduce_scatter_bytes

# The links, the placement of ranks on nodes and the link a transfer crosses (re-exported).
from .network import CUSTOM_FORMS, custom_network, link_of
from .network import NETWORKS as NETWORKS
from .network import CostModelError as CostModelError
from .network import NetworkProfile as NetworkProfile


@dataclass(frozen=True)
class ComputeProfile:
    """Seconds for one training step on ``samples`` samples: ``per_step + per_sample·samples``;
    and for applying a received gradient (its copy out of the receive buffer, then an optimiser
    step): ``apply_per_byte_s`` per parameter byte (None: from the device's memory rate)."""

    name: str
    per_step_s: float
    per_sample_s: float
    apply_per_byte_s: float | None = None

    def __post_init__(self) -> None:
        if self.per_step_s < 0 or self.per_sample_s <= 0:
            raise CostModelError(
                f"compute profile {self.name!r}: per_step_s must be >= 0 and per_sample_s > 0 "
                f"(got {self.per_step_s}, {self.per_sample_s})"
            )

    def step_time(self, samples: int) -> float:
        return self.per_step_s + self.per_sample_s * samples


# Peak FP32 rate (the datasheets: V100 SXM2 15.7, A100 19.5, H100 SXM 67 TFLOP/s) × a typical
# achieved fraction for small CNNs (~40%). "cpu-core" is the rate measured for the small CNN on
# one core of a 2-core x86 laptop-class VM (1.34 ms per sample for 3 × 24 MFLOP; `scaledl-lab
# calibrate` measures your own machine instead): an achieved rate, with no peak behind it.
PEAK_FP32: dict[str, float] = {"v100": 15.7e12, "a100": 19.5e12, "h100": 67e12}
ACHIEVED_FRACTION = 0.4
DEVICES: dict[str, float] = {
    "cpu-core": 50e9,
    **{name: peak * ACHIEVED_FRACTION for name, peak in PEAK_FP32.items()},
}
# Memory traffic of one received-gradient application, in passes over the parameter bytes:
# the copy out of the receive buffer into the gradients (read + write) and an optimiser step
# (read parameters, gradients and one state, write parameters and state). Rates: achieved
# bytes/s, assumed (70% of the GPUs' peak; 5 GB/s for one CPU core, where calibrate.time_apply
# measured 1.2 GB/s with other jobs on both cores). `scaledl-lab calibrate` times the
# application itself and stores it in the profile.
APPLY_PASSES = 7
MEMORY_RATES: dict[str, float] = {
    "cpu-core": 5e9,
    "v100": 900e9 * 0.7,
    "a100": 1.55e12 * 0.7,
    "h100": 3.35e12 * 0.7,
}

ALLREDUCE_ALGORITHMS: tuple[str, ...] = ("ring", "recursive-doubling")


def allreduce_time(
    nbytes: int, world_size: int, net: NetworkProfile, algorithm: str = "ring"
) -> float:
    """Time of an allreduce of ``nbytes`` on ``world_size`` workers."""
    p = world_size
    if p <= 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (p - 1) / p * nbytes / net.bandwidth_Bps + 2 * (p - 1) * net.latency_s
    if algorithm == "recursive-doubling":
        return math.ceil(math.log2(p)) * net.message_time(nbytes)
    raise CostModelError(
        f"allreduce algorithm {algorithm!r} is unknown; allowed: {', '.join(ALLREDUCE_ALGORITHMS)}"
    )


def allreduce_bytes(nbytes: int, world_size: int, algorithm: str = "ring") -> int:
    """Bytes one worker sends in that allreduce."""
    if algorithm == "ring" or world_size <= 1:
        return ring_allreduce_bytes(nbytes, world_size)
    return math.ceil(math.log2(world_size)) * nbytes


def allgather_time(
    nbytes: int, world_size: int, net: NetworkProfile, algorithm: str = "ring"
) -> float:
    """Time of an allgather of ``nbytes`` from each of ``world_size`` workers: everyone receives
    the other p − 1 pieces, (p − 1)·n/β, in p − 1 ring steps or ⌈log2 p⌉ doubling rounds."""
    p = world_size
    if p <= 1:
        return 0.0
    steps = p - 1 if algorithm == "ring" else math.ceil(math.log2(p))
    return steps * net.latency_s + (p - 1) * nbytes / net.bandwidth_Bps


def reduce_scatter_time(
    nbytes: int, world_size: int, net: NetworkProfile, algorithm: str = "ring"
) -> float:
    """A reduce-scatter of ``nbytes`` (or an all-gather into ``nbytes``): (p − 1)/p · n/β in
    p − 1 ring steps or ⌈log2 p⌉ halving rounds; the two together are the ring allreduce."""
    if (p := world_size) <= 1:
        return 0.0
    steps = p - 1 if algorithm == "ring" else math.ceil(math.log2(p))
    return steps * net.latency_s + (p - 1) * nbytes / p / net.bandwidth_Bps


def all_to_all_time(nbytes: int, world_size: int, net: NetworkProfile) -> float:
    """An all-to-all of ``nbytes`` from each member (its chunks of n/p, one to each member):
    p − 1 pairwise rounds, each a latency and a chunk, (p − 1)/p · n/β in all."""
    if (p := world_size) <= 1:
        return 0.0
    return (p - 1) * net.latency_s + (p - 1) * nbytes / p / net.bandwidth_Bps


@dataclass(frozen=True)
class Stragglers:
    """Seeded slowdowns: fixed slow ranks, a per-worker lognormal spread, random hiccups."""

    slow: dict[int, float] = field(default_factory=dict)
    spread: float = 0.0
    hiccup_prob: float = 0.0
    hiccup_s: float = 0.0
    seed: int = 0

    def factor(self, rank: int, world_size: int) -> float:
        """The fixed multiplier of ``rank``'s compute time."""
        f = self.slow.get(rank, 1.0)
        if self.spread > 0:
            rng = np.random.default_rng([self.seed, world_size])
            f *= float(rng.lognormal(0.0, self.spread, size=world_size)[rank])
        return f

    def hiccup(self, rank: int, step: int) -> float:
        """Extra seconds this step, drawn from (seed, rank, step) alone: order-independent."""
        if self.hiccup_prob <= 0:
            return 0.0
        u = np.random.default_rng([self.seed, rank, step, 1]).random()
        return self.hiccup_s if u < self.hiccup_prob else 0.0

    @classmethod
    def parse(cls, spec: str | None, seed: int = 0) -> Stragglers:
        """``slow:RANK:FACTOR``, ``spread:SIGMA``, ``hiccup:PROB:SECONDS``, joined by commas."""
        if not spec:
            return cls(seed=seed)
        slow: dict[int, float] = {}
        spread = prob = secs = 0.0
        seen: set[str] = set()
        for part in spec.split(","):
            kind, *args = part.strip().split(":")
            key = f"slow:{args[0]}" if kind == "slow" and args else kind
            if key in seen:  # a later one would silently replace the first
                raise CostModelError(f"stragglers={spec!r}: {key!r} is given twice")
            seen.add(key)
            try:
                if kind == "slow" and len(args) == 2:
                    slow[int(args[0])] = float(args[1])
                elif kind == "spread" and len(args) == 1:
                    spread = float(args[0])
                elif kind == "hiccup" and len(args) == 2:
                    prob, secs = float(args[0]), float(args[1])
                else:
                    raise ValueError
            except ValueError:
                raise CostModelError(
                    f"stragglers={spec!r}: cannot read {part!r}; use slow:RANK:FACTOR, "
                    "spread:SIGMA or hiccup:PROB:SECONDS, joined by commas"
                ) from None
        if any(f <= 0 for f in slow.values()) or spread < 0 or not 0 <= prob <= 1 or secs < 0:
            raise CostModelError(
                f"stragglers={spec!r}: factors must be > 0, spread >= 0, "
                "0 <= prob <= 1, seconds >= 0"
            )
        return cls(slow=slow, spread=spread, hiccup_prob=prob, hiccup_s=secs, seed=seed)


@dataclass(frozen=True)
class CostModel:
    """Everything the simulator charges time for. ``gpus_per_node`` places rank r on node
    r // G (None: every worker on one node); a transfer is charged at the link it crosses
    (:func:`.network.link_of`)."""

    compute: ComputeProfile
    network: NetworkProfile
    allreduce: str = "ring"
    stragglers: Stragglers = field(default_factory=Stragglers)
    gpus_per_node: int | None = None

    def step_time(self, rank: int, world_size: int, step: int, samples: int) -> float:
        base = self.compute.step_time(samples) * self.stragglers.factor(rank, world_size)
        return base + self.stragglers.hiccup(rank, step)

    def apply_time(self, rank: int, world_size: int, nbytes: int) -> float:
        """Seconds to apply a received gradient of ``nbytes`` parameter bytes (see
        :class:`ComputeProfile`); a straggler is slow at this too."""
        per_byte = self.compute.apply_per_byte_s
        if per_byte is None:
            device = self.compute.name.split(":")[0]
            per_byte = APPLY_PASSES / MEMORY_RATES.get(device, MEMORY_RATES["cpu-core"])
        return per_byte * nbytes * self.stragglers.factor(rank, world_size)

    def link(self, ranks: Sequence[int]) -> NetworkProfile:
        """The link a collective over ``ranks`` (or a message between two) is charged at."""
        return link_of(self.network, self.gpus_per_node, ranks)

    def allreduce_time(
        self, nbytes: int, world_size: int, ranks: Sequence[int] | None = None
    ) -> float:
        """An allreduce over ``ranks`` (default: ranks 0 to ``world_size`` − 1)."""
        link = self.link(range(world_size) if ranks is None else ranks)
        return allreduce_time(nbytes, world_size, link, self.allreduce)

    def allreduce_bytes(self, nbytes: int, world_size: int) -> int:
        return allreduce_bytes(nbytes, world_size, self.allreduce)

    def allgather_time(
        self, nbytes: int, world_size: int, ranks: Sequence[int] | None = None
    ) -> float:
        link = self.link(range(world_size) if ranks is None else ranks)
        return allgather_time(nbytes, world_size, link, self.allreduce)


# -- profiles: built-in device rates and calibration files ---------------------------------


def default_profile_path() -> Path:
    root = os.environ.get("SCALEDL_DATA_DIR") or Path.home() / ".cache" / "scaledl_lab"
    return Path(root) / "calibration.json"


def save_calibration(
    path: str | os.PathLike[str],
    compute: dict[str, ComputeProfile],
    network: NetworkProfile,
    meta: dict,
) -> Path:
    """Write a calibration: one compute profile per model, the measured network, provenance."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "compute": {k: asdict(v) for k, v in compute.items()},
        "network": asdict(network),
        "meta": meta,
    }
    path.write_text(json.dumps(body, indent=2))
    return path


def load_calibration(
    path: str | os.PathLike[str],
) -> tuple[dict[str, ComputeProfile], NetworkProfile]:
    path = Path(path)
    if not path.is_file():
        raise CostModelError(
            f"calibration file {path} does not exist; create it with `scaledl-lab calibrate`"
        )
    body = json.loads(path.read_text())
    compute = {k: ComputeProfile(**v) for k, v in body["compute"].items()}
    return compute, NetworkProfile(**body["network"])


def compute_profile(spec: str, model: str, flops_per_sample: int) -> ComputeProfile:
    """``spec`` is a device name (rate from DEVICES) or a calibration file path."""
    if spec in DEVICES:
        # A training step is ~3 forward passes (forward, and backward for inputs and weights).
        per_sample = 3 * flops_per_sample / DEVICES[spec]
        return ComputeProfile(f"{spec}:{model}", per_step_s=1e-4, per_sample_s=per_sample)
    if spec.endswith(".json") or os.sep in spec:
        compute, _ = load_calibration(spec)
        if model not in compute:
            raise CostModelError(
                f"calibration {spec} has no profile for model {model!r} "
                f"(it has {sorted(compute)}); run `scaledl-lab calibrate "
                f"--models {model}`"
            )
        return compute[model]
    raise CostModelError(
        f"compute profile {spec!r} is unknown; allowed: "
        f"{', '.join(DEVICES)} or a calibration .json file"
    )


def network_profile(spec: str) -> NetworkProfile:
    """A named network, a ``custom:`` one (one link or two tiers), or a calibration file's."""
    if spec in NETWORKS:
        return NETWORKS[spec]
    if spec.startswith("custom:"):
        return custom_network(spec)
    if spec.endswith(".json"):
        return load_calibration(spec)[1]
    raise CostModelError(
        f"network {spec!r} is unknown; allowed: {', '.join(NETWORKS)}, "
        f"{CUSTOM_FORMS} or a calibration .json file"
    )


def build_cost_model(cfg: Any, flops_per_sample: int) -> CostModel:
    """The cost model a config names (compute profile, network and placement, allreduce,
    stragglers)."""
    return CostModel(
        compute=compute_profile(cfg.compute_profile, cfg.model, flops_per_sample),
        network=network_profile(cfg.network),
        allreduce=cfg.allreduce_algorithm,
        stragglers=Stragglers.parse(cfg.stragglers, seed=cfg.seed),
        gpus_per_node=cfg.gpus_per_node,
    )
