"""The simulated network: its links, where the ranks live, and which link a transfer crosses.

A network has one link (α, β) between any two workers, or two tiers: GPUs in nodes, a fast
link inside a node (NVLink) and a slower one between nodes (InfiniBand). With ``gpus_per_node``
G, rank r lives on node r // G, so consecutive ranks share a node (a device mesh's innermost
dimension, adjacent ranks, stays inside one); without it every worker is on one node.

What a transfer is charged at (:func:`link_of`):

* a message between two ranks: the link between their nodes;
* a collective over a group: a ring over the group's ranks in rank order, whose every step
  sends one chunk along every hop at once and ends when its slowest hop does. Inside one node
  every hop is NVLink; a group whose ranks span nodes crosses each node boundary on the ring
  (going out and coming back), so each step costs α + chunk/β of the link between nodes:
  time = steps × (α_slowest + chunk/β_slowest), the ring formulas of :mod:`.cost` on the
  slowest link, with the byte counts of :mod:`scaledl_lab.runtime.collectives` unchanged.
  Recursive doubling is charged the same way, every round at the slowest link the group spans
  (an upper bound: its early rounds pair ranks of one node);
* a hosted server (a parameter server) is a host of its own, reached over the link between
  nodes.

Each worker keeps one outgoing queue whatever the link (its NIC and its NVLink ports are not
modelled apart). A one-tier network is the same link inside and between nodes: its numbers do
not depend on the placement.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass


class CostModelError(ValueError):
    """An unknown profile or an impossible cost parameter."""


def _check_link(name: str, latency_s: float, bandwidth_Bps: float) -> None:
    if latency_s < 0:
        raise CostModelError(f"network {name!r}: latency must be >= 0, got {latency_s}")
    if not bandwidth_Bps > 0:
        raise CostModelError(f"network {name!r}: bandwidth must be positive, got {bandwidth_Bps}")


@dataclass(frozen=True)
class NetworkProfile:
    """Per-message latency α (s) and bandwidth β (bytes/s) of a link. A two-tier network adds
    the link between nodes (``inter_latency_s``, ``inter_bandwidth_Bps``, the slower one); α
    and β are then the link inside a node."""

    name: str
    latency_s: float
    bandwidth_Bps: float
    inter_latency_s: float | None = None
    inter_bandwidth_Bps: float | None = None

    def __post_init__(self) -> None:
        _check_link(self.name, self.latency_s, self.bandwidth_Bps)
        lat, bw = self.inter_latency_s, self.inter_bandwidth_Bps
        if (lat is None) != (bw is None):
            raise CostModelError(
                f"network {self.name!r}: give the link between nodes both a latency and a "
                f"bandwidth, or neither (got {lat}, {bw})"
            )
        if lat is None or bw is None:
            return
        _check_link(self.name, lat, bw)
        if lat < self.latency_s or bw > self.bandwidth_Bps:
            raise CostModelError(
                f"network {self.name!r}: the link between nodes is the slower one (latency >= "
                f"{self.latency_s:g}, bandwidth <= {self.bandwidth_Bps:g} of the link inside a "
                f"node); got latency {lat:g}, bandwidth {bw:g}"
            )

    def __repr__(self) -> str:
        """The fields that say something: a one-tier network shows its one link only."""
        shown = ["name", "latency_s", "bandwidth_Bps"]
        if self.inter_latency_s is not None:
            shown += ["inter_latency_s", "inter_bandwidth_Bps"]
        return f"NetworkProfile({', '.join(f'{k}={getattr(self, k)!r}' for k in shown)})"

    @property
    def tiers(self) -> int:
        """1: one link between any two workers; 2: one inside a node, one between nodes."""
        return 1 if self.inter_latency_s is None else 2

    @functools.cached_property
    def intra(self) -> NetworkProfile:
        """The link inside a node (a one-tier network's only link: itself)."""
        if self.tiers == 1:
            return self
        return NetworkProfile(f"{self.name}:intra", self.latency_s, self.bandwidth_Bps)

    @functools.cached_property
    def inter(self) -> NetworkProfile:
        """The link between nodes (a one-tier network's only link: itself)."""
        if self.inter_latency_s is None or self.inter_bandwidth_Bps is None:
            return self
        return NetworkProfile(f"{self.name}:inter", self.inter_latency_s, self.inter_bandwidth_Bps)

    def message_time(self, nbytes: int) -> float:
        """α + n/β on this link (a two-tier network's: the link inside a node)."""
        return self.latency_s + nbytes / self.bandwidth_Bps


def link_of(
    network: NetworkProfile, gpus_per_node: int | None, ranks: Sequence[int]
) -> NetworkProfile:
    """The link a transfer among ``ranks`` is charged at (see the module's docstring): the
    one inside a node if they all live on one node (rank r on node r // ``gpus_per_node``;
    None: one node holds every worker), else the one between nodes."""
    if network.tiers == 1:
        return network
    if gpus_per_node is None or len(ranks) < 2:
        return network.intra
    same_node = min(ranks) // gpus_per_node == max(ranks) // gpus_per_node
    return network.intra if same_node else network.inter


# NCCL's tuning model charges a ring step with the Simple protocol (the one large messages use)
# 3.4 µs over NVLink and 14 µs over the network (`hwLat` in src/graph/tuning.cc of NVIDIA/nccl,
# as of commit b647562): the per-message latencies of the two-tier profiles below. Bandwidths
# are the datasheets' peak rates, per direction (a ring sends one way along each hop).
_NVLINK_STEP_S, _IB_STEP_S = 3.4e-6, 14e-6
NETWORKS: dict[str, NetworkProfile] = {
    "loopback": NetworkProfile("loopback", 120e-6, 0.9e9),  # gloo on one host (measured here)
    "1gbe": NetworkProfile("1gbe", 50e-6, 0.125e9),
    "10gbe": NetworkProfile("10gbe", 20e-6, 1.25e9),
    "100g-ib": NetworkProfile("100g-ib", 2e-6, 12.5e9),
    "nvlink": NetworkProfile("nvlink", 2e-6, 150e9),
    # Between data centres on two continents (DiLoCo's setting): 40 ms one way, half the
    # ~80 ms round trip that public inter-region latency tables give between US-east and
    # western Europe, and 1 Gbit/s, what one long-haul TCP stream typically sustains (the low
    # end of the 1-100 Gbit/s range Streaming DiLoCo's compute-utilisation simulation sweeps).
    "wan": NetworkProfile("wan", 40e-3, 0.125e9),
    # An H100 SXM node (DGX H100): NVLink 4, 900 GB/s per GPU both directions together (H100
    # datasheet), 450 GB/s each way; between nodes one ConnectX-7 InfiniBand NDR port of
    # 400 Gb/s per GPU (DGX H100 datasheet), 50 GB/s each way.
    "h100-node": NetworkProfile("h100-node", _NVLINK_STEP_S, 450e9, _IB_STEP_S, 50e9),
    # An A100 SXM node (DGX A100): NVLink 3, 600 GB/s per GPU both directions together (A100
    # datasheet), 300 GB/s each way; between nodes one ConnectX-6 InfiniBand HDR port of
    # 200 Gb/s per GPU (DGX A100 datasheet), 25 GB/s each way.
    "a100-node": NetworkProfile("a100-node", _NVLINK_STEP_S, 300e9, _IB_STEP_S, 25e9),
}
TWO_TIER = tuple(name for name, net in NETWORKS.items() if net.tiers == 2)
CUSTOM_TWO_TIER = "custom:LAT:BW:INTER_LAT:INTER_BW"
CUSTOM_FORMS = f"custom:LATENCY_S:BANDWIDTH_BPS or {CUSTOM_TWO_TIER}"


def custom_network(spec: str) -> NetworkProfile:
    """``custom:LATENCY_S:BANDWIDTH_BPS`` (one link) or ``custom:LAT:BW:INTER_LAT:INTER_BW``
    (inside a node, then between nodes)."""
    try:
        numbers = [float(x) for x in spec.split(":")[1:]]
        if len(numbers) not in (2, 4):
            raise ValueError
    except ValueError:
        raise CostModelError(
            f"network {spec!r}: use {CUSTOM_FORMS}, e.g. custom:5e-6:1.25e10 or "
            "custom:3.4e-6:4.5e11:1.4e-5:5e10"
        ) from None
    return NetworkProfile(spec, *numbers)
