"""A model's parameters (and gradients) as one flat vector, and back: what strategies send.

Every family that moves whole models or gradients (parameter servers, NNT, gossip, local SGD,
EASGD, Hogwild!) flattens them the same way: parameters in ``model.parameters()`` order, then
(for weights) the floating-point buffers such as BatchNorm statistics.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def _state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Parameters, then floating-point buffers (BatchNorm statistics): what gets averaged."""
    tensors = [p.data for p in model.parameters()]
    tensors += [b for b in model.buffers() if b.is_floating_point()]
    return tensors


def state_vector(model: nn.Module) -> torch.Tensor:
    """A private flat copy of the model's weights (parameters and floating buffers)."""
    return torch.cat([t.reshape(-1) for t in _state_tensors(model)])


def load_state_vector(model: nn.Module, flat: torch.Tensor) -> None:
    """Write ``flat`` (from :func:`state_vector`) back into the model, in place."""
    offset = 0
    for t in _state_tensors(model):
        n = t.numel()
        t.copy_(flat[offset : offset + n].view_as(t))
        offset += n


def param_vector(params: Iterable[nn.Parameter]) -> torch.Tensor:
    """The parameters alone (no buffers) as one new flat vector."""
    return torch.cat([p.detach().reshape(-1) for p in params])


def load_param_vector(params: Iterable[nn.Parameter], flat: torch.Tensor) -> None:
    """Write ``flat`` (from :func:`param_vector`) into the parameters, in place."""
    nn.utils.vector_to_parameters(flat, list(params))


def grad_or_zeros(p: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient, or zeros where backward gave it none."""
    return p.grad if p.grad is not None else torch.zeros_like(p)


def flat_grad(params: Iterable[nn.Parameter]) -> torch.Tensor:
    """All parameter gradients flattened into one new tensor (zeros where there is none)."""
    return torch.cat([grad_or_zeros(p).reshape(-1) for p in params])


def write_grads(params: Iterable[nn.Parameter], flat: torch.Tensor, *, share: bool = False) -> None:
    """Set every parameter's ``.grad`` to its slice of ``flat`` (the inverse of flat_grad).

    ``share``: the gradients become views of ``flat`` instead of copies, for a ``flat`` the
    caller owns and no longer needs (a received message): the optimiser step that follows may
    change it in place (clipping), and it must not change while the gradients are in use. The
    next ``zero_grad()`` sets them to None, so backward never accumulates into it.
    """
    offset = 0
    for p in params:
        n = p.numel()
        view = flat[offset : offset + n].view_as(p)
        if share:
            p.grad = view
        elif p.grad is None:
            p.grad = view.clone()
        else:
            p.grad.copy_(view)
        offset += n


def state_dict_cpu(model: nn.Module) -> dict[str, torch.Tensor]:
    """A private CPU copy of the model's state_dict (what a run returns per worker)."""
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
