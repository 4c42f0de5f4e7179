"""Chen et al. 2016's claim measured on the lab's models: with activation recomputation "the
memory for activations falls from O(layers) to about one layer's plus the checkpoints, for
roughly one extra forward". The memory ledger gives the activations a step keeps with and
without ``recompute``, the simulator the step's compute time; :func:`recompute_table` is the
table (one row per model), :func:`recompute_claim` the verdict on it.

Each model trains a few steps of ``allreduce`` on one simulated worker (no communication: the
step is its compute), the same seed with and without recomputation. The checkpoints and each
segment's own activations come from
:func:`scaledl_lab.strategies.memory.recompute.segment_bytes` on the same batch.
"""

from __future__ import annotations

import pandas as pd
import torch

from ...config import ExperimentConfig
from ...experiment import run
from ...models import build_model
from ...strategies.memory.recompute import segment_bytes, segments
from ...training.plan import load_for
from ..verdict import Claim, mark

MODELS = ("mlp", "cnn", "resnet18")
STEPS = 4
SOURCE = "Chen et al. 2016, Training Deep Nets with Sublinear Memory Cost (in our words)"
CLAIM = (
    "activation recomputation cuts the activations kept from O(layers) to about one layer's "
    "plus the checkpoints, for roughly one extra forward per step"
)
MB = 1e6


def _config(model: str, batch_size: int, recompute: bool, steps: int) -> ExperimentConfig:
    return ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=1, model=model, dataset="fashion-mnist",
        batch_size=batch_size, train_subset=batch_size * steps, val_size=0, test_subset=batch_size,
        epochs=1, max_steps=steps, seed=0, recompute=recompute,
    )  # fmt: skip


def _measured(cfg: ExperimentConfig) -> tuple[float, float]:
    """(the largest mem_activations over the run's steps, the median step time in seconds)."""
    train = run(cfg, progress=False).frame.query("kind == 'train'").sort_values("step")
    return float(train["mem_activations"].max()), float(train["time"].diff().median())


def recompute_table(
    models: tuple[str, ...] = MODELS, batch_size: int = 32, steps: int = STEPS
) -> pd.DataFrame:
    """One row per model: its segments, the ledger's activations without and with
    recomputation (MB), the checkpoints and the largest segment's own activations (MB), their
    sum (the claim's bound), the saving, the simulated step time ratio and the extra forwards
    it stands for (a forward is a third of a step), and whether the row bears the claim out
    (with ≤ the bound, and one extra forward within 10%).

    ``steps`` per run, at least 2 (the step time is a difference of two steps' times); on one
    worker every step keeps the same activations and takes the same simulated time, so two
    give the table that more do, for less compute (the notebook's quick mode)."""
    if steps < 2:
        raise ValueError(f"steps={steps}: the step time needs at least 2 steps")
    rows = []
    for model in models:
        cfg = _config(model, batch_size, recompute=False, steps=steps)
        data = load_for(cfg)
        net = build_model(model, data.input_shape, data.num_classes, seed=cfg.seed)
        sizes = segment_bytes(net, torch.zeros(batch_size, *data.input_shape))
        plain, plain_s = _measured(cfg)
        again, again_s = _measured(cfg.replace(recompute=True))
        largest = max(*sizes.own, sizes.loss)
        ratio = again_s / plain_s
        extra = 3 * (ratio - 1)
        bound = sizes.checkpoints + largest
        rows.append(
            dict(
                model=model,
                segments=len(segments(net)),
                activations_mb=plain / MB,
                recompute_activations_mb=again / MB,
                checkpoints_mb=sizes.checkpoints / MB,
                largest_segment_mb=largest / MB,
                bound_mb=bound / MB,
                saving=plain / again,
                step_time_ratio=ratio,
                extra_forwards=extra,
                holds=bool(again <= bound and abs(extra - 1) <= 0.1),
            )
        )
    return pd.DataFrame(rows).set_index("model")


def recompute_claim(table: pd.DataFrame) -> Claim:
    """The verdict on :func:`recompute_table`: supported if every model keeps at most its
    checkpoints and largest segment for about one extra forward, and the deepest model
    (the one with the most segments) keeps at least 2x less than without recomputation."""
    deepest = table["segments"].idxmax()
    falls = table.loc[deepest, "saving"] >= 2
    savings = ", ".join(f"{m} {r.saving:.2f}x" for m, r in table.iterrows())
    extras = ", ".join(f"{m} {r.extra_forwards:.2f}" for m, r in table.iterrows())
    # The bound tests recomputation only where a model keeps more than it without recomputing.
    tested = [str(m) for m, r in table.iterrows() if r.activations_mb > r.bound_mb]
    untested = [str(m) for m in table.index if str(m) not in tested]
    verb = "keeps" if len(untested) == 1 else "keep"
    scope = (
        f"a test for {', '.join(tested) or 'no model'} only: {', '.join(untested)} {verb} no "
        "more than the bound without recomputation"
        if untested
        else "a test for every model"
    )
    return Claim(
        key="recompute",
        claim=CLAIM,
        source=SOURCE,
        in_our_words=True,
        verdict=mark(bool(table["holds"].all()) and bool(falls)),
        reason=f"activations kept {savings} less with recomputation, each at most its "
        f"checkpoints plus its largest segment: {bool(table['holds'].all())} ({scope}); extra "
        f"forwards per step {extras} (simulated compute); a model whose every saved tensor is a "
        "layer's input (the MLP) has nothing to drop",
        figures={
            **{f"saving_{m}": r.saving for m, r in table.iterrows()},
            **{f"extra_forwards_{m}": r.extra_forwards for m, r in table.iterrows()},
        },
        test="per model: recomputed activations <= checkpoints + largest segment, and "
        "3 x (step time ratio - 1) within 0.1 of one forward; the deepest model saves >= 2x",
    )
