"""The memory ledger: exact accounting of the model states against ZeRO's formulas, derived
for this lab's float32 training; activations against what the machine reports (torch.profiler
on CPU, torch.cuda on a GPU); the same ledger on both runtimes; the summary's breakdown."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from common import SMALL, layer_sizes, zero_formula
from torch.profiler import ProfilerActivity, profile

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.cli import main
from scaledl_lab.models import build_model
from scaledl_lab.strategies.memory.plan import plan
from scaledl_lab.strategies.memory.transformer import Transformer
from scaledl_lab.training.ledger import SavedTensors

MEM = ["mem_params", "mem_grads", "mem_optim", "mem_activations", "mem_buffers"]
STAGES = ("allreduce", "zero1", "zero2", "zero3")


def _cfg(strategy: str, runtime: str = "sim", **changes) -> ExperimentConfig:
    options = {"workers": 2, "model": "mlp", **SMALL, "max_steps": 2, **changes}
    return ExperimentConfig(strategy=strategy, runtime=runtime, **options)


def _last_ledger(res) -> dict[str, list[float]]:
    train = res.frame.query("kind == 'train'")
    last = train[train["step"] == train["step"].max()].sort_values("rank")
    return {c: last[c].tolist() for c in MEM}


# Bytes of optimiser state per parameter in float32: Adam's two moments, SGD's momentum.
K_BYTES = {"adam": 8, "sgd": 4}


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("workers", [2, 4, 8])
def test_model_states_equal_the_zero_formulas(workers, optimizer):
    extra = {"optimizer": "adam", "lr": 1e-3} if optimizer == "adam" else {}
    states = {}
    for strategy in STAGES:
        cfg = _cfg(strategy, workers=workers, **extra)
        ledger = _last_ledger(run(cfg, progress=False))
        expected = zero_formula(strategy, layer_sizes(cfg), workers, K_BYTES[optimizer], 4)
        for column, value in zip(MEM[:3], expected, strict=True):
            assert ledger[column] == [value] * workers, (strategy, column)
        states[strategy] = sum(expected)
    # The saving, as ZeRO's factors say: stage 3 holds 1/N of data parallelism's model states
    # (up to the padding), and every stage holds less than the one before.
    psi = sum(layer_sizes(_cfg("allreduce")))
    assert states["zero3"] / states["allreduce"] == pytest.approx(1 / workers, rel=workers / psi)
    assert states["allreduce"] > states["zero1"] > states["zero2"] > states["zero3"]
    k = K_BYTES[optimizer]
    if k:  # (8 + K/N)/(8 + K) and (4 + (4 + K)/N)/(8 + K), the paper's ratios in float32
        ratio1 = (8 + k / workers) / (8 + k)
        assert states["zero1"] / states["allreduce"] == pytest.approx(ratio1, rel=1e-3)
    ratio2 = (4 + (4 + k) / workers) / (8 + k)
    assert states["zero2"] / states["allreduce"] == pytest.approx(ratio2, rel=1e-3)


def test_stages_save_the_activations_of_data_parallelism():
    """Activations are not sharded: every stage keeps what allreduce keeps, and what autograd
    saves is the layers' inputs and ReLU outputs, counted once per storage."""
    ledgers = {s: _last_ledger(run(_cfg(s), progress=False)) for s in STAGES}
    reference = ledgers["allreduce"]["mem_activations"]
    assert all(led["mem_activations"] == reference for led in ledgers.values())
    b, floats = SMALL["batch_size"], 4
    # MLP 784-512-512-10: the input, two ReLU outputs, log_softmax's result, the (int64)
    # targets and nll_loss's total weight, a float32 scalar.
    expected = b * (784 + 512 + 512 + 10) * floats + b * 8 + 4
    assert reference == [expected, expected]


def test_recomputation_keeps_less_on_the_cnn():
    plain = _last_ledger(run(_cfg("zero3", model="cnn", max_steps=1), progress=False))
    again = _last_ledger(
        run(_cfg("zero3", model="cnn", max_steps=1, recompute=True), progress=False)
    )
    assert again["mem_activations"][0] < plain["mem_activations"][0]
    assert again["mem_params"] == plain["mem_params"]


@pytest.mark.parametrize("strategy", STAGES)
def test_the_ledger_is_the_same_on_both_runtimes(strategy, client):
    sim = _last_ledger(run(_cfg(strategy), progress=False))
    dask = _last_ledger(run(_cfg(strategy, "dask"), client=client, progress=False))
    assert sim == dask


