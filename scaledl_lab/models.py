"""The networks of the lab: MLP, Keras-style MNIST CNN, MNIST-1D ConvBase, pre-activation ResNet-18,
gpt-tiny (:mod:`.gpt`) and gpt-tiny-moe, its mixture of experts (:mod:`.moe`).

ResNet-18 v2 follows He et al. 2016, "Identity Mappings in Deep Residual Networks", in its
CIFAR form, the model of Viviani et al. 2019 ("Deep Learning at Scale", PDP 2019).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from .gpt import GPT
from .moe import MoEGPT

MODELS: tuple[str, ...] = ("mlp", "cnn", "cnn1d", "resnet18", "gpt-tiny", "gpt-tiny-moe")
# Which models accept which datasets' sample shapes (images vs 1-D signals).
MODEL_DATASETS: dict[str, tuple[str, ...]] = {
    "mlp": ("fashion-mnist", "mnist1d", "cifar10"),
    "cnn": ("fashion-mnist", "cifar10"),
    "cnn1d": ("mnist1d",),
    "resnet18": ("fashion-mnist", "cifar10"),
    "gpt-tiny": ("licenses",),
    "gpt-tiny-moe": ("licenses",),
}

# Smallest image side for the 2-D convolutional nets: keeps every stage of ResNet-18 (three
# stride-2 stages) and the CNN's pooling at a spatial size of at least one pixel.
MIN_IMAGE_SIDE = 8


class MLP(nn.Module):
    """flatten -> 512 -> 512 -> classes; no dropout so that distributed runs stay deterministic."""

    def __init__(self, in_features: int, num_classes: int, hidden: int = 512) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class CNN(nn.Module):
    """The classic Keras MNIST CNN (conv32-conv64-pool-fc128) without dropout."""

    def __init__(self, channels: int, height: int, width: int, num_classes: int) -> None:
        super().__init__()
        # Two unpadded 3x3 convs shrink each side by 4, then the 2x2 pool halves it.
        flat = 64 * ((height - 4) // 2) * ((width - 4) // 2)
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(flat, 128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _conv1d_out(length: int, kernel: int, stride: int, padding: int) -> int:
    return (length + 2 * padding - kernel) // stride + 1


class CNN1D(nn.Module):
    """MNIST-1D ConvBase (Greydanus 2020): three strided Conv1d layers and a linear head."""

    def __init__(self, channels: int, length: int, num_classes: int, width: int = 25) -> None:
        super().__init__()
        out = _conv1d_out(_conv1d_out(_conv1d_out(length, 5, 2, 1), 3, 2, 1), 3, 2, 1)
        self.net = nn.Sequential(
            nn.Conv1d(channels, width, 5, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv1d(width, width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(width * out, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class PreActBasicBlock(nn.Module):
    """BN-ReLU-conv3x3, BN-ReLU-conv3x3, plus an identity (or 1x1 projection) shortcut."""

    def __init__(self, in_planes: int, planes: int, stride: int) -> None:
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_planes)
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.shortcut: nn.Module | None = None
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(x))
        # v2 detail: the projection reads the pre-activated input, the identity reads x itself,
        # so the residual path stays a clean identity from block to block.
        shortcut = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        out = self.conv2(torch.relu(self.bn2(out)))
        return out + shortcut


class PreActResNet(nn.Module):
    """CIFAR-style pre-activation ResNet: 3x3 stem, no max-pool, four stages, BN-ReLU, avg-pool."""

    def __init__(
        self,
        channels: int,
        num_classes: int,
        blocks: Sequence[int] = (2, 2, 2, 2),
        widths: Sequence[int] = (64, 128, 256, 512),
    ) -> None:
        super().__init__()
        self.stem = nn.Conv2d(channels, widths[0], 3, stride=1, padding=1, bias=False)
        layers: list[nn.Module] = []
        in_planes = widths[0]
        for stage, (count, planes) in enumerate(zip(blocks, widths, strict=True)):
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                layers.append(PreActBasicBlock(in_planes, planes, stride))
                in_planes = planes
        self.layers = nn.Sequential(*layers)
        # Pre-activation blocks end on a conv, so the network needs one last BN-ReLU.
        self.bn = nn.BatchNorm2d(in_planes)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.layers(self.stem(x))
        out = self.pool(torch.relu(self.bn(out)))
        return self.fc(torch.flatten(out, 1))


def model_compatible(name: str, input_shape: Sequence[int]) -> str | None:
    """Return None if model `name` accepts per-sample `input_shape`, else the reason it does not."""
    if name not in MODELS:
        return f"unknown model {name!r}; choose one of {', '.join(MODELS)}"
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d < 1 for d in shape):
        return f"input_shape must be non-empty with positive sizes, got {shape}"
    if name in ("gpt-tiny", "gpt-tiny-moe"):
        if len(shape) != 1:
            return f"{name} needs (S,) token sequences, got input_shape {shape}"
    elif name == "cnn1d":
        if len(shape) != 2:
            return f"cnn1d needs (C, L) inputs, got input_shape {shape}"
        if shape[1] < 3:
            return f"cnn1d needs a sequence length L >= 3, got {shape[1]}"
    elif name in ("cnn", "resnet18"):
        if len(shape) != 3:
            return f"{name} needs (C, H, W) images, got input_shape {shape}"
        if min(shape[1:]) < MIN_IMAGE_SIDE:
            return f"{name} needs images with H, W >= {MIN_IMAGE_SIDE}, got {shape}"
    return None


def _construct(name: str, shape: tuple[int, ...], num_classes: int) -> nn.Module:
    if name == "mlp":
        return MLP(math.prod(shape), num_classes)
    if name == "cnn":
        return CNN(*shape, num_classes)
    if name == "cnn1d":
        return CNN1D(*shape, num_classes)
    if name == "gpt-tiny":
        return GPT(num_classes, shape[0])  # the classes are the vocabulary
    if name == "gpt-tiny-moe":  # its default mixture; the config's: families.prepare_model
        return MoEGPT(num_classes, shape[0])
    return PreActResNet(shape[0], num_classes)


def build_model(
    name: str, input_shape: Sequence[int], num_classes: int, *, seed: int | None = None
) -> nn.Module:
    """Build model `name` for per-sample `input_shape` (no batch dimension) and `num_classes`.

    With `seed`, the weights depend only on the seed: construction runs inside a forked RNG,
    so the caller's global torch RNG state is left untouched.
    """
    reason = model_compatible(name, input_shape)
    if reason is not None:
        raise ValueError(reason)
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    shape = tuple(int(d) for d in input_shape)
    if seed is None:
        return _construct(name, shape, num_classes)
    # devices=[]: initialisation happens on CPU, so no CUDA RNG needs saving (and no warning).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _construct(name, shape, num_classes)


def count_parameters(model: nn.Module) -> int:
    """Total number of parameter elements (trainable or not; BN running stats are buffers)."""
    return sum(p.numel() for p in model.parameters())


def model_flops(
    name_or_model: str | nn.Module, input_shape: Sequence[int], num_classes: int
) -> int:
    """Forward FLOPs per sample, counted as 2 x multiply-accumulates of Conv1d/Conv2d/Linear
    and of the products a module reports itself (``matmul_macs``: attention's QKᵀ and AV).

    Biases, BatchNorm, activations and pooling are ignored: they are a few percent at most.
    """
    if isinstance(name_or_model, str):
        model = build_model(name_or_model, input_shape, num_classes, seed=0)
    else:
        model = name_or_model
    total = 0

    def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Linear):
            macs = output.numel() * module.in_features
        elif hasattr(module, "matmul_macs"):
            macs = module.matmul_macs(output)
        else:
            conv: nn.Conv1d | nn.Conv2d = module  # type: ignore[assignment]
            per_output = conv.in_channels // conv.groups * math.prod(conv.kernel_size)
            macs = output.numel() * per_output
        total += 2 * macs

    handles = [
        m.register_forward_hook(hook)
        for m in model.modules()
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)) or hasattr(m, "matmul_macs")
    ]
    was_training = model.training
    try:
        # eval mode: a batch of one must not touch BatchNorm running statistics.
        model.eval()
        param = next(model.parameters(), None)
        like = param if param is not None else torch.zeros(())
        shape = (1, *tuple(int(d) for d in input_shape))
        # A model (or layer) that reads token ids says so (``input_dtype``).
        dtype = getattr(model, "input_dtype", like.dtype)
        dummy = torch.zeros(shape, dtype=dtype, device=like.device)
        with torch.no_grad():
            model(dummy)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    return int(total)
