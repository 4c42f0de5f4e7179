"""The `scaledl-lab` command: reproduce, run, resume, list, data, bench, analyse, plan,
student-notebooks."""

from __future__ import annotations

import argparse
import functools
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import families, folders
from ..config import (
    DATASETS,
    IMPLEMENTED_RUNTIMES,
    ConfigError,
    ExperimentConfig,
    is_quick,
    quick,
)
from ..errors import Interrupt, RunError
from ..models import MODELS
from ..runtime.sim.cost import DEVICES, NETWORKS
from ..runtime.sim.network import CUSTOM_TWO_TIER, TWO_TIER
from . import large_batch, options
from . import plan as plan_cli

BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
OVERWRITE_HELP = "replace an existing non-empty --out folder (when the new run has ended)"
# The exit status of a run stopped by Ctrl-C: 128 + SIGINT, as shells report it (errors: 1).
INTERRUPTED = 130


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
    rep.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    rep.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="processes running the simulated runs side by side (after the real ones)",
    )
    rep.add_argument(
        "--smoke",
        action="store_true",
        help="only the runs on Dask, 512 samples each: checks a cluster, measures nothing",
    )
    _cluster_options(rep)

    run = sub.add_parser("run", help="one training run")
    options.add_config_options(run)  # a flag per config field, a group per family
    run.add_argument("--quick", action="store_true", help="quick mode (also SCALEDL_QUICK=1)")
    _cluster_options(run)
    run.add_argument("--out", default=None, help="results folder (default results/<label>)")
    run.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    res = sub.add_parser("resume", help="continue a run from the last checkpoint in its folder")
    res.add_argument("results_dir", help="the run's results folder (--out of `run`)")
    res.add_argument("--epochs", type=int, default=None, help="epochs in all (default: as saved)")
    res.add_argument("--address", default=None, help="attach to this Dask scheduler")

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

    large_batch.add_analyse(sub)

    plan_cli.add_plan(sub, run)  # memory and step time of a run, without training
    student = sub.add_parser(
        "student-notebooks",
        help="the labs to hand out: predictions blank (...), no outputs, no worked explanations",
    )
    student.add_argument("out", help="the folder to write them into")
    student.add_argument(
        "--notebooks", default=None, help="the labs' folder (default: notebooks/ of this checkout)"
    )
    student.add_argument("--overwrite", action="store_true", help="replace notebooks already there")
    bench = sub.add_parser("bench", help="side-by-side benchmarks against plain PyTorch")
    bench.add_argument("name", nargs="?", default=None)
    bench.add_argument(
        "args", nargs=argparse.REMAINDER, help="passed to the named benchmark's script"
    )
    return p


