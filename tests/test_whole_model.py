"""The whole model back from any run (``Results.model_state_dict``): every strategy that splits
the model — pipelines (interleaved too), tensor parallelism on the MLP and on gpt-tiny (with
and without sequence parallelism), ZeRO-3's shards, a mesh — gives the unsplit model's names,
shapes and dtypes, which load strictly into ``build_model(...)``, with the sequential twin's
values; so does its results folder read back. Workers that train models of their own give
worker r's as replica r. Its errors name what is missing."""

from __future__ import annotations

import pytest
import torch
from common import max_diff

from scaledl_lab import ExperimentConfig, Results, compare, run
from scaledl_lab.models import build_model
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for

IMAGES = dict(
    runtime="sim", dataset="fashion-mnist", model="mlp", train_subset=480, test_subset=64,
    val_size=64, epochs=1, batch_size=16, max_steps=3, lr=0.05, precision="float64",
)  # fmt: skip
TEXT = dict(
    runtime="sim", dataset="licenses", model="gpt-tiny", train_subset=64, val_size=16,
    test_subset=16, batch_size=8, epochs=1, max_steps=3, lr=0.05, momentum=0.9,
    precision="float64", seed=1,
)  # fmt: skip
SPLITS = {
    "model-parallel": dict(strategy="model-parallel", workers=2, **IMAGES),
    "gpipe": dict(strategy="gpipe", workers=2, micro_batches=2, **IMAGES),
    "1f1b": dict(strategy="1f1b", workers=2, micro_batches=2, **IMAGES),
    "interleaved-1f1b": dict(
        strategy="interleaved-1f1b", workers=2, micro_batches=2, virtual_stages=2, **IMAGES
    ),
    "zb-h1": dict(strategy="zb-h1", workers=2, micro_batches=2, **IMAGES),
    "gpipe-gpt": dict(strategy="gpipe", workers=2, micro_batches=2, **TEXT),
    "tensor-parallel-mlp": dict(strategy="tensor-parallel", workers=2, **IMAGES),
    "tensor-parallel-gpt": dict(strategy="tensor-parallel", workers=2, **TEXT),
    "sequence-parallel-gpt": dict(
        strategy="tensor-parallel", workers=2, sequence_parallel=True, **TEXT
    ),
    "zero3": dict(strategy="zero3", workers=2, **IMAGES),
    "mesh": dict(strategy="mesh", workers=8, mesh="dp=2,tp=2,pp=2", zero_stage=3,
                 micro_batches=2, **TEXT),
}  # fmt: skip


def _initial(cfg: ExperimentConfig) -> dict[str, torch.Tensor]:
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes, seed=cfg.seed)
    return model.to(cfg.dtype).state_dict()


@pytest.mark.parametrize("case", SPLITS)
def test_a_split_model_comes_back_whole_by_the_unsplit_names(case, tmp_path):
    cfg = ExperimentConfig(**SPLITS[case])
    res = run(cfg, progress=False, log=None)
    state = res.model_state_dict()
    initial = _initial(cfg)
    assert list(state) == list(initial)  # every tensor, in the unsplit model's order
    for name, tensor in initial.items():
        assert (state[name].shape, state[name].dtype) == (tensor.shape, tensor.dtype), name
    data = load_for(cfg)
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(cfg.dtype)
    model.load_state_dict(state, strict=True)
    assert max_diff(model.state_dict(), state) == 0.0
    twin = train_sequential(cfg, data)
    assert max_diff(state, twin) < 1e-10  # as each strategy's own twin test
    assert max_diff(twin, initial) > 1e-4  # training moved it: the comparison has power
    if cfg.model == "mlp" or case == "mesh":  # a gpt-tiny folder's summary samples text from
        res.save(tmp_path, figures=False)  # its model (2 s of CPU): the mesh's stands for all
        assert max_diff(Results.load(tmp_path).model_state_dict(), state) == 0.0


