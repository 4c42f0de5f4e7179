"""A committed study's folder (``results/NAME/``): its CSVs read back, drawn as markdown tables,
and the command that measures them or renders the summary again from them."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

Tables = dict[str, pd.DataFrame]


def read_tables(out: str | os.PathLike[str], names: Sequence[str]) -> Tables:
    """The folder's ``NAME.csv`` for each of ``names``."""
    return {name: pd.read_csv(Path(out) / f"{name}.csv") for name in names}


def markdown_table(frame: pd.DataFrame) -> list[str]:
    """``frame`` as markdown lines, floats to four significant digits."""
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row]
             for row in frame.itertuples(index=False)]  # fmt: skip
    head = "| " + " | ".join(frame.columns) + " |"
    return [head, "|" + "---|" * len(frame.columns), *("| " + " | ".join(c) + " |" for c in cells)]


def write_summary_lines(out: str | os.PathLike[str], lines: Sequence[str]) -> Path:
    """The folder's ``summary.md``: ``lines``, one per line."""
    path = Path(out) / "summary.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def study_main(
    argv: list[str] | None,
    *,
    description: str,
    default_out: str,
    names: Sequence[str],
    measure: Callable[[], Tables],
    write_summary: Callable[[str | os.PathLike[str], Tables], Path],
) -> None:
    """``--out DIR`` (``default_out``): measure, write the CSVs, and the summary from them as
    read back; ``--summary``: only the summary, from the CSVs already there."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", default=default_out)
    parser.add_argument("--summary", action="store_true", help="only summarise OUT's CSVs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    if not args.summary:
        out.mkdir(parents=True, exist_ok=True)
        for name, frame in measure().items():
            frame.to_csv(out / f"{name}.csv", index=False)
    # the summary is the CSVs' (as --summary renders it)
    print(write_summary(out, read_tables(out, names)).read_text())
