"""``scaledl-lab plan`` for gpt-tiny-moe on a mesh of ``dp`` and ``ep`` (#49): the parameters
one rank holds (the non-expert weights whole, 1/ep of the experts:
:func:`~scaledl_lab.strategies.mesh.experts.held_parameters`), the bytes it sends in a step from
the formulas (the dispatch and combine all-to-alls of every block, forward and backward, then
the non-expert gradients' average over all D·E data ranks and the experts' sum over ``dp``), and
its ledger and simulated step from two steps of the mesh on the simulator (the second's time)."""

from __future__ import annotations

from dataclasses import dataclass

from ... import families
from ...config import ExperimentConfig
from ...data import num_classes, sample_shape
from ...errors import ConfigError
from ...experiment import run
from ...models import build_model
from ...moe import capacity
from ...runtime.collectives import all_to_all_bytes, ring_allreduce_bytes
from ...strategies.memory.plan import Plan
from ...strategies.mesh.experts import held_parameters
from ...strategies.mesh.grid import Mesh
from ...training.ledger import CATEGORIES, StepMemory


@dataclass(frozen=True)
class ExpertPlan:
    """An ep mesh's plan: the :class:`Plan` (ledger, step seconds, bytes sent), the parameters
    a rank holds, and the bytes of the all-to-alls and of the gradients' reductions."""

    plan: Plan
    held_parameters: int
    all_to_all_bytes: int
    gradient_bytes: int


def all_to_all_per_step(cfg: ExperimentConfig, sequence: int, hidden: int, layers: int) -> int:
    """Bytes one rank's all-to-alls send in a step: 4 per MoE layer (dispatch and combine, and
    their backwards) of the experts' buffers (experts, capacity, hidden) of its batch."""
    ep = Mesh.parse(cfg.mesh).size("ep")
    places = capacity(cfg.batch_size * sequence, cfg.top_k, cfg.experts, cfg.capacity_factor)
    buffers = cfg.experts * places * hidden * cfg.dtype.itemsize
    return 4 * layers * all_to_all_bytes(buffers, ep)


def plan_experts(cfg: ExperimentConfig) -> ExpertPlan:
    """The plan of gpt-tiny-moe on a mesh of ``dp`` and ``ep``."""
    if cfg.model != "gpt-tiny-moe":
        raise ConfigError(f"plan_experts predicts gpt-tiny-moe on an ep mesh; not {cfg.model!r}")
    mesh = Mesh.parse(cfg.mesh)
    dp, ep, size = mesh.size("dp"), mesh.size("ep"), cfg.dtype.itemsize
    shape = sample_shape(cfg.dataset)
    model = build_model(cfg.model, shape, num_classes(cfg.dataset), seed=cfg.seed)
    model = families.prepare_model(cfg, model)  # the config's experts
    held = held_parameters(model, ep)
    experts = sum(p.numel() for m in model.mixtures() for p in m.experts.parameters())
    rest = held - experts // ep  # the non-expert weights, whole on every rank
    gradients = ring_allreduce_bytes(rest * size, dp * ep)
    gradients += ring_allreduce_bytes(experts // ep * size, dp)
    layers, hidden = len(model.blocks), model.embed.token.embedding_dim
    exchanged = all_to_all_per_step(cfg, shape[0], hidden, layers)
    one = cfg.replace(runtime="sim", max_steps=2, epochs=1, val_size=0, test_subset=1,
                      train_subset=2 * cfg.batch_size * dp * ep)  # fmt: skip
    res = run(one, progress=False, log=None)
    steps = res.frame[(res.frame["kind"] == "train") & (res.frame["rank"] == 0)]
    train, step_s = steps.iloc[-1], float(steps["time"].diff().iloc[-1])  # the second step's
    memory = StepMemory(*(float(train[f"mem_{k}"]) for k in CATEGORIES))
    return ExpertPlan(Plan(memory, step_s, exchanged + gradients), held, exchanged, gradients)
