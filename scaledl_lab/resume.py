"""Continue a run from the last checkpoint in its results folder (``scaledl-lab resume DIR``).

The run goes on with the config saved beside its metrics (``epochs`` may grow; injected faults
are dropped), from every
worker's model, optimiser and RNG states and the servers' state; its rows are appended to the
folder's table, and the summary and plots are drawn again from the whole table.

Every file it reads is checked before any work starts, and a damaged one is named in a clear
error: ``config.json`` and ``checkpoint/latest.json`` (JSON of the expected shape), each rank's
``checkpoint/step{N}/rank{R}.pt`` (a whole checkpoint of that step, written under the config in
``config.json``), and ``metrics.csv`` (a run's columns, and every rank's train rows up to the
checkpoint's step).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import ExperimentConfig
from .errors import ConfigError
from .experiment import Results, compare, total_steps
from .training import checkpoint

# What a resumed run may change: its length, and the faults that stopped the first one.
_MAY_CHANGE = ("epochs", "faults")


def resume(
    out_dir: str | os.PathLike[str],
    epochs: int | None = None,
    *,
    address: str | None = None,
    client: Any = None,
    progress: bool = True,
    log: Callable[[str], None] | None = print,
) -> Results:
    """Continue the run saved in ``out_dir`` (to ``epochs`` epochs in all, if given)."""
    out = Path(out_dir)
    step, ranks = checkpoint.load(out)  # a clear error when there is none
    path = out / "config.json"
    if not path.exists():
        raise ConfigError(f"{out} has a checkpoint but no config.json: cannot tell what ran")
    saved = _saved_config(path)
    # The resumed run is the recovery: the faults that stopped the first one are not injected.
    cfg = ExperimentConfig.from_dict(saved).replace(faults=None)
    if epochs is not None:
        cfg = cfg.replace(epochs=epochs)
    if step >= total_steps(cfg):
        raise ConfigError(
            f"the checkpoint in {out} is at step {step}, the end of a run of {cfg.epochs} "
            "epoch(s): pass more epochs (--epochs E) to go on"
        )
    missing = sorted(set(range(cfg.workers)) - set(ranks))
    if missing:
        raise ConfigError(
            f"the checkpoint in {out} has no state for rank(s) {missing} (lost workers): a run "
            "resumes with all its workers"
        )
    for rank in ranks:
        _check_rank(out, step, rank, saved)
    metrics = out / "metrics.csv"
    checkpoint.check_rows(metrics, checkpoint.metrics_table(metrics), step, ranks)
    if log is not None:
        log(f"resuming {cfg.label} from step {step} of {total_steps(cfg)}")
    return compare([cfg], address=address, client=client, out=out, progress=progress,
                   log=log, resume=step)  # fmt: skip


def _saved_config(path: Path) -> dict[str, Any]:
    """The run's config in ``config.json``, checked to be one."""
    saved = checkpoint.read_json(path)
    runs = saved.get("runs") if isinstance(saved, dict) else None
    if not isinstance(runs, list) or len(runs) != 1 or not isinstance(runs[0], dict):
        raise ConfigError(f"{path} holds no run's config (a list 'runs' of one): it is damaged")
    try:
        ExperimentConfig.from_dict(runs[0])
    except (ConfigError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path} holds a config that does not load: {exc}") from exc
    return runs[0]


def _check_rank(out: Path, step: int, rank: int, saved: dict[str, Any]) -> None:
    """Rank ``rank``'s file of the checkpoint of ``step`` loads, is that step's, and was
    written under the config in ``config.json`` (``saved``) but for what a resume changes."""
    path = checkpoint.rank_path(out, step, rank)
    try:
        state = checkpoint.load_rank(out, step, rank)
    except FileNotFoundError as exc:
        raise ConfigError(f"{path} is missing: the checkpoint of step {step} is not whole") from exc
    except Exception as exc:  # torch's zip reader, pickle: whatever a damaged file raises
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"{path} does not load ({first}): the file is damaged") from exc
    keys = ("step", "model", "rng", "clock", "config")
    if not isinstance(state, dict) or any(k not in state for k in keys):
        raise ConfigError(
            f"{path} is not a checkpoint of this version of scaledl_lab (it lacks "
            f"{[k for k in keys if not isinstance(state, dict) or k not in state]})"
        )
    if state["step"] != step:
        raise ConfigError(f"{path} holds step {state['step']}, not {step}: the file is misplaced")
    theirs = state["config"]
    differ = sorted(  # compared as JSON: a NaN equals itself there
        k for k in set(theirs) | set(saved)
        if k not in _MAY_CHANGE and json.dumps(theirs.get(k)) != json.dumps(saved.get(k))
    )  # fmt: skip
    if differ:
        shown = ", ".join(f"{k}={theirs.get(k)!r} there, {saved.get(k)!r} in config.json"
                          for k in differ[:3])  # fmt: skip
        more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
        described = out / "config.json"
        raise ConfigError(f"{path} was written by another run than {described} describes: "
                          f"{shown}{more}")  # fmt: skip