def test_strategies_without_the_ledger_leave_it_nan():
    res = run(_cfg("local-sgd", workers=2), progress=False)
    train = res.frame.query("kind == 'train'")
    assert train[MEM].isna().all().all()


def _forward_allocations(model_name: str, device: torch.device) -> tuple[int, int, int]:
    """(ledger activations, bytes of the step's inputs, bytes the machine allocated and kept
    over the forward): the profiler on CPU, the CUDA allocator's count on a GPU."""
    torch.manual_seed(0)
    model = build_model(model_name, (1, 28, 28), 10, seed=0).to(device)
    x = torch.randn(64, 1, 28, 28, device=device)
    y = torch.randint(0, 10, (64,), device=device)
    F.cross_entropy(model(x), y).backward()  # warm: lazily made state is made now
    saved = SavedTensors()
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        with saved.counting(model):
            loss = F.cross_entropy(model(x), y)
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before
    else:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            with saved.counting(model):
                loss = F.cross_entropy(model(x), y)
        kept = sum(e.self_cpu_memory_usage for e in prof.events())
    del loss
    inputs = x.numel() * x.element_size() + y.numel() * y.element_size()
    return saved.bytes.peak, inputs, kept


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_activations_agree_with_the_profiler(model_name):
    """What the forward allocates and keeps is what autograd saved, less the inputs (they
    were allocated before), plus the logits and the loss (alive, not saved): within 10%, as
    the issue asks; on these models the difference is the logits, under 2% of it."""
    ledger, inputs, kept = _forward_allocations(model_name, torch.device("cpu"))
    assert kept == pytest.approx(ledger - inputs, rel=0.10)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_activations_agree_with_the_cuda_allocator(model_name):
    """The caching allocator rounds each block up to 512 bytes: within 10% as on CPU."""
    ledger, inputs, kept = _forward_allocations(model_name, torch.device("cuda"))
    assert kept == pytest.approx(ledger - inputs, rel=0.10)


def test_summary_breaks_the_memory_down(tmp_path):
    res = run(_cfg("zero3"), progress=False)
    res.save(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert "## Memory per worker" in text
    ledger = _last_ledger(res)
    states = sum(ledger[c][0] for c in MEM[:3])
    assert f"| {res.configs[0].label} | {ledger['mem_params'][0] / 1e6:.2f} |" in text
    assert f"{states / 1e6:.2f}" in text
    assert not math.isnan(states)


# -- scaledl-lab plan: the ledger and the simulated step predicted from sizes -----------------


@pytest.mark.parametrize(
    ("strategy", "model"),
    [(s, "mlp") for s in ("allreduce", "allreduce-naive", *STAGES[1:])] + [("zero3", "cnn")],
)
def test_plan_predicts_what_a_run_records(strategy, model):
    """Exactly: every ledger column, the simulated seconds of a step and its bytes sent."""
    cfg = _cfg(strategy, workers=4, model=model, max_steps=4, optimizer="adam", lr=1e-3)
    predicted = plan(cfg)
    train = run(cfg, progress=False).frame.query("kind == 'train' and rank == 0")
    train = train.sort_values("step")
    assert train[MEM].iloc[-1].tolist() == list(predicted.memory.columns().values())
    step_s = np.diff(train["time"].to_numpy())[1:]  # after the first: no evaluation between
    assert step_s == pytest.approx([predicted.step_s] * len(step_s), rel=1e-12)
    assert (train["bytes_sent"] == predicted.bytes_per_step).all()


def test_plan_refuses_strategies_it_cannot_predict():
    with pytest.raises(ConfigError, match="plan predicts allreduce, allreduce-naive, zero1"):
        plan(_cfg("local-sgd"))


def test_plan_command_says_whether_it_fits(capsys):
    args = ["plan", "--strategy", "zero3", "--workers", "8", "--model", "mlp", "--optimizer",
            "adam", "--lr", "0.001", "--batch-size", "32"]  # fmt: skip
    assert main([*args, "--device-memory-gb", "1"]) == 0
    out = capsys.readouterr().out
    expected = plan(_cfg("zero3", workers=8, optimizer="adam", lr=1e-3, batch_size=32))
    assert f"model states {expected.memory.model_states / 1e6:.3f} MB" in " ".join(out.split())
    assert "in 1 GB per worker: fits" in out
    assert main([*args, "--device-memory-gb", "0.001"]) == 1
    total = sum(expected.memory.columns().values())  # model states, activations, buffers
    over = (total - 1e6) / 1e9
    assert f"does not fit: {over:.3f} GB over" in capsys.readouterr().out


# -- a transformer sized from its sizes alone --------------------------------------------------


class _Block(torch.nn.Module):
    """A pre-LayerNorm GPT block in Megatron's sequence-first layout: attention on views of the
    QKV output (the layout the activation formula assumes)."""

    def __init__(self, h: int, a: int) -> None:
        super().__init__()
        self.a = a
        self.ln1, self.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.qkv, self.proj = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.fc1, self.fc2 = torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s, b, h = x.shape
        a, d = self.a, h // self.a
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.reshape(s, b * a, d).transpose(0, 1) for t in (q, k, v))
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=1 / math.sqrt(d))
        y = torch.bmm(torch.softmax(scores, dim=-1), v)
        x = x + self.proj(y.transpose(0, 1).reshape(s, b, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class _GPT(torch.nn.Module):
    def __init__(self, m: Transformer) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(m.vocabulary, m.hidden)
        self.pos = torch.nn.Embedding(m.sequence, m.hidden)
        self.blocks = torch.nn.ModuleList(_Block(m.hidden, m.heads) for _ in range(m.layers))
        self.ln = torch.nn.LayerNorm(m.hidden)
        mask = torch.full((m.sequence, m.sequence), float("-inf")).triu(1)
        self.register_buffer("mask", mask)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:  # (sequence, batch) token ids
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[0]))[:, None]
        for block in self.blocks:
            x = block(x, self.mask)
        return self.ln(x) @ self.tok.weight.t()  # the head tied to the token embedding


