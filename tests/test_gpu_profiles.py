"""The GPU profiles of `scaledl-lab plan --gpu` (scaledl_lab/runtime/sim/gpus.json): the
datasheets' numbers, each with its source, and the same links as the simulator's networks."""

from __future__ import annotations

import pytest

from scaledl_lab.runtime.sim.gpus import GPUS, gpu_profile, profiles_file
from scaledl_lab.runtime.sim.network import NETWORKS, CostModelError

A100 = gpu_profile("a100")


def test_gpu_profiles_hold_the_datasheets_with_their_sources():
    h100 = gpu_profile("h100")
    assert (A100.peak_flops, A100.nvlink_Bps, A100.infiniband_Bps) == (312e12, 300e9, 25e9)
    assert (h100.peak_flops, h100.nvlink_Bps, h100.infiniband_Bps) == (989e12, 450e9, 50e9)
    assert A100.memory_bytes == h100.memory_bytes == 80 * 2**30
    body = profiles_file()
    for key in GPUS:  # every datasheet number says where it comes from
        numbers = {k for k, v in body["gpus"][key].items() if isinstance(v, int | float)}
        assert numbers == set(body["gpus"][key]["sources"])
        assert body["calibration"]["matmul_efficiency"][key]["source"]
    # the same links as the simulator's two-tier networks
    for key in GPUS:
        ours, sim = gpu_profile(key).network, NETWORKS[f"{key}-node"]
        assert (ours.latency_s, ours.bandwidth_Bps) == (sim.latency_s, sim.bandwidth_Bps)
        assert (ours.inter_latency_s, ours.inter_bandwidth_Bps) == (
            sim.inter_latency_s, sim.inter_bandwidth_Bps,
        )  # fmt: skip


def test_an_unknown_gpu_is_refused():
    with pytest.raises(CostModelError, match="gpu 'v100' is unknown; the GPU profiles are a100"):
        gpu_profile("v100")
