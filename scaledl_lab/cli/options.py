"""The `scaledl-lab run` options of the strategy families: parameter servers, EASGD, NNT,
model parallelism, gradient compression, faults and checkpoints, low communication (and the
config fields they set)."""

from __future__ import annotations

import argparse
from typing import Any

from ..config import ExperimentConfig


def _max_lead(text: str) -> int | None:
    """``--nnt-max-lead``: a non-negative step count, or ``unbounded`` (FAST: never wait)."""
    if text.strip().lower() in ("unbounded", "none"):
        return None
    try:
        lead = int(text)
    except ValueError:
        lead = -1
    if lead < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a non-negative integer nor 'unbounded'"
        )
    return lead


def add_run_options(run: argparse.ArgumentParser) -> None:
    d = ExperimentConfig.__dataclass_fields__
    opts = run.add_argument_group("strategy options")
    opts.add_argument("--servers", type=int, default=d["servers"].default, help="PS shards")
    opts.add_argument(
        "--server-transport",
        default=d["server_transport"].default,
        help="PS and EASGD servers on real workers: auto (= p2p: torch.distributed "
        "point-to-point messages) | p2p | actor (Dask actor calls)",
    )
    opts.add_argument("--backup-workers", type=int, default=d["backup_workers"].default)
    opts.add_argument("--n-fetch", type=int, default=d["n_fetch"].default, help="downpour")
    opts.add_argument("--n-push", type=int, default=d["n_push"].default, help="downpour")
    opts.add_argument("--dc-lambda", type=float, default=d["dc_lambda"].default, help="dc-asgd")
    opts.add_argument(
        "--dc-adaptive", action="store_true", help="dc-asgd: λ0/√(mean g²) (DC-ASGD-a)"
    )
    opts.add_argument(
        "--sync-period",
        type=int,
        default=d["sync_period"].default,
        help="local-sgd, easgd: local steps between averagings; diloco: inner steps (H)",
    )
    opts.add_argument("--elastic-alpha", type=float, default=None, help="easgd moving rate")
    opts.add_argument(
        "--elastic-async", action="store_true", help="easgd: centre on a server, asynchronous"
    )
    opts.add_argument(
        "--stage-epochs", type=int, default=d["stage_epochs"].default, help="nnt-staged"
    )
    opts.add_argument(
        "--nnt-max-lead",
        type=_max_lead,
        default=d["nnt_max_lead"].default,
        metavar="N|unbounded",
        help="nnt, nnt-staged: steps a worker may run ahead of a neighbour's gradients "
        "(default unbounded: never wait, as FAST)",
    )
    pipe = run.add_argument_group("model parallelism")
    pipe.add_argument(
        "--stages", type=int, default=None, help="pipelines: stages per replica (default: all)"
    )
    pipe.add_argument(
        "--micro-batches", type=int, default=1, help="gpipe, 1f1b: micro-batches per mini-batch"
    )
    pipe.add_argument(
        "--balance", default="params", help="pipelines: params | time | layers per stage 2,3,1"
    )
    pipe.add_argument(
        "--recompute",
        action="store_true",
        help="gpipe, 1f1b, zero2, zero3: recompute forwards in backward",
    )
    comp = run.add_argument_group("gradient compression (strategies that send gradients)")
    comp.add_argument(
        "--compress",
        default=d["compress"].default,
        help="none | onebit | qsgd:LEVELS | topk:RATIO | dgc:RATIO | powersgd:RANK",
    )
    comp.add_argument(
        "--no-error-feedback", action="store_true", help="drop what compression leaves out"
    )
    runs = run.add_argument_group("faults and checkpoints")
    runs.add_argument(
        "--faults", default=None, help="kill:RANK:STEP (commas): worker RANK dies after STEP"
    )
    runs.add_argument(
        "--checkpoint-every",
        default=None,
        help="N (steps) or Nepochs: checkpoints beside the metrics, for `scaledl-lab resume`",
    )
    # low communication: diloco, streaming-diloco (--sync-period is DiLoCo's H)
    low = run.add_argument_group("low communication (diloco, streaming-diloco)")
    low.add_argument(
        "--outer-optimizer",
        default=d["outer_optimizer"].default,
        help="sgd | nesterov: the outer step on the averaged outer gradient",
    )
    low.add_argument("--outer-lr", type=float, default=d["outer_lr"].default)
    low.add_argument("--outer-momentum", type=float, default=d["outer_momentum"].default)
    low.add_argument(
        "--fragments",
        type=int,
        default=d["fragments"].default,
        help="streaming-diloco: fragments of layers synchronised in turn",
    )
    low.add_argument(
        "--overlap-steps",
        type=int,
        default=d["overlap_steps"].default,
        help="streaming-diloco: τ, inner steps each outer all-reduce overlaps",
    )
    low.add_argument("--mixing-alpha", type=float, default=None,
                     help="streaming-diloco: α, the local share when merging (default 0.5 "
                     "with overlap, 0 without)")  # fmt: skip


def config_options(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields these options set."""
    return dict(
        servers=args.servers, server_transport=args.server_transport,
        backup_workers=args.backup_workers, n_fetch=args.n_fetch,
        n_push=args.n_push, dc_lambda=args.dc_lambda, dc_adaptive=args.dc_adaptive,
        sync_period=args.sync_period, elastic_alpha=args.elastic_alpha,
        elastic_async=args.elastic_async, stage_epochs=args.stage_epochs,
        nnt_max_lead=args.nnt_max_lead, stages=args.stages, micro_batches=args.micro_batches,
        balance=args.balance, recompute=args.recompute, compress=args.compress,
        error_feedback=not args.no_error_feedback, faults=args.faults,
        checkpoint_every=_steps_or_text(args.checkpoint_every),
        # low communication
        outer_optimizer=args.outer_optimizer, outer_lr=args.outer_lr,
        outer_momentum=args.outer_momentum, fragments=args.fragments,
        overlap_steps=args.overlap_steps, mixing_alpha=args.mixing_alpha,
    )  # fmt: skip


def _steps_or_text(value: str | None) -> int | str | None:
    return int(value) if value is not None and value.strip().lstrip("-").isdigit() else value
