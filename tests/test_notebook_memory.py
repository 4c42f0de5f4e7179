"""benchmarks/notebook_memory.py: a notebook's cells run in one process, and what its variables
hold."""

from __future__ import annotations

import subprocess
import sys

import nbformat
import pytest
from common import BENCHMARKS, benchmark_module


@pytest.fixture(autouse=True)
def _restored(monkeypatch, tmp_path):
    """The script sets quick mode and moves to the notebook's folder, as a kernel starts: both
    undone after each test."""
    monkeypatch.setenv("SCALEDL_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.chdir(tmp_path)


def _notebook(path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a lab")]
    nb.cells += [nbformat.v4.new_code_cell(s) for s in sources]
    nbformat.write(nb, path)


def test_a_variable_that_keeps_memory_is_listed_with_what_it_frees(tmp_path):
    path = tmp_path / "lab.ipynb"
    _notebook(path, "%matplotlib inline\nimport torch", "big = torch.ones(50_000_000)  # 200 MB",
              "small = [1, 2, 3]\nprint('not shown')")  # fmt: skip
    with benchmark_module("notebook_memory") as bench:
        assert [i for i, _ in bench.code_cells(path)] == [1, 2, 3]
    # In a process of its own, as a user runs it: this one's allocator keeps what earlier tests
    # freed (and their malloc settings), so 200 MB more need not raise its resident set.
    script = [sys.executable, str(BENCHMARKS / "notebook_memory.py"), str(path), "--top", "1"]
    done = subprocess.run(script, capture_output=True, text=True, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "not shown" not in out  # the cells' own output is discarded
    rows = [line.split() for line in out.splitlines()]
    cells = [r for r in rows if len(r) == 4 and r[0].isdigit()]
    assert [r[0] for r in cells] == ["1", "2", "3"]
    assert float(cells[1][2]) - float(cells[0][2]) == pytest.approx(0.2, abs=0.02)  # RSS, GB
    (listed,) = [r for r in rows if r[:1] == ["big"]]
    assert listed[1] == "Tensor" and float(listed[2]) == pytest.approx(0.2, abs=0.02)


def test_until_stops_after_that_cell(tmp_path, capsys):
    path = tmp_path / "lab.ipynb"
    _notebook(path, "x = 1", "raise SystemExit('cell 2 ran')")
    with benchmark_module("notebook_memory") as bench:
        assert bench.main([str(path), "--until", "1"]) == 0
    assert "\n    1 " in capsys.readouterr().out
