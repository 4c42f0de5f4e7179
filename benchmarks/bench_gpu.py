"""GPU workers, side by side with plain PyTorch on the same GPU.

1. ResNet-18 on CIFAR-10-shaped batches (3×32×32, 10 classes; random images written in the real
   CIFAR-10 file format, so no download): images/s of one scaledl_lab worker (`allreduce`, one
   Dask worker, `device="cuda"`, its data moved to the GPU once) against a plain PyTorch loop on
   the same GPU, same model, seed, batch and batch order. Both call ``loss.item()`` every step.
2. With two GPUs or more: allreduce bandwidth over NCCL between two Dask workers, our
   ``Comm.allreduce`` against a raw ``torch.distributed.all_reduce`` in the same process group.

Without a CUDA device it says so and exits (status 0, so `scaledl-lab bench` goes on).

    python benchmarks/bench_gpu.py [--batch 128] [--steps 50] [--sizes-mb 1 16 64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scaledl_lab import ExperimentConfig
from scaledl_lab.data import epoch_batches, load_dataset, shard_indices, write_cifar10_fixture
from scaledl_lab.models import build_model
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.strategies.launch import execute

WARMUP = 10
REPS = 20


def _cifar(root: str, batch: int, steps: int) -> dict:
    """A CIFAR-10-shaped fixture with enough training images for the run, and its config."""
    per_file = -(-batch * (WARMUP + steps) // 5)  # five training files, one test file
    write_cifar10_fixture(root, n_per_batch=per_file, seed=0)
    return dict(dataset="cifar10", data_dir=root, val_size=0, test_subset=batch)


def plain_images_per_s(data_kw: dict, batch: int, steps: int) -> float:
    """A plain PyTorch loop on cuda:0: data on the GPU once, SGD, ``loss.item()`` each step."""
    device = torch.device("cuda", 0)
    data = load_dataset("cifar10", data_dir=data_kw["data_dir"], val_size=0, seed=0)
    x, y = data.train.x.to(device), data.train.y.to(device)
    model = build_model("resnet18", data.input_shape, 10, seed=0).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    order = epoch_batches(shard_indices(data.train.y, 1, 0, seed=0), batch, seed=0, epoch=0, rank=0)
    for i, idx in enumerate(order[: WARMUP + steps]):
        if i == WARMUP:
            torch.cuda.synchronize()
            start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        loss.item()
    torch.cuda.synchronize()
    return steps * batch / (time.perf_counter() - start)


def ours_images_per_s(client, data_kw: dict, batch: int, steps: int) -> float:
    """One scaledl_lab worker (`allreduce` with one rank) on its GPU; rate from its own rows."""
    cfg = ExperimentConfig(
        strategy="allreduce", workers=1, model="resnet18", batch_size=batch, lr=0.05,
        momentum=0.9, epochs=1, max_steps=WARMUP + steps, device="cuda", **data_kw,
    )  # fmt: skip
    rows: list[dict] = []
    execute(cfg, cfg.label, rows.extend, client=client)
    times = {r["step"]: r["time"] for r in rows if r["kind"] == "train"}
    return steps * batch / (times[WARMUP + steps] - times[WARMUP])


def allreduce_program(sizes: list[int]):
    async def program(ctx) -> None:
        """Our Comm.allreduce and a raw dist.all_reduce on the same GPU tensors, interleaved."""
        for nbytes in sizes:
            tensor = torch.ones(nbytes // 4, device=ctx.device)
            ours, raw = [], []
            for _ in range(REPS):
                dist.barrier()
                torch.cuda.synchronize()
                start = time.perf_counter()
                await ctx.comm.allreduce(tensor)
                torch.cuda.synchronize()
                ours.append(time.perf_counter() - start)
                dist.barrier()
                torch.cuda.synchronize()
                start = time.perf_counter()
                dist.all_reduce(tensor)
                torch.cuda.synchronize()
                raw.append(time.perf_counter() - start)
            ctx.result[nbytes] = (statistics.median(ours), statistics.median(raw))

    return program


def allreduce_table(client, data_kw: dict, sizes_mb: list[float]) -> None:
    sizes = [int(mb * 2**20) for mb in sizes_mb]
    cfg = ExperimentConfig(
        strategy="allreduce", workers=2, model="mlp", dataset="cifar10", device="cuda",
        **{**data_kw, "test_subset": 10},
    )  # fmt: skip
    outcome = execute(cfg, "bench-gpu-allreduce", lambda rows: None, client=client,
                      program=allreduce_program(sizes))  # fmt: skip
    print("\nallreduce over NCCL, 2 GPU workers (median of 20 calls; GB/s = bytes / time)")
    print(f"{'size':>8} {'ours ms':>9} {'raw ms':>9} {'ours GB/s':>10} {'raw GB/s':>9}")
    for nbytes in sizes:
        ours, raw = outcome.results[0][nbytes]
        print(f"{nbytes / 2**20:6.0f}MB {ours * 1e3:9.3f} {raw * 1e3:9.3f} "
              f"{nbytes / ours / 1e9:10.2f} {nbytes / raw / 1e9:9.2f}")  # fmt: skip


def _cluster(workers: int):
    """LocalCUDACluster when dask-cuda is installed (one GPU per worker, as on a GPU node);
    else an embedded LocalCluster, whose workers each take their own GPU by position."""
    try:
        from dask_cuda import LocalCUDACluster
        from distributed import Client
    except ImportError:
        return connect(workers, dashboard=False, log=None)
    import contextlib

    @contextlib.contextmanager
    def cuda_cluster():
        with LocalCUDACluster(n_workers=workers, threads_per_worker=1) as cluster:
            with Client(cluster) as client:
                yield client

    return cuda_cluster()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--sizes-mb", type=float, nargs="+", default=[1, 16, 64])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(
            f"bench_gpu: skipped, this machine has no CUDA device (torch {torch.__version__}, "
            f"CUDA build {torch.version.cuda}); run it on a GPU node with a CUDA build of torch",
            file=sys.stderr,
        )
        return 0
    gpus = torch.cuda.device_count()
    print(f"{gpus} GPU(s): {torch.cuda.get_device_name(0)}; torch {torch.__version__}")
    with tempfile.TemporaryDirectory() as root:
        data_kw = _cifar(root, args.batch, args.steps)
        plain = plain_images_per_s(data_kw, args.batch, args.steps)
        with _cluster(min(gpus, 2)) as client:
            ours = ours_images_per_s(client, data_kw, args.batch, args.steps)
            print(f"\nResNet-18, CIFAR-10-shaped batches of {args.batch}, {args.steps} steps "
                  f"after {WARMUP} warm-up")  # fmt: skip
            print(f"  plain PyTorch loop:     {plain:9.1f} images/s")
            print(f"  one scaledl_lab worker: {ours:9.1f} images/s (×{ours / plain:.2f})")
            if gpus >= 2:
                allreduce_table(client, data_kw, args.sizes_mb)
            else:
                print("\nallreduce over NCCL: skipped, it needs two GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
