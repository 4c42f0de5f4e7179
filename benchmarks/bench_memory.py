"""Peak memory the way a laptop feels it: the summed PSS of a command's whole process tree.

Runs each target as a child process and, about twice a second while it runs, finds every process
in its tree (the command, its children and grandchildren: the Jupyter kernel, Dask nannies and
workers, simulator pool processes) and sums their proportional set size from
``/proc/PID/smaps_rollup``, so a shared library page mapped by ten processes counts once, a tenth
in each. The peak of that sum over time is what has to fit in a laptop's RAM. Beside it: the peak
of the summed RSS (shared pages counted in every process) and the largest single process's peak
RSS (its kernel high-water mark, what ``/usr/bin/time -v`` reports as "Maximum resident set
size"), the wall time and how many processes the tree had at the PSS peak.

    python benchmarks/bench_memory.py [TARGET ...] [--mode quick|full] [--interval 0.5]
                                      [--csv FILE] [--breakdown] [--out DIR] [--keep DIR]

``--out DIR`` (the committed one is ``results/memory``) merges the rows into ``DIR/memory.csv``
(a target and mode measured again replaces its row), each process at the peak into
``DIR/breakdown.csv``, the machine into ``DIR/machine.json``, and writes ``DIR/summary.md``
from them: the table a README quotes. ``--keep DIR`` copies the measured ``reproduce`` run's
results folder there (``results/reproduce-quick``: the committed results are the measured run's).

Targets (default: all of them): ``reproduce`` runs ``scaledl-lab reproduce --quick --out <tmp>``
(without ``--quick`` in full mode) through ``python -m scaledl_lab.cli``, so the code of this
checkout is measured; a notebook (``07``, ``07_large_batch`` or ``notebooks/07_large_batch.ipynb``)
is executed headless by ``python -m nbconvert --execute``, its kernel a child of nbconvert and so
part of the tree (nbconvert itself stands in for the Jupyter server a student runs). The
executed copy goes to a temporary folder; the committed notebooks are never written. Quick mode
sets ``SCALEDL_QUICK=1``, full mode removes it. ``PYTHONPATH`` is set to this checkout, so the
kernel and the workers import its ``scaledl_lab`` too.

A target that fails still gets its row, with its exit code, and the next target runs. GB is
10^9 bytes. The budgets are issue 29's: ``reproduce --quick`` ≤ 3 GB summed PSS and ≤ 5 minutes
(on an idle 2-core machine: the time verdict is only meaningful there), each notebook ≤ 2 GB
in quick mode. Processes whose ``smaps_rollup`` cannot be read (another user's) are not summed
but counted apart, with their RSS, and reported under the table. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
GB = 1e9
PAGE = os.sysconf("SC_PAGE_SIZE")

MODES = ("quick", "full")
# Issue 29's budgets, quick mode only: (summed PSS in GB, wall seconds or None).
BUDGETS = {("reproduce", "quick"): (3.0, 300.0), ("notebook", "quick"): (2.0, None)}


def process_table() -> dict[int, tuple[int, int, str]]:
    """Every process now: pid → (parent pid, start time in clock ticks, state letter).

    The start time tells a pid that was reused from the process seen under it before.
    """
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                stat = fh.read().decode(errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone between the listing and the read
        # The command name (field 2) is in parentheses and may hold spaces or ')': cut at the last.
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[19]), fields[0])
    return table


def read_memory(pid: int) -> dict[str, int] | None:
    """One process's memory in bytes: ``pss``, ``rss`` and ``hwm`` (its peak RSS so far).

    None if the process is gone; ``{"unreadable": rss}`` if its ``smaps_rollup`` may not be read
    (the RSS then comes from ``statm``, which anyone may read).
    """
    found: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as fh:
            for line in fh:
                key, _, rest = line.partition(b":")
                if key in (b"Pss", b"Rss"):
                    found[key.decode().lower()] = int(rest.split()[0]) * 1024
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    found["hwm"] = int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError:
        try:
            with open(f"/proc/{pid}/statm", "rb") as fh:
                return {"unreadable": int(fh.read().split()[1]) * PAGE}
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            return None
    if "pss" not in found:  # no address space left (exiting): nothing to count
        return None
    found.setdefault("hwm", found["rss"])
    return found


def command_of(pid: int) -> str:
    """A process's command line, shortened (what the peak's breakdown names it by)."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    words = [a.decode(errors="replace") for a in args if a]
    return " ".join(Path(words[0]).name.split() + words[1:])[:100] if words else f"pid {pid}"


