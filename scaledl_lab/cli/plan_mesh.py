"""`scaledl-lab plan --transformer L,H,A,S,V --mesh dp=..,tp=..,pp=.. --gpu a100 ...`: a
published transformer's memory per GPU and step time on a mesh of GPUs, analytically
(:mod:`scaledl_lab.strategies.memory.mesh_plan`); ``--json`` prints the same numbers."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..errors import ConfigError
from ..runtime.sim.gpus import GPUS, gpu_profile
from ..strategies.memory.mesh_plan import MeshPlan, MeshSetup, plan_mesh
from ..strategies.memory.transformer import Transformer

GB = 1e9
CP_LABELS = {"ring": "cp ring (beyond the attention it hides)",
             "ulysses": "cp ulysses all-to-alls (not overlapped)"}  # fmt: skip


def add_gpu_options(plan: argparse.ArgumentParser) -> None:
    """The plan's own options for a transformer on GPUs (``--recompute`` takes ``selective``
    here beside the run's bare switch for whole layers)."""
    plan.add_argument(
        "--recompute", nargs="?", const=True, default=argparse.SUPPRESS, metavar="selective",
        help="recompute each layer's forward in backward; `--recompute selective` (with --gpu): "
        "attention's core only (Korthikanti et al. 2022)",
    )  # fmt: skip
    plan.add_argument(
        "--gpu", choices=GPUS, default=None,
        help="plan --transformer on a mesh of these GPUs (--mesh, --global-batch-size, "
        "--micro-batches): memory per GPU, step time, MFU and HFU, analytically",
    )  # fmt: skip
    plan.add_argument(
        "--json",
        action="store_true",
        help="with --gpu, or a dry run (--strategy mesh, ...): print the plan as JSON",
    )
    plan.add_argument(
        "--overlap-grad-reduce", action="store_true",
        help="with --gpu: dp's gradient reduction hidden behind the last backward",
    )  # fmt: skip
    plan.add_argument(
        "--search", action="store_true",
        help="with --gpu: every mesh of --workers GPUs (dp with ZeRO, tp, pp with schedule, "
        "cp, ep with --experts, micro-batch size, recomputation), the best by predicted step "
        "time",
    )  # fmt: skip
    plan.add_argument("--top", type=int, default=10, help="with --search: meshes shown")


def _setup(args: argparse.Namespace) -> MeshSetup:
    if args.transformer is None:
        raise ConfigError("--gpu plans a transformer given by its sizes: give --transformer")
    if getattr(args, "model", None) is not None:
        raise ConfigError(
            f"--gpu plans --transformer {args.transformer}; --model {args.model} is one of the "
            "lab's networks, planned without --gpu"
        )
    missing = [f for f, d in (("--mesh", "mesh"), ("--global-batch-size", "global_batch_size"))
               if getattr(args, d, None) is None]  # fmt: skip
    if missing:
        raise ConfigError(f"--gpu needs {' and '.join(missing)} (e.g. --mesh dp=8,pp=2,tp=8)")
    recompute = getattr(args, "recompute", False)
    return MeshSetup(
        mesh=args.mesh, global_batch_size=args.global_batch_size,
        micro_batches=getattr(args, "micro_batches", 1),
        schedule=getattr(args, "pipeline_schedule", "1f1b"),
        virtual_stages=getattr(args, "virtual_stages", 1),
        recompute={True: "full", False: "none"}.get(recompute, recompute),
        sequence_parallel=bool(getattr(args, "sequence_parallel", False)),
        zero_stage=int(getattr(args, "zero_stage", 0)),
        overlap_grad_reduce=args.overlap_grad_reduce,
        gpus_per_node=getattr(args, "gpus_per_node", None),
        cp_method=getattr(args, "cp_method", "ring"), experts=getattr(args, "experts", 0),
        top_k=getattr(args, "top_k", 1) if getattr(args, "experts", 0) else 1,
    )  # fmt: skip


def lines(m: Transformer, spec: str, s: MeshSetup, p: MeshPlan, gpu, room: float) -> list[str]:
    """The plan as `plan` prints it."""
    nodes = s.gpus_per_node or gpu.gpus_per_node
    out = [
        f"a transformer of {m.parameters:,} parameters ({spec}) on {p.workers} {gpu.name} "
        f"(mesh {s.mesh}, {nodes} GPUs per node), batch {s.global_batch_size} in {s.micro_batches} "
        f"micro-batches per replica, {s.schedule}, recompute {s.recompute}, "
        f"ZeRO stage {s.zero_stage} over dp"
        + (f"; each MLP {s.experts} experts, {s.top_k} per token" if s.experts else ""),
        "  memory per GPU (the first pipeline stage):",
    ]
    for label, value in (("parameters", p.params), ("gradients", p.grads),
                         ("optimiser state", p.optim), ("activations", p.activations)):  # fmt: skip
        out.append(f"    {label:30s} {value / GB:10.3f} GB")
    verdict = "fits" if p.memory <= room else f"does not fit: {(p.memory - room) / GB:.3f} GB over"
    out.append(f"    {'total':30s} {p.memory / GB:10.3f} GB of {room / GB:.3f} GB: {verdict}")
    out.append(f"  step {p.step_s:.4f} s:")
    overlap = "hidden behind backward" if s.overlap_grad_reduce else "after the pipeline drains"
    for label, value in (
        (f"compute ({gpu.matmul_efficiency:.4g} of peak)", p.compute_s),
        ("tp collectives (not overlapped)", p.tp_s),
        *([(CP_LABELS[s.cp_method], p.cp_s)] if p.cp_s else []),
        *([("ep all-to-alls (not overlapped)", p.ep_s)] if p.ep_s else []),
        ("pipeline bubble", p.bubble_s),
        ("pp messages", p.pp_s),
        (f"dp gradients ({overlap})", p.dp_s),
        ("optimiser step", p.optimizer_s),
    ):
        out.append(f"    {label:42s} {value:12.4f} s")
    out += [
        f"  MFU {p.mfu:.2%}: 72BsLh²(1 + s/(6h) + V/(12Lh)) / (step × GPUs × peak)",
        f"  HFU {p.hfu:.2%}: the FLOPs run, recomputed forward included "
        "(full: 96BsLh²(1 + s/(6h) + V/(16Lh)); selective: + 4Bs²hL) / (step × GPUs × peak)",
        f"  {p.tflops_per_gpu:.1f} TFLOP/s per GPU (HFU × {gpu.peak_flops / 1e12:g} TFLOP/s)",
    ]
    return out


