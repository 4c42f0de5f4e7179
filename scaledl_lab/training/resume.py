"""Continue a run from the last checkpoint in its results folder (``scaledl-lab resume DIR``).

The run goes on with the config saved beside its metrics (``epochs`` may grow; injected faults
are dropped), from every
worker's model, optimiser and RNG states and the servers' state; its rows are appended to the
folder's table, and the summary and plots are drawn again from the whole table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import ExperimentConfig
from ..errors import ConfigError
from ..experiment import Results, compare, total_steps
from . import checkpoint


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
    runs = json.loads(path.read_text())["runs"]
    # The resumed run is the recovery: the faults that stopped the first one are not injected.
    cfg = ExperimentConfig.from_dict(runs[0]).replace(faults=None)
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
    if log is not None:
        log(f"resuming {cfg.label} from step {step} of {total_steps(cfg)}")
    return compare([cfg], address=address, client=client, out=out, progress=progress,
                   log=log, resume=step)  # fmt: skip
