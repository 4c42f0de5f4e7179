"""benchmarks/bench_memory.py's sampler: a process tree's summed PSS, grandchildren included.

Runs tiny Python commands only (a few seconds); the script's targets are run by hand.
"""

from __future__ import annotations

import os
import sys

import pytest
from common import benchmark_module

MB = 10**6

# Holds argv[1] MB (every page written, so every page is resident and private), then runs
# itself on the rest of argv, holding its block until that child ends; the last one sleeps.
HOLD = """\
import subprocess, sys, time
block = bytearray(int(sys.argv[1]) * 10**6)
for i in range(0, len(block), 4096):
    block[i] = 1
if sys.argv[2:]:
    subprocess.run([sys.executable, __file__, *sys.argv[2:]], check=True)
else:
    time.sleep(1.5)
"""


@pytest.fixture(scope="module")
def bench():
    with benchmark_module("bench_memory") as module:
        yield module


def test_summed_pss_counts_the_child_and_the_grandchild(bench, tmp_path):
    hold = tmp_path / "hold.py"
    hold.write_text(HOLD)

    def tree(child_mb: int, grandchild_mb: int) -> dict:
        # A root holding nothing, its child, its grandchild: three interpreters.
        cmd = [sys.executable, str(hold), "0", str(child_mb), str(grandchild_mb)]
        return bench.measure(cmd, dict(os.environ), 0.1)

    baseline, loaded = tree(0, 0), tree(200, 100)
    assert baseline["exit_code"] == loaded["exit_code"] == 0
    assert baseline["processes_at_peak"] == loaded["processes_at_peak"] == 3

    # The same three interpreters with and without the blocks: the peaks differ by the blocks'
    # 300 MB, which are private written pages, so their PSS is their size (to a page). What else
    # can differ between the two runs is the interpreters' share of shared pages (libpython,
    # libc), which moves when other processes on the machine map the same files; that share is
    # at most the shared part of their RSS, so the baseline's whole summed RSS (about 45 MB) bounds
    # it. The bound is below the grandchild's 100 MB: a tree without it fails.
    tolerance = baseline["peak_rss"]
    assert tolerance < 100 * MB
    assert abs(loaded["peak_pss"] - baseline["peak_pss"] - 300 * MB) <= tolerance
    assert loaded["peak_pss"] >= 300 * MB  # the blocks alone, whatever the interpreters share

    # RSS counts shared pages in full, PSS in shares; the largest process is the child alone
    # (its 200 MB and one interpreter), which is what /usr/bin/time -v would report.
    assert loaded["peak_rss"] >= loaded["peak_pss"]
    assert 200 * MB <= loaded["largest_process"] < 200 * MB + tolerance
    # wait4's figure has the child's block too (and this large pytest process's image from
    # before the exec, so it is not compared with the sampled figure here).
    assert loaded["rusage_maxrss"] >= 200 * MB
    assert loaded["unreadable"] == 0 and loaded["left_behind"] == 0
    # the tree sleeps 1.5 s; sampled every 0.1 s, within the run it measured
    assert loaded["wall"] >= 1.5 and loaded["samples"] >= 10
    assert loaded["samples"] == len(loaded["timeline"])
    assert all(0 <= t <= loaded["wall"] for t, _, _ in loaded["timeline"])


def test_cpu_seconds_count_the_grandchild_the_command_waited_for(bench):
    # The child sleeps; its child spins for 1 s of CPU: the CPU seconds are the grandchild's.
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0:\n    pass"
    child = "import subprocess, sys, time; time.sleep(0.3); "
    child += f"subprocess.run([sys.executable, '-c', {spin!r}])"
    figures = bench.measure([sys.executable, "-c", child], dict(os.environ), 0.1)
    assert figures["exit_code"] == 0
    # At least the grandchild's 1 s spin (below it when the grandchild is not counted), and
    # under 0.5 s more: the two interpreters' start-up (above it when the spin counts twice).
    assert 1.0 <= figures["cpu"] < 1.5
    assert figures["wall"] >= 1.3


