"""What every per-worker program needs besides communication: model, data order, metrics, eval."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .config import ExperimentConfig
from .data import (
    Dataset,
    DataSplits,
    epoch_batches,
    load_dataset,
    shard_indices,
    steps_per_epoch,
)
from .models import build_model
from .runtime.base import Comm, DivergenceError, Row

_TEMPLATES: dict[tuple[Any, ...], nn.Module] = {}
EVAL_BATCH = 250  # small enough that activations stay in cache


@functools.lru_cache(maxsize=4)
def _cached_dataset(
    name: str,
    data_dir: str | None,
    val_size: int,
    train_subset: int | None,
    test_subset: int | None,
    seed: int,
) -> DataSplits:
    # Kept per worker process so that a sweep loads each dataset once per worker.
    return load_dataset(
        name,
        data_dir=data_dir,
        val_size=val_size,
        train_subset=train_subset,
        test_subset=test_subset,
        seed=seed,
    )


def load_for(cfg: ExperimentConfig) -> DataSplits:
    """The data a config names (cached: every worker, the driver and the simulator use it)."""
    return _cached_dataset(
        cfg.dataset, cfg.data_dir, cfg.val_size, cfg.train_subset, cfg.test_subset, cfg.seed
    )


def make_optimizer(cfg: ExperimentConfig, params: Any) -> torch.optim.Optimizer:
    """The optimiser named by the config (every worker and the sequential twin use this)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(
            params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
        )
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.Adagrad(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def grad_or_zeros(p: torch.Tensor) -> torch.Tensor:
    """A parameter's gradient, or zeros where backward gave it none."""
    return p.grad if p.grad is not None else torch.zeros_like(p)


def flat_grad(params: list[nn.Parameter]) -> torch.Tensor:
    """All parameter gradients flattened into one new tensor (zeros where there is none)."""
    return torch.cat([grad_or_zeros(p).reshape(-1) for p in params])


def check_finite(loss: float, *, rank: int, epoch: int, step: int) -> None:
    """Stop a diverged run with a recorded reason rather than training on NaNs."""
    if not math.isfinite(loss):
        raise DivergenceError(
            f"training diverged: loss={loss} at epoch {epoch}, step {step} (rank {rank}); "
            "lower the learning rate or add warmup"
        )


@dataclass
class WorkerContext:
    """Everything one worker's program may use; built by the runtime that hosts the worker."""

    config: ExperimentConfig
    comm: Comm
    data: DataSplits
    device: torch.device
    emit: Callable[[dict[str, Any]], None]
    run_label: str
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.world_size

    def __post_init__(self) -> None:
        cfg = self.config
        self.shard = shard_indices(
            self.data.train.y, self.world_size, self.rank, scheme=cfg.sharding, seed=cfg.seed
        )
        self.steps_per_epoch = steps_per_epoch(len(self.shard), cfg.batch_size)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"each worker's shard has {len(self.shard)} samples, fewer than "
                f"batch_size={cfg.batch_size}; use a smaller batch or more data"
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
        return copy.deepcopy(_TEMPLATES[key]).to(self.device, self.config.dtype)

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return make_optimizer(self.config, model.parameters())

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This worker's mini-batches for ``epoch``, in the order the sequential twin uses."""
        train = self.data.train
        for idx in epoch_batches(
            self.shard, self.config.batch_size, seed=self.config.seed, epoch=epoch, rank=self.rank
        ):
            yield train.x[idx].to(self.device, self.config.dtype), train.y[idx].to(self.device)

    def is_done(self, step: int) -> bool:
        return self.config.max_steps is not None and step >= self.config.max_steps

    # -- metrics --------------------------------------------------------------------------

    def log(self, row: Row) -> None:
        cfg = self.config
        record = {
            "run": self.run_label,
            "strategy": cfg.strategy,
            "runtime": cfg.runtime,
            "world_size": self.world_size,
            "rank": self.rank,
        }
        record.update(asdict(row))
        self.emit(record)

    def progress(self, step: int) -> float:
        """Training progress in epochs after ``step`` local steps."""
        return step / self.steps_per_epoch

    # -- evaluation -----------------------------------------------------------------------

    def _local_eval(self, model: nn.Module, split: Dataset, idx: torch.Tensor) -> torch.Tensor:
        """[loss sum, correct, count] of ``model`` on ``split[idx]`` (eval mode, no grad)."""
        was_training = model.training
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, len(idx), EVAL_BATCH):
                part = idx[start : start + EVAL_BATCH]
                x = split.x[part].to(self.device, self.config.dtype)
                y = split.y[part].to(self.device)
                out = model(x)
                totals[0] += F.cross_entropy(out, y, reduction="sum").item()
                totals[1] += (out.argmax(1) == y).sum().item()
                totals[2] += len(part)
        model.train(was_training)
        return totals

    async def evaluate_local(
        self,
        model: nn.Module,
        *,
        epoch: float,
        step: int,
        kinds: tuple[str, ...] = ("val", "test"),
        log: bool = True,
    ) -> dict[str, float]:
        """Evaluate this worker's own model on whole splits, alone (no communication).

        Used where workers hold different models (asynchronous and decentralised methods).
        Returns ``{kind: accuracy}`` and, with ``log``, records one row per split.
        """
        scores: dict[str, float] = {}
        for kind in kinds:
            split = self.data.val if kind == "val" else self.data.test
            if len(split) == 0:
                continue
            async with self.comm.compute(len(split) // 3):  # a forward pass ~1/3 of a step
                loss_sum, correct, count = self._local_eval(
                    model, split, torch.arange(len(split))
                ).tolist()
            scores[kind] = correct / count
            if log:
                self.log(
                    Row(
                        kind=kind,
                        epoch=epoch,
                        step=step,
                        time=self.comm.now(),
                        loss=loss_sum / count,
                        accuracy=correct / count,
                        samples=int(count),
                    )
                )
        return scores

    async def evaluate_shared(self, model: nn.Module, *, epoch: float, step: int) -> None:
        """Evaluate a model that is identical on every worker, splitting val and test by rank.

        Each rank scores every world_size-th sample; an allreduce sums the counts, and rank 0
        records the rows. Used by strategies with one global model (synchronous SGD).
        """
        for kind, split in (("val", self.data.val), ("test", self.data.test)):
            if len(split) == 0:
                continue
            idx = torch.arange(self.rank, len(split), self.world_size)
            async with self.comm.compute(len(idx) // 3):  # a forward pass is ~1/3 of a step
                totals = self._local_eval(model, split, idx)
            sent_before = self.comm.bytes_sent
            await self.comm.allreduce(totals)
            loss_sum, correct, count = totals.tolist()
            if self.comm.is_root:
                self.log(
                    Row(
                        kind=kind,
                        epoch=epoch,
                        step=step,
                        time=self.comm.now(),
                        loss=loss_sum / count,
                        accuracy=correct / count,
                        samples=int(count),
                        bytes_sent=self.comm.bytes_sent - sent_before,
                    )
                )


def server_rows(
    cfg: ExperimentConfig, run_label: str, stats: list[dict[str, Any]], time: float
) -> list[dict[str, Any]]:
    """One ``kind="server"`` row per hosted server (rank = workers + index): calls served in
    ``step``, bytes it sent in ``bytes_sent`` and bytes it received in ``bytes_received``."""
    rows = []
    for s in stats:
        row = Row(
            kind="server",
            epoch=float(cfg.epochs),
            step=int(s["calls"]),
            time=time,
            loss=float("nan"),
            accuracy=float("nan"),
            samples=0,
            bytes_sent=int(s["bytes_out"]),
        )
        record = {
            "run": run_label,
            "strategy": cfg.strategy,
            "runtime": cfg.runtime,
            "world_size": cfg.workers,
            "rank": cfg.workers + int(s["server"]),
            "bytes_received": int(s["bytes_in"]),
        }
        record.update(asdict(row))
        rows.append(record)
    return rows
