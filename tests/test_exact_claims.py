"""Claims the README makes exactly, asserted exactly (``== 0.0``), on the simulator.

Where the code performs the very same floating-point operations in the same order, the
results are equal bit for bit, and a tolerance would hide a change that breaks that:

- one worker of an asynchronous or decentralised strategy takes the sequential optimiser's
  steps on the same batches ("max |Δ| 0.0 on sim");
- the synchronous parameter server sums the gradients in rank order, as the simulator's
  allreduce does, then divides by N and steps elementwise: it *is* allreduce;
- the simulator is a pure function of its config and seed ("bit-identical results table").
"""

from __future__ import annotations

import pandas as pd
import pytest
from common import SMALL, max_diff

from scaledl_lab import ExperimentConfig, run
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for

# Strategies whose one-worker form is plain SGD: no peer to average with or wait for, the
# server's update is the optimiser's step on the only gradient (staleness 0: staleness-aware
# divides by max(1, 0) = 1; DC-ASGD adds λ·g⊙g⊙(w − w) = 0), the shared vector has one writer.
ONE_WORKER_IS_SGD = (
    "allreduce",
    "allreduce-naive",
    "ps-sync",
    "backup-workers",
    "ps-async",
    "downpour",
    "staleness-aware",
    "dc-asgd",
    "hogwild",
    "local-sgd",
    "nnt",
    "nnt-lockstep",
)  # dpsgd and adpsgd: test_gossip_twins.py::test_one_worker_is_plain_sgd_bit_for_bit


@pytest.mark.parametrize("strategy", ONE_WORKER_IS_SGD)
def test_one_worker_equals_plain_sgd_bit_for_bit(strategy):
    options = {"backup_workers": 0} if strategy == "backup-workers" else {}
    cfg = ExperimentConfig(
        strategy=strategy, runtime="sim", workers=1, model="mlp", **options, **SMALL
    )
    res = run(cfg, progress=False)
    assert max_diff(res.state_dict(), train_sequential(cfg, load_for(cfg))) == 0.0


@pytest.mark.parametrize("servers", [1, 3])
def test_sync_parameter_server_is_allreduce_bit_for_bit(servers):
    cfg = ExperimentConfig(
        strategy="ps-sync", runtime="sim", workers=4, model="mlp", servers=servers, **SMALL
    )
    ps = run(cfg, progress=False)
    for strategy in ("allreduce", "allreduce-naive"):
        allreduce = run(cfg.replace(strategy=strategy, servers=1), progress=False)
        for rank in range(4):
            assert max_diff(ps.state_dict(rank=rank), allreduce.state_dict(rank=rank)) == 0.0


# A straggler spread and hiccups make the asynchronous interleavings irregular: the table must
# still be the same, row for row and bit for bit.
IRREGULAR = "spread:0.3,hiccup:0.2:0.01"


@pytest.mark.parametrize(
    "strategy,options",
    [
        ("ps-async", {"servers": 2}),
        ("staleness-aware", {}),
        ("downpour", {"n_fetch": 2, "n_push": 2}),
        ("hogwild", {}),
        ("nnt", {}),
        ("adpsgd", {"topology": "ring"}),
        ("easgd", {"elastic_async": True}),
    ],
)
def test_same_config_and_seed_give_the_same_table_and_weights(strategy, options):
    cfg = ExperimentConfig(
        strategy=strategy,
        runtime="sim",
        workers=4,
        model="mlp",
        stragglers=IRREGULAR,
        **{**SMALL, "max_steps": 8},
        **options,
    )
    a = run(cfg, progress=False)
    b = run(cfg, progress=False)
    pd.testing.assert_frame_equal(a.frame, b.frame, check_exact=True)
    pd.testing.assert_frame_equal(a.timeline(), b.timeline(), check_exact=True)
    for rank in range(4):
        assert max_diff(a.state_dict(rank=rank), b.state_dict(rank=rank)) == 0.0
    # ... and the seed matters: another seed gives another table.
    c = run(cfg.replace(seed=1), progress=False)
    assert not a.frame["loss"].equals(c.frame["loss"])
