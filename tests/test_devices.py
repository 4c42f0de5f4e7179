"""One device per worker: the GPU a worker trains on comes from what it sees (dask-cuda's
CUDA_VISIBLE_DEVICES), and asking for a GPU a worker lacks is an error naming that worker.

The plan is a pure function, tested here on every layout; the error is tested on the real
LocalCluster (CPU). Tests marked ``gpu`` run only where CUDA is; they skip cleanly elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from common import SMALL, max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.runtime.dask.cluster import live_workers
from scaledl_lab.runtime.dask.devices import plan_devices


def seen(address: str, host: str, gpus: int, visible: str | None = None) -> dict:
    return {"address": address, "name": address[-1], "host": host, "cuda_devices": gpus,
            "visible": visible}  # fmt: skip


def test_dask_cuda_workers_each_take_the_first_gpu_they_see():
    # LocalCUDACluster on 4 GPUs: worker i sees its own GPU first (i, i+1, ..., i-1).
    probes = [seen(f"tcp://10.0.0.1:400{i}", "node1", 4, f"{i},{(i + 1) % 4}") for i in range(4)]
    assert plan_devices("auto", probes) == ["cuda:0"] * 4
    assert plan_devices("cuda", probes) == ["cuda:0"] * 4


def test_workers_that_see_every_gpu_take_their_position_on_their_host():
    # Two hosts, two workers each, every worker seeing both GPUs of its host; ranks interleave.
    probes = [
        seen("tcp://a:1", "a", 2), seen("tcp://b:1", "b", 2),
        seen("tcp://a:2", "a", 2), seen("tcp://b:2", "b", 2),
    ]  # fmt: skip
    assert plan_devices("cuda", probes) == ["cuda:0", "cuda:0", "cuda:1", "cuda:1"]


def test_cpu_workers():
    probes = [seen("tcp://127.0.0.1:1", "h", 0), seen("tcp://127.0.0.1:2", "h", 0)]
    assert plan_devices("auto", probes) == ["cpu", "cpu"]
    assert plan_devices("cpu", [seen("tcp://a:1", "a", 4)]) == ["cpu"]


def test_cuda_on_a_worker_without_one_names_it():
    probes = [seen("tcp://a:1", "gpu-node", 1, "0"), seen("tcp://b:7", "cpu-node", 0)]
    with pytest.raises(ConfigError) as err:
        plan_devices("cuda", probes)
    assert str(err.value).startswith(
        "device='cuda' was asked for, but worker 7 (tcp://b:7) on cpu-node sees no CUDA device"
    )
    with pytest.raises(ConfigError, match=r"found GPUs on 1 of the run's 2 workers .* cpu-node"):
        plan_devices("auto", probes)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_on_cpu_workers_stops_before_any_work_naming_the_worker(client, tmp_path):
    cfg = ExperimentConfig(strategy="allreduce", workers=2, model="mlp", device="cuda", **SMALL)
    with pytest.raises(ConfigError) as err:
        run(cfg, client=client, out=tmp_path, progress=False)
    workers = sorted(live_workers(client))
    message = str(err.value)
    assert message.startswith("device='cuda' was asked for, but worker ")
    for address in workers:
        assert f"({address}) on " in message and "sees no CUDA device" in message
    assert "dask_cuda.LocalCUDACluster" in message


def test_data_moves_to_the_device_once():
    from scaledl_lab.training.worker import load_for

    data = load_for(ExperimentConfig(model="mlp", **{**SMALL, "max_steps": None}))
    assert data.to(torch.device("cpu")) is data  # nothing to move


@pytest.mark.gpu
def test_allreduce_on_gpu_workers_equals_the_cpu_run(client, tmp_path):
    """Two ranks on the GPU (NCCL) train as two ranks on the CPU (gloo), in float64."""
    cfg = ExperimentConfig(strategy="allreduce", workers=2, model="mlp", precision="float64",
                           **SMALL)  # fmt: skip
    cpu = run(cfg.replace(device="cpu"), client=client, progress=False)
    gpu = run(cfg.replace(device="cuda"), client=client, progress=False)
    assert max_diff(gpu.state_dict(rank=0), cpu.state_dict(rank=0)) < 1e-9
