"""Gradient compression, side by side with what it must beat and with PyTorch's own.

1. Encode + decode of a ResNet-18-sized gradient (the lab's CIFAR ResNet-18, 11.2 M
   parameters) by each compressor, error feedback included, beside that model's backward pass
   on a batch of 128 CIFAR-shaped images, on this CPU with all its threads: the cost compression
   adds to a step. (An allreduce worker decodes every worker's payload: N decodes per step.)
2. PowerSGD on 2 real Dask workers (`allreduce --compress powersgd:RANK`) beside PyTorch's
   `DistributedDataParallel` with `ddp_comm_hooks.powerSGD_hook.powerSGD_hook` (same rank,
   error feedback and warm start, 2 processes with gloo started by torch.multiprocessing), and
   both uncompressed: bytes sent per worker per step (the hook's allreduces counted by wrapping
   `dist.all_reduce`), median time per step, test accuracy after the same epochs on
   Fashion-MNIST with the MLP (same initial weights, shards and batch order).

    python benchmarks/bench_compression.py [--epochs 5] [--rank 2] [--repeats 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from scaledl_lab import ExperimentConfig
from scaledl_lab.data import epoch_batches, load_dataset, shard_indices
from scaledl_lab.experiment import run
from scaledl_lab.models import build_model
from scaledl_lab.runtime.dask.cluster import connect
from scaledl_lab.runtime.memory import keep_freed_memory
from scaledl_lab.runtime.sim.cost import ring_allreduce_bytes
from scaledl_lab.strategies.compression import layout_of, parse, payload_bytes

COMPRESSORS = ("onebit", "qsgd:4", "topk:0.004", "dgc:0.001", "powersgd:2")
SETTING = dict(lr=0.05, momentum=0.9, batch_size=64, seed=0)


def _median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def encode_decode(repeats: int, out: Path | None = None) -> None:
    model = build_model("resnet18", (3, 32, 32), 10, seed=0)
    params = list(model.parameters())
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(128, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (128,), generator=gen)

    def backward() -> None:
        model.zero_grad()
        loss = F.cross_entropy(model(x), y)
        start = time.perf_counter()
        loss.backward()
        backward.seconds = time.perf_counter() - start  # type: ignore[attr-defined]

    back = []
    for _ in range(repeats + 1):
        backward()
        back.append(backward.seconds)  # type: ignore[attr-defined]
    t_back = statistics.median(back[1:])
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    n = grad.numel()
    print(
        f"ResNet-18 (CIFAR): {n / 1e6:.1f} M parameters; backward at batch 128 on "
        f"{torch.get_num_threads()} threads: {t_back * 1e3:.0f} ms (median of {repeats})"
    )
    print(
        f"{'compressor':>12} {'encode ms':>10} {'decode ms':>10} {'/ backward':>11} "
        f"{'bytes':>11} {'ratio':>7}"
    )
    rows = []
    for name in COMPRESSORS:
        spec = parse(name)
        compressor = spec.compressor(layout_of(params), seed=0, warmup=False)
        memory = spec.memory(error_feedback=True, momentum=0.9, world_size=2)
        payload = {}

        def encode(compressor=compressor, memory=memory, payload=payload) -> None:
            corrected = memory.add(grad)
            payload.update(compressor.encode(corrected))
            memory.keep(corrected, compressor.decode(payload), payload)

        t_enc = _median_time(encode, repeats)  # error feedback needs the decode too
        t_dec = _median_time(lambda c=compressor, p=payload: c.decode(p), repeats)
        size = payload_bytes(payload)
        rows.append(dict(compressor=name, encode_s=t_enc - t_dec, decode_s=t_dec, bytes=size))
        print(
            f"{name:>12} {(t_enc - t_dec) * 1e3:>10.1f} {t_dec * 1e3:>10.1f} "
            f"{t_enc / t_back:>10.1%} {size:>11,} {4 * n / size:>6.0f}x",
            flush=True,
        )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        body = dict(parameters=n, backward_s=t_back, threads=torch.get_num_threads(), rows=rows)
        (out / "encode_decode.json").write_text(json.dumps(body, indent=2))
    print(
        "encode includes error feedback (add the residual, keep what was not sent); "
        "'/ backward' = (encode + decode) / backward"
    )


# -- PowerSGD: ours on Dask beside torch's hook on DDP -------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ddp_rank(rank: int, port: int, epochs: int, powersgd_rank: int, out: mp.Queue) -> None:
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook

    torch.set_num_threads(1)
    keep_freed_memory()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sent = [0]
    plain_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *args, **kwargs):  # what the hook sends
        sent[0] += ring_allreduce_bytes(tensor.numel() * tensor.element_size(), 2)
        return plain_all_reduce(tensor, *args, **kwargs)

    hook.dist.all_reduce = counting_all_reduce
    data = load_dataset("fashion-mnist", seed=SETTING["seed"])
    # One gradient bucket, as ours (one flat gradient). With DDP's default buckets (the first
    # capped at 1 MB) the hook runs once per bucket, and on gloo the buckets' future chains issue
    # their allreduces in different orders on the two ranks: the run stops with a collective
    # size mismatch (torch 2.13, gloo).
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 2**20
    model = DistributedDataParallel(
        build_model("mlp", data.input_shape, 10, seed=0), bucket_cap_mb=64
    )
    if powersgd_rank:
        state = hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=2,
            use_error_feedback=True,
            warm_start=True,
        )
        model.register_comm_hook(state, hook.powerSGD_hook)
    opt = torch.optim.SGD(model.parameters(), lr=SETTING["lr"], momentum=SETTING["momentum"])
    shard = shard_indices(data.train.y, 2, rank, seed=SETTING["seed"])
    steps, times, per_step = 0, [], []
    for epoch in range(epochs):
        for idx in epoch_batches(shard, SETTING["batch_size"], seed=0, epoch=epoch, rank=rank):
            start, before = time.perf_counter(), sent[0]
            opt.zero_grad()
            F.cross_entropy(model(data.train.x[idx]), data.train.y[idx]).backward()
            opt.step()
            times.append(time.perf_counter() - start)
            per_step.append(sent[0] - before)
            steps += 1
    if not powersgd_rank:  # DDP's own allreduce goes through its reducer, not dist.all_reduce
        n = sum(p.numel() * p.element_size() for p in model.parameters())
        per_step = [ring_allreduce_bytes(n, 2)] * steps
    model.eval()
    with torch.no_grad():
        correct = (model.module(data.test.x).argmax(1) == data.test.y).float().mean().item()
    out.put((rank, statistics.median(times), statistics.median(per_step[2:]), correct))
    dist.destroy_process_group()


def ddp_run(epochs: int, powersgd_rank: int) -> tuple[float, float, float]:
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_ddp_rank, args=(r, port, epochs, powersgd_rank, out)) for r in range(2)
    ]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=1800) for _ in procs)
    for p in procs:
        p.join()
    return results[0][1], results[0][2], results[0][3]  # rank 0's step time, bytes, accuracy


def ours_run(client, epochs: int, compress: str) -> tuple[float, float, float]:
    cfg = ExperimentConfig(
        strategy="allreduce", workers=2, model="mlp", epochs=epochs, compress=compress, **SETTING
    )
    frame = run(cfg, client=client, progress=False).frame
    train = frame[(frame["kind"] == "train") & (frame["rank"] == 0)].sort_values("step")
    step = float(train["time"].diff().iloc[1:].median())
    test = frame[frame["kind"] == "test"].sort_values("step")
    return step, float(train["bytes_sent"].iloc[2:].median()), float(test["accuracy"].iloc[-1])


def powersgd_side_by_side(epochs: int, rank: int, out: Path | None) -> None:
    rows = {}
    with connect(2, dashboard=False, log=None) as client:
        rows["ours, uncompressed"] = ours_run(client, epochs, "none")
        rows[f"ours, powersgd:{rank}"] = ours_run(client, epochs, f"powersgd:{rank}")
    rows["DDP, uncompressed"] = ddp_run(epochs, 0)
    rows[f"DDP + powerSGD_hook, rank {rank}"] = ddp_run(epochs, rank)
    print(
        f"\nPowerSGD rank {rank}, 2 workers x 1 thread, MLP on Fashion-MNIST, {epochs} epochs, "
        "SGD 0.05/0.9, batch 64 per worker (bytes: sent by one worker per step)"
    )
    print(f"{'run':>34} {'bytes/step':>11} {'ms/step':>8} {'test acc':>9}")
    for name, (step, sent, acc) in rows.items():
        print(f"{name:>34} {sent:>11,.0f} {step * 1e3:>8.2f} {acc:>9.2%}")
    ours, theirs = rows[f"ours, powersgd:{rank}"], rows[f"DDP + powerSGD_hook, rank {rank}"]
    gap = 100 * (ours[2] - theirs[2])
    print(
        f"accuracy, ours - torch's hook: {gap:+.2f} points "
        f"({'within' if abs(gap) <= 1 else 'not within'} 1 point)"
    )
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        body = {
            k: dict(step_s=s, bytes_per_step=b, test_accuracy=a) for k, (s, b, a) in rows.items()
        }
        body["setting"] = dict(SETTING, epochs=epochs, rank=rank, workers=2, model="mlp")
        (out / "powersgd_vs_torch.json").write_text(json.dumps(body, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5, help="PowerSGD runs: epochs")
    parser.add_argument("--rank", type=int, default=2, help="PowerSGD rank")
    parser.add_argument("--repeats", type=int, default=3, help="encode/decode: timed repeats")
    parser.add_argument("--skip-resnet", action="store_true", help="only the PowerSGD part")
    parser.add_argument("--skip-powersgd", action="store_true", help="only the ResNet-18 part")
    parser.add_argument("--out", default=None, help="also write the tables as JSON here")
    args = parser.parse_args()
    if not args.skip_resnet:
        encode_decode(args.repeats, Path(args.out) if args.out else None)
    if not args.skip_powersgd:
        powersgd_side_by_side(args.epochs, args.rank, Path(args.out) if args.out else None)


if __name__ == "__main__":
    main()
