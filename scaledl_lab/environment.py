"""Package versions and machine facts, saved beside every result."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any


def environment_info() -> dict[str, Any]:
    """Package versions and machine facts saved beside every result."""
    versions = {}
    for pkg in ("scaledl_lab", "torch", "dask", "distributed", "numpy", "pandas", "mnist1d"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                cwd=Path(__file__).parent,
                timeout=5,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    import torch

    return {
        "versions": versions,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        # the vectorised kernels torch runs here (AVX512, AVX2, DEFAULT, ...): another set rounds
        # differently, and an asynchronous run can then take another path (README, "The same
        # run on another processor")
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cuda_devices": torch.cuda.device_count(),
        "git_commit": commit,
    }
