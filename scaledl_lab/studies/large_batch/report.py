"""The large-batch claims (Goyal et al. 2017; Smith et al. 2017; Keskar et al. 2016), each
decided on measured tables by a stated rule, and the figures that show them, each titled with
the claim and whether our run supports it. Every number in a title comes from the tables. The
claims are our paraphrases of those works, with the thresholds we test; each is decided into a
:class:`~scaledl_lab.studies.verdict.Claim`."""

from __future__ import annotations

import math
import textwrap
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from ...training.schedule import StepPlan
from ..verdict import Claim, Verdict, mark

GAP_POINTS = 2.0  # "loses accuracy": at least this many points of test accuracy
# Two single-seed runs that differ by less than this are level: the drift study measured a seed
# standard deviation of 0.7 to 1.0 point for synchronous MLP runs (results/kernel-drift), so the
# difference of two runs moves by about 1.4 points from the seeds alone.
SPREAD_POINTS = 2.0
RECOVERED = 0.5  # "recovers": at least this share of the gap
MATCH_POINTS = 1.0  # "matches": within this many points
FEWER_UPDATES = 2.0  # "far fewer updates": by at least this factor
SHARPER = 1.1  # "sharper": the top eigenvalue and ε-sharpness both at least 10% larger
COLOURS = {"small": "#4C72B0", "naive": "#C44E52", "scaled": "#8172B2", "warmup": "#55A868",
           "lars": "#DD8452", "decay": "#4C72B0", "grow": "#55A868"}  # fmt: skip


def title(claim: Claim) -> str:
    """A figure's title: the claim, our verdict and the numbers."""
    text = f"{claim.claim} — our run: {claim.verdict.upper()} ({claim.reason})"
    return "\n".join(textwrap.wrap(text, 95))


def markdown_line(claim: Claim) -> str:
    """The summary's line: "- <claim>: **<verdict>** (<numbers>)"."""
    return f"- {claim.claim}: **{claim.verdict}** ({claim.reason})"


def _claim(key: str, source: str, claim: str, holds: bool, reason: str, **figures: float) -> Claim:
    return Claim(key=key, claim=claim, source=source, in_our_words=True, verdict=mark(holds),
                 reason=reason, figures=figures)  # fmt: skip


def _run(frame: pd.DataFrame, run: str) -> pd.DataFrame:
    return frame[frame["run"] == run]


def test_curve(frame: pd.DataFrame, run: str) -> pd.DataFrame:
    """A run's test evaluations (epoch, step, accuracy, loss), in order."""
    rows = _run(frame, run)
    return rows[rows["kind"] == "test"].sort_values(["step", "epoch"])


def final_accuracy(frame: pd.DataFrame, run: str) -> float:
    """The last test accuracy of ``run`` (NaN if it never finished an epoch)."""
    curve = test_curve(frame, run)
    return float(curve["accuracy"].iloc[-1]) if len(curve) else math.nan


def updates(frame: pd.DataFrame, run: str) -> int:
    """Parameter updates ``run`` made: rank 0's train rows."""
    rows = _run(frame, run)
    return int(((rows["kind"] == "train") & (rows["rank"] == 0)).sum())


def schedule_frame(cfg: Any, shard_len: int) -> pd.DataFrame:
    """Every step's epoch, learning rate and effective batch, from the config alone."""
    plan = StepPlan.build(cfg, shard_len)
    steps = range(plan.total_steps)
    return pd.DataFrame({
        "step": list(steps), "epoch": [plan.progress(s) for s in steps],
        "lr": [plan.lr(s) for s in steps],
        "effective_batch_size": [plan.effective_batch(s) for s in steps],
    })  # fmt: skip


