"""Asynchronous parameter servers with three workers against hand-computed update sequences.

The simulator is deterministic, and every train row carries (rank, step, staleness): from
these ``twins.server_push_order`` rebuilds the order in which the server applied the
pushes (update s = the version the worker last fetched + the push's staleness), and
``twins.replay_async_server`` recomputes the server's parameters in one process, push by
push: each worker's gradients at the weights it last fetched (Downpour: plus its own local
steps in between), summed over n_push steps, applied with lr (staleness-aware: lr / max(1, τ)).
"""

from __future__ import annotations

import numpy as np
import pytest
from common import SMALL, max_diff

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.strategies.parameter_server.twins import replay_async_server, server_push_order
from scaledl_lab.training.worker import load_for

STEPS = 12  # per worker: 36 gradients in all

CASES = {
    "ps-async": ("ps-async", {}),
    "staleness-aware": ("staleness-aware", {}),
    "staleness-aware-momentum-spread": (
        "staleness-aware",
        {"momentum": 0.9, "stragglers": "spread:0.5"},
    ),
    "downpour-2-2": ("downpour", {"n_fetch": 2, "n_push": 2}),
    # Fetch every 4th step, push every 2nd: a push in between keeps the worker's own replica.
    "downpour-4-2-momentum-spread": (
        "downpour",
        {"n_fetch": 4, "n_push": 2, "momentum": 0.9, "stragglers": "spread:0.5"},
    ),
    "downpour-2-1-spread": ("downpour", {"n_fetch": 2, "n_push": 1, "stragglers": "spread:0.5"}),
}


def _cfg(strategy: str, options: dict) -> ExperimentConfig:
    return ExperimentConfig(
        strategy=strategy,
        runtime="sim",
        workers=3,
        model="mlp",
        precision="float64",
        **{**SMALL, "momentum": 0.0, "max_steps": STEPS, **options},
    )


@pytest.mark.parametrize("case", list(CASES))
def test_three_workers_equal_the_replayed_update_sequence(case):
    strategy, options = CASES[case]
    cfg = _cfg(strategy, options)
    res = run(cfg, progress=False)
    train = res.frame.query("kind == 'train'")
    order = server_push_order(train, n_fetch=cfg.n_fetch, n_push=cfg.n_push)
    # The run's worth of gradients was applied, each push once, by all three workers.
    assert len(order) * cfg.n_push == 3 * STEPS and set(order) == {0, 1, 2}
    assert train["staleness"].max() >= 2  # updates really were stale
    data = load_for(cfg)
    replayed = replay_async_server(cfg, data, order)
    # The run is over when every worker has pulled the server's final weights.
    for rank in range(3):
        assert max_diff(res.state_dict(rank=rank), replayed) < 1e-10, rank
    # The replay can tell orders apart: two updates of different ranks swapped, far off.
    k = next(i for i in range(3, len(order)) if order[i] != order[i - 1])
    swapped = order[: k - 1] + [order[k], order[k - 1]] + order[k + 1 :]
    assert max_diff(replay_async_server(cfg, data, swapped), replayed) > 1e-6


def test_staleness_aware_rows_record_the_learning_rate_applied():
    cfg = _cfg("staleness-aware", {"stragglers": "spread:0.5"})
    train = run(cfg, progress=False).frame.query("kind == 'train'")
    applied = train.dropna(subset=["staleness"])
    assert len(applied) == 3 * STEPS and set(applied["staleness"]) >= {0.0, 1.0, 2.0}
    expected = cfg.lr / np.maximum(1.0, applied["staleness"].to_numpy())
    assert (applied["lr"].to_numpy() == expected).all()


def test_push_order_needs_every_fetch_to_push():
    """A pull on its own returns a version that no row records: the order is then unknown."""
    cfg = _cfg("downpour", {"n_fetch": 3, "n_push": 2})
    train = run(cfg.replace(max_steps=6), progress=False).frame.query("kind == 'train'")
    with pytest.raises(ValueError, match="n_fetch=3 is not a multiple of n_push=2"):
        server_push_order(train, n_fetch=3, n_push=2)
