"""`scaledl-lab analyse sharpness DIR`: the sharpness of a large-batch study's minima (the
family's `run` options come from its record, :mod:`.options`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_analyse(sub: Any) -> None:
    """`scaledl-lab analyse sharpness RESULTS_DIR`."""
    analyse = sub.add_parser("analyse", help="analyses of a results folder")
    kinds = analyse.add_subparsers(dest="analysis", required=True)
    sharp = kinds.add_parser(
        "sharpness",
        help="top Hessian eigenvalue, epsilon-sharpness and train/test gap of each run; the "
        "loss between the smallest- and largest-batch minima",
    )
    sharp.add_argument("results_dir", help="a folder written by `scaledl-lab run --out`")
    sharp.add_argument("--runs", nargs="+", default=None, help="runs to analyse (default all)")
    sharp.add_argument("--samples", type=int, default=1000, help="probe set for the Hessian")
    sharp.add_argument("--epsilon", type=float, default=1e-3, help="Keskar's epsilon")
    sharp.add_argument("--iterations", type=int, default=20, help="power iterations at most")


def cmd_analyse(args: argparse.Namespace) -> int:
    """Print the sharpness table; write sharpness.csv (and slice.csv, sharpness_slice.png)."""
    from ..experiment import Results
    from ..studies.large_batch.report import plot_slice

    out = Path(args.results_dir)
    if not (out / "weights.pt").exists():
        raise FileNotFoundError(
            f"{out / 'weights.pt'} not found: analyse a folder written by "
            "`scaledl-lab run --out DIR` (or Results.save)"
        )
    results = Results.load(out)
    table = results.sharpness(
        args.runs, samples=args.samples, epsilon=args.epsilon, iterations=args.iterations
    )
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    table.to_csv(out / "sharpness.csv", index=False)
    if len(table) >= 2:
        from ..strategies.large_batch.sharpness import loss_slice

        ordered = table.sort_values("effective_batch_size", kind="stable")
        small, large = ordered["run"].iloc[0], ordered["run"].iloc[-1]
        line = loss_slice(results, small, large)
        line.to_csv(out / "slice.csv", index=False)
        ax = plot_slice(line, small, large)
        ax.figure.savefig(out / "sharpness_slice.png", dpi=100, bbox_inches="tight")
        print(f"loss from {small} (alpha=0) to {large} (alpha=1): {out / 'slice.csv'}")
    print(f"written: {out / 'sharpness.csv'}")
    return 0
