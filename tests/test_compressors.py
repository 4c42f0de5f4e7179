"""The compressors alone (no runtime): error feedback loses nothing, top-k is exact, QSGD is
unbiased, PowerSGD reconstructs low-rank matrices, payloads pack to exactly their bytes."""

from __future__ import annotations

import math

import pytest
import torch

from scaledl_lab.strategies.compression import (
    DGC,
    QSGD,
    DGCMemory,
    ErrorFeedback,
    NoCompression,
    OneBit,
    PowerSGD,
    TopK,
    dgc_density,
    pack,
    parse,
    payload_bytes,
    qsgd_bits,
    shard_layouts,
    unpack,
)
from scaledl_lab.strategies.compression.compressors import QSGD_BUCKET
from scaledl_lab.strategies.compression.wire import pack_bits, unpack_bits

# A small "model": two matrices, a conv kernel and biases (1-D segments).
LAYOUT = ((48, 20), (48,), (10, 3, 3, 3), (10,), (7, 48))
NUMEL = sum(math.prod(s) for s in LAYOUT)


def _compressor(name: str):
    return {
        "none": lambda: NoCompression(LAYOUT),
        "onebit": lambda: OneBit(LAYOUT),
        "qsgd:4": lambda: QSGD(LAYOUT, 4, seed=1),
        "qsgd:1": lambda: QSGD(LAYOUT, 1, seed=1),
        "topk:0.01": lambda: TopK(LAYOUT, 0.01),
        "dgc:0.05": lambda: DGC(LAYOUT, 0.05),
        "powersgd:2": lambda: PowerSGD(LAYOUT, 2, seed=1),
    }[name]()


ALL = ["none", "onebit", "qsgd:4", "qsgd:1", "topk:0.01", "dgc:0.05", "powersgd:2"]


def _gradients(steps: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(NUMEL, generator=gen, dtype=torch.float64) * (1 + k) for k in range(steps)]


@pytest.mark.parametrize("name", ALL)
def test_error_feedback_loses_nothing(name):
    # Σ transmitted + residual == Σ raw gradients, after every step (float64).
    compressor, memory = _compressor(name), ErrorFeedback()
    raw_sum = torch.zeros(NUMEL, dtype=torch.float64)
    sent_sum = torch.zeros(NUMEL, dtype=torch.float64)
    for step, g in enumerate(_gradients(12)):
        compressor.set_epoch(step / 4)
        corrected = memory.add(g)
        payload = compressor.encode(corrected)
        sent = compressor.decode(payload)
        memory.keep(corrected, sent, payload)
        raw_sum += g
        sent_sum += sent
        assert torch.allclose(sent_sum + memory.residual, raw_sum, rtol=0, atol=1e-10)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_dgc_memory_loses_nothing_of_its_velocity(momentum):
    # DGC accumulates the momentum-corrected u_t: Σ sent + v == Σ u_t; with momentum 0, u = g.
    compressor = DGC(LAYOUT, 0.05)
    memory = DGCMemory(momentum, world_size=4, clip_norm=None)
    added = torch.zeros(NUMEL, dtype=torch.float64)
    raw = torch.zeros(NUMEL, dtype=torch.float64)
    sent_sum = torch.zeros(NUMEL, dtype=torch.float64)
    for step, g in enumerate(_gradients(10)):
        compressor.set_epoch(step / 3)
        corrected = memory.add(g)
        added += memory.velocity
        raw += g
        payload = compressor.encode(corrected)
        sent = compressor.decode(payload)
        memory.keep(corrected, sent, payload)
        sent_sum += sent
        assert torch.allclose(sent_sum + memory.residual, added, rtol=0, atol=1e-10)
        # Momentum-factor masking: the sent entries' momentum is gone.
        assert memory.velocity[payload["indices"].long()].abs().max() == 0
    if momentum == 0:
        assert torch.allclose(added, raw, rtol=0, atol=1e-12)


def test_dgc_clips_each_gradient_to_the_threshold_over_root_n():
    memory = DGCMemory(0.0, world_size=4, clip_norm=2.0)
    g = torch.full((100,), 1.0, dtype=torch.float64)  # norm 10
    assert memory.add(g).norm().item() == pytest.approx(2.0 / 2)


