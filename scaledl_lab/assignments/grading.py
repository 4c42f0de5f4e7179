"""Named, scored checks and the report a grader hands back (the autograder's test cells
assert one check each, so a failing submission is told which property it broke)."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from ..errors import RunError

# What every assignment's runs share: MNIST-1D (40 values a sample, generated, no download), the
# lab's MLP, float64 (twins to rounding), one epoch of a subset; each grader adds its strategy,
# batch and steps.
TINY_RUN = dict(
    dataset="mnist1d", model="mlp", precision="float64", train_subset=1200, test_subset=200,
    val_size=200, epochs=1, lr=0.05, momentum=0.9,
)  # fmt: skip


@dataclass(frozen=True)
class Check:
    """One property of a submission: its name (``q1-sum-sim``), points, outcome and why."""

    name: str
    points: float
    passed: bool
    detail: str

    @property
    def score(self) -> float:
        return self.points if self.passed else 0.0


@dataclass(frozen=True)
class Report:
    """Every check of one submission, in order; ``require(name)`` is what a test cell calls."""

    checks: tuple[Check, ...]

    @property
    def score(self) -> float:
        return sum(c.score for c in self.checks)

    @property
    def total(self) -> float:
        return sum(c.points for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if not c.passed]

    def __getitem__(self, name: str) -> Check:
        for check in self.checks:
            if check.name == name:
                return check
        raise KeyError(f"no check {name!r}; the checks are {[c.name for c in self.checks]}")

    def require(self, name: str) -> None:
        """An AssertionError naming check ``name`` and saying why, unless it passed."""
        check = self[name]
        if not check.passed:
            raise AssertionError(f"{check.name} failed: {check.detail}")

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([vars(c) | {"score": c.score} for c in self.checks])

    def __str__(self) -> str:
        lines = [f"{self.score:g} / {self.total:g} points"]
        for c in self.checks:
            mark = "pass" if c.passed else "FAIL"
            lines.append(f"  {mark}  {c.name:<20} {c.score:g}/{c.points:g}  {c.detail}")
        return "\n".join(lines)


class CheckFailed(Exception):
    """Raised inside a check's body: the check fails with this message."""


def describe(exc: BaseException) -> str:
    """What a failed check says about an exception: a check's own verdict as it is, the
    runtime's words for a run that stopped (a deadlock, a timeout, a lost worker), else the
    exception with the line of the submission (or library) that raised it."""
    if isinstance(exc, CheckFailed):
        return str(exc)
    if isinstance(exc, RunError):
        return f"the run failed: {type(exc).__name__}: {exc}"
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return f"{type(exc).__name__}: {exc} (line {where.lineno} of {where.name})"


def attempt(name: str, points: float, body: Callable[[], str]) -> Check:
    """Run one check's ``body``: it returns what it measured, or raises and the check fails."""
    try:
        return Check(name, points, True, body())
    except Exception as exc:
        return Check(name, points, False, describe(exc))


def failed_all(names: Iterable[tuple[str, float]], why: str) -> list[Check]:
    """The checks that could not run because what they depend on failed first."""
    return [Check(name, points, False, why) for name, points in names]


def mismatch(what: str, got: Any, want: Any, tolerance: float = 1e-10) -> str | None:
    """Why ``got`` is not the tensor ``want`` (within ``tolerance``), or None."""
    if not isinstance(got, torch.Tensor):
        return f"{what} is a {type(got).__name__}, not a tensor"
    if got.shape != want.shape:
        return f"{what} has shape {tuple(got.shape)}, not {tuple(want.shape)}"
    gap = (got.detach() - want).abs().max().item()
    if gap > tolerance:
        return f"{what} is off by up to {gap:.3g} (float64 allows {tolerance:g})"
    return None


def expect(what: str, got: Any, want: Any, *, where: str = "", then: str = "") -> None:
    """A CheckFailed, ``where`` + why + ``then``, unless ``got`` is ``want``."""
    why = mismatch(what, got, want)
    if why is not None:
        raise CheckFailed(f"{where}{why}{then}")


def train_rows(res: Any) -> pd.DataFrame:
    """A run's training rows (``res``: its Results); a CheckFailed if the program logged none."""
    train = res.frame[res.frame.kind == "train"]
    if train.empty:
        raise CheckFailed("no training rows: log each step with ctx.log_train(step, stats, sent=)")
    return train


def require_step_bytes(res: Any, expected: float, slack: float, why: str, where: str = "") -> None:
    """A CheckFailed naming the first training row whose logged ``bytes_sent`` is more than
    ``slack`` from ``expected``: ``where``, its rank, bytes and step, then ``why``."""
    train = train_rows(res)
    off = train[(train.bytes_sent - expected).abs() > slack]
    if len(off):
        row = off.iloc[0]
        raise CheckFailed(
            f"{where}rank {int(row['rank'])} logged {int(row.bytes_sent)} bytes at step "
            f"{int(row.step)}; {why}"
        )


def state_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between two state dicts' tensors, in float64."""
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)
