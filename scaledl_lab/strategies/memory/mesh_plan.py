"""A transformer given by its sizes on a mesh of GPUs (``scaledl-lab plan --transformer
L,H,A,S,V --mesh dp=D,tp=T,pp=P --gpu a100``): memory per GPU and step time, analytically.

Memory (bytes per GPU, on the first pipeline stage, which holds the most): 16-bit weights and
gradients and K = 12 bytes of optimiser state per parameter (float32 master weights, Adam's two
moments), the ZeRO stage sharding them over ``dp`` as :mod:`.zero` does; a stage holds L/P
blocks, of which the matrices and their column-split biases are split over ``tp`` (12h² + 7h
over T, 6h of LayerNorms and row-split biases whole), and the first stage the token and
position embeddings split over ``tp``. Activations of one layer and one micro-batch of b
sequences, Korthikanti et al. 2022 (16-bit, dropout masks included): sbh(10 + 24/T + 5as/(hT))
with tensor parallelism, sbh(34 + 5as/h)/T with sequence parallelism too; selective
recomputation drops the 5as/h term (attention's core runs again in backward), full
recomputation keeps 2sbh per layer (2sbh/T with sequence parallelism) and one layer's whole
activations while it runs again. The pipeline stash: 1F1B and ZB-H1 hold P micro-batches on the
first stage, L layers' worth; interleaved 1F1B L(1 + (P − 1)/(PV)); GPipe all m micro-batches
of its L/P layers. With P = 1, the output layer's 4sbh(1 + V/h)/T (Korthikanti's eq. 5).

Time: the FLOPs of Narayanan et al. 2021, 72BsLh²(1 + s/(6h) + V/(12Lh)) for a step without
recomputation (the model's, MFU's), 96BsLh²(1 + s/(6h) + V/(16Lh)) with full recomputation
(the forward again, the logits excepted: the hardware's, HFU's), + 4Bs²hL with selective (the
attention core's forward again); they run at the GPU's peak × its calibrated matmul efficiency
(:mod:`scaledl_lab.runtime.sim.gpus`), spread evenly over the D·T·P GPUs. Tensor parallelism's
allreduces (two in forward, two in backward per layer and micro-batch, two more with full
recomputation; sequence parallelism's all-gathers and reduce-scatters move the same bytes) of
bsh 16-bit values are priced by :mod:`scaledl_lab.runtime.sim.cost` on the link their group
crosses (NVLink inside a node) and are not overlapped, as Megatron-LM's are not. A micro-batch
on a stage takes its compute and collectives; the pipeline runs m + (P − 1)/V of them (the
bubble (P − 1)/(Vm) of 1F1B, GPipe and interleaved 1F1B; ZB-H1's (P − 1)/3, Qi et al. 2023, with
forward, input- and weight-gradient passes of equal time). Each micro-batch crosses every stage
boundary forward and back: 2(mV + P − 1) messages of bsh/T 16-bit values on the critical path
(Megatron's scatter/gather over the T links of a node). Data parallelism reduces the 16-bit
gradients of a GPU's parameters over ``dp`` (an allreduce, or ZeRO's reduce-scatter and
all-gather: the same bytes; stage 3 gathers the weights again for every micro-batch's forward
and backward) on the link its group crosses, after the pipeline drains, or hidden behind the
last micro-batch's backward with ``overlap_grad_reduce``. The optimiser's step moves its
calibrated bytes per parameter of the GPU's shard through GPU memory.

Context parallelism (``cp=C``) and expert parallelism (``ep=E`` with ``experts`` and
``top_k``), :mod:`.mesh_parts`: with cp every activation above (the attention scores of a
member's S/C queries against all S keys too), the tensor- and pipeline-parallel messages, divide
by C; the model states do not (every member holds the whole weights). The ring's blocks or
Ulysses' all-to-alls join each micro-batch's time. With experts each block's MLP (8h² + 5h) is
``experts`` such MLPs, experts/ep of them on a GPU (split over tp as the MLP is), with a router
of h·experts weights (whole); the MLP's FLOPs per token times k (Narayanan's 24h² per token and
layer becomes 8h² + 16kh², the router's 2h·experts left out), its inner activations (16sbh/T)
k times, and the all-to-alls of :mod:`.mesh_parts`. Every dp and ep rank is a data rank: the
global batch is split over dp × ep. ZeRO shards over dp; ZeRO-3 with cp or ep is not modelled.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ...errors import ConfigError
from ...runtime.sim.cost import allgather_time, allreduce_time, reduce_scatter_time
from ...runtime.sim.gpus import GPU
from ...runtime.sim.network import link_of
from ..mesh.grid import Mesh
from ..mesh.options import SCHEDULES
from .mesh_parts import CP_METHODS, context_layer_time, expert_layer_time, group_over
from .transformer import Transformer

RECOMPUTE = ("none", "selective", "full")
BYTES, OPTIMISER_K = 2, 12  # 16-bit weights, gradients, activations; float32 master and Adam


@dataclass(frozen=True)
class MeshSetup:
    """How the transformer is trained: the mesh, the global batch and its micro-batches per
    pipeline, the schedule, recomputation, ZeRO over ``dp``, the GPUs per node."""

    mesh: str
    global_batch_size: int
    micro_batches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero_stage: int = 0
    overlap_grad_reduce: bool = False
    gpus_per_node: int | None = None
    cp_method: str = "ring"
    experts: int = 0
    top_k: int = 1


@dataclass(frozen=True)
class MeshPlan:
    """Memory per GPU (bytes) and a step's time (seconds) by part, MFU and HFU."""

    params: float
    grads: float
    optim: float
    activations: float
    compute_s: float
    tp_s: float
    bubble_s: float
    pp_s: float
    dp_s: float
    optimizer_s: float
    cp_s: float
    ep_s: float
    step_s: float
    model_flops: float
    hardware_flops: float
    workers: int
    peak_flops: float

    @property
    def memory(self) -> float:
        return self.params + self.grads + self.optim + self.activations

    @property
    def mfu(self) -> float:
        """Model FLOPs (no recomputation) / (step time × GPUs × peak)."""
        return self.model_flops / (self.step_s * self.workers * self.peak_flops)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs (the recomputed forward too) / (step time × GPUs × peak)."""
        return self.hardware_flops / (self.step_s * self.workers * self.peak_flops)

    @property
    def tflops_per_gpu(self) -> float:
        """Hardware FLOP/s per GPU, in 10¹²: what Megatron-LM's Table 1 reports."""
        return self.hardware_flops / self.step_s / self.workers / 1e12

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "memory": self.memory, "mfu": self.mfu, "hfu": self.hfu,
                "tflops_per_gpu": self.tflops_per_gpu}  # fmt: skip


