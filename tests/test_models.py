"""Tests for scaledl_lab.models: shapes, exact parameter counts, seeding, errors and FLOPs."""

from __future__ import annotations

import pytest
import torch

from scaledl_lab.models import (
    MODELS,
    build_model,
    count_parameters,
    model_compatible,
    model_flops,
)

NATURAL_INPUTS = [
    ("mlp", (1, 28, 28)),
    ("mlp", (3, 32, 32)),
    ("cnn", (1, 28, 28)),
    ("cnn", (3, 32, 32)),
    ("cnn1d", (1, 40)),
    ("resnet18", (3, 32, 32)),
]


@pytest.mark.parametrize(("name", "shape"), NATURAL_INPUTS)
def test_forward_shape(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(name, shape, 10, seed=0)
    out = model(torch.randn(2, *shape))
    assert out.shape == (2, 10)


def test_all_models_listed() -> None:
    # gpt-tiny reads token ids, not float samples: tests/test_gpt.py, tests/test_moe.py
    assert set(MODELS) == {name for name, _ in NATURAL_INPUTS} | {"gpt-tiny", "gpt-tiny-moe"}


def test_parameter_counts_exact() -> None:
    # 784*512+512 + 512*512+512 + 512*10+10
    assert count_parameters(build_model("mlp", (1, 28, 28), 10)) == 669_706
    # conv 320 + conv 18,496 + fc 9216*128+128 + fc 1,290 (the Keras MNIST CNN, no dropout)
    assert count_parameters(build_model("cnn", (1, 28, 28), 10)) == 1_199_882


def test_resnet18_size_and_grayscale_input() -> None:
    model = build_model("resnet18", (1, 28, 28), 10, seed=0)
    # Pre-activation ResNet-18 for CIFAR has about 11.2 M parameters.
    assert 11_000_000 < count_parameters(model) < 11_300_000
    assert model(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_seed_determinism_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = build_model("cnn", (1, 28, 28), 10, seed=7)
    b = build_model("cnn", (1, 28, 28), 10, seed=7)
    c = build_model("cnn", (1, 28, 28), 10, seed=8)
    assert torch.equal(torch.get_rng_state(), state)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    pairs = zip(a.parameters(), c.parameters(), strict=True)
    assert any(not torch.equal(pa, pc) for pa, pc in pairs)


def test_unseeded_build_uses_global_rng() -> None:
    torch.manual_seed(5)
    a = build_model("mlp", (4,), 3)
    torch.manual_seed(5)
    b = build_model("mlp", (4,), 3)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_unknown_model_names_allowed() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'vgg'.*mlp, cnn, cnn1d, resnet18"):
        build_model("vgg", (1, 28, 28), 10)


@pytest.mark.parametrize(
    ("name", "shape", "pattern"),
    [
        ("cnn1d", (1, 28, 28), r"cnn1d needs \(C, L\) inputs"),
        ("cnn1d", (40,), r"cnn1d needs \(C, L\) inputs"),
        ("cnn", (1, 40), r"cnn needs \(C, H, W\) images"),
        ("resnet18", (784,), r"resnet18 needs \(C, H, W\) images"),
        ("cnn", (1, 4, 28), r"H, W >= 8"),
        ("resnet18", (3, 32, 6), r"H, W >= 8"),
    ],
)
def test_incompatible_shapes(name: str, shape: tuple[int, ...], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        build_model(name, shape, 10)


def test_bad_num_classes() -> None:
    with pytest.raises(ValueError, match="num_classes"):
        build_model("mlp", (4,), 0)


def test_model_compatible() -> None:
    for name, shape in NATURAL_INPUTS:
        assert model_compatible(name, shape) is None
    assert model_compatible("mlp", (1, 40)) is None  # the MLP flattens anything
    assert model_compatible("resnet18", (1, 28, 28)) is None
    assert "cnn1d" in model_compatible("cnn1d", (1, 28, 28))
    assert "unknown model" in model_compatible("transformer", (1, 28, 28))
    assert "positive" in model_compatible("mlp", (0, 28))


def test_model_flops_mlp_exact() -> None:
    expected = 2 * (784 * 512 + 512 * 512 + 512 * 10)
    assert model_flops("mlp", (1, 28, 28), 10) == expected
    model = build_model("mlp", (1, 28, 28), 10)
    assert model_flops(model, (1, 28, 28), 10) == expected


def test_model_flops_convs() -> None:
    # cnn1d on (1, 40): lengths 19, 10, 5; MACs = out_positions * C_out * C_in * k.
    macs = 19 * 25 * 1 * 5 + 10 * 25 * 25 * 3 + 5 * 25 * 25 * 3 + 125 * 10
    assert model_flops("cnn1d", (1, 40), 10) == 2 * macs
    # cnn on 28x28: 26x26x32 outputs of 9 MACs, 24x24x64 of 288, then the two linear layers.
    macs = 26 * 26 * 32 * 9 + 24 * 24 * 64 * 288 + 9216 * 128 + 128 * 10
    assert model_flops("cnn", (1, 28, 28), 10) == 2 * macs
    assert model_flops("resnet18", (3, 32, 32), 10) > 1e9  # ~0.56 G MACs per CIFAR image


def test_model_flops_leaves_bn_stats_and_mode_alone() -> None:
    model = build_model("resnet18", (3, 16, 16), 10, seed=0)
    model.train()
    before = model.layers[0].bn1.running_mean.clone()
    model_flops(model, (3, 16, 16), 10)
    assert model.training
    assert torch.equal(model.layers[0].bn1.running_mean, before)


@pytest.mark.parametrize(("name", "shape"), NATURAL_INPUTS[::2] + [("resnet18", (3, 16, 16))])
def test_backward(name: str, shape: tuple[int, ...]) -> None:
    model = build_model(name, shape, 10, seed=1)
    x = torch.randn(4, *shape)
    y = torch.randint(0, 10, (4,))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
