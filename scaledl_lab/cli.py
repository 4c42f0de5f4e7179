"""The `scaledl-lab` command: reproduce, run, list, data, bench, analyse."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from . import cli_large_batch
from .config import (
    CONTRACT_STRATEGIES,
    DATASETS,
    IMPLEMENTED_RUNTIMES,
    IMPLEMENTED_STRATEGIES,
    ConfigError,
    ExperimentConfig,
    is_quick,
    quick,
)
from .cost import DEVICES, NETWORKS
from .errors import RunError
from .models import MODELS

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"


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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scaledl-lab", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    rep = sub.add_parser("reproduce", help="the paper comparison")
    rep.add_argument("--quick", action="store_true", help="small data, few epochs (minutes)")
    rep.add_argument(
        "--long",
        action="store_true",
        help="simulated only: full Fashion-MNIST, 20 epochs, seeds and a learning-rate grid",
    )
    rep.add_argument("--out", default=None, help="results folder (default results/reproduce*)")
    rep.add_argument("--address", default=None, help="attach to this Dask scheduler")

    run = sub.add_parser("run", help="one training run")
    d = ExperimentConfig.__dataclass_fields__
    run.add_argument("--strategy", default=d["strategy"].default)
    run.add_argument("--runtime", default=d["runtime"].default)
    run.add_argument("--workers", type=int, default=d["workers"].default)
    run.add_argument("--dataset", default=d["dataset"].default)
    run.add_argument("--model", default=d["model"].default)
    run.add_argument("--epochs", type=int, default=d["epochs"].default)
    run.add_argument(
        "--batch-size",
        type=int,
        default=d["batch_size"].default,
        help="per worker (effective batch = workers x batch-size)",
    )
    run.add_argument(
        "--global-batch-size",
        type=int,
        default=None,
        help="effective batch; must be divisible by --workers",
    )
    # Optimiser options left out take the strategy family's defaults (health.recommended).
    run.add_argument("--lr", type=float, default=None)
    run.add_argument("--momentum", type=float, default=None)
    run.add_argument("--weight-decay", type=float, default=None)
    run.add_argument("--optimizer", default=None)
    run.add_argument("--seed", type=int, default=d["seed"].default)
    run.add_argument(
        "--topology", default=None, help="ring | torus:HxW | complete (decentralised only)"
    )
    run.add_argument("--sharding", default=d["sharding"].default)
    run.add_argument("--train-subset", type=int, default=None)
    run.add_argument("--test-subset", type=int, default=None)
    run.add_argument("--max-steps", type=int, default=None)
    run.add_argument("--data-dir", default=None)
    run.add_argument(
        "--oversubscribe", action="store_true", help="allow more real workers than CPU cores"
    )
    run.add_argument(
        "--compute-profile",
        default=d["compute_profile"].default,
        help="sim: a device (cpu-core, v100, a100, h100) or a calibration .json",
    )
    run.add_argument(
        "--network",
        default=d["network"].default,
        help="sim: loopback, 1gbe, 10gbe, 100g-ib, nvlink, custom:LAT:BW or .json",
    )
    run.add_argument(
        "--allreduce-algorithm",
        default=d["allreduce_algorithm"].default,
        help="sim: ring | recursive-doubling",
    )
    run.add_argument(
        "--stragglers",
        default=None,
        help="sim: slow:RANK:FACTOR, spread:SIGMA, hiccup:PROB:SECONDS (commas)",
    )
    opts = run.add_argument_group("strategy options")
    opts.add_argument("--servers", type=int, default=d["servers"].default, help="PS shards")
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
        help="local-sgd, easgd: local steps between averagings",
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
        "--recompute", action="store_true", help="gpipe, 1f1b: recompute forwards in backward"
    )
    cli_large_batch.add_run_options(run)
    comp = run.add_argument_group("gradient compression (strategies that send gradients)")
    comp.add_argument(
        "--compress",
        default=d["compress"].default,
        help="none | onebit | qsgd:LEVELS | topk:RATIO | dgc:RATIO | powersgd:RANK",
    )
    comp.add_argument(
        "--no-error-feedback", action="store_true", help="drop what compression leaves out"
    )
    run.add_argument("--quick", action="store_true", help="quick mode (also SCALEDL_QUICK=1)")
    run.add_argument("--address", default=None, help="attach to this Dask scheduler")
    run.add_argument("--out", default=None, help="results folder (default results/<run>)")

    sub.add_parser("list", help="strategies, runtimes, datasets, models, cost profiles")

    cal = sub.add_parser("calibrate", help="measure this machine for the simulated runtime")
    cal.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=list(MODELS))
    cal.add_argument("--out", default=None, help="profile JSON (default in ~/.cache/scaledl_lab)")

    data = sub.add_parser("data", help="where datasets are and how to get them")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    fetch = data_sub.add_parser("fetch", help="download (with checksums) or generate a dataset")
    fetch.add_argument("name", choices=DATASETS)
    fetch.add_argument("--dest", default=None)
    data_sub.add_parser("info", help="which datasets are present, and where")

    cli_large_batch.add_analyse(sub)

    bench = sub.add_parser("bench", help="side-by-side benchmarks against plain PyTorch")
    bench.add_argument("name", nargs="?", default=None)
    return p


def _config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    from .health import recommended

    family = recommended(args.strategy)
    for name in ("lr", "momentum", "weight_decay", "optimizer"):
        if getattr(args, name) is None:
            setattr(args, name, family[name])
    cfg = ExperimentConfig(
        strategy=args.strategy, runtime=args.runtime, workers=args.workers,
        dataset=args.dataset, model=args.model, epochs=args.epochs, batch_size=args.batch_size,
        global_batch_size=args.global_batch_size, lr=args.lr, momentum=args.momentum,
        weight_decay=args.weight_decay, optimizer=args.optimizer, seed=args.seed,
        topology=args.topology, sharding=args.sharding, train_subset=args.train_subset,
        test_subset=args.test_subset, max_steps=args.max_steps, data_dir=args.data_dir,
        oversubscribe=args.oversubscribe, compute_profile=args.compute_profile,
        network=args.network, allreduce_algorithm=args.allreduce_algorithm,
        stragglers=args.stragglers, servers=args.servers, backup_workers=args.backup_workers,
        n_fetch=args.n_fetch, n_push=args.n_push, dc_lambda=args.dc_lambda,
        dc_adaptive=args.dc_adaptive,
        sync_period=args.sync_period, elastic_alpha=args.elastic_alpha,
        elastic_async=args.elastic_async, stage_epochs=args.stage_epochs,
        nnt_max_lead=args.nnt_max_lead, stages=args.stages, micro_batches=args.micro_batches,
        balance=args.balance, recompute=args.recompute, **cli_large_batch.config_options(args),
        compress=args.compress, error_feedback=not args.no_error_feedback,
    )  # fmt: skip
    return quick(cfg) if (args.quick or is_quick()) else cfg


def _cmd_list() -> None:
    from .strategies import DESCRIPTIONS

    print("strategies (implemented):")
    for name in (n for n in IMPLEMENTED_STRATEGIES if n in DESCRIPTIONS):
        print(f"  {name:18s} {DESCRIPTIONS.get(name, '')}")
    pending = [s for s in CONTRACT_STRATEGIES if s not in DESCRIPTIONS]
    if pending:
        print("strategies (planned): " + ", ".join(pending))
    print("runtimes: " + ", ".join(IMPLEMENTED_RUNTIMES))
    print("datasets: " + ", ".join(DATASETS))
    print("models: " + ", ".join(MODELS))
    print("sim compute profiles: " + ", ".join(DEVICES) + ", or a file from `calibrate`")
    print("sim networks: " + ", ".join(NETWORKS) + ", custom:LATENCY_S:BANDWIDTH_BPS")
    print(
        "compressors (--compress): none, onebit, qsgd:LEVELS, topk:RATIO, dgc:RATIO, powersgd:RANK"
    )


def _cmd_data(args: argparse.Namespace) -> None:
    from .data import DatasetNotFoundError, dataset_info, fetch, locate

    if args.data_command == "fetch":
        if args.dest is None:
            try:
                print(f"{args.name}: already present in {locate(args.name)}")
                return
            except DatasetNotFoundError:
                pass
        path = fetch(args.name, args.dest)
        print(f"{args.name}: ready in {path}")
        return
    for info in dataset_info():
        status = f"found in {info['path']}" if info["found"] else "not found"
        print(f"{info['name']}: {status}")
        if not info["found"]:
            print(f"  how to get it: {info['how_to_get']}")


def _cmd_bench(name: str | None) -> int:
    if not BENCH_DIR.is_dir():
        print(
            f"benchmarks/ not found beside the package ({BENCH_DIR}); run from a checkout",
            file=sys.stderr,
        )
        return 2
    scripts = sorted(p for p in BENCH_DIR.glob("bench_*.py"))
    if name is not None:
        scripts = [p for p in scripts if p.stem in (name, f"bench_{name}")]
        if not scripts:
            names = [p.stem.removeprefix("bench_") for p in BENCH_DIR.glob("bench_*.py")]
            print(
                f"unknown benchmark {name!r}; available: {', '.join(sorted(names))}",
                file=sys.stderr,
            )
            return 2
    status = 0
    for script in scripts:
        print(f"== {script.stem} ==", flush=True)
        status |= subprocess.call([sys.executable, str(script)])
    return status


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            _cmd_list()
        elif args.command == "data":
            _cmd_data(args)
        elif args.command == "calibrate":
            from .calibrate import calibrate

            calibrate(tuple(args.models), args.out)
        elif args.command == "bench":
            return _cmd_bench(args.name)
        elif args.command == "analyse":
            return cli_large_batch.cmd_analyse(args)
        elif args.command == "run":
            from .experiment import run

            cfg = _config_from_args(args)
            out = args.out or f"results/{cfg.label}"
            results = run(cfg, address=args.address, out=out)
            print(results.summary().to_string(index=False))
            for warning in results.warnings():
                print(f"warning: {warning}")
            print(f"results written to {out}")
        elif args.command == "reproduce" and args.long:
            from .long_run import reproduce_long

            out = args.out or "results/reproduce-long"
            reproduce_long(out=out)
            print((Path(out) / "summary.md").read_text())
        elif args.command == "reproduce":
            from .reproduce import reproduce

            is_q = args.quick or is_quick()
            out = args.out or ("results/reproduce-quick" if is_q else "results/reproduce")
            reproduce(is_quick=is_q, out=out, address=args.address)
            print((Path(out) / "summary.md").read_text())
            print(f"results written to {out}")
    except (ConfigError, RunError, FileNotFoundError, ValueError) as exc:  # CostModelError too
        print(f"scaledl-lab: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
