"""Where the test suite's time goes: the ``--durations=0`` table of a run, grouped by test file
and by what the tests wait on.

    SCALEDL_QUICK=1 python -m pytest ... --durations=0 > run.log   # the README's command
    python benchmarks/suite_durations.py run.log [more.log ...] --out results/suite-durations

For each log it writes ``NAME.csv`` (one row per test phase: seconds, phase, test, file, what it
waits on), ``files.csv`` (the last log's seconds per file: ``tests/conftest.py`` hands the
costliest files to pytest-xdist's processes first) and a ``report.md`` that sets the runs side
by side: wall time (pytest's own closing line), the summed test time (the work; with
pytest-xdist it exceeds the wall time), the share of each kind of wait, and the files that cost
most.

What a test waits on is read from the test itself (a ``--collect-only`` pass over the same
paths records each test's fixtures and source):

- *notebook cells*: nbval running a notebook's cells in its kernel;
- *fixture set-up*: the ``setup`` phase (the session's two-worker LocalCluster is started in the
  setup of the first test that asks for it; module fixtures train shared runs there too);
- *real Dask runs*: tests that use the ``client`` fixture, start a cluster or a scheduler of
  their own, or run the CLI or a benchmark in a subprocess (processes that start and talk);
- *waits by design*: tests that sleep, or wait on a timeout, a dead worker or a deadlock;
- *simulated runs and unit tests*: the rest (the simulator trains in the test's own process);
- *teardown*: closing what the fixtures opened.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^\s*([\d.]+)s (setup|call|teardown)\s+(.+?)\s*$")
WALL = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in ([\d.]+)s")
# The CPU seconds of every process of the run, forked Dask workers and pools included (which
# /usr/bin/time's user and sys leave out: they are not the test process's children), read from
# a cgroup's cpuacct.usage around the command and appended to its log as this line.
CPU = re.compile(r"cgroup_cpu_s ([\d.]+)")
KINDS = [
    "notebook cells",
    "real Dask runs",
    "simulated runs and unit tests",
    "waits by design",
    "fixture set-up",
    "teardown",
]
DASK = re.compile(r"\bconnect\(|LocalCluster|Scheduler\(|subprocess|start_local|\bclient\b")
WAITS = re.compile(r"time\.sleep|timeout|deadlock|dead_worker|\bdead\b|kill", re.I)


def parse_log(path: Path) -> tuple[pd.DataFrame, float | None, str]:
    """The durations table of one pytest log, its wall time and its closing counts."""
    rows, wall, counts, inside, cpu = [], None, "", False, None
    for line in path.read_text(errors="replace").splitlines():
        if "slowest durations" in line:
            inside = True
            continue
        m = LINE.match(line) if inside else None
        if m:
            rows.append({"seconds": float(m[1]), "phase": m[2], "test": m[3]})
        w = WALL.search(line)
        if w and ("passed" in w[1] or "failed" in w[1]):
            wall, counts = float(w[2]), w[1]
        if c := CPU.search(line):
            cpu = float(c[1])
    frame = pd.DataFrame(rows, columns=["seconds", "phase", "test"])
    frame["file"] = frame.test.str.split("::").str[0]
    frame.attrs["cpu"] = cpu
    return frame, wall, counts


def parse_table(path: Path) -> tuple[pd.DataFrame, float | None, str]:
    """A ``NAME.csv`` this script wrote, with the wall time of ``NAME.time.txt`` beside it (the
    ``/usr/bin/time -f "wall %e user %U sys %S"`` line of that run) and the counts of its
    ``NAME.counts.txt``, where they were kept."""
    frame = pd.read_csv(path)
    timing = path.with_suffix(".time.txt")
    wall, text = None, timing.read_text() if timing.is_file() else ""
    if m := re.search(r"wall ([\d.]+)", text):
        wall = float(m[1])
    elif m := re.search(r"real\s+(\d+)m([\d.]+)s", text):  # bash's `time`
        wall = 60 * float(m[1]) + float(m[2])
    if c := CPU.search(text):  # else user + sys: every process's, where the workers spawned
        frame.attrs["cpu"] = float(c[1])
    elif m := re.search(r"user ([\d.]+) sys ([\d.]+)", text):
        frame.attrs["cpu"] = float(m[1]) + float(m[2])
    elif m := re.search(r"user\s+(\d+)m([\d.]+)s\s+sys\s+(\d+)m([\d.]+)s", text):
        frame.attrs["cpu"] = 60 * float(m[1]) + float(m[2]) + 60 * float(m[3]) + float(m[4])
    counts = path.with_suffix(".counts.txt")
    return frame, wall, counts.read_text().strip() if counts.is_file() else "?"


class _Collector:
    """A pytest plugin that records, per collected test, what it waits on."""

    def __init__(self) -> None:
        self.kind: dict[str, str] = {}

    def pytest_collection_modifyitems(self, items) -> None:  # noqa: ANN001 (pytest's hook)
        for item in items:
            if item.nodeid.startswith("notebooks/"):
                continue
            try:
                source = inspect.getsource(item.function)
            except (AttributeError, OSError, TypeError):
                source = ""
            names = set(getattr(item, "fixturenames", ()))
            if WAITS.search(item.name) or WAITS.search(source):
                self.kind[item.nodeid] = "waits by design"
            elif "client" in names or DASK.search(source):
                self.kind[item.nodeid] = "real Dask runs"
            else:
                self.kind[item.nodeid] = "simulated runs and unit tests"


def collect_kinds(paths: list[str]) -> dict[str, str]:
    """Each test's kind, from a collect-only pass (seconds; nothing runs)."""
    import pytest

    plugin = _Collector()
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "--runslow", *paths]
    pytest.main(args, plugins=[plugin])
    return plugin.kind