def tree_of(root: int, known: dict[int, int], table: dict[int, tuple[int, int, str]]) -> list[int]:
    """The live processes of ``root``'s tree: its descendants now, and those seen in the tree
    before (``known``: pid → start time, updated here) with their descendants, so that a worker
    whose parent died and which was re-parented to init is still counted."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = [root] + [pid for pid, start in known.items() if table.get(pid, (0, -1))[1] == start]
    members: set[int] = set()
    while stack:
        pid = stack.pop()
        if pid in members or pid not in table:
            continue
        members.add(pid)
        stack.extend(children.get(pid, ()))
    for pid in members:
        known[pid] = table[pid][1]
    return [pid for pid in members if table[pid][2] not in "ZX"]  # zombies hold no memory


def measure(
    cmd: list[str],
    env: dict[str, str],
    interval: float = 0.5,
    *,
    cwd: str | Path | None = None,
    output: str | Path | None = None,
) -> dict:
    """Run ``cmd`` to its end and sample its process tree's memory every ``interval`` seconds.

    Returns, in bytes and seconds: ``peak_pss`` (the largest summed PSS of one sample),
    ``peak_rss`` (the largest summed RSS), ``largest_process`` (the largest peak RSS of a single
    process, from its kernel high-water mark, so a spike between two samples counts),
    ``processes_at_peak`` (processes summed in the peak PSS sample), ``max_processes``,
    ``peak_at`` (seconds from the start to the peak PSS sample), ``wall``, ``exit_code``
    (negative: killed by that signal), ``samples``, ``unreadable`` and ``unreadable_rss`` (the
    most processes, and RSS, in one sample whose PSS could not be read: not in the sums),
    ``rusage_maxrss`` (what ``wait4`` reports for the command and the descendants it reaped,
    ``/usr/bin/time -v``'s figure; the kernel counts the forked caller's image before ``exec``
    in it, so it is at least the caller's own RSS: a cross-check only when the caller is small,
    as this script is), ``left_behind`` (processes of the tree still alive when the
    command exited) and ``timeline`` ((seconds, summed PSS, processes) per sample).

    The command's stdout and stderr go to ``output`` if given, else they are inherited. It runs
    in its own session; if measuring is interrupted, that process group is terminated.
    """
    sink = open(output, "wb") if output is not None else None  # closed below
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, env=env, cwd=cwd, stdout=sink, stderr=subprocess.STDOUT if sink else None,
        start_new_session=True,
    )  # fmt: skip
    exited = threading.Event()
    ending: dict = {}

    def reap() -> None:  # wait4 rather than Popen.wait: it also returns the rusage
        _, status, usage = os.wait4(proc.pid, 0)
        ending.update(end=time.perf_counter(), status=status, usage=usage)
        exited.set()

    waiter = threading.Thread(target=reap, daemon=True)
    waiter.start()
    known: dict[int, int] = {}
    result = dict(peak_pss=0, peak_rss=0, largest_process=0, processes_at_peak=0, peak_at=0.0)
    result |= dict(max_processes=0, unreadable=0, unreadable_rss=0, samples=0)
    timeline: list[tuple[float, int, int]] = []
    try:
        tick = start
        while not exited.is_set():
            now = time.perf_counter() - start  # when the sample began: the command was running
            table = process_table()
            pss = rss = unreadable = unreadable_rss = counted = 0
            each: dict[int, int] = {}
            for pid in tree_of(proc.pid, known, table):
                memory = read_memory(pid)
                if memory is None:
                    continue  # gone between the listing and the read
                if "unreadable" in memory:
                    unreadable += 1
                    unreadable_rss += memory["unreadable"]
                    continue
                counted += 1
                each[pid] = memory["pss"]
                pss += memory["pss"]
                rss += memory["rss"]
                result["largest_process"] = max(result["largest_process"], memory["hwm"])
            timeline.append((now, pss, counted))
            result["samples"] += 1
            if pss > result["peak_pss"]:
                result.update(peak_pss=pss, processes_at_peak=counted, peak_at=now)
                result["at_peak"] = sorted(
                    ((command_of(pid), n) for pid, n in each.items()), key=lambda c: -c[1]
                )
            result["peak_rss"] = max(result["peak_rss"], rss)
            result["max_processes"] = max(result["max_processes"], counted)
            result["unreadable"] = max(result["unreadable"], unreadable)
            result["unreadable_rss"] = max(result["unreadable_rss"], unreadable_rss)
            tick += interval
            exited.wait(max(0.0, tick - time.perf_counter()))
    finally:
        if not exited.is_set():  # interrupted: stop what was started, then reap it
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                if not exited.wait(10):
                    os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            exited.wait(10)
        if sink is not None:
            sink.close()
    proc.returncode = os.waitstatus_to_exitcode(ending["status"])  # reaped above, not by Popen
    table = process_table()
    left = [
        pid for pid, st in known.items() if pid != proc.pid and table.get(pid, (0, -1))[1] == st
    ]
    wall = ending["end"] - start
    result |= dict(
        wall=wall,
        exit_code=proc.returncode,
        rusage_maxrss=ending["usage"].ru_maxrss * 1024,  # kB on Linux
        cpu=ending["usage"].ru_utime + ending["usage"].ru_stime,
        left_behind=len(left),
        # A sample that began as the command exited (between the check and the clock) is
        # stamped at the exit.
        timeline=[(min(t, wall), pss, n) for t, pss, n in timeline],
    )
    return result


@dataclass(frozen=True)
class Target:
    """One thing to measure: ``reproduce`` or a notebook (``path``)."""

    name: str
    path: Path | None = None

    @property
    def kind(self) -> str:
        return "reproduce" if self.path is None else "notebook"

    def command(self, mode: str, tmp: Path) -> list[str]:
        if self.path is None:
            quick = ["--quick"] if mode == "quick" else []
            return [sys.executable, "-m", "scaledl_lab.cli", "reproduce", *quick, "--out",
                    str(tmp / "reproduce")]  # fmt: skip
        return [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute",
                "--output-dir", str(tmp), "--output", self.path.name, str(self.path)]  # fmt: skip

    def cwd(self) -> Path:
        return ROOT if self.path is None else self.path.parent


def all_targets() -> list[Target]:
    return [Target("reproduce")] + [
        Target(p.stem, p) for p in sorted(NOTEBOOKS.glob("[0-9]*.ipynb"))
    ]


def resolve(names: Sequence[str]) -> list[Target]:
    """Targets by name: ``reproduce``, a notebook's number, stem, file name or path."""
    known = all_targets()
    chosen = []
    for name in names:
        stem = Path(name).stem
        match = [t for t in known if t.name == stem or t.name.split("_")[0] == stem]
        if len(match) != 1:
            choices = ", ".join(t.name for t in known)
            raise SystemExit(f"unknown target {name!r}; choose from: {choices}")
        chosen.append(match[0])
    return chosen


