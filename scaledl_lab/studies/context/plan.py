"""``scaledl-lab plan`` for a mesh of ``dp`` and ``cp`` (#49): the bytes a rank sends in a step
from the formulas (ring attention's key/value blocks or Ulysses' all-to-alls in every block,
forward and backward, then the gradients' average over ``cp`` and over ``dp``), and its ledger
and simulated step from two steps of the mesh on the simulator (the second's time; the
activations of a rank's positions: about 1/C of the unsplit mesh's, :mod:`.study`'s memory
table)."""

from __future__ import annotations

from dataclasses import dataclass

from ... import gpt
from ...config import ExperimentConfig
from ...errors import ConfigError
from ...experiment import run
from ...runtime.collectives import ring_allreduce_bytes
from ...strategies.memory.plan import Plan
from ...strategies.mesh.grid import Mesh
from ...training.ledger import CATEGORIES, StepMemory
from .study import ring_bytes, ulysses_bytes

STATS = 16  # a step's loss sum and correct count (two float64), averaged over cp


@dataclass(frozen=True)
class ContextPlan:
    """A cp mesh's plan: the :class:`Plan` (ledger, step seconds, bytes sent), and the part of
    the bytes that is the attention's (``attention_bytes``) and the weights' average's."""

    plan: Plan
    attention_bytes: int
    gradient_bytes: int


def attention_bytes(cfg: ExperimentConfig, sequence: int, size: int) -> int:
    """Bytes one rank's attention sends in a step over ``cfg``'s cp group: every block's
    forward and backward (:func:`.study.ring_bytes`, :func:`.study.ulysses_bytes`) for the
    rank's whole batch (the micro-batches' add up to it)."""
    c = Mesh.parse(cfg.mesh).size("cp")
    formula = ring_bytes if cfg.cp_method == "ring" else ulysses_bytes
    d = gpt.HIDDEN // gpt.HEADS
    return gpt.LAYERS * formula(cfg.batch_size, gpt.HEADS, sequence, c, d, size)


def plan_context(cfg: ExperimentConfig) -> ContextPlan:
    """The plan of a mesh of ``dp`` and ``cp`` (tp = pp = 1, no ZeRO: the weights whole on
    every rank)."""
    mesh = Mesh.parse(cfg.mesh)
    others = [f"{n}={mesh.size(n)}" for n in ("tp", "pp") if mesh.size(n) > 1]
    if others or cfg.zero_stage:
        also = others + ([f"zero_stage={cfg.zero_stage}"] if cfg.zero_stage else [])
        raise ConfigError(
            f"plan predicts a mesh of dp and cp (the weights whole on every rank); not "
            f"{', '.join(also)}"
        )
    one = cfg.replace(runtime="sim", max_steps=2, epochs=1, val_size=0, test_subset=1,
                      train_subset=2 * cfg.batch_size * mesh.size("dp"))  # fmt: skip
    res = run(one, progress=False, log=None)
    steps = res.frame[(res.frame["kind"] == "train") & (res.frame["rank"] == 0)]
    train, step_s = steps.iloc[-1], float(steps["time"].diff().iloc[-1])  # the second step's
    size = res.configs[0].dtype.itemsize
    sequence = res.model_state_dict()["embed.position.weight"].shape[0]
    params = int(train["mem_params"])  # the whole model on every rank
    c, dp = mesh.size("cp"), mesh.size("dp")
    gradients = ring_allreduce_bytes(params, c) + ring_allreduce_bytes(params, dp)
    attention = attention_bytes(cfg, sequence, size)
    memory = StepMemory(*(float(train[f"mem_{k}"]) for k in CATEGORIES))
    sent = attention + gradients + ring_allreduce_bytes(STATS, c)
    return ContextPlan(Plan(memory, step_s, sent), attention, gradients)