def model_flops(m: Transformer, batch: int, top_k: int = 1) -> float:
    """Narayanan et al. 2021's FLOPs of a step without recomputation: 72BsLh²(1 + s/(6h) +
    V/(12Lh)) (forward, and backward twice the forward, the logits included); with k experts
    per token the 1 is (1 + 2k)/3 (the MLP's two thirds of the h² term run k times)."""
    s, h, L, V = m.sequence, m.hidden, m.layers, m.vocabulary
    dense = (1 + 2 * top_k) / 3
    return 72 * batch * s * L * h * h * (dense + s / (6 * h) + V / (12 * L * h))


def hardware_flops(m: Transformer, batch: int, recompute: str, top_k: int = 1) -> float:
    """The FLOPs the GPUs run: with full recomputation Narayanan et al.'s 96BsLh²(1 + s/(6h) +
    V/(16Lh)) (each layer's forward again), with selective the attention core's forward again
    (4Bs²hL: QKᵀ and the product with V)."""
    s, h, L, V = m.sequence, m.hidden, m.layers, m.vocabulary
    if recompute == "full":
        dense = (1 + 2 * top_k) / 3
        return 96 * batch * s * L * h * h * (dense + s / (6 * h) + V / (16 * L * h))
    extra = 4 * batch * s * s * h * L if recompute == "selective" else 0
    return model_flops(m, batch, top_k) + extra


def layer_activation_bytes(m: Transformer, b: int, tp: int, sp: bool, recompute: str) -> float:
    """Korthikanti et al. 2022's bytes one layer keeps for backward for one micro-batch of
    ``b`` sequences (16-bit); with full recomputation, the layer's input only."""
    s, h, a = m.sequence, m.hidden, m.heads
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh / (tp if sp else 1)
    core = 0 if recompute == "selective" else 5 * a * s / h
    if sp:
        return sbh * (34 + core) / tp
    return sbh * (10 + 24 / tp + core / tp)