def test_zero3_comes_back_as_allreduce_bit_for_bit():
    cfg = ExperimentConfig(**SPLITS["zero3"])
    zero3 = run(cfg, progress=False, log=None).model_state_dict()
    allreduce = run(cfg.replace(strategy="allreduce"), progress=False, log=None)
    assert max_diff(zero3, allreduce.model_state_dict()) == 0.0


def test_each_pipeline_replica_is_the_whole_model():
    cfg = ExperimentConfig(strategy="1f1b", workers=4, stages=2, micro_batches=2, **IMAGES)
    res = run(cfg, progress=False, log=None)
    twin = train_sequential(cfg, load_for(cfg))
    for replica in range(2):
        assert max_diff(res.model_state_dict(replica=replica), twin) < 1e-10
    # a stage alone is a part: replica 1's first stage holds the first linear layer only
    assert list(res.state_dict(rank=2)) == ["net.1.weight", "net.1.bias"]


def test_workers_that_train_models_of_their_own_give_their_own_as_replicas():
    cfg = ExperimentConfig(strategy="nnt", workers=4, topology="ring", **IMAGES)
    res = run(cfg, progress=False, log=None)
    for rank in range(4):
        assert max_diff(res.model_state_dict(replica=rank), res.state_dict(rank=rank)) == 0.0
    assert max_diff(res.model_state_dict(replica=0), res.model_state_dict(replica=1)) > 1e-4


def test_a_folder_saved_without_weights_says_so(tmp_path):
    cfg = ExperimentConfig(strategy="gpipe", workers=2, micro_batches=2, **IMAGES)
    compare([cfg], out=tmp_path / "run", weights=False, progress=False, log=None)
    assert not (tmp_path / "run" / "weights.pt").exists()
    loaded = Results.load(tmp_path / "run")
    with pytest.raises(ValueError) as info:
        loaded.model_state_dict()
    assert str(info.value) == (
        f"run {cfg.label!r} kept no weights of replica 0: its ranks returned none (a run keeps "
        "none with weights=False; a results folder keeps replica 0's only, in weights.pt; a "
        "mesh returns replica 0's only)"
    )
    with pytest.raises(ValueError) as info:
        loaded.state_dict(rank=1)
    assert str(info.value) == (
        f"run {cfg.label!r} kept no weights of rank 1: a run keeps every rank's unless "
        "weights=False; a results folder keeps only the whole model (model_state_dict())"
    )


def test_a_replica_without_weights_and_a_part_of_the_model_are_named():
    cfg = ExperimentConfig(**SPLITS["gpipe"])
    res = run(cfg, progress=False, log=None)
    with pytest.raises(ValueError) as info:
        res.model_state_dict(replica=1)
    assert str(info.value) == (
        f"run {cfg.label!r} trains 1 replica(s), numbered from 0: there is no replica 1"
    )
    first_stage = Results(res.frame, res.configs, {cfg.label: res.outputs[cfg.label][:1]})
    with pytest.raises(ValueError) as info:
        first_stage.model_state_dict()
    assert str(info.value) == (
        f"run {cfg.label!r}: the ranks of replica 0 returned 2 tensors, not mlp's 6: "
        "4 missing (net.3.weight, net.3.bias, net.5.weight, ...)"
    )
    wrong = {k: v.float() for k, v in res.state_dict(rank=1).items()}  # float64 trained
    wrong["net.7.weight"] = torch.zeros(1)
    mixed = Results(res.frame, res.configs, {cfg.label: [res.outputs[cfg.label][0],
                                                         {"state_dict": wrong}]})  # fmt: skip
    with pytest.raises(ValueError) as info:
        mixed.model_state_dict()
    assert str(info.value) == (
        f"run {cfg.label!r}: the ranks of replica 0 returned 7 tensors, not mlp's 6: not the "
        "model's: net.7.weight; shape or dtype not the model's: net.3.weight (512, 512) "
        "torch.float32, net.3.bias (512,) torch.float32, net.5.weight (10, 512) torch.float32, ..."
    )