def environment(mode: str) -> dict[str, str]:
    """This process's environment, with quick mode on or off and this checkout importable."""
    env = dict(os.environ)
    env.pop("SCALEDL_QUICK", None)
    if mode == "quick":
        env["SCALEDL_QUICK"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    # The kernel spec may run `python`: make it this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


@dataclass(frozen=True)
class Row:
    """One target's figures, in GB and seconds."""

    target: str
    mode: str
    peak_pss_gb: float
    peak_rss_gb: float
    largest_process_gb: float
    processes_at_peak: int
    wall_s: float
    exit_code: int
    budget: str
    unreadable: int = 0
    unreadable_rss_gb: float = 0.0
    left_behind: int = 0
    load_at_start: float = math.nan  # the 1-minute load average as the target started
    measured_at: str = ""  # UTC, ISO 8601
    # CPU seconds (user + system) of the command and every descendant reaped before it ended
    # (kernel, nannies, workers, pool processes): what a shared server's cores must supply.
    cpu_s: float = math.nan
    processor: str = ""  # the CPU model (/proc/cpuinfo): wall and CPU seconds depend on it


def budget_verdict(kind: str, mode: str, pss_gb: float, wall_s: float, exit_code: int) -> str:
    """``≤ 3 GB, ≤ 300 s: met`` or ``not met``; ``—`` without a budget; a failed run unjudged."""
    if (kind, mode) not in BUDGETS:
        return "—"
    gb, seconds = BUDGETS[kind, mode]
    text = f"≤ {gb:g} GB" + (f", ≤ {seconds:g} s" if seconds is not None else "")
    if exit_code != 0:
        return f"{text}: not judged (failed)"
    met = pss_gb <= gb and (seconds is None or wall_s <= seconds)
    return f"{text}: {'met' if met else 'not met'}"


def to_row(target: Target, mode: str, figures: dict, load: float = math.nan, at: str = "") -> Row:
    pss, wall, code = figures["peak_pss"] / GB, figures["wall"], figures["exit_code"]
    verdict = budget_verdict(target.kind, mode, pss, wall, code)
    return Row(
        target.name, mode, pss, figures["peak_rss"] / GB, figures["largest_process"] / GB,
        figures["processes_at_peak"], wall, code, verdict,
        figures["unreadable"], figures["unreadable_rss"] / GB, figures["left_behind"], load, at,
        figures.get("cpu", math.nan), figures.get("processor", ""),
    )  # fmt: skip


HEADER = ["target", "mode", "peak summed PSS GB", "peak summed RSS GB", "largest process GB",
          "processes at peak", "wall s", "exit code", "budget"]  # fmt: skip


def markdown(rows: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = [r.target, r.mode, f"{r.peak_pss_gb:.2f}", f"{r.peak_rss_gb:.2f}",
                 f"{r.largest_process_gb:.2f}", str(r.processes_at_peak), f"{r.wall_s:.0f}",
                 str(r.exit_code), r.budget]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_csv(rows: Sequence[Row], path: str | Path) -> None:
    """The rows, numbers unrounded, one column per ``Row`` field."""
    fields = list(Row.__dataclass_fields__)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(fields)
        for r in rows:
            writer.writerow([getattr(r, f) for f in fields])


def machine() -> str:
    """Cores, RAM and load when the measurement starts (the wall times depend on them)."""
    with open("/proc/meminfo") as fh:
        total = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {total / GB:.1f} GB RAM, load average {load}"


def read_rows(path: Path) -> list[Row]:
    """The rows of a ``memory.csv`` written by :func:`write_csv`."""
    types = {f.name: f.type for f in Row.__dataclass_fields__.values()}
    cast = {"int": int, "float": float, "str": str}
    with open(path, newline="") as fh:
        # a column a later version added is missing from older files: the field's default
        return [Row(**{k: cast[types[k]](v) for k, v in r.items() if k in types})
                for r in csv.DictReader(fh)]  # fmt: skip


def cpu_model() -> str:
    """The processor's model name, as /proc/cpuinfo gives it ("" where it gives none)."""
    with open("/proc/cpuinfo") as fh:
        return next((line.split(":", 1)[1].strip() for line in fh if "model name" in line), "")


def machine_facts() -> dict[str, object]:
    """What the figures depend on: cores, RAM, CPU model, kernel, Python and torch."""
    import platform

    import torch

    with open("/proc/meminfo") as fh:
        total = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))
    return {"cores": os.cpu_count(), "ram_gb": round(total / GB, 1), "cpu": cpu_model(),
            "kernel": platform.release(), "python": platform.python_version(),
            "torch": torch.__version__}  # fmt: skip


