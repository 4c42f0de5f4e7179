"""What every per-worker program needs besides communication: the per-worker loop vocabulary.

A strategy is an ``async def`` taking a :class:`WorkerContext`: its model and optimiser, its
batches in the order the sequential twins use, how many steps it takes and where epochs end,
evaluation, metric rows and the result it returns. ``launch.BoundProgram`` binds a strategy to
a config so that a runtime (which knows nothing of either) can run it on every rank.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .. import families
from ..config import ExperimentConfig
from ..data import DataSplits, epoch_batches, shard_indices
from ..metrics import Row, record
from ..models import build_model
from ..moe import Load, MoE
from ..moe import columns as moe_columns
from ..objective import model_input
from ..params import state_dict_cpu
from ..runtime.base import Comm
from . import precision_checks  # noqa: F401  (the config's check of precision, registered)
from .evaluation import EVAL_BATCH, Evaluation
from .faults import kill_step
from .health import check_finite
from .plan import load_for, make_optimizer, steps_per_epoch_of, total_steps
from .precision import Precision
from .profile import StepProfiler
from .schedule import StepPlan, set_lr

__all__ = [
    "EVAL_BATCH",
    "Program",
    "StepStats",
    "WorkerContext",
    "check_finite",
    "load_for",
    "lr_of",
    "make_optimizer",
    "steps_per_epoch_of",
    "total_steps",
]

_TEMPLATES: dict[tuple[Any, ...], nn.Module] = {}


@dataclass(frozen=True)
class StepStats:
    """What one local step measured on its own mini-batch."""

    loss: float
    correct: float  # samples predicted right (a sequence: the share of its tokens)
    samples: int


def lr_of(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate the optimiser's (first) parameter group steps with."""
    return optimizer.param_groups[0]["lr"]


