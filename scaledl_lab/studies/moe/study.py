"""The measurements behind expert parallelism's claims, each read from runs on the simulator.

- :func:`capacity_table`: gpt-tiny-moe on ``ep=2`` at several capacity factors: the share of
  assignments dropped and the all-to-all bytes its metrics recorded, the simulated step, and
  the experts' buffers and FLOPs counted in a forward of one rank's batch (hooks on the experts),
  each beside its formula (places ``C = ceil(f·T·k/E)``, buffers ``E·C·h`` elements per layer,
  ``16·h²`` FLOPs per place and layer, four all-to-alls of the buffers per layer and step). The
  simulator charges a step's compute from the default mixture's FLOPs whatever the factor, so
  the simulated step grows by the all-to-alls alone; the experts' FLOPs are the hooks' count.
- :func:`balance_table`: the same mesh trained longer at several load-balancing weights α, per
  step the busiest expert's load over the mean, the dropped share, the aux loss and the loss.
- :func:`network_table`: ``dp=2,ep=4`` on an H100 node's two-tier network with 8, 4 and 2 GPUs a
  node (the ep group on one node, or across two), the simulated step beside the all-to-alls'
  time by the cost model's formula on the link the ep group crosses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import torch

from ... import families
from ...config import ExperimentConfig
from ...data import num_classes, sample_shape
from ...experiment import run
from ...models import build_model
from ...moe import Expert, capacity
from ...runtime.collectives import all_to_all_bytes
from ...runtime.sim.cost import all_to_all_time
from ...runtime.sim.network import NETWORKS, link_of
from ...strategies.mesh.grid import Mesh

BASE = dict(
    strategy="mesh", runtime="sim", dataset="licenses", model="gpt-tiny-moe", val_size=8,
    test_subset=8, batch_size=8, epochs=1, lr=0.05, momentum=0.9, precision="float32", seed=1,
    compute_profile="h100", experts=4, top_k=1,
)  # fmt: skip
FACTORS = (0.5, 1.0, 1.25, 2.0)
WEIGHTS = (0.0, 0.01, 0.1, 1.0)  # 0.01: Switch's α
BALANCE_STEPS = 80
SEEDS = (1, 2, 3)
NETWORK = "h100-node"
PLACEMENTS = (8, 4, 2)  # GPUs a node for dp=2,ep=4: one node; ep inside a node; ep across two
BYTES = 4  # float32


def config(mesh: str, steps: int, **extra: Any) -> ExperimentConfig:
    """gpt-tiny-moe on ``mesh`` for ``steps`` steps, each rank its own batch of 8."""
    workers = Mesh.parse(mesh).world_size
    fields = {**BASE, "train_subset": steps * 8 * workers, "max_steps": steps, **extra}
    return ExperimentConfig(**fields, mesh=mesh, workers=workers)


def _train(cfg: ExperimentConfig) -> pd.DataFrame:
    return run(cfg, progress=False, log=None).frame.query("kind == 'train'")


def counted(cfg: ExperimentConfig) -> dict[str, int]:
    """The experts' input buffers (elements, every layer) and FLOPs (2 a multiply-accumulate of
    their two Linears) in one forward of a rank's batch of random tokens, counted by hooks."""
    shape = sample_shape(cfg.dataset)
    model = build_model(cfg.model, shape, num_classes(cfg.dataset), seed=cfg.seed)
    model = families.prepare_model(cfg, model)
    seen = {"buffer_elements": 0, "expert_flops": 0}

    def hook(module: Expert, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        (x,) = inputs
        seen["buffer_elements"] += x.numel()
        macs = sum(lin.in_features * lin.out_features for lin in (module.fc, module.proj))
        seen["expert_flops"] += 2 * x.shape[0] * macs

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, Expert)]
    tokens = torch.randint(0, model.vocabulary, (cfg.batch_size, *shape))
    with torch.no_grad():
        model(tokens)
    for h in handles:
        h.remove()
    return seen


