"""The low-communication study: synchronous SGD against DiLoCo for growing H, DiLoCo's outer
Nesterov against plain averaging (FedAvg) at one H, and Streaming DiLoCo, on a simulated
cross-data-centre link (the ``wan`` profile), with seed spreads; the verdicts on the lab's
claims as :class:`~scaledl_lab.studies.verdict.Claim` records.

The setting: 8 simulated workers, Fashion-MNIST (58,000 training samples: 60,000 less 2,000
for validation; one epoch), the MLP, batch 16 per worker (453 steps per worker), AdamW 1e-3
with decay 0.01 as every run's (inner) optimiser, seeds 0-2. H ∈ {1, 10, 50, 100, 500}: H = 500
exceeds the run, whose only round is then its closing one (one average at the end). Quick mode
keeps the grid on a 4000-sample subset (31 steps).
``python -m scaledl_lab.studies.low_communication.study`` writes results/diloco/ (``--out
DIR`` elsewhere).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
from pathlib import Path

import pandas as pd

from ...config import ExperimentConfig
from ...experiment import Results, compare, to_frame
from ..verdict import Claim, mark

H_GRID = (1, 10, 50, 100, 500)
SEEDS = (0, 1, 2)
FEDAVG_H = 50  # the H at which outer Nesterov meets plain averaging
STREAMING = dict(fragments=3, overlap_steps=5)  # the MLP's three layers, τ = 5 steps
TOLERANCE = 0.01  # "within 1 point"
QUICK = dict(train_subset=4000, val_size=500, test_subset=2000)
SOURCE = "the lab's summary of Douillard et al. 2023, 2025, in our words"


def base_config(is_quick: bool = False) -> ExperimentConfig:
    cfg = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=8, dataset="fashion-mnist", model="mlp",
        batch_size=16, epochs=1, val_size=2000, test_subset=5000, optimizer="adamw", lr=1e-3,
        momentum=0.0, weight_decay=0.01, network="wan",
    )  # fmt: skip
    return cfg.replace(**QUICK) if is_quick else cfg


def study_configs(is_quick: bool = False, seeds: tuple[int, ...] = SEEDS) -> list[ExperimentConfig]:
    """Every run of the study, named ``what · seed S``."""
    base = base_config(is_quick)
    runs: list[tuple[str, dict]] = [("allreduce", {})]
    runs += [(f"diloco H={h}", dict(strategy="diloco", sync_period=h)) for h in H_GRID]
    runs.append((f"fedavg H={FEDAVG_H}", dict(strategy="diloco", sync_period=FEDAVG_H,
                 outer_optimizer="sgd", outer_lr=1.0, outer_momentum=0.0)))  # fmt: skip
    runs.append((f"streaming H={FEDAVG_H}", dict(strategy="streaming-diloco",
                 sync_period=FEDAVG_H, **STREAMING)))  # fmt: skip
    return [
        base.replace(seed=s, name=f"{what} · seed {s}", **options)
        for what, options in runs
        for s in seeds
    ]


def run_study(out: str | os.PathLike[str] | None = None, is_quick: bool = False,
              configs: list[ExperimentConfig] | None = None) -> Results:  # fmt: skip
    """The runs one after another on the simulator (saved in ``out`` with their table)."""
    configs = configs if configs is not None else study_configs(is_quick)
    rows: list[dict] = []
    for cfg in configs:
        compare([cfg], progress=False, log=None, on_rows=rows.extend)
    results = Results(frame=to_frame(rows), configs=configs)
    if out is not None:
        results.save(out)
        results.frame.to_csv(Path(out) / "metrics.csv", index=False, float_format="%.6g")
    return results


def table(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run: final test accuracy, bytes per worker per step, the largest bytes of
    one step before the last (peak per synchronisation: the closing round sends every
    fragment at once), virtual seconds to the end; ``what`` and ``seed`` (from a name ``what ·
    seed S``; another name is the whole ``what``, with no seed)."""
    records = []
    for run, rows in frame.groupby("run", sort=False):
        train = rows[rows.kind == "train"]
        per_rank = train.groupby("rank").bytes_sent
        what, named, seed = str(run).rpartition(" · seed ")
        records.append({
            "what": what if named else str(run),  # a name without " · seed S": the whole name
            "seed": int(seed) if named else None,
            "test_accuracy": float(rows[rows.kind == "test"].accuracy.iloc[-1]),
            "bytes_per_step": float(per_rank.sum().mean() / train.step.max()),
            "peak_bytes": float(train[train.step < train.step.max()].bytes_sent.max()),
            "time_s": float(rows.time.max()),
        })  # fmt: skip
    return pd.DataFrame(records)