@pytest.mark.parametrize("sizes", ["3,64,4,32,100", "2,96,8,48,250"])
def test_transformer_sizes_match_a_gpt_built_from_them(sizes):
    """Ψ exactly; activations as the ledger counts them on the GPT above, the formula short by
    only what it leaves out: 8sb bytes of LayerNorm statistics per norm (2L + 1 of them), the
    token and position ids (8sb + 8s), the mask (4s²) and nll's scalars (8 bytes)."""
    m = Transformer.parse(sizes)
    torch.manual_seed(0)
    gpt = _GPT(m)
    assert sum(p.numel() for p in gpt.parameters()) == m.parameters
    b = 5
    idx = torch.randint(0, m.vocabulary, (m.sequence, b))
    saved = SavedTensors()
    with saved.counting(gpt):
        loss = F.cross_entropy(gpt(idx).reshape(-1, m.vocabulary), idx.reshape(-1))
    measured = saved.bytes.peak
    del loss
    s = m.sequence
    left_out = (2 * m.layers + 1) * 8 * s * b + 8 * s * b + 8 * s + 4 * s * s + 8
    assert 0 <= measured - m.activation_bytes(b) <= left_out


def test_a_7b_transformer_fits_8_gpus_with_zero3_not_with_allreduce(capsys):
    """Ψ = 6.66e9 (32 layers, hidden 4096): data parallelism's (4 + 4 + 8)Ψ = 106.5 GB of
    float32 Adam model states per worker cannot fit 80 GB; ZeRO-3 on 8 holds 16Ψ/8 = 13.3 GB."""
    args = ["plan", "--workers", "8", "--transformer", "32,4096,32,2048,50257",
            "--batch-size", "1", "--optimizer", "adam", "--lr", "1e-4",
            "--compute-profile", "a100", "--network", "nvlink",
            "--device-memory-gb", "80"]  # fmt: skip
    m = Transformer.parse("32,4096,32,2048,50257")
    assert main([*args, "--strategy", "zero3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    shard = sum(
        -(-u // 8) for u in [m.block_parameters] * 32 + [m.parameters - 32 * m.block_parameters]
    )
    assert f"model states {16 * shard / 1e6:.3f} MB" in out
    assert "in 80 GB per worker: fits" in out
    assert main([*args, "--strategy", "allreduce"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"model states {16 * m.parameters / 1e6:.3f} MB" in out
    total = 16 * m.parameters + m.activation_bytes(1)
    assert f"does not fit: {(total - 80e9) / 1e9:.3f} GB over" in out


def test_transformer_sizes_are_checked():
    with pytest.raises(ConfigError, match="give LAYERS,HIDDEN,HEADS,SEQUENCE,VOCABULARY"):
        Transformer.parse("32,4096,32")
    with pytest.raises(ConfigError, match="heads divide hidden"):
        Transformer.parse("2,100,3,16,10")
