"""Context parallelism drawn (:mod:`..strategies.mesh.context`, :mod:`..strategies.mesh.ring`):
which member holds which positions, the causal scores each member computes on the plain and the
zig-zag split, and ring attention's steps (the key/value block each member attends to as the
blocks go round)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch

from ..strategies.mesh.context import Split, scores


def _owners(split: Split) -> np.ndarray:
    """The member that holds each position."""
    owner = np.zeros(split.sequence, dtype=int)
    for m in range(split.members):
        owner[split.positions(m).numpy()] = m
    return owner


def causal_work_diagram(split: Split, ax: Any = None) -> Any:
    """The S × S causal scores (query rows, key columns), each kept score coloured by the member
    that holds its query: the member's area is its work. The title gives the max/min."""
    if ax is None:
        _, ax = plt.subplots(figsize=(3.6, 3.6))
    owner = _owners(split)
    s = split.sequence
    image = np.where(np.tril(np.ones((s, s), dtype=bool)), owner[:, None], np.nan)
    cmap = plt.get_cmap("tab10", 10)
    ax.imshow(image, cmap=cmap, vmin=-0.5, vmax=9.5, interpolation="nearest")
    work = [scores(split.positions(m), torch.arange(s), True) for m in range(split.members)]
    kind = "zig-zag" if split.zigzag else "plain"
    ax.set_title(f"{kind} split, C={split.members}: work max/min {max(work) / min(work):.2f}",
                 fontsize=9)  # fmt: skip
    ax.set(xlabel="key position", ylabel="query position (colour: its member)")
    return ax


def ring_steps_diagram(split: Split, ax: Any = None) -> Any:
    """Ring attention's C steps (columns) for each member (rows): the member whose key/value
    block it attends to at that step, and the block's kept causal scores; an arrow per step
    that sends (every member passes its block to the next)."""
    c = split.members
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 * c + 1.5, 0.9 * c + 0.8))
    cmap = plt.get_cmap("tab10", 10)
    for r in range(c):
        for t in range(c):
            owner = (r - t) % c
            n = scores(split.positions(r), split.positions(owner), True)
            ax.add_patch(plt.Rectangle((t, -r - 0.4), 0.8, 0.8, color=cmap(owner), alpha=0.6))
            ax.text(t + 0.4, -r, f"K,V of {owner}\n{n} scores", ha="center", va="center",
                    fontsize=8)  # fmt: skip
            if t < c - 1:
                ax.annotate("", (t + 1.0, -r), (t + 0.8, -r), arrowprops={"arrowstyle": "->"})
    ax.set_xlim(-0.1, c)
    ax.set_ylim(-c + 0.4, 0.6)
    ax.set_xticks([t + 0.4 for t in range(c)], [f"step {t}" for t in range(c)])
    ax.set_yticks([-r for r in range(c)], [f"member {r}" for r in range(c)])
    ax.set_title("ring attention: each member keeps its queries; the K,V blocks go round "
                 "(member r sends to r + 1)", fontsize=9)  # fmt: skip
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    return ax
