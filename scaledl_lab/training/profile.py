"""One training step of a real rank recorded with ``torch.profiler`` (``--profile-step K``).

The profiler runs from the moment the rank draws step K's batch to the moment it logs step K's
row: forward, backward with the gradient hooks that start the allreduces (their transfers show
on the communication backend's own threads), waiting for them, the optimiser step. It records
CPU operators only (and the CUDA kernels on a GPU), with no stacks or shapes, so the trace of a
small model's step stays a few hundred kilobytes; the rank sends it back to the driver as the
Chrome trace JSON text (``export_chrome_trace``), under its result's ``"trace"``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from ..config import ExperimentConfig
from ..errors import ConfigError


class StepProfiler:
    """Profiles step ``step`` (1-based, as the metrics' ``step``) of one rank into ``result``."""

    def __init__(self, step: int, result: dict[str, Any], device: torch.device) -> None:
        self.step, self.result = step, result
        self.activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            self.activities.append(ProfilerActivity.CUDA)
        self._profile: profile | None = None

    def drawn(self, step: int) -> None:
        """The rank draws the batch of ``step``: step K's starts the profiler."""
        if step == self.step and self._profile is None and "trace" not in self.result:
            self._profile = profile(activities=self.activities)
            with _kineto_quiet():
                self._profile.__enter__()

    def logged(self, step: int) -> None:
        """The rank logged the row of ``step``: step K's ends the recording."""
        if step != self.step or self._profile is None:
            return
        recorded, self._profile = self._profile, None
        with _kineto_quiet():
            recorded.__exit__(None, None, None)
        handle, path = tempfile.mkstemp(suffix=".json", prefix="scaledl-trace-")
        os.close(handle)
        try:
            recorded.export_chrome_trace(path)
            with open(path, encoding="utf-8") as f:
                self.result["trace"] = f.read()
        finally:
            os.unlink(path)


@contextlib.contextmanager
def _kineto_quiet() -> Iterator[None]:
    """Drop what the profiler's C++ side (Kineto) writes to this process's stderr while it
    starts and stops: banners ("profiler_start") and, on a Dask task's thread, a warning that
    it was not initialised on that thread, which a notebook would show as the workers'
    output. Python's own errors are raised, not written, so nothing of ours is lost."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_profile_step(cfg: ExperimentConfig, steps: int) -> None:
    """Refuse, before the run starts, a ``profile_step`` past the run's ``steps`` steps."""
    if cfg.profile_step is not None and cfg.profile_step > steps:
        raise ConfigError(
            f"profile_step={cfg.profile_step} is outside the run: {cfg.label} takes {steps} "
            f"training step(s) per worker; choose a step from 1 to {steps}"
        )
