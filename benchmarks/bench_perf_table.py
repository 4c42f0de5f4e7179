"""The performance targets in one run: every figure timed here, as a ratio to its reference.

Calls the measurements of the other side-by-side scripts on one 2-worker Dask cluster:

- ``bench_collectives``: one allreduce through ``Comm`` vs raw ``dist.all_reduce`` (1, 4, 16 MB);
- ``bench_sync_sgd``: the default (bucketed) reducer vs DDP with the same malloc tuning, CNN,
  batch 64 and 256 per worker;
- ``bench_ps_sync``: ``ps-sync`` vs ``allreduce`` samples/s, MLP and CNN;
- ``bench_async``: ``ps-async`` on 2 workers vs the plain single-process loop, CNN and MLP;
- ``bench_sim_fidelity``: the simulator's predicted step time vs the measured one;

then, with the cluster closed, ``bench_sim_cost``: simulating N workers vs the same gradients
computed plainly (MLP and CNN, N = 16 and 64). It prints one markdown table with the project's
performance targets; nothing in it is typed in, only the targets.

    python benchmarks/bench_perf_table.py [--quick] [--out table.csv] [--only sim_cost ...]

``--quick`` (or SCALEDL_QUICK=1) takes few steps and repetitions: a smoke check whose ratios are
noisy, not a measurement to quote.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent

PIECES = ("collectives", "sync_sgd", "ps_sync", "async", "sim_fidelity", "sim_cost")
FIDELITY_TARGETS = [("cnn", 64), ("cnn", 256), ("mlp", 64), ("mlp", 256)]


@dataclass(frozen=True)
class Target:
    """The target bound on a ratio: at least ``low``, at most ``high`` (None: no bound)."""

    low: float | None = None
    high: float | None = None
    note: str = ""

    def text(self) -> str:
        if self.low is not None and self.high is not None:
            bound = f"{self.low:.2f} to {self.high:.2f}"
        elif self.low is not None:
            bound = f"≥ {self.low:.2f}"
        else:
            bound = f"≤ {self.high:.2f}"
        return f"{bound} ({self.note})" if self.note else bound

    def is_met(self, ratio: float) -> bool:
        return (self.low is None or ratio >= self.low) and (self.high is None or ratio <= self.high)


@dataclass(frozen=True)
class Figure:
    """One row: our value, the reference's (both in ``unit``), and the ratio the target judges."""

    what: str
    ours: float
    reference: float
    unit: str
    ratio: float
    target: Target


def _number(x: float) -> str:
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def markdown(figures: Sequence[Figure]) -> str:
    """The table in markdown, one row per figure."""
    lines = [
        "| what | ours | reference | ratio | target | met? |",
        "|---|---|---|---|---|---|",
    ]
    for f in figures:
        met = "yes" if f.target.is_met(f.ratio) else "**no**"
        lines.append(
            f"| {f.what} | {_number(f.ours)} {f.unit} | {_number(f.reference)} {f.unit} "
            f"| ×{f.ratio:.2f} | {f.target.text()} | {met} |"
        )
    return "\n".join(lines)


def write_csv(figures: Sequence[Figure], path: str | Path) -> None:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["what", "ours", "reference", "unit", "ratio", "target", "met"])
        for f in figures:
            met = f.target.is_met(f.ratio)
            out.writerow([f.what, f.ours, f.reference, f.unit, f.ratio, f.target.text(), met])


# Each piece times one part of the table and returns its figures. Ratios follow the targets:
# reference time / ours for a collective, ours / reference for a rate, and simulator /
# plain and predicted / measured for the simulator's cost and fidelity.


@dataclass(frozen=True)
class Settings:
    reps: int = 500  # collectives: trimmed means of ours and raw, the same call, within noise
    sync_steps: int = 60
    sync_repeats: int = 2
    ps_steps: int = 60
    ps_rounds: int = 3
    async_steps: int = 60
    async_rounds: int = 3
    sim_steps: int = 10
    fidelity_steps: int = 40
    fidelity_rounds: int = 3


QUICK = Settings(
    reps=5,
    sync_steps=10,
    sync_repeats=1,
    ps_steps=10,
    ps_rounds=1,
    async_steps=20,
    async_rounds=1,
    sim_steps=2,  # the simulator's start-up then weighs more: its ratios come out high
    fidelity_steps=10,
    fidelity_rounds=1,
)


def collectives(client, s: Settings) -> list[Figure]:
    import bench_collectives

    timings = bench_collectives.measure(client, s.reps)
    figures = []
    for nbytes, low in zip(bench_collectives.SIZES, (0.9, 0.95, 0.95), strict=True):
        ours, raw = timings[nbytes]["ours"] * 1e3, timings[nbytes]["raw"] * 1e3
        what = f"allreduce {nbytes >> 20} MB through `Comm` vs raw `dist.all_reduce`, time"
        figures.append(Figure(what, ours, raw, "ms", raw / ours, Target(low=low)))
    return figures


def _medians(what: str, runs: dict, ours: str, ref: str, unit: str, target: Target) -> Figure:
    """A figure from two sides' repeated rates: their medians, ratio ours / reference."""
    mine, theirs = statistics.median(runs[ours]), statistics.median(runs[ref])
    return Figure(what, mine, theirs, unit, mine / theirs, target)