def processors(rows: Sequence[Row]) -> str:
    """A sentence naming each processor the rows were measured on, if more than one."""
    count = collections.Counter(r.processor or "unrecorded" for r in rows)
    if len(count) < 2:
        return ""
    each = ", ".join(f"{n} on {cpu}" for cpu, n in count.most_common())
    return f" The rows were measured on {len(count)} processors ({each}: `memory.csv`, processor)."


def summary_markdown(rows: Sequence[Row], facts: dict[str, object], commands: list[str]) -> str:
    """``summary.md`` of a results folder: the table, how it was measured, on what."""
    order = {t.name: i for i, t in enumerate(all_targets())}
    rows = sorted(rows, key=lambda r: (MODES.index(r.mode), order.get(r.target, len(order))))
    loads = [r.load_at_start for r in rows if math.isfinite(r.load_at_start)] or [math.nan]
    lines = [
        "# Peak memory of the main command and the notebooks",
        "",
        "The peak, sampled twice a second, of the summed proportional set size (PSS: a page",
        "shared by n processes counts 1/n in each) of each command's whole process tree: the",
        "driver or notebook kernel, Dask nannies and workers, simulator processes. GB = 10^9 B.",
        "",
        markdown(rows),
        "",
        f"Machine: {facts['cores']} cores, {facts['ram_gb']} GB RAM, {facts['cpu']}; Linux "
        f"{facts['kernel']}, Python {facts['python']}, torch {facts['torch']}." + processors(rows),
        "",
        f"The 1-minute load average as the targets started: {min(loads):.1f}–{max(loads):.1f}"
        " (`memory.csv`); above the core count the machine was shared with other jobs. PSS"
        " barely depends on that, wall time does: the time budget is judged on an idle machine.",
        "",
        "Measured by:",
        "",
        *[f"    {c}" for c in commands],
        "",
        "Each process's PSS at each target's peak: `breakdown.csv`.",
        "",
    ]
    return "\n".join(lines)


