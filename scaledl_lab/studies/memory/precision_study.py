"""Mixed precision on the lab's models (Micikevicius et al. 2018): why float16 needs loss
scaling (:func:`gradient_underflow`: the gradient elements that float16 flushes to zero) and
what 16 bits cost in accuracy, bytes and memory (:func:`compare_precisions`)."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F

from ...config import ExperimentConfig
from ...experiment import Results, compare
from ...models import build_model
from ...training.plan import load_for
from ...training.precision import INIT_SCALE, Precision
from ...training.reference import one_thread
from ..verdict import Claim, Verdict


@one_thread()
def gradient_underflow(
    cfg: ExperimentConfig,
    state: dict[str, torch.Tensor] | None = None,
    *,
    scales: Sequence[float] = (1.0, INIT_SCALE),
    samples: int = 256,
) -> pd.DataFrame:
    """How many of the weight-gradient elements of one batch that are non-zero in float32
    become zero in float16, at each loss scale S (the gradient of S·loss, as a run's backward
    computes it, then divided by S): ``cfg``'s model at ``state`` (default: its initial
    weights), on the first ``samples`` training samples.

    One row per scale: ``loss_scale``, ``nonzero_float32`` (elements), ``zero_in_float16``
    (of those, the ones float16 made zero), ``fraction`` (the ratio), ``overflowed`` (elements
    that became inf or NaN: S too large). Gradients below float16's smallest subnormal, 2**-24,
    flush to zero; a trained model's are smaller than a fresh one's, so a float32-trained
    state shows what a float16 run without scaling loses (a few percent on the MLP)."""
    data = load_for(cfg)
    x, y = data.train.x[:samples], data.train.y[:samples]
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    if state is not None:
        model.load_state_dict(state)
    F.cross_entropy(model(x), y).backward()
    reference = [p.grad for p in model.parameters()]
    rows = []
    for scale in scales:
        half = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
        half.load_state_dict(model.state_dict())
        half = Precision("float16", float(scale)).attach(half.half())
        F.cross_entropy(half(x.half()), y).backward()
        pairs = list(zip(reference, (p.grad for p in half.parameters()), strict=True))
        nonzero = sum(int((g != 0).sum()) for g, _ in pairs)
        lost = sum(int(((g != 0) & (h == 0)).sum()) for g, h in pairs)
        rows.append({
            "loss_scale": float(scale),
            "nonzero_float32": nonzero,
            "zero_in_float16": lost,
            "fraction": lost / nonzero if nonzero else float("nan"),
            "overflowed": sum(int((~torch.isfinite(h)).sum()) for _, h in pairs),
        })  # fmt: skip
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class PrecisionComparison:
    """:func:`compare_precisions`' table (one row per precision) and the runs behind it."""

    table: pd.DataFrame
    results: Results  # the runs, one per precision, in the table's order


def compare_precisions(
    cfg: ExperimentConfig,
    precisions: Sequence[str] = ("float32", "bfloat16", "float16"),
    *,
    loss_scale: float | str | None = None,
    **run_options: Any,
) -> PrecisionComparison:
    """Train ``cfg`` once per precision (same seed, batches and epochs; ``loss_scale`` for
    float16, default dynamic) and tabulate, per precision: the final test accuracy and its
    difference from float32's in points, the bytes one worker sent per step, its model states
    (parameters + gradients + optimiser state, the ledger's bytes), the steps skipped on a
    gradient overflow and the last loss scale (float16)."""
    configs = [
        cfg.replace(
            precision=p,
            loss_scale=loss_scale if p == "float16" else None,
            name=f"{cfg.label}-{p}",
        )
        for p in precisions
    ]
    results = compare(configs, **{"progress": False, **run_options})
    frame = results.frame
    rows = []
    for config in configs:
        rows_of = frame[frame["run"] == config.label]
        test = rows_of[rows_of["kind"] == "test"].sort_values("step")
        train = rows_of[(rows_of["kind"] == "train") & (rows_of["rank"] == 0)].sort_values("step")
        states = train[["mem_params", "mem_grads", "mem_optim"]].sum(axis=1)
        rows.append({
            "precision": config.precision,
            "test_accuracy": float(test["accuracy"].iloc[-1]),
            "bytes_per_step": float(train["bytes_sent"].median()),
            "model_states": float(states.iloc[-1]),
            "skipped_steps": int(train["skipped"].fillna(0).sum()),
            "loss_scale": float(train["loss_scale"].iloc[-1]),
        })  # fmt: skip
    table = pd.DataFrame(rows)
    base = table.loc[table["precision"] == "float32", "test_accuracy"]
    reference = float(base.iloc[0]) if len(base) else float("nan")
    table.insert(2, "points_vs_float32", 100 * (table["test_accuracy"] - reference))
    return PrecisionComparison(table, results)


