"""The large-batch reproductions (notebook 07): a fixed epoch budget on Fashion-MNIST with the MLP
on simulated workers; batch 128 against a naive 4096, linear scaling without and with warmup,
LARS; Smith's decaying LR against a growing batch; the sharpness of the small- and large-batch
minima. ``python -m scaledl_lab.studies.large_batch.study --out results/large-batch`` writes
the folder the notebook loads: metrics.csv, config.json, sharpness.csv, slice.csv, PNGs and
summary.md.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ...config import ExperimentConfig
from ...errors import DivergenceError
from ...experiment import Results, environment_info, run
from ...metrics import to_frame
from ...strategies.large_batch.sharpness import analyse, loss_slice
from ...training.plan import load_for
from ..verdict import Claim
from .report import (
    figure_accuracy,
    figure_schedules,
    figure_sharpness,
    markdown_line,
    schedule_frame,
    verdicts,
)

EPOCHS = 10
LR = 0.01  # the rate of batch 128 (the reference batch): × 32 = 0.32 at 4096 with linear scaling
LARS_LR = 10.0  # LARS's global rate (its trust coefficient 0.001 scales each layer's step)
SMITH_LR = 0.05  # Smith et al.: decay 0.05 by 5 at epochs 3 and 6, or grow the batch by 5 there
FIGURES = ("schedules", "gap", "warmup", "smith", "sharpness")


def study_configs(is_quick: bool = False) -> dict[str, ExperimentConfig]:
    """The runs by role: small, naive, scaled, warmup, lars, too-large, too-large-warmup,
    decay, grow."""
    data = dict(train_subset=8000, test_subset=2000, val_size=1000) if is_quick else {}
    common = dict(
        strategy="allreduce",
        runtime="sim",
        dataset="fashion-mnist",
        model="mlp",
        epochs=EPOCHS,
        momentum=0.9,
        lr=LR,
        reference_batch_size=128,
        seed=0,
        **data,
    )
    large = dict(workers=16, batch_size=256)  # 16 simulated workers × 256 = 4096
    roles = {
        "small": dict(name="batch-128", workers=1, batch_size=128),
        "naive": dict(name="naive-4096", **large),
        "scaled": dict(name="linear-4096", lr_scaling="linear", **large),
        "warmup": dict(name="linear-warmup-4096", lr_scaling="linear", warmup_epochs=2, **large),
        "lars": dict(name="lars-4096", optimizer="lars", lr=LARS_LR, warmup_epochs=2, **large),
        # Where linear scaling stops working: from 0.05 (1.6 at 4096), and from 0.02 with warmup.
        "too-large": dict(name="linear-4096-from-0.05", lr_scaling="linear", lr=0.05, **large),
        "too-large-warmup": dict(name="linear-warmup-4096-from-0.02", lr_scaling="linear",
                                 lr=0.02, warmup_epochs=2, **large),
        "decay": dict(name="decay-lr-128", workers=1, batch_size=128, lr=SMITH_LR,
                      lr_schedule="step:3,6:0.2"),
        "grow": dict(name="grow-batch-128", workers=1, batch_size=128, lr=SMITH_LR,
                     batch_schedule="3,6:5"),
    }  # fmt: skip
    return {role: ExperimentConfig(**{**common, **changes}) for role, changes in roles.items()}


@dataclass
class Study:
    """The reproductions' tables, and the claims decided on them."""

    frame: pd.DataFrame
    configs: dict[str, ExperimentConfig]
    sharpness: pd.DataFrame
    slice: pd.DataFrame
    diverged: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def roles(self) -> dict[str, str]:
        return {role: cfg.label for role, cfg in self.configs.items()}

    @property
    def claims(self) -> dict[str, Claim]:
        return verdicts(self.frame, self.sharpness, self.roles, self.diverged)

    def runs(self, *roles: str) -> dict[str, str]:
        return {role: self.roles[role] for role in roles}

    def figure(self, name: str) -> Any:
        """One of :data:`FIGURES`, titled with its claim and our verdict (schedules: none)."""
        claims, d, f = self.claims, self.diverged, self.frame
        if name == "schedules":
            n = len(load_for(self.configs["small"]).train)
            return figure_schedules({
                self.roles[r]: schedule_frame(self.configs[r], n // self.configs[r].replicas)
                for r in ("warmup", "lars", "decay", "grow")
            })  # fmt: skip
        if name == "gap":
            return figure_accuracy(f, self.runs("small", "naive"), claims["gap"], d)
        if name == "warmup":
            runs = self.runs("small", "naive", "scaled", "warmup", "lars")
            return figure_accuracy(f, runs, claims["warmup"], d)
        if name == "smith":
            runs = self.runs("decay", "grow")
            return figure_accuracy(f, runs, claims["smith"], d, by_updates=True)
        if name == "sharpness":
            return figure_sharpness(self.sharpness, self.slice, self.roles, claims["sharp"])
        raise ValueError(f"unknown figure {name!r}; allowed: {', '.join(FIGURES)}")

    def save(self, out: str | Path) -> Path:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.frame.to_csv(out / "metrics.csv", index=False, float_format="%.7g")
        self.sharpness.to_csv(out / "sharpness.csv", index=False)
        self.slice.to_csv(out / "slice.csv", index=False)
        meta = {"runs": [c.to_dict() for c in self.configs.values()],  # as Results.load reads
                "roles": {r: c.to_dict() for r, c in self.configs.items()},
                "diverged": self.diverged, "seconds": self.seconds,
                "environment": environment_info()}  # fmt: skip
        (out / "config.json").write_text(json.dumps(meta, indent=2, default=str))
        import matplotlib.pyplot as plt

        for name in FIGURES:
            fig = self.figure(name)
            fig.savefig(out / f"{name}.png", dpi=90, bbox_inches="tight")
            plt.close(fig)
        (out / "summary.md").write_text(self.summary())
        return out

    def summary(self) -> str:
        from .report import final_accuracy, updates

        rows = [f"| {c.label} | {final_accuracy(self.frame, c.label):.2%} | "
                f"{updates(self.frame, c.label)} | {self.diverged.get(c.label, '')[:60]} |"
                for c in self.configs.values()]  # fmt: skip
        lines = ["# Large-batch reproductions", "",
                 "Fashion-MNIST, MLP, simulated workers, "
                 f"{EPOCHS} epochs each "
                 "(`python -m scaledl_lab.studies.large_batch.study`).", "",
                 "| run | final test accuracy | updates | diverged |", "|---|---:|---:|---|",
                 *rows, "", "## Claims", ""]  # fmt: skip
        lines += [markdown_line(c) for c in self.claims.values()]
        cols = list(self.sharpness.columns)
        table = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        table += ["| " + " | ".join(v if isinstance(v, str) else f"{v:.4g}" for v in row) + " |"
                  for row in self.sharpness.itertuples(index=False)]  # fmt: skip
        return "\n".join(lines + ["", "## Sharpness", "", *table, ""])


def run_study(is_quick: bool = False, out: str | Path | None = None, log: Any = print) -> Study:
    """Run every role (a diverged run keeps its rows and its reason), then the sharpness of the
    small- and large-batch minima and the loss between them."""
    configs = study_configs(is_quick)
    rows: list[dict[str, Any]] = []
    outputs: dict[str, list[dict[str, Any]]] = {}
    diverged: dict[str, str] = {}
    seconds: dict[str, float] = {}
    for cfg in configs.values():
        start = time.perf_counter()
        try:
            res = run(cfg, progress=False, log=None, on_rows=rows.extend)
            outputs.update(res.outputs)
        except DivergenceError as exc:
            diverged[cfg.label] = str(exc)
        seconds[cfg.label] = time.perf_counter() - start
        if log:
            log(f"{cfg.label}: {seconds[cfg.label]:.0f} s{' (diverged)' * (cfg.label in diverged)}")
    frame = to_frame(rows)
    results = Results(frame=frame, configs=list(configs.values()), outputs=outputs)
    small, naive = configs["small"].label, configs["naive"].label
    minima = [small, naive, configs["warmup"].label]
    sharp = analyse(results, minima)
    # Keskar's ε = 1e-3 moves every weight of the MLP by 0.1% and can saturate; a tenth of it too.
    sharp["epsilon_sharpness_1e-4"] = analyse(results, minima, epsilon=1e-4)["epsilon_sharpness"]
    line = loss_slice(results, small, naive)
    study = Study(frame, configs, sharp, line, diverged, seconds)
    if out is not None:
        study.save(out)
        results.save_weights(out)  # not committed (.gitignore): for `scaledl-lab analyse`
    return study


def load_study(out: str | Path) -> Study:
    """A study saved by :func:`run_study` (the claims are decided again from its tables)."""
    out = Path(out)
    meta = json.loads((out / "config.json").read_text())
    configs = {r: ExperimentConfig.from_dict(c) for r, c in meta["roles"].items()}
    return Study(
        frame=pd.read_csv(out / "metrics.csv"),
        configs=configs,
        sharpness=pd.read_csv(out / "sharpness.csv"),
        slice=pd.read_csv(out / "slice.csv"),
        diverged=meta["diverged"],
        seconds=meta["seconds"],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/large-batch")
    parser.add_argument("--quick", action="store_true", help="a data subset (minutes)")
    args = parser.parse_args()
    study = run_study(is_quick=args.quick, out=args.out)
    print(study.summary())


if __name__ == "__main__":
    main()