def test_without_error_feedback_nothing_is_kept():
    memory = ErrorFeedback(enabled=False)
    g = torch.ones(5)
    assert memory.add(g) is g
    memory.keep(g, torch.zeros(5), {})
    assert memory.residual is None


def test_topk_keeps_exactly_the_k_largest_magnitudes():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(NUMEL, generator=gen)
    top = TopK(LAYOUT, 0.05)
    payload = top.encode(x)
    assert top.k == math.ceil(0.05 * NUMEL) == len(payload["values"])
    expected = set(torch.argsort(x.abs(), descending=True)[: top.k].tolist())
    assert set(payload["indices"].tolist()) == expected
    decoded = top.decode(payload)
    kept = torch.zeros(NUMEL, dtype=torch.bool)
    kept[list(expected)] = True
    assert torch.equal(decoded[kept], x[kept]) and decoded[~kept].abs().max() == 0
    assert payload_bytes(payload) == top.k * (4 + 4)  # float32 values, int32 indices


@pytest.mark.parametrize("levels", [1, 2, 4, 127])
def test_qsgd_is_unbiased(levels):
    # Each entry decodes to ‖v‖/s·(⌊r⌋ + Bernoulli(r − ⌊r⌋)) with r = |x|/‖v‖·s: its standard
    # error over the draws is known exactly. The mean of 400 draws lies within 3 standard
    # errors entrywise (allowing the 0.3% a normal tail leaves), and so does the total error.
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(NUMEL, generator=gen, dtype=torch.float64)
    q = QSGD(LAYOUT, levels, seed=11)
    draws = 400
    mean = torch.stack([q.decode(q.encode(x)) for _ in range(draws)]).mean(0)
    norms = q._bucketed(x).norm(dim=1).repeat_interleave(QSGD_BUCKET)[:NUMEL]
    r = x.abs() / norms * levels
    frac = r - r.floor()
    se = norms / levels * torch.sqrt(frac * (1 - frac) / draws)
    error = mean - x
    assert torch.all(error[se == 0].abs() < 1e-12)  # entries on a level never vary
    assert ((error.abs() > 3 * se + 1e-12).float().mean().item()) < 0.01
    assert abs(error.sum().item()) < 3 * se.pow(2).sum().sqrt().item()


def test_qsgd_codes_and_bytes():
    assert [qsgd_bits(s) for s in (1, 7, 8, 127, 128, 32767)] == [2, 4, 8, 8, 16, 16]
    x = torch.randn(1000)
    q = QSGD(((1000,),), 4)
    payload = q.encode(x)
    assert payload_bytes(payload) == math.ceil(1000 / 2) + 4 * math.ceil(1000 / 512)
    levels = (q.decode(payload) / payload["norms"].repeat_interleave(512)[:1000] * 4).round()
    assert levels.abs().max() <= 4


@pytest.mark.parametrize("rank", [2, 3, 6])
def test_powersgd_reconstructs_a_matrix_of_rank_at_most_its_rank_exactly(rank):
    gen = torch.Generator().manual_seed(7)
    low = torch.randn(64, 2, generator=gen, dtype=torch.float64) @ torch.randn(
        2, 40, generator=gen, dtype=torch.float64
    )
    bias = torch.randn(64, generator=gen, dtype=torch.float64)
    x = torch.cat([low.reshape(-1), bias])
    psgd = PowerSGD(((64, 40), (64,)), rank, seed=0)
    payload = psgd.encode(x)
    assert torch.allclose(psgd.decode(payload), x, rtol=0, atol=1e-10)
    assert payload_bytes(payload) == (64 + 40) * rank * 8 + 64 * 8


def test_powersgd_of_rank_one_is_not_exact_on_a_rank_two_matrix():
    gen = torch.Generator().manual_seed(7)
    low = torch.randn(64, 2, generator=gen, dtype=torch.float64) @ torch.randn(
        2, 40, generator=gen, dtype=torch.float64
    )
    psgd = PowerSGD(((64, 40),), 1, seed=0)
    assert (psgd.decode(psgd.encode(low.reshape(-1))) - low.reshape(-1)).abs().max() > 1e-3


