"""Tensor parallelism of gpt-tiny's whole blocks, and sequence parallelism, equal the unsplit
GPT; what they send and what they save for backward, computed from the sizes."""

from __future__ import annotations

import matplotlib
import pytest
from common import max_diff

from scaledl_lab import ConfigError, ExperimentConfig, gpt, run
from scaledl_lab.data import licenses
from scaledl_lab.runtime.sim.cost import ring_allreduce_bytes, ring_reduce_scatter_bytes
from scaledl_lab.studies.model_parallel.study import sequence_parallel_costs
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for
from scaledl_lab.viz.tensor_parallel import transformer_block_diagram

matplotlib.use("Agg")

BATCH, S, H, L = 8, licenses.SEQUENCE, gpt.HIDDEN, gpt.LAYERS
TP = dict(
    strategy="tensor-parallel", runtime="sim", dataset="licenses", model="gpt-tiny",
    train_subset=256, val_size=32, test_subset=32, batch_size=BATCH, epochs=1, max_steps=20,
    lr=0.05, momentum=0.9, precision="float64", seed=2,
)  # fmt: skip
ACTIVATION = BATCH * S * H * 8  # bytes of one (S, B, h) float64 activation
SPLIT_PARAMETERS = L * 6 * H  # per block LN1, LN2 (weight, bias) and the two replicated biases


def _run(degree: int, sequence_parallel: bool, **changes) -> tuple[ExperimentConfig, object]:
    cfg = ExperimentConfig(workers=degree, sequence_parallel=sequence_parallel, **{**TP, **changes})
    return cfg, run(cfg, progress=False, log=None)


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("degree", [2, 4])
def test_equals_the_unsplit_gpt_after_20_steps(degree, sequence_parallel):
    cfg, res = _run(degree, sequence_parallel)
    reference = train_sequential(cfg, load_for(cfg))
    # Rank 0 reassembles the whole unsplit model (gpt-tiny's tensor parallelism is the mesh's).
    assert max_diff(res.state_dict(rank=0), reference) < 1e-10
    init = train_sequential(cfg.replace(max_steps=1, lr=1e-12), load_for(cfg))
    assert max_diff(reference, init) > 1e-3  # ... and training really moved it
    train = res.frame[res.frame.kind == "train"]
    for step in range(1, 21):  # the logits are replicated: one loss on every rank
        assert train[train.step == step]["loss"].nunique() == 1


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_dask_equals_sim_bit_for_bit(client, sequence_parallel):
    cfg = ExperimentConfig(
        workers=2, sequence_parallel=sequence_parallel, **{**TP, "runtime": "dask", "max_steps": 8}
    )
    dask = run(cfg, client=client, progress=False, log=None)
    sim = run(cfg.replace(runtime="sim"), progress=False, log=None)
    assert max_diff(dask.state_dict(rank=0), sim.state_dict(rank=0)) == 0.0
    assert max_diff(dask.state_dict(rank=0), train_sequential(cfg, load_for(cfg))) < 1e-10
    keys = ["rank", "step", "loss", "bytes_sent"]
    train = [
        r.frame[r.frame.kind == "train"][keys].sort_values(["step", "rank"], ignore_index=True)
        for r in (dask, sim)
    ]
    assert train[0].equals(train[1])


@pytest.mark.parametrize("degree", [2, 4])
def test_sequence_parallelism_sends_tensor_parallelisms_bytes_in_the_blocks(degree):
    _, tp = _run(degree, False, max_steps=2)
    _, sp = _run(degree, True, max_steps=2)
    # Tensor parallelism: per block two allreduces forward (g) and two backward (f).
    blocks = 4 * L * ring_allreduce_bytes(ACTIVATION, degree)
    # Sequence parallelism: each allreduce becomes an all-gather and a reduce-scatter ...
    gather = ring_reduce_scatter_bytes(ACTIVATION, degree)  # a ring all-gather sends as much
    assert 4 * L * 2 * gather == blocks
    for res in (tp, sp):
        assert {o["block_bytes_sent"] for o in res.outputs[res.configs[0].label]} == {blocks}
    # ... and outside the blocks: the embedding's gradient and the head's input all-gathered,
    # and one allreduce of the split regions' parameter gradients.
    extra = 2 * gather + ring_allreduce_bytes(SPLIT_PARAMETERS * 8, degree)
    sent = {
        name: set(res.frame[res.frame.kind == "train"]["bytes_sent"])
        for name, res in (("tp", tp), ("sp", sp))
    }
    assert sent == {"tp": {blocks}, "sp": {blocks + extra}}


