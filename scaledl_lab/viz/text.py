"""What a language model's run says in words: its next-token loss and a greedy sample from a
fixed prompt, for ``summary.md``."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..data import licenses, sample_shape
from ..gpt import GPT, generated_text
from ..models import build_model

NEW_TOKENS = 120  # characters generated after the prompt


def sample_of(cfg: Any, weights: dict[str, torch.Tensor], new_tokens: int = NEW_TOKENS) -> str:
    """The greedy continuation of the corpus's fixed prompt by the model ``weights`` hold."""
    model = build_model(cfg.model, sample_shape(cfg.dataset), len(licenses.VOCABULARY))
    model.load_state_dict(weights)
    assert isinstance(model, GPT)
    model = model.to(cfg.dtype)
    return generated_text(model, licenses.PROMPT, licenses.encode, licenses.decode, new_tokens)


def generation_markdown(results: Any) -> str:
    """For every gpt-tiny run whose final weights were kept: its last test (else train)
    next-token loss, perplexity, and a greedy sample; "" when there is none."""
    frame, parts = results.frame, []
    for cfg in results.configs:
        if cfg.model != "gpt-tiny":
            continue
        weights = results.weights(cfg.label) if cfg.label in results.outputs else {}
        rows = frame[frame["run"] == cfg.label]
        scored = rows[rows["kind"] == "test"]
        scored = scored if len(scored) else rows[rows["kind"] == "train"]
        lines = [f"### {cfg.label}\n"]
        if len(scored):
            loss = float(scored["loss"].iloc[-1])
            kind = scored["kind"].iloc[-1]
            lines.append(
                f"- {kind} loss per character: {loss:.4f} (perplexity {math.exp(loss):.2f})"
            )
        if weights:
            text = sample_of(cfg, weights).replace("`", "'")
            lines.append(f"- greedy sample from the prompt {licenses.PROMPT!r}:\n")
            lines.append("```text\n" + text + "\n```")
        parts.append("\n".join(lines) + "\n")
    if not parts:
        return ""
    return "\n## Language model: loss and a greedy sample\n\n" + "\n".join(parts)
