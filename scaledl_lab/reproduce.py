"""The paper comparison: the set of runs `scaledl-lab reproduce` executes, and its report.

It grows as techniques land. Today: synchronous data parallelism (allreduce) on 1 and 2 real
workers, the baseline every later method of the paper is compared against.
"""

from __future__ import annotations

import os
from pathlib import Path

from .config import ExperimentConfig, quick
from .experiment import Results, compare


def paper_configs(is_quick: bool) -> list[ExperimentConfig]:
    """Quick: Fashion-MNIST subset, small CNN, 2 epochs. Full: the whole set, 5 epochs."""
    base = ExperimentConfig(
        strategy="allreduce",
        runtime="dask",
        dataset="fashion-mnist",
        model="cnn",
        epochs=5,
        batch_size=64,
        lr=0.05,
        momentum=0.9,
    )
    if is_quick:
        base = quick(base)
    return [base.replace(workers=1), base.replace(workers=2)]


def reproduce(
    *,
    is_quick: bool,
    out: str | os.PathLike[str],
    address: str | None = None,
    progress: bool = True,
) -> Results:
    """Run the comparison and write the results folder (table, config, plots, summary.md)."""
    results = compare(paper_configs(is_quick), address=address, out=out, progress=progress)
    _append_speedup(results, Path(out))
    return results


def _append_speedup(results: Results, out: Path) -> None:
    """Add the measured speed-up of 2 workers over 1 to summary.md."""
    table = results.summary().set_index("run")
    if "samples_per_s" not in table.columns or len(table) < 2:
        return
    one, two = table["samples_per_s"].iloc[0], table["samples_per_s"].iloc[1]
    lines = [
        "",
        "## Scaling",
        "",
        f"Throughput speed-up of {table.index[1]} over {table.index[0]}: "
        f"{two / one:.2f}x (ideal 2x; measured samples/s {one:.0f} -> {two:.0f}).",
        "",
    ]
    with (out / "summary.md").open("a") as f:
        f.write("\n".join(lines))
