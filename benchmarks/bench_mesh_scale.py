"""The mesh at scale in the simulator (#48): a 512-rank mesh of gpt-tiny trains one quick-mode
epoch; its wall time against the ranks' own arithmetic, and the process tree's summed PSS.

    python benchmarks/bench_mesh_scale.py [--mesh dp=32,tp=4,pp=4] [--batch-size 16]

gpt-tiny has 4 heads and 4 layers for the pipeline to cut (the embedding, 2 blocks, the head),
so ``tp`` and ``pp`` are at most 4 and 512 ranks are ``dp=32,tp=4,pp=4`` (the issue's example,
dp=16, tp=4, pp=8, needs 8 layers). The ranks' own arithmetic is :mod:`bench_sim_cost`'s
measure for the mesh: every rank's own program (``train(ctx)``, the same config) run plainly
on a :class:`Solo` comm that never waits for a peer, the ranks taking turns where the simulator
switches between them. A collective
does this rank's part of the sum (one add and one pass of the tensor, as the simulator's sum in
rank order costs per member), a receive yields a zeroed tensor of the message's shape, a send
nothing. The values differ from the run's; the tensors' shapes and so the arithmetic do not.
Each side runs ``--repeats`` times, alternating, and keeps its best: its wall time and its CPU
time (the main thread's, where every rank's program runs with one torch thread; on a shared
machine the wall time also counts the other jobs' turns). PSS is sampled every 0.2 s over this
process and its children while the simulated run trains; the peak of all repeats.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import threading
import time
import types
from collections.abc import AsyncIterator, Iterator, Sequence

import torch

from scaledl_lab import ExperimentConfig, quick
from scaledl_lab.runtime.base import Comm, Group, Incoming, Pending
from scaledl_lab.runtime.memory import keep_freed_memory
from scaledl_lab.strategies.launch import execute
from scaledl_lab.strategies.registry import get_strategy
from scaledl_lab.training.worker import WorkerContext, load_for


@types.coroutine
def _pass() -> Iterator[None]:
    """Hand the turn to the next rank (where the simulator would switch ranks)."""
    yield


class _Done(Pending, Incoming):
    def __init__(self, value: object = None) -> None:
        self.value = value

    def ready(self) -> bool:
        return True

    async def wait(self):  # noqa: ANN201
        await _pass()
        return self.value


class Solo(Comm):
    """One rank alone: each collective is this member's share of the arithmetic only."""

    def now(self) -> float:
        return 0.0

    def new_group(self, ranks: Sequence[int]) -> Group:
        return tuple(sorted(set(ranks)))  # no checks: the simulated run made them

    def allreduce_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        tensor.add_(tensor).mul_(0.5)  # one add into the sum and one pass to copy it back
        return _Done(tensor)

    def reduce_scatter_start(self, tensor: torch.Tensor, group: Group | None = None) -> Pending:
        members = group or tuple(range(self.world_size))
        total = tensor.clone()  # as the simulator's sum: a pass over the whole, then a chunk
        return _Done(total.chunk(len(members))[members.index(self.rank)].clone())

    def all_gather_into_start(
        self, out: torch.Tensor, shard: torch.Tensor, group: Group | None = None
    ) -> Pending:
        out.view(-1, shard.numel()).copy_(shard.reshape(1, -1))
        return _Done(out)

    async def allgather(self, tensor: torch.Tensor, group: Group | None = None) -> list:
        return [tensor.detach().clone()] * self.group_size(group)

    async def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        return tensor

    def isend(self, tensor: torch.Tensor, dst: int) -> Pending:
        return _Done()

    def irecv(self, tensor: torch.Tensor, src: int) -> Incoming:
        return _Done(tensor.zero_())

    async def barrier(self) -> None:
        await _pass()

    @contextlib.asynccontextmanager
    async def compute(self, samples: int, share: float = 1.0) -> AsyncIterator[None]:
        yield
        await _pass()  # the simulator switches ranks after each block of computation


