"""Reading a gradient-compression study: the accuracy table, the verdicts on the claims of the
works the survey cites, accuracy against epochs and against bytes sent, and the study folder's
``summary.md``. Everything here reads results tables (and the benchmark's JSON), never a cluster.

Claims: Seide et al. 2014 (1-bit SGD with error feedback loses no accuracy), Lin et al. 2018
(DGC: top-k at 270-600x with no loss), Stich et al. 2018 / Karimireddy et al. 2019 (without
error feedback a sparsifier is measurably worse), Vogels et al. 2019 (PowerSGD rank 2 matches
the uncompressed run; here beside torch's own hook too), Alistarh et al. 2017 (QSGD, unbiased,
converges without error feedback). Each claim, in our words, is decided into a
:class:`~scaledl_lab.studies.verdict.Claim` (:func:`verdicts`); :func:`sentence` renders it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ...experiment import Results
from ...metrics import compression_ratio
from ...viz.plots import summary_markdown
from ..verdict import Claim, mark

WITHIN = 0.01  # "within 1 point"
WORSE_POINTS = 0.5  # "measurably worse": more than this many points below
# Who claims it for each compressor with error feedback; without it, for every compressor.
EF_SOURCE = {"topk:0.004": "Stich et al. 2018", "onebit": "Seide et al. 2014",
             "dgc:0.001": "Lin et al. 2018", "powersgd:2": "Vogels et al. 2019"}  # fmt: skip
UNBIASED_SOURCE = {"qsgd:4": "Alistarh et al. 2017"}  # unbiased: no error feedback needed
NO_EF_SOURCE = "Stich et al. 2018; Karimireddy et al. 2019"
# What a verdict says in the words of the summary, for claims with and without error feedback.
WORDS = {
    "EF": {"supported": "within 1 point", "not supported": "not within 1 point"},
    "no EF": {"supported": "measurably worse", "not supported": "not worse"},
    "unbiased": {"supported": "within 1 point", "not supported": "not within 1 point"},
}


def accuracy_table(results: Results) -> pd.DataFrame:
    """One row per run: its compressor, error feedback, final test accuracy, the difference to
    the uncompressed run in points, the compression ratio and the bytes sent per worker step."""
    frame = results.frame
    records = []
    for cfg in results.configs:
        run = cfg.label
        rows = frame[frame["run"] == run]
        train, test = rows[rows["kind"] == "train"], rows[rows["kind"] == "test"]
        finished = bool(len(train)) and train["epoch"].max() >= cfg.epochs - 1e-9
        records.append(
            {
                "run": run,
                "compress": cfg.compress,
                "error_feedback": cfg.error_feedback,
                # A diverged run (loss NaN) has no final accuracy; its last evaluation is kept.
                "diverged_after_epoch": math.nan if finished else float(test["epoch"].max()),
                "test_accuracy": float(test.sort_values("step")["accuracy"].iloc[-1])
                if finished
                else math.nan,
                "compression_ratio": compression_ratio(train),
                # DGC warms its sparsity up over the first epoch: the ratio it reaches after.
                "ratio_after_epoch_1": compression_ratio(train[train["epoch"] > 1]),
                "bytes_per_step": float(train["bytes_sent"].mean()),
            }
        )
    table = pd.DataFrame(records)
    reference = table.loc[table["compress"] == "none", "test_accuracy"]
    base = float(reference.iloc[0]) if len(reference) else math.nan
    table["points_vs_none"] = 100 * (table["test_accuracy"] - base)
    return table


def _row(table: pd.DataFrame, compress: str, ef: bool) -> pd.Series | None:
    hit = table[(table["compress"] == compress) & (table["error_feedback"] == ef)]
    return None if hit.empty else hit.iloc[0]


def _ef_claim(compress: str, who: str, row: pd.Series) -> Claim:
    points, epoch = row["points_vs_none"], row["diverged_after_epoch"]
    figures = {"compression_ratio": row["compression_ratio"], "points_vs_none": points,
               "test_accuracy": row["test_accuracy"], "diverged_after_epoch": epoch}  # fmt: skip
    if math.isnan(row["test_accuracy"]):
        held, reason = False, f"{who} with error feedback diverged after epoch {epoch:g}"
    else:
        held = points >= -100 * WITHIN
        reason = (
            f"{who} at ×{row['compression_ratio']:.0f} with error feedback: {points:+.2f} points "
            "against uncompressed"
        )
    claim = f"{who} with error feedback loses no accuracy: within 1 point of uncompressed"
    return Claim(key=f"{compress} · EF", claim=claim, source=EF_SOURCE[compress],
                 in_our_words=True, verdict=mark(held), reason=reason, figures=figures)  # fmt: skip


def _no_ef_claim(compress: str, who: str, ef: pd.Series, no_ef: pd.Series) -> Claim:
    epoch = no_ef["diverged_after_epoch"]
    if math.isnan(no_ef["test_accuracy"]):
        worse, gap = True, math.nan
        reason = f"{who} without error feedback diverged after epoch {epoch:g}"
    else:
        gap = 100 * (ef["test_accuracy"] - no_ef["test_accuracy"])
        worse = gap > WORSE_POINTS
        reason = (
            f"{who} without error feedback: {abs(gap):.2f} points "
            f"{'below' if gap >= 0 else 'above'} the same compressor with it"
        )
    claim = (
        f"Without error feedback, {who} is measurably worse: more than {WORSE_POINTS:g} points "
        "below the same compressor with it"
    )
    return Claim(key=f"{compress} · no EF", claim=claim, source=NO_EF_SOURCE, in_our_words=True,
                 verdict=mark(worse), reason=reason,
                 figures={"points_below_ef": gap, "diverged_after_epoch": epoch})  # fmt: skip


def _unbiased_claim(compress: str, who: str, row: pd.Series) -> Claim:
    """An unbiased compressor needs no error feedback: without it, within 1 point."""
    points = row["points_vs_none"]
    if math.isnan(row["test_accuracy"]):
        epoch = row["diverged_after_epoch"]
        held, reason = False, f"{who} without error feedback diverged after epoch {epoch:g}"
    else:
        held = points >= -100 * WITHIN
        reason = (
            f"{who} (unbiased) at ×{row['compression_ratio']:.0f} without error feedback: "
            f"{points:+.2f} points against uncompressed"
        )
    claim = (
        f"{who} is unbiased and converges without error feedback: within 1 point of uncompressed"
    )
    figures = {"compression_ratio": row["compression_ratio"], "points_vs_none": points,
               "test_accuracy": row["test_accuracy"]}  # fmt: skip
    return Claim(key=f"{compress} · unbiased", claim=claim, source=UNBIASED_SOURCE[compress],
                 in_our_words=True, verdict=mark(held), reason=reason, figures=figures)  # fmt: skip


def verdicts(table: pd.DataFrame) -> list[Claim]:
    """The claims against the measured table, numbers from the table."""
    out = []
    for compress, who in (("topk:0.004", "top-k"), ("onebit", "1-bit"), ("dgc:0.001", "DGC"),
                          ("powersgd:2", "PowerSGD rank 2")):  # fmt: skip
        ef, no_ef = _row(table, compress, True), _row(table, compress, False)
        if ef is not None:
            out.append(_ef_claim(compress, who, ef))
            if no_ef is not None:
                out.append(_no_ef_claim(compress, who, ef, no_ef))
    for compress, who in (("qsgd:4", "QSGD with 4 levels"),):
        if (no_ef := _row(table, compress, False)) is not None:
            out.append(_unbiased_claim(compress, who, no_ef))
    return out


def sentence(claim: Claim) -> str:
    """The summary's sentence: the numbers, then what the verdict says ("within 1 point",
    "measurably worse", …)."""
    return f"{claim.reason} — {WORDS[claim.key.rpartition(' · ')[2]][claim.verdict]}."


# -- figures ---------------------------------------------------------------------------------


def bytes_at_evaluations(frame: pd.DataFrame) -> pd.DataFrame:
    """Each test evaluation of each run with the bytes rank 0 had sent by then (cumulative)."""
    out = []
    for run, rows in frame.groupby("run", sort=False):
        train = rows[(rows["kind"] == "train") & (rows["rank"] == 0)].sort_values("step")
        sent = train.set_index("step")["bytes_sent"].cumsum()
        for _, test in rows[rows["kind"] == "test"].iterrows():
            before = sent[sent.index <= test["step"]]
            out.append(
                {
                    "run": run,
                    "epoch": test["epoch"],
                    "accuracy": test["accuracy"],
                    "bytes_sent": float(before.iloc[-1]) if len(before) else 0.0,
                }
            )
    return pd.DataFrame(out)


def plot_accuracy(
    frame: pd.DataFrame, x: str = "epoch", ax: Axes | None = None, runs: list[str] | None = None
) -> Figure:
    """Test accuracy of every run (or of ``runs`` only) against epochs or against the bytes
    sent (log scale, from the first evaluation after training started). A run's colour is its
    place in ``frame``, so that panels drawing parts of one frame agree; without error feedback
    a run is dashed."""
    if ax is None:
        fig = Figure(figsize=(6.4, 4.0), layout="constrained")
        ax = fig.add_subplot()
    points = bytes_at_evaluations(frame)
    if x == "bytes_sent":
        points = points[points["bytes_sent"] > 0]
    order = list(dict.fromkeys(frame["run"]))
    for run, rows in points.groupby("run", sort=False):
        if runs is not None and run not in runs:
            continue
        style = "--" if run.endswith("no EF") else "-"
        colour = f"C{order.index(run) % 10}"
        ax.plot(rows[x], rows["accuracy"], style, marker="o", ms=3, label=run, color=colour)
    if x == "bytes_sent":
        ax.set_xscale("log")
        ax.set_xlabel("bytes sent by one worker (cumulative)")
    else:
        ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    return ax.figure  # type: ignore[return-value]


def figure_groups(frame: pd.DataFrame, groups: dict[str, list[str]]) -> Figure:
    """Small multiples of :func:`plot_accuracy`: one row per group of runs (its title → its
    runs), by epoch and by bytes, the accuracy axis zoomed to the evaluations after the start
    (where every run scores the same untrained model) and each row's legend beside it."""
    fig = Figure(figsize=(12.5, 3.6 * len(groups)), layout="constrained")
    rows = fig.subplots(len(groups), 2, squeeze=False)
    points = bytes_at_evaluations(frame)
    for (title, runs), (by_epoch, by_bytes) in zip(groups.items(), rows, strict=True):
        plot_accuracy(frame, "epoch", by_epoch, runs)
        plot_accuracy(frame, "bytes_sent", by_bytes, runs)
        later = points[points["run"].isin(runs) & (points["epoch"] > 0)]["accuracy"]
        pad = 0.08 * (later.max() - later.min()) or 0.01
        for ax in (by_epoch, by_bytes):
            ax.set_ylim(later.min() - pad, later.max() + pad)
        by_epoch.set_title(f"{title}: by epoch")
        by_bytes.set_title(f"{title}: by bytes one worker sent")
        by_bytes.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    return fig