def test_powersgd_sends_vectors_and_small_matrices_as_they_are():
    psgd = PowerSGD(((48, 20), (48,), (4, 4)), 2)
    assert [s.rank for s in psgd.segments] == [2, 0, 0]  # (4+4)·2·2 = 32 ≥ 16: no gain


def test_onebit_sends_signs_and_two_means_per_row():
    x = torch.tensor([1.0, 3.0, -2.0, 7.0, -4.0, -6.0, 0.5, -0.5])
    one = OneBit(((2, 3), (2,)))  # a 2 × 3 matrix (two rows) and a vector (one row)
    payload = one.encode(x)
    assert payload_bytes(payload) == 1 + 2 * 3 * 4  # 8 bits in one byte, 2 scales per row
    assert one.decode(payload).tolist() == [2.0, 2.0, -2.0, 7.0, -5.0, -5.0, 0.5, -0.5]


@pytest.mark.parametrize("name", ALL)
def test_a_payload_packs_to_exactly_its_bytes_and_back(name):
    compressor = _compressor(name)
    x = torch.randn(NUMEL)
    payload = compressor.encode(x)
    wire = pack(payload)
    assert wire.dtype == torch.uint8 and wire.numel() == payload_bytes(payload)
    back = unpack(wire, payload)
    assert all(torch.equal(back[k], payload[k]) for k in payload)


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_bit_packing_round_trips(bits):
    codes = torch.randint(0, 2**bits, (37,))
    packed = pack_bits(codes, bits)
    assert packed.numel() == math.ceil(37 * bits / 8)
    assert torch.equal(unpack_bits(packed, bits, 37), codes)


def test_dgc_warms_up_its_sparsity_over_the_first_epoch():
    densities = [dgc_density(0.001, e) for e in (0.0, 0.25, 0.5, 0.75, 1.0, 3.0)]
    assert densities == [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001]
    dgc = DGC(LAYOUT, 0.001)
    assert dgc.k == math.ceil(0.25 * NUMEL)
    dgc.set_epoch(2.0)
    assert dgc.k == max(1, math.ceil(0.001 * NUMEL))
    assert DGC(LAYOUT, 0.001, warmup=False).k == max(1, math.ceil(0.001 * NUMEL))


def test_shard_layouts_cut_only_the_segments_that_straddle_a_boundary():
    layout = ((4, 3), (3,), (2, 5))  # 12 + 3 + 10 = 25 entries; 2 shards: 13 and 12
    assert shard_layouts(layout, 1) == [layout]
    assert shard_layouts(layout, 2) == [((4, 3), (1,)), ((2,), (2, 5))]
    assert [sum(math.prod(s) for s in lay) for lay in shard_layouts(layout, 3)] == [9, 8, 8]


def test_parse_reads_every_spelling():
    assert parse("none").is_none
    assert parse("onebit").name == "onebit"
    assert parse("qsgd:4").levels == 4
    assert parse("topk:0.01").ratio == 0.01
    assert parse("dgc:1").ratio == 1.0
    assert parse("powersgd:2").rank == 2


def test_error_feedback_needs_a_contractive_qsgd():
    # QSGD with 1 level per 512-entry bucket has variance ω ≈ 22.6 × ‖v‖²: fed back, its residual
    # grows geometrically. Damped by 1/(1 + ω) it keeps part of every vector and stays bounded.
    g = torch.randn(4096, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    norms = {}
    for contractive in (False, True):
        q, memory = QSGD(((4096,),), 1, seed=0, contractive=contractive), ErrorFeedback()
        for _ in range(30):
            corrected = memory.add(g)
            payload = q.encode(corrected)
            memory.keep(corrected, q.decode(payload), payload)
        norms[contractive] = memory.residual.norm().item() / g.norm().item()
    assert norms[False] > 1e4 and norms[True] < 30, norms
    assert QSGD(((4096,),), 1).variance_bound() == pytest.approx(math.sqrt(512))