def curves(frame: pd.DataFrame) -> pd.DataFrame:
    """Each test evaluation of each run: the mean accuracy over the models evaluated (the
    global one, or every NNT worker's own) with its min and max, the virtual time it was taken
    at, and the bytes one worker had sent by then (cumulative, mean over the workers)."""
    records = []
    for run, rows in frame.groupby("run", sort=False):
        sent = rows[rows.kind == "train"].groupby("step").bytes_sent.mean().sort_index().cumsum()
        for epoch, tests in rows[rows.kind == "test"].groupby("epoch", sort=True):
            before = sent[sent.index <= tests.step.max()]
            records.append({
                "run": run, "epoch": float(epoch), "accuracy": float(tests.accuracy.mean()),
                "lo": float(tests.accuracy.min()), "hi": float(tests.accuracy.max()),
                "time": float(tests.time.max()),
                "bytes_sent": float(before.iloc[-1]) if len(before) else 0.0,
            })  # fmt: skip
    return pd.DataFrame(records)


def plot_curves(points: pd.DataFrame, x: str, ax, runs: list[str] | None = None,
                labels: list[str] | None = None) -> None:  # fmt: skip
    """Test accuracy against ``x`` (``bytes_sent`` or ``time``, log scale) from :func:`curves`,
    from the first evaluation after training started; a band where several models were
    evaluated. The i-th of ``runs`` (default: all) takes colour Ci and the i-th of ``labels``,
    so that panels of different runs of the same methods match."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    runs = runs or list(dict.fromkeys(points.run))
    span = []
    for i, run in enumerate(runs):
        rows = points[(points.run == run) & (points.epoch > 0) & (points[x] > 0)]
        span += [rows[x].min(), rows[x].max()] if len(rows) else []
        label = labels[i] if labels else run
        ax.plot(rows[x], rows.accuracy, marker="o", ms=3, color=f"C{i}", label=label)
        if (rows.hi > rows.lo).any():
            ax.fill_between(rows[x], rows.lo, rows.hi, color=f"C{i}", alpha=0.15)
    ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels collide
    if span and max(span) < 100 * min(span):  # under two decades: 2× and 5× labelled too
        ax.xaxis.set_minor_locator(LogLocator(subs=(2.0, 5.0)))
        ax.xaxis.set_minor_formatter(FuncFormatter(_two_and_five))
    ax.set_xlabel({"bytes_sent": "bytes one worker sent (cumulative)",
                   "time": "virtual time (s)"}.get(x, x))  # fmt: skip
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)


def _two_and_five(value: float, _: int) -> str:
    """A log axis's minor label, as 2×10⁶ beside matplotlib's 10⁶."""
    exponent = int(f"{value:e}".split("e")[1])
    return f"${round(value / 10**exponent)}\\times10^{{{exponent}}}$"


def spread(runs: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample standard deviation over seeds, per ``what``."""
    grouped = runs.groupby("what", sort=False)
    out = grouped.mean(numeric_only=True).drop(columns="seed")
    out["accuracy_sd"] = grouped.test_accuracy.std()
    out["seeds"] = grouped.size()
    return out