def verdicts(
    frame: pd.DataFrame, sharp: pd.DataFrame, roles: dict[str, str], diverged: dict[str, str]
) -> dict[str, Claim]:
    """Each claim decided on the tables. ``roles`` names the runs: small, naive, scaled (linear,
    no warmup), warmup (linear + warmup), lars, decay (step LR), grow (batch schedule)."""
    acc = {role: final_accuracy(frame, run) for role, run in roles.items()}
    gap = 100 * (acc["small"] - acc["naive"])
    small_batch, naive_batch = _batch(frame, roles["small"]), _batch(frame, roles["naive"])
    claims = {
        "gap": _claim(
            "gap",
            "Keskar et al. 2016",
            f"A naive large batch loses ≥ {GAP_POINTS:g} points of test accuracy at equal epochs",
            gap >= GAP_POINTS,
            f"batch {small_batch}: {acc['small']:.1%}, batch {naive_batch}: {acc['naive']:.1%}, "
            f"{gap:.1f} points",
            small_acc=acc["small"],
            naive_acc=acc["naive"],
            gap_points=gap,
            small_batch=small_batch,
            naive_batch=naive_batch,
        )
    }
    recovered = 100 * (acc["warmup"] - acc["naive"]) / gap if gap > 0 else math.nan  # a share
    scaled_diverged = roles["scaled"] in diverged
    verdict, reason = _warmup_verdict(gap, recovered, acc["warmup"], acc["scaled"], scaled_diverged)
    claims["warmup"] = Claim(
        key="warmup",
        claim=f"Linear scaling with warmup recovers ≥ {RECOVERED:.0%} of that gap, more than "
        "linear scaling alone (Goyal et al. 2017)",
        source="Goyal et al. 2017",
        in_our_words=True,
        verdict=verdict,
        reason=reason,
        test=f"recovered share ≥ {RECOVERED:.0%}, and warmup ahead of the run without it by "
        f"more than {SPREAD_POINTS:g} points (or that run diverged); within "
        f"{SPREAD_POINTS:g} points: inconclusive",
        figures=dict(warmup_acc=acc["warmup"], recovered_share=recovered,
                     scaled_acc=acc["scaled"], scaled_diverged=scaled_diverged,
                     warmup_over_scaled_points=100 * (acc["warmup"] - acc["scaled"])),
    )  # fmt: skip
    fewer = updates(frame, roles["decay"]) / max(1, updates(frame, roles["grow"]))
    diff = 100 * (acc["grow"] - acc["decay"])
    claims["smith"] = _claim(
        "smith",
        "Smith et al. 2017",
        f"Growing the batch matches decaying the LR within {MATCH_POINTS:g} point with "
        f"≥ {FEWER_UPDATES:g}× fewer updates (Smith et al. 2017)",
        abs(diff) <= MATCH_POINTS and fewer >= FEWER_UPDATES,
        f"{acc['grow']:.1%} vs {acc['decay']:.1%} ({diff:+.1f} points), {fewer:.1f}× fewer updates",
        grow_acc=acc["grow"],
        decay_acc=acc["decay"],
        diff_points=diff,
        fewer_updates=fewer,
    )
    s = sharp.set_index("run")
    small, large = s.loc[roles["small"]], s.loc[roles["naive"]]
    eig = large["top_eigenvalue"] / small["top_eigenvalue"]
    eps = large["epsilon_sharpness"] / small["epsilon_sharpness"]
    claims["sharp"] = _claim(
        "sharp",
        "Keskar et al. 2016",
        "Large-batch training converges to sharper minima (Keskar et al. 2016): both measures "
        f"≥ {SHARPER:g}×",
        eig >= SHARPER and eps >= SHARPER,
        f"top Hessian eigenvalue ×{eig:.2f}, ε-sharpness ×{eps:.2f} for the large batch",
        eigenvalue_ratio=eig,
        epsilon_sharpness_ratio=eps,
    )
    return claims


def _warmup_verdict(
    gap: float, recovered: float, warmup: float, scaled: float, scaled_diverged: bool
) -> tuple[Verdict, str]:
    """The warmup claim's verdict and its reason. The claim credits the warmup, so the run with
    it must recover the gap *and* beat the same scaled run without it by more than the spread
    of single-seed runs (:data:`SPREAD_POINTS`); level with it, the measurement cannot tell
    the warmup's share from the seed's: inconclusive."""
    head = f"{warmup:.1%} with warmup, {recovered:.0%} of the gap"
    if scaled_diverged:
        holds = gap > 0 and recovered >= RECOVERED
        return mark(holds), f"{head}; diverged without warmup"
    ahead = 100 * (warmup - scaled)
    without = f"{scaled:.1%} without warmup ({ahead:+.1f} points"
    if not (gap > 0 and recovered >= RECOVERED) or ahead < -SPREAD_POINTS:
        return "not supported", f"{head}; {without})"
    if ahead <= SPREAD_POINTS:
        spread = f"within the ±{SPREAD_POINTS:g}-point spread of single-seed runs"
        return "inconclusive", f"{head}; {without}, {spread})"
    return "supported", f"{head}; {without})"


def _batch(frame: pd.DataFrame, run: str) -> int:
    rows = _run(frame, run)
    return int(rows.loc[rows["kind"] == "train", "effective_batch_size"].iloc[0])


def _label(frame: pd.DataFrame, run: str, diverged: dict[str, str]) -> str:
    return f"{run} (diverged)" if run in diverged else run


