"""The gradient-compression study: every compressor on the same synchronous run, with and
without error feedback; bytes against accuracy; time per step on slow and fast networks; and the
claims of the works the survey cites, checked against the measured tables.

Claims (quoted in ``CLAIMS``): Seide et al. 2014 (1-bit SGD with error feedback loses no
accuracy), Lin et al. 2018 (DGC: top-k at 270-600x with no loss), Stich et al. 2018 / Karimireddy
et al. 2019 (without error feedback a sparsifier is measurably worse), Vogels et al. 2019
(PowerSGD rank 2 matches the uncompressed run). The setting: 2 simulated workers (traffic per
step is then the payload, as with a parameter server), Fashion-MNIST, the MLP, SGD 0.05 with
momentum 0.9, batch 64 per worker, 5 epochs; quick mode takes a subset and 2 epochs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .config import ExperimentConfig, quick
from .errors import DivergenceError
from .experiment import Results, compare, to_frame
from .metrics import compression_ratio

STUDY: tuple[tuple[str, bool], ...] = (
    ("none", True),
    ("topk:0.004", True),
    ("topk:0.004", False),
    ("onebit", True),
    ("onebit", False),
    ("qsgd:4", True),
    ("qsgd:4", False),
    ("powersgd:2", True),
    ("dgc:0.001", True),
)
SEPARATOR = " · "
WITHIN = 0.01  # "within 1 point"


def label(compress: str, error_feedback: bool) -> str:
    if compress == "none":
        return "none"
    return f"{compress}{SEPARATOR}{'EF' if error_feedback else 'no EF'}"


def base_config(is_quick: bool = False) -> ExperimentConfig:
    cfg = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=2, dataset="fashion-mnist", model="mlp",
        batch_size=64, lr=0.05, momentum=0.9, epochs=5, seed=0,
    )  # fmt: skip
    return quick(cfg) if is_quick else cfg


def study_configs(is_quick: bool = False) -> list[ExperimentConfig]:
    base = base_config(is_quick)
    return [base.replace(compress=c, error_feedback=ef, name=label(c, ef)) for c, ef in STUDY]


def run_study(
    out: str | os.PathLike[str] | None = None,
    is_quick: bool = False,
    configs: list[ExperimentConfig] | None = None,
) -> Results:
    """Every run of ``STUDY`` on the simulator, one after another (and the results folder, with
    ``out``). A run that diverges keeps the rows it logged and the others go on: the table
    says where it stopped."""
    configs = configs if configs is not None else study_configs(is_quick)
    rows: list[dict] = []
    for cfg in configs:
        try:
            compare([cfg], progress=False, log=None, on_rows=rows.extend)
        except DivergenceError:
            pass  # recorded by its rows: its last train row is before its last epoch
    results = Results(frame=to_frame(rows), configs=configs)
    if out is not None:
        results.save(out)
        save_figures(results, out)
        # Six significant digits keep the committed table a few MB (loss, time, accuracy).
        results.frame.to_csv(Path(out) / "metrics.csv", index=False, float_format="%.6g")
    return results


# -- tables and verdicts from a results table ---------------------------------------------------


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


def _ef_claim(who: str, row: pd.Series) -> str:
    if math.isnan(row["test_accuracy"]):
        return f"{who} with error feedback diverged after epoch {row['diverged_after_epoch']:g}."
    held = row["points_vs_none"] >= -100 * WITHIN
    return (
        f"{who} at ×{row['compression_ratio']:.0f} with error feedback: "
        f"{row['points_vs_none']:+.2f} points against uncompressed — "
        f"{'within' if held else 'not within'} 1 point."
    )


def _no_ef_claim(who: str, ef: pd.Series, no_ef: pd.Series) -> str:
    if math.isnan(no_ef["test_accuracy"]):
        return (
            f"{who} without error feedback diverged after epoch "
            f"{no_ef['diverged_after_epoch']:g} — measurably worse."
        )
    gap = 100 * (ef["test_accuracy"] - no_ef["test_accuracy"])
    return (
        f"{who} without error feedback: {abs(gap):.2f} points {'below' if gap >= 0 else 'above'} "
        f"the same compressor with it — {'measurably worse' if gap > 0.5 else 'not worse'}."
    )


def verdicts(table: pd.DataFrame) -> list[str]:
    """The claims against the measured table: one sentence each, numbers from the table."""
    out = []
    for compress, who in (("topk:0.004", "top-k"), ("onebit", "1-bit"), ("dgc:0.001", "DGC")):
        ef, no_ef = _row(table, compress, True), _row(table, compress, False)
        if ef is not None:
            out.append(_ef_claim(who, ef))
            if no_ef is not None:
                out.append(_no_ef_claim(who, ef, no_ef))
    return out


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


def plot_accuracy(frame: pd.DataFrame, x: str = "epoch", ax: Axes | None = None) -> Figure:
    """Test accuracy of every run against epochs or against the bytes sent (log scale)."""
    if ax is None:
        fig = Figure(figsize=(6.4, 4.0), layout="constrained")
        ax = fig.add_subplot()
    points = bytes_at_evaluations(frame)
    for i, (run, rows) in enumerate(points.groupby("run", sort=False)):
        style = "--" if run.endswith("no EF") else "-"
        ax.plot(rows[x], rows["accuracy"], style, marker="o", ms=3, label=run, color=f"C{i}")
    if x == "bytes_sent":
        ax.set_xscale("symlog", linthresh=1e5)
        ax.set_xlabel("bytes sent by one worker (cumulative)")
    else:
        ax.set_xlabel("epoch")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    return ax.figure  # type: ignore[return-value]


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


# -- time per step on networks --------------------------------------------------------------


def step_time_configs(
    compressors: tuple[str, ...], networks: tuple[str, ...], workers: int, steps: int = 6
) -> list[ExperimentConfig]:
    """Short runs of each compressor on each simulated network (a fast device, so that the
    network's share of a step shows)."""
    base = quick(base_config()).replace(
        workers=workers, max_steps=steps, epochs=1, val_size=0, test_subset=64,
        compute_profile="v100",
    )  # fmt: skip
    return [
        base.replace(compress=c, network=n, name=f"{c} @ {n}")
        for n in networks
        for c in compressors
    ]


def step_times(results: Results) -> pd.DataFrame:
    """Median virtual seconds per step (rank 0, after the first), by compressor and network."""
    records = []
    for cfg in results.configs:
        train = results.frame[
            (results.frame["run"] == cfg.label)
            & (results.frame["kind"] == "train")
            & (results.frame["rank"] == 0)
        ].sort_values("step")
        records.append(
            {
                "compress": cfg.compress,
                "network": cfg.network,
                "step_ms": 1e3 * float(train["time"].diff().iloc[1:].median()),
                "bytes_per_step": float(train["bytes_sent"].mean()),
            }
        )
    return pd.DataFrame(records)


# -- the report --------------------------------------------------------------------------------

NETWORKS = ("1gbe", "nvlink")
STEP_WORKERS = 16
STEP_COMPRESSORS = ("none", "onebit", "qsgd:4", "topk:0.004", "powersgd:2")


def _markdown(table: pd.DataFrame) -> str:
    cols = list(table.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for row in table.itertuples(index=False):
        cells = [f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_report(out: str | os.PathLike[str]) -> str:
    """summary.md of a study folder: the standard table, the accuracy table and the verdicts,
    time per step by network (``step_times.csv``) and PowerSGD beside torch's hook
    (``powersgd_vs_torch.json``, from ``benchmarks/bench_compression.py --out``) when there."""
    import json

    from .plots import summary_markdown

    out = Path(out)
    results = Results.load(out)
    table = accuracy_table(results)
    text = "# Gradient compression study\n\n" + summary_markdown(results.frame)
    text += "\n## Accuracy after equal epochs\n\n" + _markdown(table.round(4))
    text += "\n" + "\n".join(f"- {v}" for v in verdicts(table)) + "\n"
    path = out / "step_times.csv"
    if path.exists():
        steps = pd.read_csv(path).pivot(index="compress", columns="network", values="step_ms")
        text += f"\n## Time per step (ms, simulated, {STEP_WORKERS} workers)\n\n"
        text += _markdown(steps.reset_index().round(3))
    path = out / "powersgd_vs_torch.json"
    if path.exists():
        body = json.loads(path.read_text())
        setting = body.pop("setting")
        rows = pd.DataFrame([{"run": k, **v} for k, v in body.items()])
        text += f"\n## PowerSGD beside torch's powerSGD_hook ({setting})\n\n" + _markdown(rows)
    (out / "summary.md").write_text(text)
    return text
