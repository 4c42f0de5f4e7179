"""Checkpoints on disk: every worker's model and optimiser, the servers' state and the RNG
states, written atomically (a temporary file, then ``os.replace``) beside a run's metrics.

Workers send their state to the driver with their metric rows (a ``table="checkpoint"``
record); the driver writes ``checkpoint/step{N}/rank{R}.pt`` per worker and, once every living
worker's file of step N is in, ``checkpoint/latest.json``; older steps are then removed. A
crash while writing leaves the previous complete checkpoint in place.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from .. import families
from ..errors import ConfigError, choices

FOLDER = "checkpoint"
_EVERY = re.compile(r"^\s*(\d+)\s*(epochs?)?\s*$")


def parse_every(value: int | str | None) -> tuple[int, str] | None:
    """``checkpoint_every`` as (count, "steps" | "epochs"); None: no checkpoints."""
    if value is None:
        return None
    match = None if isinstance(value, bool) else _EVERY.match(str(value))
    if match is None or int(match.group(1)) <= 0:
        raise ConfigError(
            f"checkpoint_every={value!r} must be a positive number of steps (e.g. 100) or of "
            "epochs (e.g. '1epochs')"
        )
    return int(match.group(1)), "epochs" if match.group(2) else "steps"


@families.register_check
def check_run(cfg: Any) -> None:
    """The config's check of ``checkpoint_every`` (registered: the config asks the records)."""
    check_config(cfg.strategy, cfg.compress, cfg.checkpoint_every)


def check_config(strategy: str, compress: str, value: int | str | None) -> None:
    if parse_every(value) is None:
        return
    # The strategies whose every step ends at a point all workers agree on (no message in
    # flight) are the families' "checkpointable" ones.
    if not families.has(strategy, "checkpointable"):
        able = families.with_capability("checkpointable")
        raise ConfigError(
            f"checkpoint_every does not apply to strategy={strategy!r}: checkpoints need a "
            f"point where no message is in flight; strategies with one: {choices(able)}"
        )
    if compress != "none":
        raise ConfigError("checkpoint_every does not save compression's residuals yet")


def every_steps(value: int | str | None, steps_per_epoch: int) -> int | None:
    """Steps between two checkpoints (per worker), or None."""
    parsed = parse_every(value)
    if parsed is None:
        return None
    count, unit = parsed
    return count * steps_per_epoch if unit == "epochs" else count


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename it into place: a
    reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def is_checkpoint(row: dict[str, Any]) -> bool:
    return row.get("table") == "checkpoint"


class Writer:
    """The driver's side: writes each worker's record, marks a step complete when every
    worker not known to be lost has written it, and keeps only the latest complete step."""

    def __init__(self, folder: str | os.PathLike[str], workers: int) -> None:
        self.root = Path(folder) / FOLDER
        self.workers = workers
        self.written: dict[int, set[int]] = {}
        self.lost: set[int] = set()

    def __call__(self, record: dict[str, Any]) -> None:
        step, rank = int(record["step"]), int(record["rank"])
        atomic_save(record["state"], self.root / f"step{step}" / f"rank{rank}.pt")
        self.written.setdefault(step, set()).add(rank)
        self._complete()

    def lose(self, rank: int) -> None:
        self.lost.add(rank)
        self._complete()

    def _complete(self) -> None:
        done = [s for s, ranks in self.written.items() if len(ranks | self.lost) >= self.workers]
        if not done:
            return
        step = max(done)
        tmp = self.root / f".latest.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"step": step, "ranks": sorted(self.written[step])}))
        os.replace(tmp, self.root / "latest.json")
        for old in [s for s in self.written if s < step]:
            shutil.rmtree(self.root / f"step{old}", ignore_errors=True)
            del self.written[old]


def latest_step(folder: str | os.PathLike[str]) -> int | None:
    path = Path(folder) / FOLDER / "latest.json"
    return json.loads(path.read_text())["step"] if path.exists() else None


def load_rank(folder: str | os.PathLike[str], step: int, rank: int) -> dict[str, Any]:
    """Worker ``rank``'s state in the checkpoint of ``step`` (read where the rank runs)."""
    return torch.load(Path(folder) / FOLDER / f"step{step}" / f"rank{rank}.pt", weights_only=False)


def load_servers(folder: str | os.PathLike[str], step: int) -> list[Any]:
    """The hosted servers' states in the checkpoint of ``step`` (kept by its first rank)."""
    ranks = json.loads((Path(folder) / FOLDER / "latest.json").read_text())["ranks"]
    return load_rank(folder, step, min(ranks)).get("servers", [])


def load(folder: str | os.PathLike[str]) -> tuple[int, list[int]]:
    """The last complete checkpoint in ``folder``: its step and the ranks it holds."""
    step = latest_step(folder)
    if step is None:
        raise ConfigError(
            f"{folder} holds no checkpoint ({Path(folder) / FOLDER / 'latest.json'} is missing):"
            " only runs started with --checkpoint-every (config checkpoint_every) can be resumed"
        )
    return step, json.loads((Path(folder) / FOLDER / "latest.json").read_text())["ranks"]


def kept_rows(out_dir: Path, step: int) -> tuple[list[dict[str, Any]], float]:
    """The rows of ``out_dir``'s table up to checkpoint step ``step`` (a resumed run redoes
    what came after), and the time they end at."""
    frame = pd.read_csv(out_dir / "metrics.csv")
    frame = frame[frame.step <= step]
    return frame.to_dict("records"), float(frame.time.max()) if len(frame) else 0.0


def left_on_disk(out_dir: Path | None) -> str:
    """Where a run that stopped early left its metrics, config and last checkpoint."""
    if out_dir is None or not (out_dir / "metrics.csv").exists():
        return ""  # nothing measured yet (the folder is discarded)
    step = latest_step(out_dir)
    saved = f", the last checkpoint (step {step}) in {out_dir / 'checkpoint'}" if step else ""
    return f"; metrics so far are in {out_dir / 'metrics.csv'}, the config in config.json{saved}"
