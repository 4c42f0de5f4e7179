"""benchmarks/pipeline_profile.py: a real pipeline's step taken apart from its events table."""

from __future__ import annotations

import pandas as pd
import pytest
from common import benchmark_module


def _gpipe_step(step: int, hand: float, at: float) -> list[dict]:
    """GPipe, 2 stages, 2 micro-batches, F = 1 and B = 2 on both, each message ``hand`` late."""
    ops = [  # (stage, micro-batch, phase, start)
        (0, 0, "F", 0), (0, 1, "F", 1), (1, 0, "F", 1 + hand), (1, 1, "F", 2 + hand),
        (1, 1, "B", 3 + hand), (1, 0, "B", 5 + hand), (0, 1, "B", 5 + 2 * hand),
        (0, 0, "B", 7 + 2 * hand),
    ]  # fmt: skip
    return [dict(run="r", rank=s, replica=0, stage=s, step=step, micro_batch=m, phase=p,
                 start=at + t, end=at + t + (1 if p == "F" else 2), chunk=0)
            for s, m, p, t in ops]  # fmt: skip


def test_the_step_is_compute_replayed_schedule_and_hand_overs():
    hand = 0.25
    events = pd.DataFrame(_gpipe_step(0, 5.0, 0.0) + _gpipe_step(1, hand, 100.0))
    with benchmark_module("pipeline_profile") as profile:
        parts = profile.decompose(events, micro_batches=2)
    assert parts["step"] == pytest.approx(9 + 2 * hand)  # the first step (slow) left out
    assert parts["compute"] == 12 and parts["busy_0"] == parts["busy_1"] == 6
    assert parts["replayed"] == pytest.approx(9)  # free messages: (M + p - 1)(F + B)
    assert parts["wait_forward"] == pytest.approx(hand)
    assert parts["wait_backward"] == pytest.approx(hand)
