"""Results folders, never overwritten or mixed: a run writes into a partial folder beside its
``out`` and moves it into place only when it ends; a run that fails leaves it there, named so.

An existing non-empty ``out`` is refused before any work unless the caller says ``overwrite``
(a command's default folder is not refused: the run takes the next free ``<out>-N`` and says so);
then the old folder is replaced at the moment the new run has ended, not before. A failed or
interrupted run leaves the old folder whole and its own rows, config and checkpoints beside it
in ``<out>.partial-<time>``, which ``resume`` continues in place.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import ConfigError
from .metrics import METRIC_COLUMNS

PARTIAL = ".partial-"


def check_out(out: Path, *, overwrite: bool = False) -> None:
    """A ConfigError, before any work, unless a run may write ``out`` (now or at its end)."""
    try:
        if out.exists():
            if not out.is_dir():
                raise ConfigError(f"--out {out} is a file, not a folder: choose another --out")
            if not any(out.iterdir()):
                return
            if not overwrite:
                raise ConfigError(
                    f"results folder {out} exists and is not empty: pass --overwrite (Python: "
                    "overwrite=True) to replace it when the new run ends, or choose another --out"
                )
            if not (out / "config.json").is_file():  # e.g. `--out .` in a checkout
                raise ConfigError(
                    f"{out} holds no config.json, so it is not a results folder: --overwrite "
                    "replaces only those; choose another --out"
                )
            return
        above = next(p for p in out.absolute().parents if p.exists())
    except OSError as exc:  # e.g. a folder this user may not list
        raise ConfigError(f"cannot use results folder {out}: {exc.strerror}") from None
    if not above.is_dir():
        raise ConfigError(f"--out {out} cannot be created: {above} is a file, not a folder")


def free_default(out: Path, *, overwrite: bool = False) -> tuple[Path, str | None]:
    """A command's default folder (no ``--out``), never refused nor overwritten unasked: ``out``
    itself if it is free, empty or ``overwrite`` is given, else the first free ``out-2``,
    ``out-3``, ... and a line that says which folder the run writes instead."""
    if overwrite or not out.is_dir() or not any(out.iterdir()):
        return out, None
    for n in range(2, 10_000):
        other = out.with_name(f"{out.name}-{n}")
        if not other.exists() or (other.is_dir() and not any(other.iterdir())):
            return other, (
                f"{out} holds an earlier run: this one writes {other} "
                f"(--overwrite replaces {out}; --out chooses the folder)"
            )
    raise ConfigError(f"{out}-2 to {out}-9999 are all taken: choose the folder with --out")


def start(out: Path, *, overwrite: bool = False) -> Path:
    """Check ``out`` and create the partial folder a run writes into instead (its name says
    when the run started); a ConfigError naming the folder when it cannot be created."""
    check_out(out, overwrite=overwrite)
    out = _named(out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        partial = out.with_name(f"{out.name}{PARTIAL}{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            partial.mkdir(parents=True)
            return partial
        except FileExistsError:
            continue
        except OSError as exc:
            raise ConfigError(
                f"cannot write results folder {out}: {exc.strerror} ({exc.filename})"
            ) from None
    raise ConfigError(f"cannot write results folder {out}: too many partial folders beside it")


def _named(out: Path) -> Path:
    """``out`` with a name of its own (``.`` and ``..`` made absolute): the partial folder is
    named after it."""
    return Path(os.path.abspath(out)) if out.name in ("", ".", "..") else out


def finish(partial: Path, out: Path) -> None:
    """The run has ended: its folder takes ``out``'s place (an old ``out`` goes only now)."""
    out = _named(out)
    if not out.exists():
        os.rename(partial, out)
        return
    old = partial.with_name(partial.name.replace(PARTIAL, ".replaced-", 1))
    os.rename(out, old)
    os.rename(partial, out)
    shutil.rmtree(old, ignore_errors=True)


def discard_if_empty(partial: Path) -> bool:
    """Remove the partial folder of a run that wrote nothing (e.g. its scheduler was never
    reached); True when it is gone."""
    try:
        partial.rmdir()
    except OSError:  # it holds something: it stays, for the error message to name
        return False
    return True


@contextlib.contextmanager
def staged(out: Path, *, overwrite: bool = False) -> Iterator[Path]:
    """The partial folder to write ``out``'s contents into; moved into place when the block
    ends, left beside ``out`` when it raises (removed if nothing was written: an interrupted
    run's ``KeyboardInterrupt`` then carries a note naming it)."""
    partial = start(out, overwrite=overwrite)
    try:
        yield partial
    except BaseException as exc:
        if not discard_if_empty(partial) and isinstance(exc, KeyboardInterrupt):
            note = f"partial results in {partial}"
            if hasattr(exc, "add_note"):  # Python 3.11+
                exc.add_note(note)
            else:
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
        raise
    finish(partial, out)


class MetricsFile:
    """Appends rows to metrics.csv as they arrive, so a failed run leaves what it measured."""

    def __init__(self, path: Path, on_first: Callable[[], None]) -> None:
        self.path, self.on_first = path, on_first  # on_first: e.g. config.json beside it

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        if not self.path.exists():  # with the first rows: a run that never started (its
            self.on_first()  # scheduler unreachable) leaves no file
            with self.path.open("w", newline="") as f:
                csv.writer(f).writerow(METRIC_COLUMNS)
        with self.path.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
            writer.writerows(rows)
