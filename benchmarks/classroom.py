"""Classroom sizing from the measured table: what a class of S students needs of a shared server.

Reads ``results/memory/memory.csv`` (written by ``benchmarks/bench_memory.py --out
results/memory``) and prints, for each lab, what one student's run measured — the peak summed
PSS of its process tree, its wall time and the CPU seconds its processes used, in quick mode, and
the peak PSS and wall time in full mode where measured — and what a class needs when every
student runs the same lab at once:

- **memory**: S × the lab's peak PSS. An upper bound: the students' kernels also share the
  library pages (torch's, Python's) that each tree's PSS counts whole among its own processes.
- **time on N cores**: max(one run's wall time, S × its CPU seconds / N). The labs are
  CPU-bound; when S × CPU seconds exceed what N cores supply in one run's time, the class waits
  for the cores. A lower bound: it leaves out the cost of switching between more processes than
  cores.

    python benchmarks/classroom.py [--students 40] [--cores 32 64] [--table FILE]

The course plan (``notebooks/README.md``, "Classroom sizing") prints this output for 40 students
on 32 and 64 cores; ``tests/test_memory_figures.py`` checks it against the table.
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "results" / "memory" / "memory.csv"


def read(path: str | Path = TABLE) -> dict[tuple[str, str], dict[str, float]]:
    """(target, mode) → its measured figures (GB, seconds); NaN where a column is missing."""
    keys = ("peak_pss_gb", "wall_s", "cpu_s", "load_at_start")
    with open(path, newline="") as fh:
        return {
            (r["target"], r["mode"]): {k: float(r.get(k) or math.nan) for k in keys}
            for r in csv.DictReader(fh)
            if r["exit_code"] == "0"
        }


def _minutes(seconds: float) -> str:
    return "—" if not math.isfinite(seconds) else f"{seconds / 60:.1f}"


def _gb(value: float) -> str:
    return "—" if not math.isfinite(value) else f"{value:.2f}"


def class_time(wall_s: float, cpu_s: float, students: int, cores: int) -> float:
    """Seconds until every one of ``students`` simultaneous runs is done on ``cores`` cores
    (NaN when either figure was not measured)."""
    if not (math.isfinite(wall_s) and math.isfinite(cpu_s)):
        return math.nan
    return max(wall_s, students * cpu_s / cores)


def sizing_table(
    measured: dict[tuple[str, str], dict[str, float]], students: int, cores: Sequence[int]
) -> str:
    """The markdown table: one row per lab measured in quick mode."""
    labs = sorted(t for t, m in measured if m == "quick" and t != "reproduce")
    head = ["lab", "quick: peak PSS GB", "quick: wall min", "quick: CPU min",
            "full: peak PSS GB", "full: wall min", f"{students} students: GB"]  # fmt: skip
    head += [f"{students} students on {n} cores: min" for n in cores]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for lab in labs:
        quick = measured[lab, "quick"]
        full = measured.get((lab, "full"), dict(peak_pss_gb=math.nan, wall_s=math.nan))
        cells = [lab[:2], _gb(quick["peak_pss_gb"]), _minutes(quick["wall_s"]),
                 _minutes(quick["cpu_s"]), _gb(full["peak_pss_gb"]), _minutes(full["wall_s"]),
                 f"{students * quick['peak_pss_gb']:.0f}"]  # fmt: skip
        cells += [_minutes(class_time(quick["wall_s"], quick["cpu_s"], students, n)) for n in cores]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--students", type=int, default=40)
    parser.add_argument("--cores", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--table", default=str(TABLE))
    args = parser.parse_args()
    print(sizing_table(read(args.table), args.students, args.cores))


if __name__ == "__main__":
    main()
