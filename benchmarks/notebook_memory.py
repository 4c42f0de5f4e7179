"""Where a notebook kernel's memory goes: its resident set cell by cell, then what each of the
notebook's variables holds.

Runs a notebook's code cells, in quick mode, in this one process, as a kernel would (each
cell's output discarded, IPython's ``%`` lines skipped), and prints after each cell its time,
the process's resident set (RSS) and its peak so far (the kernel's own memory: the processes a
cell starts, Dask workers or simulator pools, are not counted; ``bench_memory.py`` measures the
whole tree). Then (after the last cell, or cell ``--until``) it hands freed memory back to the
OS and deletes the notebook's variables one at a time, in the order the cells made them, and
lists those whose deletion freed the most: what a cell's result (a ``compare`` with every
worker's final model) keeps alive for the rest of the session.

    python benchmarks/notebook_memory.py NOTEBOOK [--until CELL] [--top K]

RSS, not PSS: one process, whose library pages are the same throughout.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import os
import sys
import time
from pathlib import Path

from scaledl_lab.runtime.memory import hand_back_memory

GB = 1e9


def resident() -> tuple[float, float]:
    """(RSS, its peak so far) of this process, in GB."""
    fields = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                fields[key] = int(value.split()[0]) * 1024 / GB
    return fields["VmRSS"], fields["VmHWM"]


def settle() -> float:
    """Collect garbage, return free memory to the OS (the lab's own hand-back), read the RSS."""
    gc.collect()
    hand_back_memory()
    return resident()[0]


def code_cells(path: Path) -> list[tuple[int, str]]:
    import nbformat

    cells = nbformat.read(path, as_version=4).cells
    return [
        (i, "\n".join(line for line in c.source.splitlines() if not line.lstrip().startswith("%")))
        for i, c in enumerate(cells)
        if c.cell_type == "code"
    ]


def run_cells(path: Path, until: int | None) -> dict[str, object]:
    """Run the code cells up to ``until`` (all by default) in one namespace; print each one's
    time and the RSS after it. The namespace, for :func:`held`."""
    namespace: dict[str, object] = {"__name__": "__main__"}
    print(f"{'cell':>5} {'seconds':>8} {'RSS GB':>7} {'peak GB':>8}")
    for index, source in code_cells(path):
        if until is not None and index > until:
            break
        start = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(source, f"{path.name}, cell {index}", "exec"), namespace)  # noqa: S102
        rss, peak = resident()
        print(f"{index:>5} {time.perf_counter() - start:>8.1f} {rss:>7.2f} {peak:>8.2f}")
    return namespace


def held(namespace: dict[str, object], top: int) -> list[tuple[str, str, float]]:
    """Delete the namespace's variables one at a time, in the order they were made: (name, type,
    GB freed) of the ``top`` that freed most. Memory two variables share is freed with the last
    of them."""
    names = [n for n in namespace if not n.startswith("_") and not callable(namespace[n])]
    freed = []
    for name in names:
        before = settle()
        kind = type(namespace[name]).__name__
        del namespace[name]
        freed.append((name, kind, before - settle()))
    return sorted(freed, key=lambda r: -r[2])[:top]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--until", type=int, help="the last cell to run (its index)")
    parser.add_argument("--top", type=int, default=8, help="variables to list")
    args = parser.parse_args(argv)
    path = args.notebook.resolve()
    os.environ["SCALEDL_QUICK"] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.chdir(path.parent)  # as Jupyter starts a kernel
    namespace = run_cells(path, args.until)
    after = settle()
    print(f"\nafter the last cell, freed memory returned: {after:.2f} GB")
    for name, kind, gb in held(namespace, args.top):
        print(f"  {name:<24} {kind:<16} {gb:6.3f} GB")
    print(f"with none of the notebook's variables: {settle():.2f} GB")
    return 0


if __name__ == "__main__":  # the guard Dask's worker processes need when a cell starts them
    sys.exit(main())