def formulas(cfg: ExperimentConfig) -> dict[str, int]:
    """Places per expert, the buffers' elements and the experts' FLOPs per forward (every layer)
    and the all-to-all bytes per step of one rank, from the config alone."""
    model = build_model(cfg.model, sample_shape(cfg.dataset), num_classes(cfg.dataset), seed=0)
    layers, hidden = len(model.blocks), model.embed.token.embedding_dim
    tokens = cfg.batch_size * sample_shape(cfg.dataset)[0]
    places = capacity(tokens, cfg.top_k, cfg.experts, cfg.capacity_factor)
    buffer = cfg.experts * places * hidden
    ep = Mesh.parse(cfg.mesh).size("ep")
    return {"layers": layers, "places": places, "buffer_formula": layers * buffer,
            "flops_formula": layers * cfg.experts * places * 16 * hidden**2,
            "all_to_all_formula": 4 * layers * all_to_all_bytes(buffer * BYTES, ep)}  # fmt: skip


def capacity_table(factors: Sequence[float] = FACTORS, steps: int = 10) -> pd.DataFrame:
    """Per capacity factor, ``ep=2``: the dropped share (mean over steps and ranks), the
    all-to-all bytes rank 0 recorded (every step alike), its last step's simulated seconds, the
    counted buffers and FLOPs (:func:`counted`) and the formulas (:func:`formulas`)."""
    rows = []
    for factor in factors:
        cfg = config("ep=2", steps, capacity_factor=factor)
        train = _train(cfg)
        first = train[train["rank"] == 0]
        sent = sorted(set(first["bytes_all_to_all"]))
        rows.append({"capacity_factor": factor, **formulas(cfg),
                     "dropped": train["moe_dropped"].mean(),
                     "load_max": train["moe_load_max"].mean(),
                     "bytes_all_to_all": sent[0] if len(sent) == 1 else -1,
                     "step_s": float(first["time"].diff().iloc[-1]),
                     **counted(cfg)})  # fmt: skip
    table = pd.DataFrame(rows)
    table["buffer_bytes"] = table["buffer_elements"] * BYTES
    return table


def balance_table(
    weights: Sequence[float] = WEIGHTS, steps: int = BALANCE_STEPS,
    seeds: Sequence[int] = SEEDS,
) -> pd.DataFrame:  # fmt: skip
    """Per seed, α and step, ``ep=2``: the ranks' mean of the busiest expert's load over the
    mean load, the dropped share, the aux loss, and the loss."""
    parts = []
    columns = ["moe_load_max", "moe_dropped", "moe_aux_loss", "loss"]
    for seed in seeds:
        for weight in weights:
            cfg = config("ep=2", steps, aux_loss_weight=weight, seed=seed)
            per_step = _train(cfg).groupby("step")[columns].mean().reset_index()
            parts.append(per_step.assign(aux_loss_weight=weight, seed=seed))
    table = pd.concat(parts, ignore_index=True)
    return table[["aux_loss_weight", "seed", "step", *columns]]


def network_table(placements: Sequence[int] = PLACEMENTS, steps: int = 3) -> pd.DataFrame:
    """Per GPUs a node, ``dp=2,ep=4`` on :data:`NETWORK`: rank 0's last simulated step, the
    link its ep group crosses, the all-to-alls' seconds per step by the cost model's formula
    (four per layer of the buffers, :func:`~scaledl_lab.runtime.sim.cost.all_to_all_time`) and
    their share of the step."""
    rows = []
    network = NETWORKS[NETWORK]
    for gpus in placements:
        cfg = config("dp=2,ep=4", steps, network=NETWORK, gpus_per_node=gpus)
        first = _train(cfg).query("rank == 0")
        mesh = Mesh.parse(cfg.mesh)
        group = mesh.group_of(0, "ep")
        link = link_of(network, gpus, group)
        f = formulas(cfg)
        buffer = f["buffer_formula"] // f["layers"] * BYTES  # one layer's, bytes
        seconds = 4 * f["layers"] * all_to_all_time(buffer, len(group), link)
        step = float(first["time"].diff().iloc[-1])
        rows.append({"gpus_per_node": gpus, "ep_link": link.name,
                     "bytes_all_to_all": int(first["bytes_all_to_all"].iloc[-1]),
                     "all_to_all_formula": f["all_to_all_formula"], "step_s": step,
                     "all_to_all_s": seconds, "all_to_all_share": seconds / step})  # fmt: skip
    return pd.DataFrame(rows)
