"""The code stays formatted and lint-clean (ruff check + ruff format), as CI checks it; the
notebooks' code cells lint-clean too (hand-laid-out for reading, so not reformatted)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["scaledl_lab", "tests", "benchmarks"]


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the test extras")
@pytest.mark.parametrize("command", [["check"], ["format", "--check"]])
def test_ruff(command):
    result = subprocess.run(["ruff", *command, *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.skipif(shutil.which("ruff") is None, reason="ruff is in the test extras")
def test_ruff_check_notebooks():
    result = subprocess.run(
        ["ruff", "check", "notebooks"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
