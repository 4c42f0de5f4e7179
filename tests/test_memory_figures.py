"""The memory figures the README and the course plan quote are those of the committed table,
``results/memory/memory.csv`` (written by ``benchmarks/bench_memory.py --out results/memory``)."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

from common import benchmark_module

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "results" / "memory" / "memory.csv"


def _measured() -> dict[tuple[str, str], dict[str, str]]:
    with TABLE.open(newline="") as fh:
        return {(r["target"], r["mode"]): r for r in csv.DictReader(fh)}


def _gb(value: str) -> str:
    return f"{float(value):.2f} GB"


def _readme_rows() -> list[list[str]]:
    """The cells of the README's memory table (the first table of its Memory section)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Memory\n") :]
    section = section[: section.index("\n## ", 1)]
    lines = [line for line in section.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[1:]]


def _target(what: str) -> tuple[str, str]:
    """``scaledl-lab reproduce --quick`` or ``notebook 02 (quick)`` → (target, mode)."""
    if what.startswith("`scaledl-lab reproduce"):
        return "reproduce", "quick" if "--quick" in what else "full"
    number, mode = re.fullmatch(r"notebook (\d\d) \((quick|full)\)", what).groups()
    names = {target for target, _ in _measured()}
    return next(n for n in names if n.startswith(number + "_")), mode


def test_the_readme_memory_table_quotes_the_committed_table():
    measured = _measured()
    rows = _readme_rows()
    assert len(rows) >= 9  # reproduce and the eight notebooks in quick mode at least
    for what, pss, largest, wall, budget in rows:
        row = measured[_target(what)]
        assert (pss, largest) == (_gb(row["peak_pss_gb"]), _gb(row["largest_process_gb"])), what
        # the wall time, idle or the load it ran under, and on which processor
        load = float(row["load_at_start"])
        where = "idle" if load < 1 else f"load {load:.0f}"
        cpu = " ".join(row["processor"].replace("(R)", "").split()[:2])  # "Intel Xeon"
        assert wall == f"{float(row['wall_s']):.0f} s ({where}, {cpu})", what
        failed = f"failed (exit {row['exit_code']})"
        assert budget == (row["budget"] if row["exit_code"] == "0" else failed), what
    quick = {key for key in measured if key[1] == "quick"}
    assert quick <= {_target(r[0]) for r in rows}  # every quick measurement is in the README


def test_the_course_plan_quotes_the_notebooks_range():
    quick = {t: r for (t, m), r in _measured().items() if m == "quick" and t != "reproduce"}
    notebooks = {t: float(r["peak_pss_gb"]) for t, r in quick.items()}
    low, high = min(notebooks, key=notebooks.get), max(notebooks, key=notebooks.get)
    plan = " ".join((ROOT / "notebooks" / "README.md").read_text().split())
    quoted = f"{notebooks[low]:.2f} GB (lab {low[:2]}) to {notebooks[high]:.2f} GB (lab {high[:2]})"
    assert quoted in plan


def test_the_course_plans_classroom_sizing_is_the_scripts_output_for_the_committed_table():
    with benchmark_module("classroom") as classroom:
        table = classroom.sizing_table(classroom.read(TABLE), students=40, cores=[32, 64])
    assert table in (ROOT / "notebooks" / "README.md").read_text()


def test_class_time_is_the_wall_time_until_the_cores_are_the_limit():
    with benchmark_module("classroom") as classroom:
        assert classroom.class_time(60.0, 90.0, students=40, cores=32) == 40 * 90.0 / 32
        assert classroom.class_time(600.0, 90.0, students=40, cores=64) == 600.0
        assert math.isnan(classroom.class_time(60.0, math.nan, students=40, cores=32))