def ranks_arithmetic(cfg: ExperimentConfig, *, in_turns: bool = True) -> tuple[float, float]:
    """Seconds (wall, CPU) for every rank's own program, run plainly: in turns, each rank up
    to its next collective, message or block of computation, as the simulator interleaves them
    (so the ranks' states are alive together and share the caches as they do there); or, not
    ``in_turns``, each rank from its start to its end before the next starts."""
    program, data = get_strategy(cfg.strategy).program, load_for(cfg)
    torch.set_num_threads(1)
    start, cpu = time.perf_counter(), time.thread_time()

    def rank_program(rank: int):  # noqa: ANN202
        ctx = WorkerContext(cfg, Solo(rank, cfg.workers), data, torch.device("cpu"),
                            lambda row: None, cfg.label)  # fmt: skip
        return program(ctx)

    if not in_turns:
        for rank in range(cfg.workers):
            with contextlib.suppress(StopIteration):
                coroutine = rank_program(rank)
                while True:
                    coroutine.send(None)
        return time.perf_counter() - start, time.thread_time() - cpu
    ranks = [rank_program(rank) for rank in range(cfg.workers)]
    while ranks:
        running = []
        for coroutine in ranks:
            try:
                coroutine.send(None)
                running.append(coroutine)
            except StopIteration:
                pass
        ranks = running
    return time.perf_counter() - start, time.thread_time() - cpu


def tree_pss() -> int:
    """Summed PSS (bytes) of this process and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [os.getpid()]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        with contextlib.suppress(OSError), open(f"/proc/{pid}/smaps_rollup") as f:
            total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith("Pss:"))
    return total


def simulated(cfg: ExperimentConfig) -> tuple[float, float, int, int]:
    """Seconds (wall, CPU) of the simulated run, its peak summed PSS and its rows' number."""
    peak, done, rows = [tree_pss()], threading.Event(), []

    def sample() -> None:
        while not done.wait(0.2):
            peak.append(tree_pss())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start, cpu = time.perf_counter(), time.thread_time()
    execute(cfg, cfg.label, rows.extend)
    seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
    done.set()
    sampler.join()
    return seconds, cpu, max(peak), len(rows)


def config(mesh: str, batch_size: int, micro_batches: int) -> ExperimentConfig:
    workers = 1
    for part in mesh.split(","):
        workers *= int(part.split("=")[1])
    cfg = ExperimentConfig(
        strategy="mesh", runtime="sim", dataset="licenses", model="gpt-tiny", mesh=mesh,
        workers=workers, batch_size=batch_size, micro_batches=micro_batches, epochs=1,
    )  # fmt: skip
    cfg = quick(cfg)
    load_for(cfg)  # data loading is not part of either side
    return cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", nargs="+", default=["dp=32,tp=4,pp=4"])
    parser.add_argument("--batch-size", type=int, default=16, help="per replica")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    keep_freed_memory()  # both sides run in this process with the tuning the simulator applies
    print(f"{'':29} {'wall s':^22} {'CPU s':^22}")
    print(f"{'mesh':>16} {'ranks':>6} {'steps':>5} {'sim':>7} {'arith.':>7} {'ratio':>6} "
          f"{'sim':>7} {'arith.':>7} {'ratio':>6} {'peak PSS':>9} {'rows':>6} "
          f"{'rank by rank':>13}")  # fmt: skip
    for mesh in args.mesh:
        cfg = config(mesh, args.batch_size, args.micro_batches)
        sims, ariths = [], []
        for _ in range(args.repeats):
            sims.append(simulated(cfg))
            ariths.append(ranks_arithmetic(cfg))
        alone = ranks_arithmetic(cfg, in_turns=False)
        sim, sim_cpu = min(s[0] for s in sims), min(s[1] for s in sims)
        arith, arith_cpu = min(a[0] for a in ariths), min(a[1] for a in ariths)
        pss, rows = max(s[2] for s in sims), sims[0][3]
        steps = cfg.train_subset // cfg.replicas // cfg.batch_size
        print(f"{mesh:>16} {cfg.workers:>6} {steps:>5} {sim:>7.1f} {arith:>7.1f} "
              f"{sim / arith:>6.2f} {sim_cpu:>7.1f} {arith_cpu:>7.1f} {sim_cpu / arith_cpu:>6.2f} "
              f"{pss / 2**30:>7.2f} G {rows:>6} {alone[0]:>11.1f} s", flush=True)  # fmt: skip
        for label, runs in (("sim", sims), ("arith.", ariths)):
            each = ", ".join(f"{w:.1f} s wall / {c:.1f} s CPU" for w, c, *_ in runs)
            print(f"  each {label}: {each}")
    print(
        f"one quick-mode epoch: {cfg.train_subset} training samples, val {cfg.val_size}, "
        f"test {cfg.test_subset}; batch {args.batch_size} per replica in "
        f"{args.micro_batches} micro-batches; best of {args.repeats} alternating runs a side; "
        "ratio: sim / arith. (the ranks' own programs, in turns as the simulator runs them); "
        "rank by rank: the same programs one after the other (wall)"
    )


if __name__ == "__main__":
    main()