def _cluster_options(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("an existing cluster")
    group.add_argument("--address", default=None, help="attach to this Dask scheduler")
    group.add_argument("--tls-ca-file", default=None, help="tls:// scheduler: CA (PEM)")
    group.add_argument("--tls-cert", default=None, help="tls:// scheduler: client certificate")
    group.add_argument("--tls-key", default=None, help="tls:// scheduler: its private key")


def _security(args: argparse.Namespace) -> Any:
    from ..runtime.dask.cluster import tls_security

    given = [f for f in ("--tls-ca-file", "--tls-cert", "--tls-key") if _flag(args, f)]
    if given and args.address is None:
        verb, it = ("secures", "it") if len(given) == 1 else ("secure", "them")
        raise ConfigError(
            f"{', '.join(given)} {verb} the connection to an existing cluster's tls:// "
            f"scheduler: give its --address, or drop {it} (the embedded cluster listens on "
            "127.0.0.1 only)"
        )
    return tls_security(args.tls_ca_file, args.tls_cert, args.tls_key)


def _flag(args: argparse.Namespace, flag: str) -> Any:
    return getattr(args, flag.removeprefix("--").replace("-", "_"))


def _config_from_args(args: argparse.Namespace) -> ExperimentConfig:
    """The config of `run` and `plan`: the flags given, the config's defaults for the others.
    Quick mode (``--quick``, ``SCALEDL_QUICK=1``) shrinks the defaults only: a size or an
    epoch count typed on the command line is run as typed."""
    given = options.given_config(args)
    cfg = ExperimentConfig(**given)  # left out: the config's defaults
    return quick(cfg, keep=given) if (args.quick or is_quick()) else cfg


def _default_out(default: str, args: argparse.Namespace) -> Path:
    """The default folder, or the next free ``-N`` beside it, said in one line."""
    out, note = folders.free_default(Path(default), overwrite=args.overwrite)
    if note:
        print(note)
    return out


def _results_dir(cfg: ExperimentConfig) -> str:
    """``results/<label>``: a label that would leave ``results/`` (a path) is refused."""
    name = cfg.label
    if "/" in name or "\\" in name or name in (".", ".."):
        raise ConfigError(
            f"name={name!r} names the results folder results/<name>: it may not hold '/' or "
            "'\\' nor be '.' or '..'; choose a plain name, or the folder itself with --out DIR"
        )
    return f"results/{name}"


def _cmd_list() -> None:
    print("strategies (implemented), by family:")
    for family in families.families():
        print(f"  {family.name}: {family.summary}")
        for name, description in family.strategies.items():
            print(f"    {name:18s} {description}")
        if family.options is not None:
            print("    options:")
            for line in options.describe_options(family.options):
                print(f"      {line}")
    print("runtimes: " + ", ".join(IMPLEMENTED_RUNTIMES))
    print("datasets: " + ", ".join(DATASETS))
    print("models: " + ", ".join(MODELS))
    print("sim compute profiles: " + ", ".join(DEVICES) + ", or a file from `calibrate`")
    one_tier = [name for name, net in NETWORKS.items() if net.tiers == 1]
    print("sim networks: " + ", ".join(one_tier) + ", custom:LATENCY_S:BANDWIDTH_BPS")
    print("sim two-tier networks (inside a node, between nodes; --gpus-per-node G): "
          + ", ".join(TWO_TIER) + ", " + CUSTOM_TWO_TIER)  # fmt: skip
    print(
        "compressors (--compress): none, onebit, qsgd:LEVELS, topk:RATIO, dgc:RATIO, powersgd:RANK"
    )


def _cmd_data(args: argparse.Namespace) -> None:
    from ..data import DatasetNotFoundError, dataset_info, fetch, locate

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


def _cmd_bench(name: str | None, args: Sequence[str] = ()) -> int:
    if not BENCH_DIR.is_dir():
        print(
            f"benchmarks/ not found beside the package ({BENCH_DIR}); run from a checkout",
            file=sys.stderr,
        )
        return 2
    scripts = sorted(p for p in BENCH_DIR.glob("bench_*.py"))
    if name is None:  # perf_table repeats the other benchmarks: only when asked by name
        scripts = [p for p in scripts if p.stem != "bench_perf_table"]
    else:
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
        status |= subprocess.call([sys.executable, str(script), *args])
    return status


def _cmd_student_notebooks(args: argparse.Namespace) -> None:
    from ..course import NOTEBOOKS, write_student_notebooks

    written = write_student_notebooks(
        args.out, args.notebooks or NOTEBOOKS, overwrite=args.overwrite
    )
    print(f"{len(written)} student notebooks written to {args.out}")


def _cmd_calibrate(args: argparse.Namespace) -> None:
    from ..studies.calibrate import calibrate

    calibrate(tuple(args.models), args.out)


def _cmd_run(args: argparse.Namespace) -> None:
    from ..experiment import run

    cfg = _config_from_args(args)
    out = args.out or _default_out(_results_dir(cfg), args)
    results = run(
        cfg, address=args.address, out=out, security=_security(args), overwrite=args.overwrite
    )
    print(results.summary().to_string(index=False))
    for warning in results.warnings():
        print(f"warning: {warning}")
    print(f"results written to {out}")


def _cmd_resume(args: argparse.Namespace) -> None:
    from ..resume import resume

    results = resume(args.results_dir, args.epochs, address=args.address)
    print(results.summary().to_string(index=False))
    print(f"results written to {args.results_dir}")


def _cmd_reproduce(args: argparse.Namespace) -> None:
    is_q = args.quick or args.smoke or is_quick()
    default = "results/reproduce" + (
        "-long" if args.long else "-smoke" if args.smoke else "-quick" if is_q else ""
    )
    out = Path(args.out or _default_out(default, args))
    security = _security(args)
    with folders.staged(out, overwrite=args.overwrite) as partial:  # as `run` writes its own
        _reproduce_into(partial, args, is_q, security)
    print((out / "summary.md").read_text())
    print(f"results written to {out}")


def _reproduce_into(out: Path, args: argparse.Namespace, is_q: bool, security: Any) -> None:
    if args.long:
        from ..studies.long_run import reproduce_long

        reproduce_long(out=out, jobs=args.jobs)
        return
    from ..studies.reproduce import reproduce, smoke_configs

    configs, traffic = (smoke_configs(), []) if args.smoke else (None, None)
    reproduce(
        is_quick=is_q,
        out=out,
        address=args.address,
        configs=configs,
        traffic=traffic,
        security=security,
        jobs=args.jobs,
    )


# Each subcommand's handler: it returns the exit status, or None for 0.
COMMANDS: dict[str, Callable[[argparse.Namespace], int | None]] = {
    "list": lambda args: _cmd_list(),
    "data": _cmd_data,
    "calibrate": _cmd_calibrate,
    "bench": lambda args: _cmd_bench(args.name, args.args),
    "analyse": large_batch.cmd_analyse,
    "plan": lambda args: plan_cli.cmd_plan(args, _config_from_args),
    "run": _cmd_run,
    "resume": _cmd_resume,
    "reproduce": _cmd_reproduce,
    "student-notebooks": _cmd_student_notebooks,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Ctrl-C is remembered as well as raised: one that a finalizer swallows is raised again at
    # the run's next rows (errors.Interrupt). Only where Ctrl-C has Python's default action.
    own = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    hook = sys.unraisablehook
    if own:
        Interrupt.pending = False
        signal.signal(signal.SIGINT, Interrupt.handler)
        sys.unraisablehook = functools.partial(_unraisable, hook)  # no traceback for it
    try:
        return COMMANDS[args.command](args) or 0
    except (ConfigError, RunError, OSError, ValueError) as exc:  # CostModelError too
        print(f"scaledl-lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:  # the run's own partial results stay, named in its note
        notes = "; ".join(getattr(exc, "__notes__", []))
        print("scaledl-lab: interrupted" + (f"; {notes}" if notes else ""), file=sys.stderr)
        return INTERRUPTED
    finally:
        if own:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            sys.unraisablehook = hook


def _unraisable(hook: Callable[[Any], None], unraisable: Any) -> None:
    """Python's report of an exception a finalizer raised, except Ctrl-C's (raised again)."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        hook(unraisable)