# -- the committed study: 16 bits against float32 over seeds, long enough to settle -----------

STUDY_DOC = """The setting: 2 simulated workers, synchronous allreduce, SGD with momentum 0.9, one
epoch of Fashion-MNIST, seeds 0-5; float32, bfloat16 and float16 with the dynamic loss scale
(from 2**16, halved on each overflow, as torch.amp.GradScaler), every run on the same batches.
The MLP: 20,000 training samples, batch 64 per worker, lr 0.05 (156 steps per worker). The CNN:
10,000 training samples, batch 32 per worker, lr 0.02 (156 steps per worker: five times the
tests' claim setting, whose 31 steps end while the scale is still coming down). Each is tested
on the 10,000 test samples. Quick mode: 2,000 training and 1,000 test samples.
``python -m scaledl_lab.studies.memory.precision_study`` writes results/precision/ (``--out
DIR`` elsewhere, ``--jobs N`` processes side by side)."""

STUDY_SEEDS = (0, 1, 2, 3, 4, 5)
STUDY_PRECISIONS = ("float32", "bfloat16", "float16")
# model: (training samples, per-worker batch, lr)
STUDY_SETTINGS = {"mlp": (20_000, 64, 0.05), "cnn": (10_000, 32, 0.02)}
STUDY_QUICK = dict(train_subset=2_000, test_subset=1_000)
BOUND = 0.005  # "within 0.5 points of float32"
STUDY_SOURCE = "Micikevicius et al. 2018 (mixed-precision training), in our words"


def study_configs(
    is_quick: bool = False, seeds: Sequence[int] = STUDY_SEEDS
) -> list[ExperimentConfig]:
    """Every run of the study, named ``model precision · seed S``."""
    configs = []
    for model, (train, batch, lr) in STUDY_SETTINGS.items():
        base = ExperimentConfig(
            strategy="allreduce", runtime="sim", workers=2, dataset="fashion-mnist",
            model=model, epochs=1, batch_size=batch, lr=lr, momentum=0.9, val_size=0,
            train_subset=train, test_subset=10_000,
        )  # fmt: skip
        base = base.replace(**STUDY_QUICK) if is_quick else base
        configs += [
            base.replace(precision=p, seed=s, name=f"{model} {p} · seed {s}")
            for p in STUDY_PRECISIONS
            for s in seeds
        ]
    return configs


def run_study(out: str | os.PathLike[str], is_quick: bool = False, jobs: int = 1,
              configs: list[ExperimentConfig] | None = None) -> Results:  # fmt: skip
    """The study's runs (``jobs`` processes side by side), saved in ``out``."""
    from ..side_by_side import compare_side_by_side

    configs = configs if configs is not None else study_configs(is_quick)
    return compare_side_by_side(configs, out=out, jobs=jobs, progress=False)


def study_table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run: ``model``, ``precision``, ``seed`` (from its name), final test
    accuracy, the steps float16 skipped on an overflow, the loss scale's lowest and last
    values, and each worker's bytes per step (median)."""
    records = []
    for run, rows in frame.groupby("run", sort=False):
        what, _, seed = str(run).rpartition(" · seed ")
        model, precision = what.split(" ")
        train = rows[(rows["kind"] == "train") & (rows["rank"] == 0)].sort_values("step")
        records.append({
            "model": model, "precision": precision, "seed": int(seed),
            "test_accuracy": float(rows[rows["kind"] == "test"].sort_values("step")
                                   ["accuracy"].iloc[-1]),
            "steps": int(train["step"].max()),
            "skipped_steps": int(train["skipped"].fillna(0).sum()),
            "lowest_scale": float(train["loss_scale"].min()),
            "last_scale": float(train["loss_scale"].iloc[-1]),
            "bytes_per_step": float(train["bytes_sent"].median()),
        })  # fmt: skip
    return pd.DataFrame(records)


def scale_history(frame: pd.DataFrame) -> pd.DataFrame:
    """The loss scale of every float16 step (rank 0's: every worker takes the same decision,
    on the allreduced overflow flag) and whether that step was skipped."""
    train = frame[(frame["kind"] == "train") & (frame["rank"] == 0) & frame["loss_scale"].notna()]
    return train[["run", "step", "loss_scale", "skipped"]].reset_index(drop=True)


