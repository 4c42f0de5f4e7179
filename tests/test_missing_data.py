"""Without Fashion-MNIST the test session stops at once, with one message saying how to get it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_missing_fashion_mnist_stops_the_session_with_one_message(tmp_path):
    env = {
        **os.environ,
        "SCALEDL_DATA_NO_DEFAULTS": "1",  # search only $SCALEDL_DATA_DIR: an empty folder
        "SCALEDL_DATA_DIR": str(tmp_path),
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert output.count("fashion-mnist not found") == 1, output
    assert output.count("scaledl-lab data fetch fashion-mnist") == 1
    assert output.count("sudo apt-get install dataset-fashion-mnist") == 1
    assert f"  - {tmp_path}\n" in output  # where it looked
    assert "collected" not in output and "passed" not in output  # nothing ran