def test_a_failing_command_keeps_its_exit_code(bench):
    figures = bench.measure([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), 0.1)
    assert figures["exit_code"] == 3
    assert figures["samples"] >= 1 and figures["samples"] == len(figures["timeline"])


def test_budgets_are_judged_in_quick_mode_only(bench):
    assert bench.budget_verdict("reproduce", "quick", 2.9, 290, 0) == "≤ 3 GB, ≤ 300 s: met"
    assert bench.budget_verdict("reproduce", "quick", 2.9, 301, 0) == "≤ 3 GB, ≤ 300 s: not met"
    assert bench.budget_verdict("notebook", "quick", 2.01, 10, 0) == "≤ 2 GB: not met"
    assert bench.budget_verdict("notebook", "quick", 1.0, 10, 1).endswith("not judged (failed)")
    assert bench.budget_verdict("notebook", "full", 9.0, 10, 0) == "—"


def test_targets_resolve_by_number_stem_or_path(bench):
    by_number, by_path = bench.resolve(["07"]), bench.resolve(["notebooks/07_large_batch.ipynb"])
    assert by_number == by_path and by_number[0].name == "07_large_batch"
    assert [t.name for t in bench.resolve(["reproduce"])] == ["reproduce"]
    assert {t.name for t in bench.all_targets()} >= {"reproduce", "07_large_batch"}
    with pytest.raises(SystemExit):
        bench.resolve(["99"])


def test_a_results_folder_merges_targets_and_replaces_one_measured_again(bench, tmp_path):
    def row(target: str, pss: float, load: float) -> object:
        return bench.Row(target, "quick", pss, pss + 0.1, pss / 2, 3, 12.0, 0, "—", 0, 0.0, 0,
                         load, "2026-01-01T00:00:00Z", 2 * pss)  # fmt: skip

    first = [row("reproduce", 2.5, 3.0), row("07_large_batch", 0.8, 3.5)]
    bench.write_folder(tmp_path, first, {("reproduce", "quick"): [("python", 10**9)]}, "cmd a")
    again = [row("07_large_batch", 0.7, 1.0)]
    bench.write_folder(tmp_path, again, {("07_large_batch", "quick"): [("kernel", 7 * 10**8)]},
                       "cmd b")  # fmt: skip
    rows = {r.target: r for r in bench.read_rows(tmp_path / "memory.csv")}
    assert rows == {"reproduce": first[0], "07_large_batch": again[0]}  # read back exactly
    breakdown = (tmp_path / "breakdown.csv").read_text().splitlines()
    assert breakdown[1:] == ["reproduce,quick,python,1.0000", "07_large_batch,quick,kernel,0.7000"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| reproduce | quick | 2.50 |" in summary
    assert "| 07_large_batch | quick | 0.70 |" in summary
    assert "1.0–3.0" in summary and "    cmd a\n    cmd b\n" in summary
    assert (tmp_path / "machine.json").exists()


def test_each_row_names_its_processor_and_older_files_read_without_the_column(bench, tmp_path):
    def row(target: str, processor: str) -> object:
        return bench.Row(target, "quick", 1.0, 1.1, 0.5, 3, 12.0, 0, "—", 0, 0.0, 0, 1.0,
                         "2026-01-01T00:00:00Z", 20.0, processor)  # fmt: skip

    rows = [row("reproduce", "AMD EPYC"), row("07_large_batch", "Intel(R) Xeon(R) Processor")]
    bench.write_csv(rows, tmp_path / "memory.csv")
    assert bench.read_rows(tmp_path / "memory.csv") == rows
    older = tmp_path / "older.csv"  # written before the processor column existed
    lines = (tmp_path / "memory.csv").read_text().splitlines()
    older.write_text("\n".join(line.rsplit(",", 1)[0] for line in lines) + "\n")
    assert [r.processor for r in bench.read_rows(older)] == ["", ""]
    assert bench.processors(rows[:1]) == ""  # one processor: the Machine line says which
    assert bench.processors(rows) == (
        " The rows were measured on 2 processors (1 on AMD EPYC, 1 on Intel(R) Xeon(R)"
        " Processor: `memory.csv`, processor)."
    )
    assert bench.cpu_model() == bench.machine_facts()["cpu"]