@pytest.mark.parametrize("degree", [2, 4])
def test_layernorm_regions_save_one_degreeth_of_the_activations(degree):
    _, tp = _run(degree, False, max_steps=2)
    _, sp = _run(degree, True, max_steps=2)
    # Each LayerNorm saves its input (S, B, h) and its mean and 1/std (S, B, 1), float64.
    per_norm = (S * BATCH * H + 2 * S * BATCH) * 8
    tp_norms = {o["norm_activations"] for o in tp.outputs[tp.configs[0].label]}
    sp_norms = {o["norm_activations"] for o in sp.outputs[sp.configs[0].label]}
    assert tp_norms == {2 * L * per_norm}
    assert sp_norms == {2 * L * per_norm // degree}
    saving = 2 * L * per_norm * (degree - 1) // degree
    activations = [r.frame[r.frame.kind == "train"]["mem_activations"].max() for r in (tp, sp)]
    assert activations[0] - activations[1] == saving


def test_config_errors_name_the_field_before_any_work(monkeypatch):
    with pytest.raises(
        ConfigError,
        match="the tensor-parallel degree workers=8 does not divide gpt-tiny's 4 attention heads; "
        "choose a divisor of 4",
    ):
        ExperimentConfig(**{**TP, "workers": 8})
    with pytest.raises(
        ConfigError,
        match=r"sequence_parallel=True applies only to strategy='tensor-parallel' \(it splits the "
        r"regions tensor parallelism replicates\), not to strategy='allreduce'",
    ):
        ExperimentConfig(**{**TP, "strategy": "allreduce", "workers": 2}, sequence_parallel=True)
    with pytest.raises(
        ConfigError,
        match="sequence_parallel=True splits a transformer's LayerNorm regions along the "
        "sequence; model='mlp' has none, use model='gpt-tiny'",
    ):
        ExperimentConfig(
            **{**TP, "model": "mlp", "dataset": "mnist1d", "workers": 2}, sequence_parallel=True
        )
    with pytest.raises(ConfigError, match="model='cnn1d' is not supported, use model='mlp' or"):
        ExperimentConfig(**{**TP, "model": "cnn1d", "dataset": "mnist1d", "workers": 2})
    monkeypatch.setattr(gpt, "HEADS", 6)
    monkeypatch.setattr(gpt, "HIDDEN", 96)
    with pytest.raises(
        ConfigError,
        match="sequence_parallel=True splits the sequence of 32 positions over workers=3, "
        "which does not divide it; choose a divisor of 32",
    ):
        ExperimentConfig(**{**TP, "workers": 3}, sequence_parallel=True)
    monkeypatch.setattr(gpt, "HIDDEN", 100)
    with pytest.raises(ConfigError, match="does not divide gpt-tiny's 100 hidden width"):
        ExperimentConfig(**{**TP, "workers": 3})


def test_the_notebooks_comparison_and_diagram():
    table = sequence_parallel_costs(degrees=(2,), batch_size=BATCH)
    tp, sp = (table[table.variant == v].iloc[0] for v in ("tensor parallel", "sequence parallel"))
    assert tp.block_bytes_sent == sp.block_bytes_sent
    assert sp.bytes_sent > tp.bytes_sent and tp.norm_activations == 2 * sp.norm_activations
    assert sp.activations < tp.activations
    ax = transformer_block_diagram(4, sequence_parallel=True)
    texts = [t.get_text() for t in ax.texts]
    assert [f"rank {r}" for r in range(4)] == [t for t in texts if t.startswith("rank")]
    assert texts.count("all-gather\n(bwd: reduce-scatter)") == 2
    assert texts.count("reduce-scatter\n(bwd: all-gather)") == 2
    texts = [t.get_text() for t in transformer_block_diagram(2).texts]
    assert texts.count("g: allreduce\n(bwd: identity)") == 2
    assert texts.count("f: identity\n(bwd: allreduce)") == 2
