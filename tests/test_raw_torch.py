"""The data-parallel step written with torch.distributed directly (no lab runtime) trains to the
lab's allreduce run bit for bit in float32, on Dask workers and on torch.multiprocessing."""

from __future__ import annotations

import pytest
from common import SMALL, max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.strategies.data_parallel.raw_torch import check_raw, run_raw

CFG = ExperimentConfig(strategy="allreduce", workers=2, model="mlp", **SMALL)


@pytest.fixture(scope="module")
def lab(client):
    return run(CFG, client=client, progress=False).state_dict()


def test_plain_torch_distributed_on_dask_workers_equals_the_lab_bit_for_bit(client, lab):
    raw = run_raw(CFG, client=client)
    assert max_diff(raw, lab) == 0.0
    # ... and training really moved the parameters.
    start = run_raw(CFG.replace(max_steps=1, lr=1e-12), client=client)
    assert max_diff(raw, start) > 1e-3


def test_plain_torch_distributed_on_spawned_processes_equals_the_lab_bit_for_bit(lab):
    assert max_diff(run_raw(CFG), lab) == 0.0


def test_the_plain_loop_refuses_what_it_does_not_implement():
    with pytest.raises(
        ConfigError,
        match=r"it takes strategy allreduce or allreduce-naive, optimizer sgd, accumulate 1 and "
        r"no compression \(got ps-async, sgd, accumulate 1, compress none\)$",
    ):
        check_raw(ExperimentConfig(strategy="ps-async"))
    with pytest.raises(ConfigError, match=r"optimizer sgd.*\(got allreduce, adam, accumulate 1"):
        check_raw(CFG.replace(optimizer="adam"))
    with pytest.raises(ConfigError, match=r"keeps the learning rate constant"):
        check_raw(CFG.replace(lr_schedule="cosine"))