def sync_sgd(client, s: Settings) -> list[Figure]:
    import bench_sync_sgd

    figures = []
    for batch in (64, 256):
        runs = bench_sync_sgd.measure(
            client, "cnn", batch, s.sync_steps, s.sync_repeats, sides=("ours", "ddpm")
        )
        what = f"sync DP (default reducer) vs DDP + same malloc tuning, CNN, batch {batch}"
        figures.append(_medians(what, runs, "ours", "ddpm", "samples/s", Target(low=0.95)))
    return figures


def ps_sync(client, s: Settings) -> list[Figure]:
    import bench_ps_sync

    figures = []
    for model in ("mlp", "cnn"):
        runs = bench_ps_sync.measure(
            client, model, 64, s.ps_steps, s.ps_rounds, sides=("ps", "allreduce")
        )
        what = f"ps-sync vs allreduce, 2 workers, {model.upper()}, batch 64"
        figures.append(_medians(what, runs, "ps", "allreduce", "samples/s", Target(low=0.85)))
    return figures


def async_ps(client, s: Settings) -> list[Figure]:
    import bench_async

    figures = []
    for model, low, today in (("cnn", 1.5, "×1.41 today"), ("mlp", 0.6, "×0.38 today")):
        runs = bench_async.measure(
            client, model, 64, s.async_steps, s.async_rounds, sides=("ps", "plain")
        )
        what = f"async PS, 2 workers vs plain 1-process loop, {model.upper()}, batch 64"
        figures.append(_medians(what, runs, "ps", "plain", "updates/s", Target(low, note=today)))
    return figures


def sim_fidelity(client, s: Settings) -> list[Figure]:
    import bench_sim_fidelity

    rows = bench_sim_fidelity.measure(
        client, FIDELITY_TARGETS, s.fidelity_steps, s.fidelity_rounds, log=None
    )
    figures = []
    for model, batch in FIDELITY_TARGETS:
        mine = [(p, m) for mo, b, p, m in rows if (mo, b) == (model, batch)]
        p = statistics.median(p for p, _ in mine) * 1e3
        m = statistics.median(m for _, m in mine) * 1e3
        what = f"sim's predicted vs measured step time, {model.upper()}@{batch}, 2 workers"
        figures.append(Figure(what, p, m, "ms", p / m, Target(0.9, 1.1, "error within ±10%")))
    return figures


def sim_cost(s: Settings) -> list[Figure]:
    import bench_sim_cost
    import torch

    from scaledl_lab.runtime.memory import keep_freed_memory

    keep_freed_memory()  # as bench_sim_cost: both sides with the tuning the simulator applies
    threads = torch.get_num_threads()
    figures = []
    cases = (("mlp", 16, 1.5, ""), ("mlp", 64, 1.5, ""), ("cnn", 16, 1.15, "today"))
    cases += (("cnn", 64, 1.14, "today"),)
    try:
        for model, n, high, note in cases:
            plain, sim = bench_sim_cost.measure(model, n, s.sim_steps)
            what = f"simulator vs plain gradients, {model.upper()}, N = {n} × {s.sim_steps} steps"
            figures.append(Figure(what, sim, plain, "s", sim / plain, Target(high=high, note=note)))
    finally:
        torch.set_num_threads(threads)
    return figures


ORDER = ("collectives", "sync_sgd", "ps_sync", "async", "sim_cost", "sim_fidelity")  # the table's


def measure_all(
    settings: Settings, pieces: Sequence[str] = PIECES, log: Callable[[str], None] = print
) -> list[Figure]:
    """Time the chosen pieces (Dask ones on one cluster, then the simulator's cost)."""
    from scaledl_lab.runtime.dask.cluster import connect

    if str(BENCH_DIR) not in sys.path:  # the sibling scripts, imported by name as they import
        sys.path.insert(0, str(BENCH_DIR))  # each other
    on_dask = {"collectives": collectives, "sync_sgd": sync_sgd, "ps_sync": ps_sync}
    on_dask |= {"async": async_ps, "sim_fidelity": sim_fidelity}
    found: dict[str, list[Figure]] = {}
    if any(p in on_dask for p in pieces):
        with connect(2, dashboard=False, log=None) as client:
            for piece in (p for p in PIECES if p in pieces and p in on_dask):
                log(f"timing {piece} ...")
                found[piece] = on_dask[piece](client, settings)
                log(markdown(found[piece]))
    if "sim_cost" in pieces:
        log("timing sim_cost ...")
        found["sim_cost"] = sim_cost(settings)
        log(markdown(found["sim_cost"]))
    return [f for piece in ORDER if piece in found for f in found[piece]]


def main(argv: list[str] | None = None) -> None:
    from scaledl_lab.config import is_quick

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and repetitions")
    parser.add_argument("--out", help="also write the table as CSV to this file")
    parser.add_argument("--only", nargs="+", choices=PIECES, default=list(PIECES))
    args = parser.parse_args(argv)
    quick = args.quick or is_quick()
    settings = QUICK if quick else Settings()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    figures = measure_all(settings, args.only, log)
    print(f"the performance figures, timed in this run{' (--quick: noisy)' if quick else ''}:\n")
    print(markdown(figures))
    if args.out:
        write_csv(figures, args.out)
        print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