def write_folder(
    out: Path,
    rows: Sequence[Row],
    peaks: dict[tuple[str, str], list[tuple[str, int]]],
    command: str,
) -> None:
    """Merge ``rows`` (and each one's processes at the peak) into the folder ``out``: a target
    and mode measured again replaces its earlier row; ``summary.md`` is written from all."""
    out.mkdir(parents=True, exist_ok=True)
    new = {(r.target, r.mode) for r in rows}
    old = read_rows(out / "memory.csv") if (out / "memory.csv").exists() else []
    merged = [r for r in old if (r.target, r.mode) not in new] + list(rows)
    write_csv(merged, out / "memory.csv")
    breakdown: list[list[str]] = []
    if (out / "breakdown.csv").exists():
        with open(out / "breakdown.csv", newline="") as fh:
            breakdown = [r for r in list(csv.reader(fh))[1:] if (r[0], r[1]) not in new]
    for (target, mode), processes in peaks.items():
        breakdown += [[target, mode, name, f"{pss / GB:.4f}"] for name, pss in processes]
    with open(out / "breakdown.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["target", "mode", "process", "pss_gb"])
        writer.writerows(breakdown)
    commands_file = out / "commands.txt"
    commands = commands_file.read_text().splitlines() if commands_file.exists() else []
    commands = [c for c in commands if c != command] + [command]
    commands_file.write_text("\n".join(commands) + "\n")
    facts = machine_facts()
    (out / "machine.json").write_text(json.dumps(facts, indent=2) + "\n")
    (out / "summary.md").write_text(summary_markdown(merged, facts, commands))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help="reproduce and/or notebooks (default: all)")
    parser.add_argument("--mode", choices=MODES, default="quick")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--csv", help="also write the table as CSV to this file")
    parser.add_argument(
        "--breakdown", action="store_true", help="also print each process's PSS at the peak"
    )
    parser.add_argument("--out", help="merge the rows into this folder (e.g. results/memory)")
    parser.add_argument(
        "--keep", help="copy reproduce's results folder here (e.g. results/reproduce-quick)"
    )
    args = parser.parse_args(argv)
    if not math.isfinite(args.interval) or args.interval <= 0:
        parser.error("--interval must be a positive number of seconds")
    targets = resolve(args.targets) if args.targets else all_targets()

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    where = machine()
    log(f"on {where}")
    rows = []
    peaks: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for target in targets:
        with tempfile.TemporaryDirectory(prefix=f"bench-memory-{target.name}-") as tmp:
            output = Path(tmp) / "output.log"
            log(f"measuring {target.name} ({args.mode}) ...")
            load, at = os.getloadavg()[0], time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            figures = measure(
                target.command(args.mode, Path(tmp)), environment(args.mode), args.interval,
                cwd=target.cwd(), output=output,
            )  # fmt: skip
            row = to_row(target, args.mode, figures | {"processor": cpu_model()}, load, at)
            rows.append(row)
            peaks[(target.name, args.mode)] = figures.get("at_peak", [])
            kept = Path(tmp) / "reproduce"
            if args.keep and target.path is None and row.exit_code == 0 and kept.is_dir():
                shutil.copytree(kept, args.keep, dirs_exist_ok=True)  # the measured run's
                log(f"its results folder copied to {args.keep}")
            if args.breakdown:
                log(f"{target.name} at its peak ({figures['peak_at']:.0f} s in):")
                for name, pss in figures.get("at_peak", []):
                    log(f"    {pss / GB:6.2f} GB  {name}")
            log(markdown([row]).splitlines()[-1])
            if row.exit_code != 0:
                tail = output.read_text(errors="replace").splitlines()[-20:]
                log(f"{target.name} exited with {row.exit_code}; its output ended:")
                log("\n".join("    " + line for line in tail))
    command = " ".join(
        ["python", "benchmarks/bench_memory.py", *(sys.argv[1:] if argv is None else argv)]
    )
    print(f"peak memory of each target's process tree, measured by\n    {command}\non {where}:\n")
    print(markdown(rows))
    for r in rows:
        if r.unreadable:
            print(
                f"\n{r.target}: up to {r.unreadable} process(es) whose PSS could not be read "
                f"({r.unreadable_rss_gb:.2f} GB RSS): not in the sums"
            )
        if r.left_behind:
            print(
                f"\n{r.target}: {r.left_behind} process(es) of its tree still alive after it exited"
            )
    if args.csv:
        write_csv(rows, args.csv)
        print(f"\nwritten to {args.csv}")
    if args.out:
        write_folder(Path(args.out), rows, peaks, command)
        print(f"\nmerged into {args.out}/ (memory.csv, breakdown.csv, summary.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
