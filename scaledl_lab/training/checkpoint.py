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
from ..metrics import METRIC_COLUMNS

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

    def __init__(self, folder: str | os.PathLike[str], workers: int, offset: float = 0.0) -> None:
        self.root = Path(folder) / FOLDER
        self.workers = workers
        self.offset = offset  # what the driver adds to the ranks' times in the table
        self.written: dict[int, set[int]] = {}
        self.closing: dict[int, dict[str, dict[str, Any]]] = {}
        self.lost: set[int] = set()

    def __call__(self, record: dict[str, Any]) -> None:
        step, rank = int(record["step"]), int(record["rank"])
        atomic_save(record["state"], self.root / f"step{step}" / f"rank{rank}.pt")
        self.written.setdefault(step, set()).add(rank)
        closing = record["state"].get("closing")
        if closing:  # as the table holds it: its time as the rows' are
            if closing["time"] is not None:
                closing = {**closing, "time": closing["time"] + self.offset}
            self.closing.setdefault(step, {})[str(rank)] = closing
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
        latest = {"step": step, "ranks": sorted(self.written[step])}
        if step in self.closing:
            latest["closing"] = self.closing[step]
        tmp.write_text(json.dumps(latest))
        os.replace(tmp, self.root / "latest.json")
        for old in [s for s in self.written if s < step]:
            shutil.rmtree(self.root / f"step{old}", ignore_errors=True)
            del self.written[old]
            self.closing.pop(old, None)


def read_json(path: Path) -> Any:
    """The JSON in ``path``; a damaged file is a clear error that names it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc}): the file is damaged") from exc


def latest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """``checkpoint/latest.json`` of ``folder`` (checked), or None when there is none."""
    path = Path(folder) / FOLDER / "latest.json"
    if not path.exists():
        return None
    saved = read_json(path)
    step = saved.get("step") if isinstance(saved, dict) else None
    ranks = saved.get("ranks") if isinstance(saved, dict) else None
    if (
        not isinstance(step, int)
        or step < 1
        or not isinstance(ranks, list)
        or not all(isinstance(r, int) for r in ranks)
    ):
        raise ConfigError(f"{path} does not name a checkpoint's step and ranks: it is damaged")
    return saved


def latest_step(folder: str | os.PathLike[str]) -> int | None:
    saved = latest(folder)
    return None if saved is None else saved["step"]


def rank_path(folder: str | os.PathLike[str], step: int, rank: int) -> Path:
    return Path(folder) / FOLDER / f"step{step}" / f"rank{rank}.pt"


def load_rank(folder: str | os.PathLike[str], step: int, rank: int) -> dict[str, Any]:
    """Worker ``rank``'s state in the checkpoint of ``step`` (read where the rank runs)."""
    return torch.load(rank_path(folder, step, rank), weights_only=False)


def load_servers(folder: str | os.PathLike[str], step: int) -> list[Any]:
    """The hosted servers' states in the checkpoint of ``step`` (kept by its first rank)."""
    ranks = read_json(Path(folder) / FOLDER / "latest.json")["ranks"]
    return load_rank(folder, step, min(ranks)).get("servers", [])


def load(folder: str | os.PathLike[str]) -> tuple[int, list[int]]:
    """The last complete checkpoint in ``folder``: its step and the ranks it holds."""
    saved = latest(folder)
    if saved is None:
        raise ConfigError(
            f"{folder} holds no checkpoint ({Path(folder) / FOLDER / 'latest.json'} is missing):"
            " only runs started with --checkpoint-every (config checkpoint_every) can be resumed"
        )
    return saved["step"], saved["ranks"]


def kept_rows(out_dir: Path, step: int) -> tuple[list[dict[str, Any]], float]:
    """The rows of ``out_dir``'s table up to checkpoint step ``step`` (a resumed run redoes
    what came after), and the time they end at.

    A run's closing work after its checkpointed state (DiLoCo's closing round, which only
    yields the run's one model) is taken out of them, as a longer run does not do it: each
    rank's train row of ``step`` takes the time and bytes the checkpoint's ``closing`` record
    gives (from before that work), and the evaluations of ``step`` go (the resumed run scores
    again what a longer run scores there)."""
    frame = metrics_table(out_dir / "metrics.csv")
    frame = frame[frame.step <= step]
    closing = (latest(out_dir) or {}).get("closing", {})
    if closing:
        frame = frame[~((frame.step == step) & frame.kind.isin(("val", "test")))].copy()
        for rank, before in closing.items():
            row = (frame.kind == "train") & (frame.step == step) & (frame["rank"] == int(rank))
            for column in ("time", "bytes_sent"):  # None: the closing work left the row alone
                if before[column] is not None:
                    frame.loc[row, column] = before[column]
    return frame.to_dict("records"), float(frame.time.max()) if len(frame) else 0.0


def metrics_table(path: Path) -> pd.DataFrame:
    """A results folder's ``metrics.csv``, checked to be whole: this version's columns, every
    row complete (a clear error naming the file otherwise)."""
    try:
        raw = path.read_bytes()
        frame = pd.read_csv(path)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path} is missing: the run's metrics are needed to resume") from exc
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path} is not a metrics table ({first}): the file is damaged") from exc
    columns = list(frame.columns)
    if columns != list(METRIC_COLUMNS):
        missing = [c for c in METRIC_COLUMNS if c not in columns]
        other = [c for c in columns if c not in METRIC_COLUMNS]
        raise ConfigError(
            f"{path} has other columns than a run writes (missing: {missing or 'none'}; "
            f"unknown: {other or 'none'}): it is not this run's metrics table"
        )
    if raw and not raw.endswith(b"\n"):
        raise ConfigError(f"{path} ends in the middle of a row: the file is truncated")
    for column in ("rank", "step", "time"):
        values = pd.to_numeric(frame[column], errors="coerce")
        if values.isna().any():
            line = int(values.isna().to_numpy().nonzero()[0][0]) + 2  # the header is line 1
            raise ConfigError(f"{path} line {line} has no number in column {column!r}: damaged")
        frame[column] = values
    return frame


def check_rows(path: Path, frame: pd.DataFrame, step: int, ranks: list[int]) -> None:
    """Every rank of the checkpoint has its train rows 1 to ``step`` in ``frame`` (the table
    in ``path``), once each: nothing the checkpointed run measured is missing."""
    train = frame[frame.kind == "train"]
    for rank in ranks:
        steps = sorted(train[(train["rank"] == rank) & (train.step <= step)].step.astype(int))
        if steps != list(range(1, step + 1)):
            have = f"{len(steps)} train rows up to step {steps[-1]}" if steps else "no train row"
            raise ConfigError(
                f"{path} has {have} for rank {rank}, but the checkpoint is at step {step} "
                f"(rows 1 to {step} expected once each): the table is truncated or damaged"
            )


def left_on_disk(out_dir: Path | None) -> str:
    """Where a run that stopped early left its metrics, config and last checkpoint."""
    if out_dir is None or not (out_dir / "metrics.csv").exists():
        return ""  # nothing measured yet (the folder is discarded)
    try:
        step = latest_step(out_dir)
    except ConfigError:  # a damaged latest.json: the run's own error comes first
        step = None
    saved = f", the last checkpoint (step {step}) in {out_dir / 'checkpoint'}" if step else ""
    return f"; metrics so far are in {out_dir / 'metrics.csv'}, the config in config.json{saved}"