def classify(frame: pd.DataFrame, kinds: dict[str, str]) -> pd.Series:
    def one(row) -> str:  # noqa: ANN001
        if row.test.startswith("notebooks/"):
            return "notebook cells"
        if row.phase == "setup":
            return "fixture set-up"
        if row.phase == "teardown":
            return "teardown"
        return kinds.get(row.test, "simulated runs and unit tests")

    return frame.apply(one, axis=1)


def report(runs: dict[str, tuple[pd.DataFrame, float | None, str]], top: int = 25) -> str:
    names = list(runs)
    lines = ["# Where the test suite's time goes", ""]
    lines += [
        "Written by `python benchmarks/suite_durations.py` from the logs of the runs below "
        "(each the README's test command with `--durations=0`).",
        "",
    ]
    lines += [
        "| run | closing line | wall time | CPU time, all processes | summed test time "
        "| test phases timed (≥ 5 ms) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for name, (frame, wall, counts) in runs.items():
        n = frame[frame.phase == "call"].shape[0]
        wall_text = f"{wall:.0f} s ({wall / 60:.1f} min)" if wall else "?"
        cpu = frame.attrs.get("cpu")
        cpu_text = "?" if cpu is None else f"{cpu:.0f} s"
        lines.append(
            f"| {name} | {counts} | {wall_text} | {cpu_text} | {frame.seconds.sum():.0f} s | {n} |"
        )
    lines += ["", "## By what the tests wait on (summed seconds, share of the summed time)", ""]
    lines += ["| kind | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for kind in KINDS:
        cells = []
        for name in names:
            frame = runs[name][0]
            s = frame.loc[frame.kind == kind, "seconds"].sum()
            cells.append(f"{s:.0f} s ({s / frame.seconds.sum():.0%})")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    lines += ["", f"## By file: the {top} costliest of the last run (summed seconds)", ""]
    lines += ["| file | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    by_file = {n: runs[n][0].groupby("file").seconds.sum() for n in names}
    last = by_file[names[-1]].sort_values(ascending=False)
    for file in last.index[:top]:
        cells = [f"{by_file[n].get(file, float('nan')):.1f}" for n in names]
        lines.append(f"| {file} | " + " | ".join(cells) + " |")
    lines += ["", f"## The {top} costliest test phases of the last run", ""]
    lines += ["| seconds | phase | test | kind |", "|---:|---|---|---|"]
    head = runs[names[-1]][0].sort_values("seconds", ascending=False).head(top)
    for row in head.itertuples():
        lines.append(f"| {row.seconds:.1f} | {row.phase} | `{row.test}` | {row.kind} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "logs", nargs="+", type=Path, help="pytest logs (or tables written before), NAME=PATH"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "suite-durations")
    parser.add_argument("--paths", nargs="+", default=["tests"], help="what to collect")
    args = parser.parse_args(argv)
    kinds = collect_kinds(args.paths)
    runs = {}
    for spec in args.logs:  # NAME=LOG, or NAME=TABLE.csv for a run measured before
        name, _, path = str(spec).rpartition("=")
        path = Path(path)
        if path.suffix == ".csv":  # a table this script wrote before: its log is gone
            frame, wall, counts = parse_table(path)
        else:
            frame, wall, counts = parse_log(path)
            if frame.empty:
                print(f"suite_durations: error: {path} has no --durations table", file=sys.stderr)
                return 1
            frame["kind"] = classify(frame, kinds)
        runs[name or path.stem] = (frame, wall, counts)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (frame, _, _) in runs.items():
        frame.to_csv(args.out / f"{name}.csv", index=False)
    # The last run's seconds per file: the order tests/conftest.py hands files out in.
    last = runs[list(runs)[-1]][0].groupby("file", sort=True).seconds.sum().round(2)
    last.rename_axis("file").reset_index().to_csv(args.out / "files.csv", index=False)
    text = report(runs)
    (args.out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