@dataclass
class WorkerContext(Evaluation):
    """Everything one worker's program may use; built by the runtime that hosts the worker."""

    config: ExperimentConfig
    comm: Comm
    data: DataSplits
    device: torch.device
    emit: Callable[[dict[str, Any]], None]
    run_label: str
    result: dict[str, Any] = field(default_factory=dict)
    resume: dict[str, Any] | None = None  # this rank's checkpoint, when a run is resumed
    # gpt-tiny-moe: what its mixtures routed since the last train row (the moe_* columns)
    moe_loads: list[Load] = field(default_factory=list)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    @property
    def data_rank(self) -> int:
        """This worker's replica: the workers that split one model read the same batches."""
        return families.placement(self.config, self.rank)[1]

    def __post_init__(self) -> None:
        cfg = self.config
        labels = self.data.train.y.cpu()  # indices on the CPU, wherever the data lives
        self.shard = shard_indices(
            labels, cfg.replicas, self.data_rank, scheme=cfg.sharding, seed=cfg.seed
        )
        self.plan = StepPlan.build(cfg, len(self.shard))  # each epoch's steps, batch; each rate
        self.steps_per_epoch = self.plan.steps_per_epoch
        self.total_steps = self.plan.total_steps
        self.bytes_saved = self._saved_logged = 0  # compression's codecs count what they save
        self.kill_step = kill_step(cfg.faults, cfg.workers, self.rank)  # an injected fault
        self.precision = Precision.of(cfg)  # 16 bits: logits cast, master weights, loss scale
        self._drawn = 0  # batches drawn so far: the step whose batch is drawn next is one more
        self.profiler = (  # --profile-step K on real workers (the simulator's is its timeline)
            StepProfiler(cfg.profile_step, self.result, self.device)
            if cfg.profile_step is not None and cfg.runtime == "dask"
            else None
        )

    # -- model and data -------------------------------------------------------------------

    def build_model(self) -> nn.Module:
        """The model, initialised from the run's seed: the same weights on every worker."""
        data = self.data
        key = (self.config.model, data.input_shape, data.num_classes, self.config.seed)
        if key not in _TEMPLATES:
            # Copying a template is cheaper than drawing the initial weights again, which
            # matters when the simulator builds hundreds of replicas.
            _TEMPLATES.clear()
            _TEMPLATES[key] = build_model(key[0], key[1], key[2], seed=key[3])
        model = families.prepare_model(self.config, copy.deepcopy(_TEMPLATES[key]))
        model = model.to(self.device, self.config.dtype)
        self.moe_loads = [m.load for m in model.modules() if isinstance(m, MoE)]
        return model if self.precision is None else self.precision.attach(model)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return self.make_optimizer(model.parameters())

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        """The config's optimiser of ``params``; in 16 bits, stepping float32 master weights."""
        return make_optimizer(self.config, params, self.precision)

    def set_lr(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Before local step ``step`` (0-based): the scheduled rate into every group; returned."""
        return set_lr(optimizer, self.plan.lr(step))

    async def start(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        """The model and its optimiser, the model evaluated before training (all together)."""
        model = self.build_model()
        optimizer = self.build_optimizer(model)
        await self.evaluate_shared(model, epoch=0.0, step=0)
        return model, optimizer

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This worker's mini-batches for ``epoch``, in the order the sequential twin uses
        (``accumulate`` micro-batches each; their size follows a batch schedule)."""
        train = self.data.train
        cfg = self.config
        size = self.plan.batch_size(epoch) * cfg.accumulate
        for idx in epoch_batches(self.shard, size, seed=cfg.seed, epoch=epoch, rank=self.data_rank):
            x = model_input(train.x[idx], self.device, self.config.dtype)
            self._drawn += 1
            if self.profiler is not None:
                self.profiler.drawn(self._drawn)
            yield x, train.y[idx].to(self.device)

    def local_batches(self, start: int = 0) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This worker's first ``total_steps`` mini-batches, epoch after epoch (after the
        first ``start``: a resumed run)."""
        taken = 0
        for epoch in range(self.config.epochs):
            for x, y in self.batches(epoch):
                if taken >= self.total_steps:
                    return
                taken += 1
                if taken > start:
                    yield x, y

    def batches_forever(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This worker's batches, epoch after epoch (asynchronous workers draw until the end)."""
        epoch = 0
        while True:
            yield from self.batches(epoch)
            epoch += 1

    def is_boundary(self, step: int) -> bool:
        """After ``step`` local steps: the end of an epoch, or of the run."""
        return self.plan.is_boundary(step)

    # -- metrics --------------------------------------------------------------------------

    def log(self, row: Row) -> None:
        cfg = self.config
        self.emit(
            record(
                row,
                run=self.run_label,
                strategy=cfg.strategy,
                runtime=cfg.runtime,
                world_size=self.world_size,
                rank=self.rank,
            )
        )

    def log_train(
        self,
        step: int,
        stats: StepStats,
        *,
        sent: int = 0,
        lr: float = math.nan,
        staleness: float = math.nan,
        epoch: float | None = None,
        counted: int | None = None,
        memory: dict[str, float] | None = None,
    ) -> None:
        """The ``kind="train"`` row of local step ``step`` (epoch: local progress by default).
        Compressed runs add ``bytes_uncompressed``: ``sent`` + what the codecs saved since.
        Every strategy calls :meth:`die_if_killed` right after it (an injected fault).

        ``counted``: the samples this row adds to the run's throughput, when several workers
        share one mini-batch (a pipeline counts it once, on its last stage); default all.
        ``memory``: the step's ``mem_*`` columns (:meth:`.ledger.StepMemory.columns`).
        gpt-tiny-moe's ``moe_*`` columns come from :attr:`moe_loads`.
        """
        if self.profiler is not None:
            self.profiler.logged(step)
        uncompressed = sent + self.bytes_saved - self._saved_logged
        self._saved_logged = self.bytes_saved
        self.log(
            Row(
                kind="train",
                epoch=self.progress(step) if epoch is None else epoch,
                step=step,
                time=self.comm.now(),
                loss=stats.loss,
                accuracy=stats.correct / stats.samples,
                samples=stats.samples if counted is None else counted,
                bytes_sent=sent,
                staleness=staleness,
                lr=lr,
                effective_batch_size=self.plan.effective_batch(step - 1),
                bytes_uncompressed=uncompressed if self.config.compress != "none" else math.nan,
                **(memory or {}),
                **(self.precision.columns() if self.precision is not None else {}),
                **moe_columns(self.moe_loads),
            )
        )

    def die_if_killed(self, step: int) -> None:
        """End this worker after its step ``step`` if the run injects ``kill:RANK:STEP`` there,
        as a crash would: a ``worker-lost`` row records the shard lost with it, then
        :meth:`Comm.die` (on Dask the process exits, ``os._exit``; the simulator raises)."""
        if step == self.kill_step:
            self.log(Row(kind="worker-lost", epoch=self.progress(step), step=step,
                         time=self.comm.now(), samples=len(self.shard)))  # fmt: skip
            self.comm.die(step)

    def log_event(
        self, *, step: int, micro_batch: int, phase: str, start: float, end: float, chunk: int = 0
    ) -> None:
        """One forward or backward of a pipeline stage (of its ``chunk``, where a worker holds
        several): a row of the events table."""
        cfg = self.config
        stage = self.rank % cfg.model_parallel_size
        self.emit({"table": "events", "run": self.run_label, "rank": self.rank,
                   "replica": self.data_rank, "stage": stage, "step": step,
                   "micro_batch": micro_batch, "phase": phase, "start": start,
                   "end": end, "chunk": chunk})  # fmt: skip

    def keep_model(self, model: nn.Module, key: str = "state_dict") -> None:
        """Return ``model``'s final weights from this rank (CPU copies) under ``key``."""
        self.result[key] = state_dict_cpu(model)

    def progress(self, step: int) -> float:
        """Training progress in epochs after ``step`` local steps."""
        return self.plan.progress(step)


Program = Callable[[WorkerContext], Awaitable[None]]