def paired(runs: pd.DataFrame, model: str, precision: str) -> pd.Series:
    """``precision``'s test accuracy minus float32's, seed by seed (same batches), on ``model``."""
    of = runs[runs["model"] == model].set_index(["precision", "seed"])["test_accuracy"]
    return (of.loc[precision] - of.loc["float32"]).rename("difference")


def study_verdicts(runs: pd.DataFrame) -> list[Claim]:
    """Per model and 16-bit precision: 16 bits train as accurately as float32 (within 0.5
    points) — supported if the mean paired difference is at least -0.5 points, not supported if
    even two standard errors above the mean stay below -0.5, inconclusive between."""
    claims = []
    for model in dict.fromkeys(runs["model"]):
        for precision in ("bfloat16", "float16"):
            d = paired(runs, model, precision)
            mean = float(d.mean())
            noise = 2 * float(d.std()) / math.sqrt(len(d)) if len(d) > 1 else float("inf")
            verdict: Verdict = (
                "supported" if mean >= -BOUND
                else "not supported" if mean + noise < -BOUND else "inconclusive"
            )  # fmt: skip
            of = runs[(runs["model"] == model) & (runs["precision"] == precision)]
            scaled = (f"; {of['skipped_steps'].mean():.1f} of {of['steps'].iloc[0]} steps "
                      f"skipped on an overflow, the scale down to 2^"
                      f"{math.log2(of['lowest_scale'].min()):.0f}"
                      if precision == "float16" else "")  # fmt: skip
            float32 = runs[(runs["model"] == model) & (runs["precision"] == "float32")]
            claims.append(Claim(
                key=f"{model}-{precision}",
                claim=f"The {model.upper()} trained in {precision}"
                + (" with dynamic loss scaling" if precision == "float16" else "")
                + " ends within 0.5 accuracy points of float32 after the same epochs",
                source=STUDY_SOURCE, in_our_words=True, verdict=verdict,
                reason=f"{of['test_accuracy'].mean():.2%} against float32's "
                f"{float32['test_accuracy'].mean():.2%}: {100 * mean:+.2f} points over "
                f"{len(d)} seeds (2 standard errors {100 * noise:.2f}, worst seed "
                f"{100 * float(d.min()):+.2f}){scaled}",
                figures={"points": 100 * mean, "two_standard_errors": 100 * noise,
                         "worst_seed": 100 * float(d.min())},
                test="mean over seeds of the paired difference (same seed and batches); "
                "supported if at least -0.5 points, not supported if the mean plus two "
                "standard errors is below -0.5, inconclusive between",
            ))  # fmt: skip
    return claims


def study_verdict_section(runs: pd.DataFrame) -> list[str]:
    """The summary's verdict lines, rendered from the typed claims."""
    lines = ["## Verdicts", ""]
    return lines + [f"- **{c.key}** ({c.verdict}): {c.reason}." for c in study_verdicts(runs)]


def write_study_summary(out: str | os.PathLike[str], runs: pd.DataFrame) -> Path:
    """``summary.md``: the table over seeds and one line per verdict."""
    lines = ["# Mixed-precision study", "", STUDY_DOC.replace("\n", " "), "",
             "| model | precision | test accuracy | sd | points vs float32 | skipped steps "
             "| lowest scale | bytes/step |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (model, precision), r in runs.groupby(["model", "precision"], sort=False):
        points = 100 * paired(runs, model, precision).mean()
        low = r["lowest_scale"].min()
        cells = [model, precision, f"{r.test_accuracy.mean():.2%}", f"{r.test_accuracy.std():.2%}",
                 f"{points:+.2f}", f"{r.skipped_steps.mean():.1f}",
                 "" if math.isnan(low) else f"2^{math.log2(low):.0f}",
                 f"{r.bytes_per_step.mean():,.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *study_verdict_section(runs)]
    path = Path(out) / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="The mixed-precision study: 16 bits against float32 over seeds."
    )
    parser.add_argument("--out", default="results/precision")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--summary", action="store_true", help="only summarise OUT/runs.csv")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if args.summary:
        runs = pd.read_csv(out / "runs.csv")
    else:
        frame = run_study(out, is_quick=args.quick, jobs=args.jobs).frame
        runs = study_table(frame)
        runs.to_csv(out / "runs.csv", index=False)
        scale_history(frame).to_csv(out / "scales.csv", index=False)
    print(write_study_summary(out, runs).read_text())


if __name__ == "__main__":
    main()