def save_figures(results: Results, out: str | os.PathLike[str]) -> list[Path]:
    """accuracy_vs_epoch and accuracy_vs_bytes, one legend beside both."""
    fig = Figure(figsize=(12, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    plot_accuracy(results.frame, "epoch", left)
    plot_accuracy(results.frame, "bytes_sent", right)
    left.set_title("test accuracy by epoch")
    right.set_title("test accuracy by bytes sent")
    right.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    path = Path(out) / "compression_accuracy.png"
    fig.savefig(path, dpi=100)
    return [path]


# -- the report --------------------------------------------------------------------------------


def _markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table.itertuples(index=False):
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(out: str | os.PathLike[str]) -> str:
    """summary.md (:func:`report_text`) and compression_accuracy.png of a study folder."""
    out = Path(out)
    results = Results.load(out)
    text = report_text(results, out)
    (out / "summary.md").write_text(text)
    save_figures(results, out)
    return text


def report_text(results: Results, out: str | os.PathLike[str]) -> str:
    """The summary.md of a study folder (``results`` loaded from it): the standard table, the
    accuracy table and the verdicts, time per step by network (``step_times.csv``), PowerSGD
    beside torch's hook and encode + decode beside the backward pass (``powersgd_vs_torch.json``
    and ``encode_decode.json``, from ``benchmarks/bench_compression.py --out``) when there."""
    out = Path(out)
    table = accuracy_table(results)
    text = "# Gradient compression study\n\n" + summary_markdown(results.frame)
    text += "\n## Accuracy after equal epochs\n\n" + _markdown(table.round(4))
    text += "\n" + "\n".join(f"- {sentence(c)}" for c in verdicts(table)) + "\n"
    path = out / "step_times.csv"
    if path.exists():
        measured = pd.read_csv(path)
        steps = measured.pivot(index="compress", columns="network", values="step_ms")
        text += f"\n## Time per step (ms, simulated, {measured['workers'].iloc[0]} workers)\n\n"
        text += _markdown(steps.reset_index().round(3))
    path = out / "powersgd_vs_torch.json"
    if path.exists():
        body = json.loads(path.read_text())
        setting = body.pop("setting")
        rows = pd.DataFrame([{"run": k, **v} for k, v in body.items()])
        text += f"\n## PowerSGD beside torch's powerSGD_hook ({setting})\n\n" + _markdown(rows)
    path = out / "encode_decode.json"
    if path.exists():
        text += "\n## Encode + decode beside the backward pass\n\n" + encode_decode_markdown(path)
    return text


def encode_decode_table(path: str | os.PathLike[str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """``encode_decode.json`` (bench_compression.py --out): per compressor its encode and
    decode seconds, bytes, and (encode + decode) over the model's backward pass."""
    body = json.loads(Path(path).read_text())
    table = pd.DataFrame(body.pop("rows"))
    table["of_backward"] = (table["encode_s"] + table["decode_s"]) / body["backward_s"]
    return table, body


def encode_decode_markdown(path: str | os.PathLike[str]) -> str:
    table, meta = encode_decode_table(path)
    return (
        f"ResNet-18 ({meta['parameters']:,} parameters), backward at batch 128 on "
        f"{meta['threads']} threads: {meta['backward_s'] * 1e3:.0f} ms\n\n" + _markdown(table)
    )
