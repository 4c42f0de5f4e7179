"""Side by side: starting an embedded cluster whose workers spawn (Dask's default: each worker
imports torch and the lab itself) against the lab's, forked from a server that imported them
once per process. Each way runs in a fresh process: it starts ``--clusters`` clusters of
``--workers`` workers one after the other, runs one small torch task on every worker of each
(unpickling it loads the lab, as a training run's does) and closes it; the first cluster of the
forked way also pays for starting its server. CPU is the process's and all its descendants'
(the server's and the workers' included), read from /proc while they still run.

    python benchmarks/bench_cluster_start.py [--workers 4] [--clusters 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _task(_: int) -> float:
    import torch

    import scaledl_lab.strategies  # noqa: F401  (a run's task loads it)

    return float(torch.ones(4).sum())


def _cpu_of_tree() -> float:
    import psutil

    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.NoSuchProcess:
            pass
    return total


def one_way(method: str, workers: int, clusters: int) -> dict:
    import dask
    from distributed import Client

    from scaledl_lab.runtime.dask import cluster

    if method == "spawn":  # Dask's default start, as before the fork server
        cluster.start_method = lambda: "spawn"
    starts, cpu = [], 0.0
    for _ in range(clusters):
        t0 = time.perf_counter()
        with dask.config.set({"distributed.worker.multiprocessing-method": method}):
            client = Client(cluster.local_cluster(workers, dashboard=False))
        client.gather(client.map(_task, range(workers), pure=False))
        starts.append(time.perf_counter() - t0)
        cpu = _cpu_of_tree()  # the workers are alive: their CPU counts now
        client.shutdown()
        client.close()
    return {"method": method, "starts": starts, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--clusters", type=int, default=3)
    parser.add_argument("--method", choices=["spawn", "forkserver"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.method:  # one way, in this fresh process
        print(json.dumps(one_way(args.method, args.workers, args.clusters)))
        return
    rows = {}
    for method in ("spawn", "forkserver"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--method",
                method,
                "--workers",
                str(args.workers),
                "--clusters",
                str(args.clusters),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows[method] = json.loads(out.strip().splitlines()[-1])
    print(
        f"{args.clusters} clusters of {args.workers} workers, each started, one task per "
        "worker, closed"
    )
    print(f"{'workers':>12} {'first start s':>14} {'later starts s':>15} {'CPU s (all)':>12}")
    for method, r in rows.items():
        later = statistics.median(r["starts"][1:]) if len(r["starts"]) > 1 else float("nan")
        print(f"{method:>12} {r['starts'][0]:>14.2f} {later:>15.2f} {r['cpu']:>12.1f}")
    s, f = rows["spawn"], rows["forkserver"]
    later = statistics.median(s["starts"][1:]) / statistics.median(f["starts"][1:])
    print(
        f"spawn ÷ forked: first start x{s['starts'][0] / f['starts'][0]:.1f}, "
        f"later starts x{later:.1f}, CPU x{s['cpu'] / f['cpu']:.1f}"
    )


if __name__ == "__main__":
    main()
