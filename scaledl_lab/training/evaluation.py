"""Evaluation on the validation and test splits, for every strategy's workers.

:class:`Evaluation` is part of :class:`.worker.WorkerContext`: a worker scores its own model
alone (:meth:`~Evaluation.evaluate_local`, where workers hold different models) or its share of
a model every worker holds (:meth:`~Evaluation.evaluate_shared`), and logs the rows.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..data import Dataset
from ..metrics import Row
from ..objective import correct_count, model_input, summed_loss

EVAL_BATCH = 250  # small enough that activations stay in cache


class Evaluation:
    """Scoring and its rows; needs the worker's ``config``, ``comm``, ``data``, ``device`` and
    ``log`` (:class:`.worker.WorkerContext` has them)."""

    config: Any
    comm: Any
    data: Any
    device: torch.device
    rank: int
    world_size: int
    log: Any

    def _local_eval(self, model: nn.Module, split: Dataset, idx: torch.Tensor) -> torch.Tensor:
        """[loss sum, correct, count] of ``model`` on ``split[idx]`` (eval mode, no grad)."""
        was_training = model.training
        model.eval()
        totals = torch.zeros(3, dtype=torch.float64)
        with torch.no_grad():
            for start in range(0, len(idx), EVAL_BATCH):
                part = idx[start : start + EVAL_BATCH]
                x = model_input(split.x[part], self.device, self.config.dtype)
                y = split.y[part].to(self.device)
                out = model(x)
                totals[0] += summed_loss(out, y).item()
                totals[1] += correct_count(out, y)
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
        at: float | None = None,
    ) -> dict[str, float]:
        """Evaluate this worker's own model on whole splits, alone (no communication).

        Used where workers hold different models (asynchronous and decentralised methods).
        Returns ``{kind: accuracy}`` and, with ``log``, records one row per split, stamped when
        it ends or at ``at``: when the weights it scores existed (an initial state fetched again).
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
                self.log_eval(kind, epoch, step, loss_sum, correct, count, time=at)
        return scores

    def log_eval(
        self,
        kind: str,
        epoch: float,
        step: int,
        loss_sum: float,
        correct: float,
        count: float,
        sent: int = 0,
        time: float | None = None,
    ) -> None:
        self.log(
            Row(
                kind=kind,
                epoch=epoch,
                step=step,
                time=self.comm.now() if time is None else time,
                loss=loss_sum / count,
                accuracy=correct / count,
                samples=int(count),
                bytes_sent=sent,
            )
        )

    async def evaluate_shared(
        self, model: nn.Module, *, epoch: float, step: int, defer: bool = False
    ) -> None:
        """Evaluate a model that is identical on every worker, splitting val and test by rank.

        Each rank scores every world_size-th sample; an allreduce sums the counts, and rank 0
        records the rows (after a worker died: the survivors split it, the first reports).

        ``defer``: the sum waits for :meth:`report_deferred`, so that no rank waits here for the
        others, for methods whose workers never wait for each other (unbounded NNT: otherwise a
        straggler, scoring its part slowly, would hold every fast worker at the start). The rows
        are stamped when the last rank had scored its part; a rank that dies before the report
        takes its part with it (the rows' ``samples`` say how many were scored).
        """
        alive = self.comm.survivors()
        for kind, split in (("val", self.data.val), ("test", self.data.test)):
            if len(split) == 0:
                continue
            # every len(alive)-th sample from this rank's place: none when the split is smaller
            idx = torch.arange(len(split))[alive.index(self.rank) :: len(alive)]
            async with self.comm.compute(len(idx) // 3):  # a forward pass is ~1/3 of a step
                totals = self._local_eval(model, split, idx)
            if defer:
                done = torch.zeros(self.world_size, dtype=torch.float64)  # when each rank was
                done[self.rank] = self.comm.now()
                self._deferred().append((kind, epoch, step, torch.cat([totals, done])))
                continue
            await self._sum_and_log(kind, epoch, step, totals, alive[0])

    async def report_deferred(self) -> None:
        """The sums of the deferred shared evaluations, their rows logged (every rank calls it,
        at the same point: a collective)."""
        pending, self._pending_evals = self._deferred(), []
        for kind, epoch, step, totals in pending:
            await self._sum_and_log(kind, epoch, step, totals, self.comm.survivors()[0])

    def _deferred(self) -> list[tuple[str, float, int, torch.Tensor]]:
        if not hasattr(self, "_pending_evals"):
            self._pending_evals: list[tuple[str, float, int, torch.Tensor]] = []
        return self._pending_evals

    async def _sum_and_log(
        self, kind: str, epoch: float, step: int, totals: torch.Tensor, reporter: int
    ) -> None:
        sent_before = self.comm.bytes_sent
        await self.comm.allreduce(totals)
        loss_sum, correct, count = totals[:3].tolist()
        if self.rank == reporter:
            at = totals[3:].max().item() if len(totals) > 3 else None  # deferred: when scored
            sent = self.comm.bytes_sent - sent_before
            self.log_eval(kind, epoch, step, loss_sum, correct, count, sent, time=at)
