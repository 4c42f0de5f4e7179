"""Kill one real Dask worker mid-run, for each strategy family: what happens, and how fast.

Each strategy runs on a fresh embedded LocalCluster of 3 worker processes (4 for AD-PSGD, whose
active/passive scheme needs a bipartite ring); ``faults="kill:1:STEP"`` makes rank 1's process
exit abruptly (``os._exit``) right after its train row of step STEP. The table gives the outcome
(the run finishes with the survivors, or stops with an error), the wall-clock seconds from the
kill (when its last rows reach the driver) to that outcome, the steps the survivors reached,
and whether every row the killed rank logged before dying is in the saved ``metrics.csv``.

    python benchmarks/faults_table.py [--step 10] [--train-subset 6000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pandas as pd

from scaledl_lab import ExperimentConfig, RunError, run
from scaledl_lab.experiment import total_steps
from scaledl_lab.runtime.dask.cluster import connect

STRATEGIES: list[tuple[str, dict]] = [
    ("allreduce", {}),
    ("ps-sync", {}),
    ("ps-async", {}),
    ("hogwild", {}),
    ("nnt", {}),
    ("dpsgd", {}),
    ("adpsgd", {"workers": 4}),
    ("easgd", {"elastic_async": True}),
    ("diloco", {}),
]


def measure(name: str, extra: dict, args: argparse.Namespace, out: Path) -> dict:
    options = {"workers": 3, **extra}
    cfg = ExperimentConfig(
        strategy=name, model="mlp", dataset="fashion-mnist", train_subset=args.train_subset,
        test_subset=1000, val_size=1000, batch_size=32, epochs=1, optimizer="sgd", lr=0.05,
        momentum=0.9, weight_decay=0.0, timeout_s=30,
        oversubscribe=True, faults=f"kill:1:{args.step}", **options,
    )  # fmt: skip
    killed_at: list[float] = []

    def on_rows(batch: list[dict]) -> None:
        if not killed_at and any(r["kind"] == "worker-lost" and r["step"] > 0 for r in batch):
            killed_at.append(time.monotonic())

    with connect(cfg.workers, dashboard=False, log=None) as client:
        try:
            run(cfg, client=client, out=out, progress=False, on_rows=on_rows, log=None)
            outcome, error = "continues", ""
        except RunError as exc:
            outcome, error = "stops", f"{type(exc).__name__}: {str(exc)[:90]}"
        ended = time.monotonic()
    if not out.exists():  # a stopped run's rows are in its partial folder beside ``out``
        out = next(out.parent.glob(f"{out.name}.partial-*"))
    frame = pd.read_csv(out / "metrics.csv")
    train = frame[frame.kind == "train"]
    killed = train[train["rank"] == 1].step.tolist()
    survivors = train[train["rank"] != 1].groupby("rank").step.max().to_dict()
    return {
        "strategy": name + (" (async)" if extra.get("elastic_async") else ""),
        "workers": cfg.workers,
        "outcome": outcome,
        "seconds after kill": round(ended - killed_at[0], 1) if killed_at else float("nan"),
        "survivors' last step": ", ".join(f"{r}: {s}" for r, s in survivors.items()),
        "of": total_steps(cfg),
        "rows before kill kept": killed == list(range(1, args.step + 1)),
        "error": error,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--step", type=int, default=10, help="rank 1 dies after this step")
    p.add_argument("--train-subset", type=int, default=6000)
    p.add_argument("--only", nargs="*", default=None, help="strategies to measure")
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, extra in STRATEGIES:
            if args.only and name not in args.only:
                continue
            rows.append(measure(name, extra, args, Path(tmp) / name))
            print(pd.DataFrame(rows[-1:]).to_string(index=False, header=len(rows) == 1), flush=True)
    print()
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + " --- |" * len(rows[0]))
    for row in rows:
        print("| " + " | ".join(str(v) for v in row.values()) + " |")


if __name__ == "__main__":
    main()
