"""Are live Dask ranks ever reported lost on a loaded machine? And is a real loss still caught?

Real multi-worker runs — synchronous allreduce, unbounded NNT on a ring, asynchronous PS — with
more workers than cores (``--oversubscribe``) while CPU-hog processes keep every core busy, as
forty kernels do on a classroom server. Each kind runs ``--runs`` times in a row; a run that
ends in ``WorkerLostError`` although no worker was killed is a false loss. Then a worker is
really killed (``--faults kill:1:STEP``) in the same conditions: the synchronous run must stop
with ``WorkerLostError`` and the asynchronous one go on with the survivors.

    python benchmarks/stress_workers.py [--runs 20] [--workers 4] [--steps 300] [--hogs 2]
                                        [--kinds "nnt unbounded"] [--no-kill]
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from scaledl_lab import ExperimentConfig, WorkerLostError, run
from scaledl_lab.runtime.dask import driver
from scaledl_lab.runtime.dask.cluster import connect

KINDS = {
    "allreduce": dict(strategy="allreduce"),
    "nnt unbounded": dict(strategy="nnt", topology="ring", optimizer="adagrad", lr=0.01,
                          momentum=0.0, weight_decay=0.0),
    "ps-async": dict(strategy="ps-async", lr=0.01, momentum=0.0),
}  # fmt: skip


def _spin() -> None:
    while True:
        pass


@contextmanager
def hogs(n: int) -> Iterator[None]:
    """``n`` processes that keep a core busy each, until the block ends."""
    procs = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.join()


BATCH = 32
MOST_SAMPLES = 51_200  # of Fashion-MNIST's 59,800 training samples past val: whole batches


def config(kind: str, workers: int, steps: int, **extra) -> ExperimentConfig:
    """``steps`` steps per worker: one epoch when the data holds them, else as many epochs as
    it takes, cut at ``steps`` (1000 steps of 8 workers are 256,000 samples)."""
    per_epoch = min(steps, MOST_SAMPLES // (workers * BATCH))
    return ExperimentConfig(
        runtime="dask", workers=workers, oversubscribe=True, dataset="fashion-mnist",
        model="mlp", batch_size=BATCH, train_subset=workers * BATCH * per_epoch, val_size=200,
        test_subset=200, epochs=math.ceil(steps / per_epoch), max_steps=steps,
        **{**KINDS[kind], **extra},
    )  # fmt: skip


def attempt(client, cfg: ExperimentConfig, on_rows=None) -> tuple[str, float]:
    """('ok' | 'worker lost: ...' | 'error: ...', seconds)."""
    start = time.perf_counter()
    try:
        run(cfg, client=client, progress=False, log=None, on_rows=on_rows)
        outcome = "ok"
    except WorkerLostError as exc:
        outcome = f"worker lost: {exc}"
    except Exception as exc:  # noqa: BLE001 - counted and printed, the campaign goes on
        outcome = f"error: {type(exc).__name__}: {exc}"
    return outcome, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs of each kind (default 20)")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=300, help="steps per worker and run")
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy processes")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--no-kill", action="store_true", help="skip the real kills")
    args = parser.parse_args()
    print(f"the driver asks the scheduler for live workers every {driver.LIVENESS_S:g} s")
    print(f"{args.workers} workers on {os.cpu_count()} cores, {args.hogs} CPU hogs, "
          f"{args.steps} steps per run")  # fmt: skip
    false_losses = errors = 0
    with hogs(args.hogs), connect(args.workers, dashboard=False, log=None) as client:
        for kind in args.kinds:
            cfg = config(kind, args.workers, args.steps)
            for i in range(args.runs):
                outcome, seconds = attempt(client, cfg)
                false_losses += outcome.startswith("worker lost")
                errors += outcome.startswith("error")
                print(f"{kind:<14} run {i + 1:2d}/{args.runs}: {outcome} ({seconds:.1f} s)",
                      flush=True)  # fmt: skip
        print(f"\nfalse worker losses: {false_losses}; other errors: {errors}")
    if args.no_kill:
        return
    # A real loss, in the same conditions, on a cluster of its own (the killed worker's
    # process ends; the nanny starts a new one, which must not be mistaken for it).
    # Rank 1's process exits right after its train row of step STEP: that row's arrival at the
    # driver dates the kill (to within the row batches' interval), and the run's end after it
    # is how long the loss took to be acted on.
    step = args.steps // 4
    for kind, expect in (("allreduce", "worker lost"), ("ps-async", "ok")):
        cfg = config(kind, args.workers, args.steps, faults=f"kill:1:{step}")
        last_row: list[float] = []

        def on_rows(batch: list[dict], last_row: list[float] = last_row) -> None:
            if any(r["kind"] == "train" and r["rank"] == 1 and r["step"] == step for r in batch):
                last_row.append(time.perf_counter())

        with hogs(args.hogs), connect(args.workers, dashboard=False, log=None) as client:
            outcome, seconds = attempt(client, cfg, on_rows)
            ended = time.perf_counter()
        verdict = "as expected" if outcome.startswith(expect) else "NOT as expected"
        after = f"{ended - last_row[0]:.1f} s after rank 1's last row" if last_row else "no row"
        print(f"{kind:<14} rank 1 killed at step {step}: {outcome} "
              f"({seconds:.1f} s in all, the run ended {after}; {verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
