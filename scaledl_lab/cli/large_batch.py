"""The `scaledl-lab` side of large batches: the `run` options (LR scaling and warmup, schedules,
accumulation, LARS/LAMB options, Goyal's details) and `scaledl-lab analyse sharpness DIR`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_run_options(run: argparse.ArgumentParser) -> None:
    """The large-batch options of `scaledl-lab run` (defaults: a constant --lr, as before)."""
    g = run.add_argument_group("large batches (--optimizer also takes lars, lamb)")
    g.add_argument(
        "--lr-scaling",
        default="none",
        help="none | linear | sqrt: --lr x (effective batch / reference batch)^1 or ^½",
    )
    g.add_argument(
        "--reference-batch-size",
        type=int,
        default=256,
        help="the effective batch at which --lr is the rate (default 256)",
    )
    g.add_argument(
        "--warmup-epochs",
        type=float,
        default=0.0,
        help="gradual warmup (Goyal et al.), fractional allowed",
    )
    g.add_argument(
        "--lr-schedule",
        default="constant",
        help="constant | step:E1,E2[:GAMMA] (default GAMMA 0.1) | cosine",
    )
    g.add_argument(
        "--batch-schedule",
        default=None,
        help="E1,E2[:FACTOR]: the batch x FACTOR (default 10) from each epoch "
        "(allreduce, allreduce-naive)",
    )
    g.add_argument(
        "--accumulate",
        type=int,
        default=1,
        help="micro-batches per update (allreduce, allreduce-naive)",
    )
    g.add_argument(
        "--trust-coefficient",
        type=float,
        default=None,
        help="lars (default 0.001) and lamb (default 1)",
    )
    g.add_argument(
        "--zero-init-residual",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="resnet18: gamma = 0 closing each residual branch (default: in the recipe)",
    )
    g.add_argument(
        "--no-bias-decay",
        dest="no_bias_decay",
        action="store_true",
        default=None,
        help="no weight decay or trust ratio on biases/BN (default: in the recipe)",
    )
    g.add_argument("--bias-decay", dest="no_bias_decay", action="store_false",
                   help="decay biases and BN like the weights")  # fmt: skip


def config_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ExperimentConfig fields of those options."""
    names = ("lr_scaling", "reference_batch_size", "warmup_epochs", "lr_schedule",
             "batch_schedule", "accumulate", "trust_coefficient", "zero_init_residual",
             "no_bias_decay")  # fmt: skip
    return {name: getattr(args, name) for name in names}


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
    from ..strategies.large_batch.report import plot_slice

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
