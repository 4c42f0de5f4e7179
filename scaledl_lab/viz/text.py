"""What a language model's run says in words: its next-token loss and two continuations of a
fixed prompt, drawn at a temperature and greedy, for ``summary.md``."""

from __future__ import annotations

import math
from typing import Any

import torch

from ..data import licenses, sample_shape
from ..gpt import GPT, generated_text
from ..models import build_model

NEW_TOKENS = 120  # characters generated after the prompt
TEMPERATURE = 0.8  # a draw a little sharper than the model's own distribution (minGPT's habit)


def sample_of(
    cfg: Any,
    weights: dict[str, torch.Tensor],
    new_tokens: int = NEW_TOKENS,
    temperature: float = 0.0,
) -> str:
    """The continuation of the corpus's fixed prompt by the model ``weights`` hold: greedy at
    ``temperature`` 0, else drawn at that temperature with the run's seed (the same text for
    the same weights)."""
    model = build_model(cfg.model, sample_shape(cfg.dataset), len(licenses.VOCABULARY))
    model.load_state_dict(weights)
    assert isinstance(model, GPT)
    model = model.to(cfg.dtype)
    return generated_text(model, licenses.PROMPT, licenses.encode, licenses.decode, new_tokens,
                          temperature=temperature, seed=cfg.seed)  # fmt: skip


def _block(text: str) -> str:
    return "```text\n" + text.replace("`", "'") + "\n```"


def generation_markdown(results: Any) -> str:
    """For every gpt-tiny run whose final weights were kept: its last test (else train)
    next-token loss, perplexity, a continuation drawn at :data:`TEMPERATURE` and the greedy
    one; "" when there is none."""
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
            prompt = licenses.PROMPT
            lines.append(f"- sampled at temperature {TEMPERATURE} (seed {cfg.seed}) from the "
                         f"prompt {prompt!r}:\n")  # fmt: skip
            lines.append(_block(sample_of(cfg, weights, temperature=TEMPERATURE)) + "\n")
            lines.append("- greedy (the likeliest character every time; a small model soon "
                         "repeats its likeliest words):\n")  # fmt: skip
            lines.append(_block(sample_of(cfg, weights)))
        parts.append("\n".join(lines) + "\n")
    if not parts:
        return ""
    return "\n## Language model: loss and samples\n\n" + "\n".join(parts)