def plot_accuracy(
    frame: pd.DataFrame,
    runs: dict[str, str],
    ax: Any,
    *,
    x: str = "epoch",
    diverged: dict[str, str] | None = None,
) -> Any:
    """Test accuracy against ``x`` ("epoch" or "step": updates) for the runs, by role."""
    for role, run in runs.items():
        curve = test_curve(frame, run)
        ax.plot(curve[x], 100 * curve["accuracy"], marker="o", ms=3,
                color=COLOURS.get(role), label=_label(frame, run, diverged or {}))  # fmt: skip
    ax.set_xlabel("epoch" if x == "epoch" else "parameter updates")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return ax


def figure_accuracy(
    frame: pd.DataFrame,
    runs: dict[str, str],
    claim: Claim,
    diverged: dict[str, str],
    *,
    by_updates: bool = False,
) -> Any:
    """Test accuracy against epochs (and against updates), titled with the claim."""
    panels = 2 if by_updates else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.2), squeeze=False)
    plot_accuracy(frame, runs, axes[0][0], diverged=diverged)
    if by_updates:
        plot_accuracy(frame, runs, axes[0][1], x="step", diverged=diverged)
    low = min(100 * test_curve(frame, r)["accuracy"].iloc[1:].min() for r in runs.values()
              if len(test_curve(frame, r)) > 1)  # fmt: skip
    for ax in axes[0]:
        ax.set_ylim(max(0, low - 2), None)  # the untrained first point would flatten the rest
    fig.suptitle(title(claim), fontsize=9)
    fig.tight_layout()
    return fig


def plot_slice(line: pd.DataFrame, run_a: str, run_b: str, ax: Any = None) -> Any:
    """Train and test loss along θ(α) = (1−α)·θ_a + α·θ_b."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    ax.plot(line["alpha"], line["train_loss"], color="#4C72B0", label="train loss")
    ax.plot(line["alpha"], line["test_loss"], color="#C44E52", ls="--", label="test loss")
    for alpha, name in ((0.0, run_a), (1.0, run_b)):
        ax.axvline(alpha, color="grey", lw=0.8)
        ax.text(alpha, 0.02, f" {name}", transform=ax.get_xaxis_transform(), fontsize=8,
                rotation=90, va="bottom")  # fmt: skip
    ax.set_xlabel("α  (0: small-batch minimum, 1: large-batch minimum)")
    ax.set_ylabel("cross-entropy")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", fontsize=8)
    return ax


def figure_sharpness(sharp: pd.DataFrame, line: pd.DataFrame, roles: dict[str, str],
                     claim: Claim) -> Any:  # fmt: skip
    """Top eigenvalue and ε-sharpness of the small- and large-batch minima; the loss between."""
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    runs = [roles["small"], roles["naive"]]
    table = sharp.set_index("run").loc[runs]
    colours = [COLOURS["small"], COLOURS["naive"]]
    for ax, column, name in ((axes[0], "top_eigenvalue", "top Hessian eigenvalue"),
                             (axes[1], "epsilon_sharpness", "ε-sharpness (%)")):  # fmt: skip
        ax.bar(runs, table[column], color=colours)
        ax.set_ylabel(name)
        for i, value in enumerate(table[column]):
            ax.annotate(f"{value:.3g}", (i, value), ha="center", va="bottom", fontsize=8)
    plot_slice(line, *runs, ax=axes[2])
    fig.suptitle(title(claim), fontsize=9)
    fig.tight_layout()
    return fig


def figure_schedules(schedules: dict[str, pd.DataFrame]) -> Any:
    """Learning rate and effective batch per epoch of each schedule (what the config implies).
    The two panels draw the same runs: one legend, beside them, over no curve."""
    fig = plt.figure(figsize=(12.5, 3.6), layout="constrained")
    lr_ax, batch_ax = fig.subplots(1, 2)
    for (name, table), style in zip(schedules.items(), ("-", "--", "-.", ":") * 3, strict=False):
        lr_ax.plot(table["epoch"], table["lr"], ls=style, lw=2, label=name)
        batch_ax.plot(table["epoch"], table["effective_batch_size"], ls=style, lw=2, label=name)
    lr_ax.set_ylabel("learning rate (log scale)")
    batch_ax.set_ylabel("effective batch (log scale)")
    lr_ax.set_yscale("log")
    batch_ax.set_yscale("log")
    for ax in (lr_ax, batch_ax):
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    fig.legend(*lr_ax.get_legend_handles_labels(), loc="outside right upper", fontsize=8)
    fig.suptitle("The schedules: rate and batch of every step, computed from the configs alone",
                 fontsize=9)  # fmt: skip
    return fig
