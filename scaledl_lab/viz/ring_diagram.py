"""The ring allreduce drawn step by step, both phases (reduce-scatter, then all-gather)."""

from __future__ import annotations

import matplotlib.pyplot as plt

from .colours import COLLECTIVE, FORWARD


def ring_allreduce_steps(workers: int) -> list[tuple[str, list[list[int]], list[int]]]:
    """The ring allreduce step by step, as the diagram draws it: ``(phase, counts, received)``
    after each step (the first entry is the start), where ``counts[r][c]`` is how many ranks'
    gradients rank ``r``'s chunk ``c`` sums and ``received[r]`` the chunk rank ``r`` got in that
    step from rank ``r - 1`` (``-1`` at the start). Reduce-scatter: at step ``s`` rank ``r``
    sends chunk ``(r - s) mod N`` and its successor adds it; all-gather: rank ``r`` sends its
    finished chunk ``(r + 1 - s) mod N`` and its successor copies it (Patarasuk & Yuan 2009)."""
    n = workers
    held = [[{r} for _ in range(n)] for r in range(n)]  # the ranks summed in each chunk

    def snapshot(phase: str, received: list[int]):
        return phase, [[len(chunk) for chunk in row] for row in held], received

    steps = [snapshot("start", [-1] * n)]
    for phase, shift in (("reduce-scatter", 0), ("all-gather", 1)):
        for s in range(n - 1):
            sent = [(r, (r + shift - s) % n, set(held[r][(r + shift - s) % n])) for r in range(n)]
            received = [-1] * n
            for r, c, chunk in sent:
                dest = (r + 1) % n
                held[dest][c] = held[dest][c] | chunk if phase == "reduce-scatter" else chunk
                received[dest] = c
            steps.append(snapshot(phase, received))
    return steps


def ring_allreduce_diagram(workers: int = 4, ax=None):
    """Ring allreduce in its two phases: every rank's gradient cut into N chunks (a row of
    squares), one column per step. In the N − 1 steps of reduce-scatter every rank sends one
    chunk to the next rank, which adds it to its own (the number in a chunk is how many ranks'
    gradients it sums); in the N − 1 steps of all-gather the finished sums travel round and are
    copied. The outlined chunk is the one a rank received in that step."""
    steps = ring_allreduce_steps(workers)
    cell, gap = 0.5, 0.9
    width = workers * cell + gap
    if ax is None:
        _, ax = plt.subplots(figsize=(1.9 + 0.32 * len(steps) * workers, 1.4 + 0.45 * workers))
    for k, (phase, counts, received) in enumerate(steps):
        x0 = 0.9 + k * width
        step = k if phase == "reduce-scatter" else k - (workers - 1)
        title = "start" if phase == "start" else f"step {step}"
        ax.text(x0 + workers * cell / 2, 0.15, title, ha="center", va="bottom", fontsize=8)
        for r in range(workers):
            y = -(r + 1) * 0.75
            for c in range(workers):
                done = counts[r][c] / workers
                edge = "black" if received[r] == c else "0.6"
                ax.add_patch(plt.Rectangle((x0 + c * cell, y), cell * 0.92, 0.6,
                                           facecolor=(1 - 0.55 * done, 1 - 0.25 * done,
                                                      1 - 0.55 * done),
                                           edgecolor=edge, linewidth=2.0 if edge == "black"
                                           else 0.6))  # fmt: skip
                label = "Σ" if counts[r][c] == workers else str(counts[r][c])
                ax.text(x0 + c * cell + cell * 0.46, y + 0.3, label, ha="center", va="center",
                        fontsize=7)  # fmt: skip
    for r in range(workers):
        ax.text(0.75, -(r + 1) * 0.75 + 0.3, f"rank {r}", ha="right", va="center", fontsize=8)
    top = 0.75
    for phase, first, colour in (("reduce-scatter: receive a chunk, add it", 1, COLLECTIVE),
                                 ("all-gather: receive a finished sum, copy it", workers,
                                  FORWARD)):  # fmt: skip
        a = 0.9 + first * width
        b = a + (workers - 1) * width - gap
        ax.plot([a, b], [top - 0.1, top - 0.1], color=colour, lw=2)
        ax.text((a + b) / 2, top, f"{phase} ({workers - 1} steps)", ha="center", va="bottom",
                fontsize=9, color=colour)  # fmt: skip
    bottom = -(workers + 1) * 0.75 + 0.3
    ax.text(0.9, bottom,
            f"number in a chunk: how many ranks' gradients it sums (Σ: all {workers});\n"
            f"outlined: the chunk received in that step from the rank above (rank 0 from rank "
            f"{workers - 1}); in every step each rank sends one chunk of n/{workers} bytes",
            ha="left", va="top", fontsize=8)  # fmt: skip
    ax.set(xlim=(-0.4, 0.9 + len(steps) * width), ylim=(bottom - 0.45, top + 0.5))
    ax.set_axis_off()
    ax.set_title(f"ring allreduce, N = {workers}: each rank sends 2(N−1)/N × n bytes in "
                 f"2(N−1) = {2 * (workers - 1)} steps", fontsize=10)  # fmt: skip
    return ax
