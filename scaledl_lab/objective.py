"""What the lab's models read and how they are scored: one definition for every strategy.

A classifier's sample is one target; a sequence model's (gpt-tiny) is ``S`` next tokens, its
logits channels-first ``(N, V, S)``. Both are trained on ``F.cross_entropy(model(x), y)``, the
mean over every target; summed for evaluation, a sequence counts as one sample whose loss and
accuracy are the means over its tokens, so that ``loss_sum / samples`` and
``correct / samples`` are the mean next-token loss and the next-token accuracy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def summed_loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The sum over samples of each sample's cross-entropy (a sequence's: over its tokens)."""
    total = F.cross_entropy(out, y, reduction="sum")
    return total if y.dim() == 1 else total / y[0].numel()


def correct_count(out: torch.Tensor, y: torch.Tensor) -> float:
    """Samples predicted right: the argmax's hits (a sequence counts the share of its tokens)."""
    hits = out.argmax(1) == y
    if y.dim() == 1:
        return int(hits.sum().item())
    return hits.sum().item() / y[0].numel()


def model_input(
    x: torch.Tensor, device: torch.device | str | None, dtype: torch.dtype
) -> torch.Tensor:
    """``x`` on ``device``: features in the run's float ``dtype``, token ids left integers."""
    return x.to(device, dtype) if x.is_floating_point() else x.to(device)
