"""The gradient-compression study: every compressor on the same synchronous run, with and
without error feedback, and short runs that time a step on a slow and a fast simulated network.
Its tables, verdicts, figures and report are in :mod:`.report`.

The setting: 2 simulated workers (traffic per step is then the payload, as with a parameter
server), Fashion-MNIST, the MLP, SGD 0.05 with momentum 0.9, batch 64 per worker, 5 epochs;
quick mode takes a 4000-sample subset.
"""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ...config import ExperimentConfig, quick
from ...errors import DivergenceError
from ...experiment import Results, compare, to_frame

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
QUICK_STUDY = dict(train_subset=4000, val_size=1000, test_subset=2000)
# Time per step: these compressors on a slow and a fast network, with many workers.
NETWORKS = ("1gbe", "nvlink")
STEP_WORKERS = 16
STEP_COMPRESSORS = ("none", "onebit", "qsgd:4", "topk:0.004", "powersgd:2")


def label(compress: str, error_feedback: bool) -> str:
    if compress == "none":
        return "none"
    return f"{compress}{SEPARATOR}{'EF' if error_feedback else 'no EF'}"


def base_config(is_quick: bool = False) -> ExperimentConfig:
    """The study's run; quick: 4000 samples for the same 5 epochs (six points per curve), as
    many sample-steps as quick mode's usual 10,000 for 2 epochs."""
    cfg = ExperimentConfig(
        strategy="allreduce", runtime="sim", workers=2, dataset="fashion-mnist", model="mlp",
        batch_size=64, lr=0.05, momentum=0.9, epochs=5, seed=0,
    )  # fmt: skip
    return cfg.replace(**QUICK_STUDY) if is_quick else cfg


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
        # Six significant digits keep the committed table a few MB (loss, time, accuracy).
        results.frame.to_csv(Path(out) / "metrics.csv", index=False, float_format="%.6g")
    return results


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
                "workers": cfg.workers,
                "step_ms": 1e3 * float(train["time"].diff().iloc[1:].median()),
                "bytes_per_step": float(train["bytes_sent"].mean()),
            }
        )
    return pd.DataFrame(records)