def check(m: Transformer, setup: MeshSetup, workers: int | None) -> Mesh:
    """The mesh, after every check a setup must pass before it is planned (ConfigError)."""
    mesh = Mesh.parse(setup.mesh)
    dp, tp, pp, cp, ep = (mesh.size(d) for d in ("dp", "tp", "pp", "cp", "ep"))
    where = f"mesh={setup.mesh!r}"
    if workers is not None and mesh.world_size != workers:
        raise ConfigError(
            f"{where}: its product {mesh.world_size} is not --workers {workers} (a worker is a GPU)"
        )
    if m.heads % tp:
        raise ConfigError(f"{where}: tp={tp} does not divide the {m.heads} attention heads")
    check_cp_ep(m, setup, where, tp, cp, ep)
    if setup.schedule not in SCHEDULES:
        raise ConfigError(f"pipeline schedule {setup.schedule!r}; allowed: {', '.join(SCHEDULES)}")
    v = setup.virtual_stages
    if v < 1 or (v > 1 and setup.schedule != "interleaved-1f1b"):
        raise ConfigError(
            f"virtual_stages={v}: a positive count, above 1 only with interleaved-1f1b"
        )
    if m.layers % (pp * v):
        raise ConfigError(
            f"{where}: pp={pp} × virtual stages {v} = {pp * v} does not divide the "
            f"{m.layers} layers"
        )
    B, micro = setup.global_batch_size, setup.micro_batches
    if micro < 1:
        raise ConfigError(f"--micro-batches {micro} must be a positive count")
    ranks = f"dp={dp}" if ep == 1 else f"dp × ep = {dp * ep}"
    dp = dp * ep  # every dp and ep rank is a data rank
    if B < 1 or B % dp:
        raise ConfigError(
            f"global batch {B} is not a positive multiple of {ranks} (sequences per replica)"
        )
    if (B // dp) % micro:
        raise ConfigError(
            f"global batch {B} over {ranks} is {B // dp} sequences per replica, which "
            f"--micro-batches {micro} does not divide"
        )
    if v > 1 and micro % pp:
        raise ConfigError(
            f"interleaved-1f1b needs the micro-batches ({micro}) a multiple of pp={pp}"
        )
    if setup.recompute not in RECOMPUTE:
        raise ConfigError(f"recompute={setup.recompute!r}; allowed: {', '.join(RECOMPUTE)}")
    if setup.gpus_per_node is not None and setup.gpus_per_node < 1:
        raise ConfigError(f"--gpus-per-node {setup.gpus_per_node} must be a positive count")
    if setup.zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_stage={setup.zero_stage}; allowed: 0, 1, 2, 3")
    if setup.zero_stage == 3 and cp * ep > 1:
        raise ConfigError(f"{where}: ZeRO-3 with cp or ep is not modelled; use stage 0, 1 or 2")
    return mesh


def check_cp_ep(m: Transformer, setup: MeshSetup, where: str, tp: int, cp: int, ep: int) -> None:
    """Context and expert parallelism's own checks (ConfigError)."""
    if setup.cp_method not in CP_METHODS:
        raise ConfigError(f"--cp-method {setup.cp_method!r}; allowed: {', '.join(CP_METHODS)}")
    if m.sequence % cp:
        raise ConfigError(f"{where}: cp={cp} does not divide the sequence of {m.sequence}")
    if cp > 1 and setup.cp_method == "ulysses" and (m.heads // tp) % cp:
        raise ConfigError(
            f"{where}: Ulysses splits the heads over cp: cp={cp} does not divide the "
            f"{m.heads // tp} heads each tp rank holds"
        )
    E, k = setup.experts, setup.top_k
    if E < 0 or (E and not 1 <= k <= E):
        raise ConfigError(f"--experts {E} --top-k {k}: experts ≥ 1 with 1 ≤ k ≤ experts")
    if ep > 1 and not E:
        raise ConfigError(f"{where}: ep={ep} splits the experts: give --experts N (--top-k K)")
    if E % ep:
        raise ConfigError(f"{where}: ep={ep} does not divide the {E} experts")


def plan_mesh(m: Transformer, setup: MeshSetup, gpu: GPU, workers: int | None = None) -> MeshPlan:
    """Memory per GPU and step time of ``m`` trained as ``setup`` says on ``gpu``s (module
    docstring)."""
    mesh = check(m, setup, workers)
    dp, tp, pp, cp, ep = (mesh.size(d) for d in ("dp", "tp", "pp", "cp", "ep"))
    n, v, micro = mesh.world_size, setup.virtual_stages, setup.micro_batches
    b = setup.global_batch_size // (dp * ep * micro)  # sequences per micro-batch
    s, h, L, V = m.sequence, m.hidden, m.layers, m.vocabulary
    E, k = setup.experts, setup.top_k if setup.experts else 1
    # -- memory: the first stage's shard of the model states, then its activations
    block = (12 * h * h + 7 * h) / tp + 6 * h
    expert_psi = 0.0  # the experts' parameters on this GPU
    if E:  # attention's, the norms', the router's; experts/ep MLPs
        expert_psi = L // pp * E // ep * ((8 * h * h + 4 * h) / tp + h)
        block = (4 * h * h + 3 * h) / tp + 5 * h + h * E
    psi = L // pp * block + expert_psi + (V * h) / tp + s * h
    shard = {0: (1, 1, 1), 1: (1, 1, dp), 2: (1, dp, dp), 3: (dp, dp, dp)}[setup.zero_stage]
    params, grads = BYTES * psi / shard[0], BYTES * psi / shard[1]
    optim = OPTIMISER_K * psi / shard[2]
    sp, rc = setup.sequence_parallel and tp > 1, setup.recompute
    per_layer = layer_activation_bytes(m, b, tp, sp, rc) / cp
    if E and rc != "full":  # the experts' inner activations k times
        per_layer += (k - 1) * 16 * s * b * h / tp / cp
    if pp == 1:  # micro-batches one after another: one micro-batch's L layers at a time
        in_flight = float(L)
    else:  # layers' worth of one micro-batch's activations the first stage holds
        in_flight = {
            "gpipe": L / pp * micro,
            "1f1b": L / pp * min(pp, micro),
            "zb-h1": L / pp * min(pp, micro),
            "interleaved-1f1b": min(L * (1 + (pp - 1) / (pp * v)), L / pp * micro),
        }[setup.schedule]
    activations = per_layer * in_flight
    if rc == "full":  # the layer run again holds its whole activations
        activations += layer_activation_bytes(m, b, tp, sp, "none") / cp
    if pp == 1:
        activations += 4 * s * b * h * (1 + V / h) / tp / cp
    # -- time: compute, tensor parallelism's collectives, the bubble, messages, gradients
    net, nodes = gpu.network, setup.gpus_per_node or gpu.gpus_per_node
    B = setup.global_batch_size
    hw, mf = hardware_flops(m, B, rc, k), model_flops(m, B, k)
    compute_mb = hw / (n * micro) / gpu.achieved_flops  # one micro-batch on one stage
    tp_link = link_of(net, nodes, mesh.group_of(0, "tp"))
    per_layer_collectives = 6 if rc == "full" else 4
    tp_mb = L / pp * per_layer_collectives * allreduce_time(BYTES * s * b * h / cp, tp, tp_link)
    attention_s = 12 * b * s * s * h / (cp * tp) / gpu.achieved_flops  # the ring hides behind
    cp_link = link_of(net, nodes, mesh.group_of(0, "cp"))
    cp_mb = L / pp * context_layer_time(setup.cp_method, b, m.heads // tp, s, cp, h // m.heads,
                                        BYTES, cp_link, attention_s, rc == "full")  # fmt: skip
    ep_mb = 0.0
    if ep > 1:
        tokens = b * s * k // cp // (tp if sp else 1)
        ep_link = link_of(net, nodes, mesh.group_of(0, "ep"))
        ep_mb = L / pp * expert_layer_time(tokens, h, ep, BYTES, ep_link, rc == "full")
    bubble_factor = (pp - 1) / (3 if setup.schedule == "zb-h1" else v)
    compute_s, tp_s, cp_s, ep_s = micro * compute_mb, micro * tp_mb, micro * cp_mb, micro * ep_mb
    bubble_s = bubble_factor * (compute_mb + tp_mb + cp_mb + ep_mb)
    pp_s = 0.0
    if pp > 1:
        pp_group = mesh.group_of(0, "pp")
        pp_link = link_of(net, nodes, pp_group[:2])
        messages = 2 * (micro * v + pp - 1)
        pp_s = messages * pp_link.message_time(BYTES * s * b * h / tp / cp)
    data = group_over(mesh, 0, ("dp", "cp", "ep"))  # the non-expert weights' gradients
    dp_link = link_of(net, nodes, data)
    grad_bytes = BYTES * psi
    dp_s = allreduce_time(BYTES * (psi - expert_psi), len(data), dp_link)
    if expert_psi:  # the experts' over dp × cp
        replicas = group_over(mesh, 0, ("dp", "cp"))
        dp_s += allreduce_time(BYTES * expert_psi, len(replicas), link_of(net, nodes, replicas))
    if setup.zero_stage == 3:  # the weights gathered for every micro-batch's forward, backward
        dp_s = reduce_scatter_time(grad_bytes, dp, dp_link) + 2 * micro * allgather_time(
            grad_bytes / dp, dp, dp_link
        )
    if setup.overlap_grad_reduce:  # behind the last micro-batch's backward (2/3 of its work)
        dp_s = max(0.0, dp_s - compute_mb * 2 / 3)
    optimizer_s = gpu.optimizer_bytes_per_parameter * psi / shard[2] / gpu.memory_bandwidth_Bps
    step = compute_s + tp_s + cp_s + ep_s + bubble_s + pp_s + dp_s + optimizer_s
    return MeshPlan(
        params=params, grads=grads, optim=optim, activations=activations,
        compute_s=compute_s, tp_s=tp_s, bubble_s=bubble_s, pp_s=pp_s, dp_s=dp_s,
        optimizer_s=optimizer_s, cp_s=cp_s, ep_s=ep_s, step_s=step, model_flops=mf,
        hardware_flops=hw, workers=n,
        peak_flops=gpu.peak_flops,
    )  # fmt: skip


def fits(plan: MeshPlan, gpu: GPU) -> bool:
    return math.isfinite(plan.memory) and plan.memory <= gpu.memory_bytes