def search_text(args: argparse.Namespace, room_gb: float | None) -> tuple[str, bool]:
    """``--search``: the best setup of each mesh, fastest first, and the meshes none of
    whose setups fit, with what they need."""
    from ..strategies.memory.mesh_search import best_per_mesh, refusal, search

    if args.transformer is None or getattr(args, "workers", None) is None:
        raise ConfigError("--search needs --transformer and --workers (the GPUs to search over)")
    if getattr(args, "mesh", None) is not None or getattr(args, "global_batch_size", None) is None:
        raise ConfigError("--search tries every mesh: give --global-batch-size, not --mesh")
    model, gpu = Transformer.parse(args.transformer), gpu_profile(args.gpu)
    room = gpu.memory_bytes if room_gb is None else room_gb * GB
    experts = getattr(args, "experts", 0)
    found = search(model, args.workers, args.global_batch_size, gpu, room,
                   getattr(args, "gpus_per_node", None), experts,
                   getattr(args, "top_k", 1) if experts else 1)  # fmt: skip
    best = best_per_mesh(found)
    if not best:
        raise ConfigError(refusal(found, args.workers, gpu, room))
    fitting = {c.dims for c in best}
    short = {}  # the least memory of each mesh none of whose setups fits
    for c in sorted(found, key=lambda c: c.plan.memory):
        if c.dims not in fitting and c.dims not in short:
            short[c.dims] = c
    if args.json:
        rows = [dict(rank=i + 1, **dataclasses.asdict(c.setup), **c.plan.as_dict())
                for i, c in enumerate(best)]  # fmt: skip
        misses = [dict(**dataclasses.asdict(c.setup), memory=c.plan.memory, over=c.plan.memory
                       - room) for c in short.values()]  # fmt: skip
        return json.dumps(dict(best=rows, do_not_fit=misses, setups=len(found)), indent=2), True
    n_fit = sum(c.fits for c in found)
    out = [
        f"{len(found)} setups of {args.workers} {gpu.name} for a transformer of "
        f"{model.parameters:,} parameters ({args.transformer}), batch {args.global_batch_size}:"
        f" {n_fit} fit in {room / GB:.3f} GB per GPU, {len(found) - n_fit} do not",
        f"  the fastest setup of each mesh ({len(best)} meshes fit; the first {args.top}):",
        f"  {'rank':>4} {'dp':>5} {'tp':>3} {'pp':>4} {'cp':>2} {'ep':>3} {'cp by':>7} "
        f"{'schedule':>16} {'V':>2} "
        f"{'recompute':>9} {'ZeRO':>4} {'micro':>5} {'step s':>10} {'MFU':>7} {'HFU':>7} "
        f"{'GB':>8}",
    ]
    for i, c in enumerate(best[: args.top]):
        (dp, tp, pp, cp, ep), s, p = c.dims, c.setup, c.plan
        method = s.cp_method if cp > 1 else "-"
        out.append(
            f"  {i + 1:>4} {dp:>5} {tp:>3} {pp:>4} {cp:>2} {ep:>3} {method:>7} "
            f"{s.schedule:>16} {s.virtual_stages:>2} "
            f"{s.recompute:>9} {s.zero_stage:>4} {c.micro_batch_size:>5} {p.step_s:>10.3f} "
            f"{p.mfu:>7.2%} {p.hfu:>7.2%} {p.memory / GB:>8.3f}"
        )
    out.append(f"  meshes none of whose setups fit ({len(short)}): the least memory of each")
    for c in short.values():
        over = (c.plan.memory - room) / GB
        out.append(f"    {c.setup.mesh}: {c.plan.memory / GB:.3f} GB, {over:.3f} GB over")
    return "\n".join(out), True


def plan_text(args: argparse.Namespace, room_gb: float | None) -> tuple[str, bool]:
    """The plan as text (JSON with ``--json``) and whether it fits."""
    if args.search:
        return search_text(args, room_gb)
    setup = _setup(args)
    model = Transformer.parse(args.transformer)
    gpu = gpu_profile(args.gpu)
    p = plan_mesh(model, setup, gpu, getattr(args, "workers", None))
    room = gpu.memory_bytes if room_gb is None else room_gb * GB
    fits = p.memory <= room
    if args.json:
        body = dict(transformer=args.transformer, gpu=gpu.key, setup=dataclasses.asdict(setup),
                    **p.as_dict(), device_memory_bytes=room, fits=fits)  # fmt: skip
        text = json.dumps(body, indent=2)
    else:
        text = "\n".join(lines(model, args.transformer, setup, p, gpu, room))
    return text, fits