def verdicts(runs: pd.DataFrame) -> list[Claim]:
    """The three claims decided on the per-run table (:func:`table`)."""
    s = spread(runs)
    sync = s.loc["allreduce"]
    holds = [h for h in H_GRID if s.loc[f"diloco H={h}"].test_accuracy >= sync.test_accuracy
             - TOLERANCE]  # fmt: skip
    # "up to the largest H": every H > 1 of the grid holds from the smallest to it, no gap
    unbroken = list(itertools.takewhile(holds.__contains__, [h for h in H_GRID if h > 1]))
    largest = max(unbroken, default=0)
    ratio = sync.bytes_per_step / s.loc[f"diloco H={largest}"].bytes_per_step if largest else 0
    claims = [Claim(
        key="diloco-h",
        claim="DiLoCo with H inner steps reaches synchronous SGD's accuracy (within 1 point, "
        "same samples) while communicating H times less, up to the largest H where it holds",
        source=SOURCE, in_our_words=True, verdict=mark(largest > 1 and ratio >= 0.8 * largest),
        reason=f"within 1 point of synchronous SGD's {sync.test_accuracy:.1%} at H = "
        f"{', '.join(map(str, holds)) or 'none'} of {H_GRID}; at the largest, "
        f"{ratio:.0f}x fewer bytes per step",
        figures={"largest_h": largest, "bytes_ratio": ratio,
                 **{f"accuracy_h{h}": s.loc[f"diloco H={h}"].test_accuracy for h in H_GRID},
                 "accuracy_sync": sync.test_accuracy},
        test="mean over seeds; H holds if DiLoCo's mean is at least synchronous SGD's − 0.01; "
        "supported if the H > 1 of the grid hold from the smallest up to some largest, without "
        "a gap, and bytes per step fall at least 0.8 H times there (below H: the closing round "
        "adds a synchronisation, 10 rounds in 453 steps at H = 50)",
    )]  # fmt: skip
    nesterov, fedavg = s.loc[f"diloco H={FEDAVG_H}"], s.loc[f"fedavg H={FEDAVG_H}"]
    gap = nesterov.test_accuracy - fedavg.test_accuracy
    noise = 2 * statistics.sqrt((nesterov.accuracy_sd**2 + fedavg.accuracy_sd**2) / len(SEEDS))
    claims.append(Claim(
        key="nesterov-vs-fedavg",
        claim="DiLoCo's outer Nesterov beats plain model averaging (outer SGD 1.0) at the same H",
        source=SOURCE, in_our_words=True,
        verdict="supported" if gap > noise else "not supported" if gap < -noise
        else "inconclusive",
        reason=f"at H = {FEDAVG_H}: {nesterov.test_accuracy:.1%} against "
        f"{fedavg.test_accuracy:.1%} ({gap:+.1%}; 2 standard errors {noise:.1%})",
        figures={"gap": gap, "two_standard_errors": noise},
        test="supported if the mean gap exceeds two standard errors of the difference, not "
        "supported if it is below minus that, inconclusive between",
    ))  # fmt: skip
    streaming = s.loc[f"streaming H={FEDAVG_H}"]
    same = streaming.test_accuracy >= nesterov.test_accuracy - TOLERANCE
    peak = nesterov.peak_bytes / streaming.peak_bytes
    faster = streaming.time_s < nesterov.time_s
    claims.append(Claim(
        key="streaming",
        claim="Streaming DiLoCo: DiLoCo's accuracy with F times lower peak bandwidth per "
        "synchronisation, and less time on a wan network",
        source=SOURCE, in_our_words=True,
        verdict=mark(same and faster and peak >= STREAMING["fragments"] - 0.5),
        reason=f"{streaming.test_accuracy:.1%} against DiLoCo's {nesterov.test_accuracy:.1%}, "
        f"peak bytes per synchronisation {peak:.2f}x lower with F = {STREAMING['fragments']} "
        f"(the layers' sizes bound it), {streaming.time_s:.1f} s against "
        f"{nesterov.time_s:.1f} s of virtual time on the wan",
        figures={"peak_ratio": peak, "accuracy": streaming.test_accuracy,
                 "time_s": streaming.time_s, "diloco_time_s": nesterov.time_s},
        test="within 1 point of DiLoCo, less virtual time, and a peak ratio of F (± 0.5)",
    ))  # fmt: skip
    return claims


def verdict_section(runs: pd.DataFrame) -> list[str]:
    """The summary's verdict lines, rendered from the typed claims."""
    return [
        "## Verdicts",
        "",
        *(f"- **{c.key}** ({c.verdict}): {c.reason}." for c in verdicts(runs)),
    ]


def write_summary(out: str | os.PathLike[str], runs: pd.DataFrame) -> Path:
    """``summary.md``: the table over seeds and one line per verdict."""
    s = spread(runs)
    lines = ["# Low-communication study", "", __doc__.split("\n\n")[1].replace("\n", " "), "",
             "| run | test accuracy | sd | bytes/step | peak bytes | time (s, wan) |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for what, r in s.iterrows():
        cells = [f"{r.test_accuracy:.2%}", f"{r.accuracy_sd:.2%}", f"{r.bytes_per_step:,.0f}",
                 f"{r.peak_bytes:,.0f}", f"{r.time_s:.1f}"]  # fmt: skip
        lines.append(f"| {what} | " + " | ".join(cells) + " |")
    lines += ["", *verdict_section(runs)]
    path = Path(out) / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="results/diloco")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--summary", action="store_true", help="only summarise OUT/runs.csv")
    args = parser.parse_args(argv)
    if args.summary:
        runs = pd.read_csv(Path(args.out) / "runs.csv")
    else:
        runs = table(run_study(args.out, is_quick=args.quick).frame)
        runs.to_csv(Path(args.out) / "runs.csv", index=False)
    print(write_summary(args.out, runs).read_text())


if __name__ == "__main__":
    main()
