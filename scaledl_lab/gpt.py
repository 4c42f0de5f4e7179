"""gpt-tiny: a decoder-only transformer (Radford et al. 2019, GPT-2's pre-LayerNorm layout, as
karpathy/nanoGPT writes it), small enough to train on a laptop's CPU in seconds.

Token and learned position embeddings, ``layers`` blocks of pre-LayerNorm causal self-attention
(Q, K and V in one Linear, then an output projection) and a GELU MLP of width 4h, each added to
the residual stream, then a final LayerNorm and a linear head. No dropout, so every run is
deterministic. The head is *untied* from the token embedding: a pipeline puts the embedding on
its first stage and the head on its last, and a tied weight would need its two gradients summed
across stages.

The lab trains every model with ``F.cross_entropy(model(x), y)``: for next-token prediction
``x`` and ``y`` are ``(N, S)`` token ids (``y`` is ``x`` shifted by one), and the model returns
its logits channels-first, ``(N, V, S)``, so that cross-entropy is the mean next-token loss and
``argmax(1)`` the predicted tokens (:mod:`.objective` scores them per sequence).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

# gpt-tiny's sizes: an epoch of the licenses corpus (about 6k sequences of 32 characters) takes
# seconds on two cores.
LAYERS, HIDDEN, HEADS = 2, 64, 4


class Embedding(nn.Module):
    """Token plus learned position embeddings: ``(N, S)`` ids -> ``(N, S, h)``."""

    input_dtype = torch.int64  # token ids, never cast to the run's float dtype

    def __init__(self, vocabulary: int, sequence: int, hidden: int) -> None:
        super().__init__()
        self.token = nn.Embedding(vocabulary, hidden)
        self.position = nn.Embedding(sequence, hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.token(idx) + self.position(positions)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(QKᵀ/√d + causal mask)·V on ``(N, heads, S, d)`` tensors (the explicit form, so
    that every runtime and device computes the same numbers)."""
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1) @ v


def attention_core(qkv: torch.Tensor, heads: int) -> torch.Tensor:
    """Attention's core, softmax(QKᵀ/√d + mask)·V of every head, from the QKV Linear's output
    ``(N, S, 3h)`` to the heads side by side ``(N, S, h)``: the part selective recomputation
    runs again (Korthikanti et al. 2022), between two Linears whose outputs it keeps."""
    n, s, h = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    q, k, v = (t.view(n, s, heads, h // heads).transpose(1, 2) for t in qkv.split(h, dim=2))
    return causal_attention(q, k, v).transpose(1, 2).reshape(n, s, h)


class SelfAttention(nn.Module):
    """Multi-head causal self-attention: QKV in one Linear (columns [Q | K | V], each head's
    d = h / heads columns contiguous inside each), then the output projection."""

    # Selective recomputation's stand-in for attention_core (same arguments, same numbers),
    # set on an instance by the memory family; None: the core itself.
    recomputed_core: Callable[[torch.Tensor, int], torch.Tensor] | None = None

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        core = self.recomputed_core or attention_core
        return self.proj(core(self.qkv(x), self.heads))

    def matmul_macs(self, output: torch.Tensor) -> int:
        """Multiply-accumulates of QKᵀ and of the product with V (not Linear layers)."""
        n, s, h = output.shape
        return 2 * n * s * s * h


class Block(nn.Module):
    """x + attn(LN1(x)), then + MLP(LN2(·)): one pre-LayerNorm transformer block."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = SelfAttention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(
            nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final LayerNorm and the (untied) vocabulary projection; logits ``(N, V, S)``."""

    def __init__(self, hidden: int, vocabulary: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, vocabulary)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x)).transpose(1, 2)


class GPT(nn.Module):
    """embedding | blocks... | head, in turn its forward (the layer list a pipeline splits)."""

    input_dtype = torch.int64

    def __init__(
        self,
        vocabulary: int,
        sequence: int,
        layers: int = LAYERS,
        hidden: int = HIDDEN,
        heads: int = HEADS,
    ) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"heads={heads} must divide hidden={hidden}")
        self.vocabulary, self.sequence, self.heads = vocabulary, sequence, heads
        self.embed = Embedding(vocabulary, sequence, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads) for _ in range(layers))
        self.head = Head(hidden, vocabulary)
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x)
        return self.head(x)

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        new_tokens: int,
        temperature: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Continuation of ``idx`` (``(N, T)`` ids) by ``new_tokens`` tokens, each predicted
        from at most the last ``sequence`` tokens: the most likely token (greedy) when
        ``temperature`` is 0, else a draw from softmax(logits / temperature) by ``generator``
        (minGPT's ``generate``). Greedy decoding of a small model soon repeats its likeliest
        words; a draw shows what it learnt of the text's distribution."""
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be 0 (greedy) or positive")
        was_training = self.training
        self.eval()
        for _ in range(new_tokens):
            logits = self(idx[:, -self.sequence :])[:, :, -1]
            if temperature == 0:
                token = logits.argmax(1, keepdim=True)
            else:
                probs = torch.softmax(logits.double() / temperature, dim=1)
                token = torch.multinomial(probs, 1, generator=generator)
            idx = torch.cat([idx, token], dim=1)
        self.train(was_training)
        return idx


def _init_weights(module: nn.Module) -> None:
    # GPT-2's initialisation: N(0, 0.02) weights, zero biases (LayerNorm keeps its 1 and 0).
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def generated_text(
    model: GPT,
    prompt: str,
    encode,
    decode,
    new_tokens: int = 80,
    temperature: float = 0.0,
    seed: int = 0,
) -> str:
    """``prompt`` and its continuation by ``model`` (``encode``/``decode``: text <-> token
    ids): greedy at ``temperature`` 0, else drawn at that temperature by a generator seeded
    with ``seed`` (the same text for the same weights and seed)."""
    param = next(model.parameters())
    idx = torch.tensor([encode(prompt)], dtype=torch.int64, device=param.device)
    generator = torch.Generator(device=param.device).manual_seed(seed)
    return decode(model.generate(idx, new_tokens, temperature, generator)[0].tolist())


__all__ = [
    "GPT",
    "Block",
    "Embedding",
    "Head",
    "SelfAttention",
    "attention_core",
    "causal_attention",
    "generated_text",
]
