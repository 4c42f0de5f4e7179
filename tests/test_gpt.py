"""gpt-tiny and the licenses corpus: the model's layers and loss, the data and its errors, every
strategy that takes any model trains it, and summary.md speaks of it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from common import max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.data import DatasetNotFoundError, dataset_info, licenses, load_dataset, locate
from scaledl_lab.gpt import GPT
from scaledl_lab.models import build_model, model_flops
from scaledl_lab.objective import correct_count, model_input, summed_loss
from scaledl_lab.strategies.model_parallel import partition
from scaledl_lab.training.reference import train_sequential
from scaledl_lab.training.worker import load_for
from scaledl_lab.viz.text import sample_of

TEXT = dict(
    runtime="sim", dataset="licenses", model="gpt-tiny", train_subset=128, val_size=32,
    test_subset=32, batch_size=8, epochs=1, max_steps=6, lr=0.05, momentum=0.9,
    precision="float64", seed=1,
)  # fmt: skip
VOCAB, S = len(licenses.VOCABULARY), licenses.SEQUENCE


def _ids(n: int = 3, seed: int = 0) -> torch.Tensor:
    return torch.randint(VOCAB, (n, S), generator=torch.Generator().manual_seed(seed))


def test_layers_compose_to_the_forward_and_logits_are_channels_first():
    model = build_model("gpt-tiny", (S,), VOCAB, seed=0)
    assert isinstance(model, GPT)
    x = _ids()
    out = model(x)
    assert out.shape == (3, VOCAB, S)
    h = x
    layers = partition.layers(model)
    assert len(layers) == 1 + len(model.blocks) + 1  # embedding | blocks | head
    for layer in layers:
        h = layer(h)
    assert torch.equal(h, out)
    # The lab's loss on (N, V, S) logits is the mean next-token loss over every position.
    y = _ids(seed=1)
    flat = F.cross_entropy(out.transpose(1, 2).reshape(-1, VOCAB), y.reshape(-1))
    assert torch.allclose(F.cross_entropy(out, y), flat, atol=1e-6)


def test_gpt_tiny_takes_token_sequences_only():
    with pytest.raises(ValueError, match=r"gpt-tiny needs \(S,\) token sequences, got input_shape"):
        build_model("gpt-tiny", (1, 28, 28), 10)


def test_attention_is_causal():
    model = build_model("gpt-tiny", (S,), VOCAB, seed=0)
    x = _ids(1)
    changed = x.clone()
    changed[0, 20:] = (changed[0, 20:] + 1) % VOCAB
    with torch.no_grad():
        a, b = model(x), model(changed)
    assert torch.equal(a[..., :20], b[..., :20])  # a position sees no later token
    assert not torch.equal(a[..., 20:], b[..., 20:])


def test_sequence_scores_are_per_sequence_means_and_classification_is_unchanged():
    out, y = torch.randn(4, VOCAB, S, dtype=torch.float64), _ids(4)
    tokens = F.cross_entropy(out, y, reduction="none")  # (N, S)
    assert torch.allclose(summed_loss(out, y), tokens.mean(1).sum(), atol=1e-12, rtol=0)
    hits = (out.argmax(1) == y).double().mean(1).sum().item()
    assert correct_count(out, y) == pytest.approx(hits, abs=1e-12)
    logits, labels = torch.randn(5, 10), torch.tensor([0, 1, 2, 3, 4])
    assert torch.equal(
        summed_loss(logits, labels), F.cross_entropy(logits, labels, reduction="sum")
    )
    assert correct_count(logits, labels) == int((logits.argmax(1) == labels).sum())
    # Token ids are never cast to the run's float dtype; features are.
    assert model_input(y, "cpu", torch.float64).dtype == torch.int64
    assert model_input(out.float(), "cpu", torch.float64).dtype == torch.float64


def test_flops_count_the_linears_and_attentions_products():
    model = build_model("gpt-tiny", (S,), VOCAB, seed=0)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    h = model.embed.token.embedding_dim
    expected = 2 * (S * linear + len(model.blocks) * 2 * S * S * h)
    assert model_flops("gpt-tiny", (S,), VOCAB) == expected


def test_licenses_load_as_next_token_windows_with_a_fixed_split():
    data = load_dataset("licenses", val_size=100)
    folder = locate("licenses")
    n_train, n_test = licenses.sizes(folder)
    assert (len(data.train) + len(data.val), len(data.test)) == (n_train, n_test)
    assert data.num_classes == VOCAB and data.input_shape == (S,)
    for split in (data.train, data.val, data.test):
        assert split.x.dtype == split.y.dtype == torch.int64 and split.is_sequence
        assert torch.equal(split.x[:, 1:], split.y[:, :-1])  # y is x shifted by one
    # The test split is the tail of each file: the last window of GPL-3 is in it.
    text = (folder / "GPL-3").read_text()
    count = (len(text) - 1) // S
    last = torch.tensor(licenses.encode(text[(count - 1) * S : count * S]))
    assert (data.test.x == last).all(1).any()
    assert not (data.train.x == last).all(1).any()
    assert licenses.decode(licenses.encode("GNU\tGPL\n")) == "GNU GPL\n"
    row = next(r for r in dataset_info() if r["name"] == "licenses")
    assert row["found"] and row["num_classes"] == VOCAB and row["input_shape"] == (S,)


def test_missing_licenses_say_where_they_were_looked_for_and_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEDL_DATA_NO_DEFAULTS", "1")
    monkeypatch.setenv("SCALEDL_DATA_DIR", str(tmp_path))
    (tmp_path / "licenses").mkdir()
    (tmp_path / "licenses" / "GPL-3").write_text("only one")
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("licenses")
    message = str(info.value)
    assert message.startswith("licenses not found. Looked in:\n")
    assert f"  - {tmp_path}\n" in message
    assert f"{tmp_path / 'licenses'} (has some files but lacks Apache-2.0, Artistic" in message
    assert "installed by Debian's essential base-files package in /usr/share/common-licenses" in (
        message
    )


def test_config_errors_for_text_before_any_work():
    with pytest.raises(ConfigError, match="model='gpt-tiny' does not fit dataset='mnist1d'"):
        ExperimentConfig(**{**TEXT, "dataset": "mnist1d"})
    with pytest.raises(ConfigError, match="model='mlp' does not fit dataset='licenses'"):
        ExperimentConfig(**{**TEXT, "model": "mlp"})
    with pytest.raises(
        ConfigError,
        match="sharding='label-skew' needs class labels; dataset='licenses' is next-token text",
    ):
        ExperimentConfig(**TEXT, sharding="label-skew")


@pytest.mark.parametrize("strategy", ["allreduce", "gpipe"])
def test_parallel_training_equals_the_sequential_twin(strategy):
    extra = {"micro_batches": 2} if strategy == "gpipe" else {}
    cfg = ExperimentConfig(strategy=strategy, workers=2, **TEXT, **extra)
    res = run(cfg, progress=False, log=None)
    reference = train_sequential(cfg, load_for(cfg))
    assert max_diff(res.model_state_dict(), reference) < 1e-10
    init = train_sequential(cfg.replace(max_steps=1, lr=1e-12), load_for(cfg))
    assert max_diff(reference, init) > 1e-3


@pytest.mark.parametrize(
    "strategy, extra",
    [
        ("ps-sync", {}),
        ("nnt", {"workers": 4, "topology": "ring"}),
        ("local-sgd", {"sync_period": 2}),
        ("1f1b", {"micro_batches": 2}),
        ("zero2", {}),
    ],
)
def test_every_kind_of_strategy_trains_gpt_tiny(strategy, extra):
    adam = dict(optimizer="adam", lr=3e-3, momentum=0.0, max_steps=8)
    cfg = ExperimentConfig(strategy=strategy, **{"workers": 2, **TEXT, **adam, **extra})
    frame = run(cfg, progress=False, log=None).frame
    train, test = frame[frame.kind == "train"], frame[frame.kind == "test"]
    assert len(train) and train["loss"].notna().all() and len(test)
    assert test["accuracy"].between(0, 1).all()  # next-token accuracy, not hits per sequence
    first, last = train[train.step == train.step.min()], train[train.step == train.step.max()]
    assert last["loss"].mean() < first["loss"].mean()  # it learns


def test_summary_gives_the_loss_a_sample_and_the_greedy_continuation(tmp_path):
    cfg = ExperimentConfig(strategy="allreduce", workers=2, **TEXT)
    res = run(cfg, progress=False, log=None)
    res.save(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    loss = res.frame[res.frame.kind == "test"]["loss"].iloc[-1]
    assert f"- test loss per character: {loss:.4f} (perplexity {math.exp(loss):.2f})" in text
    greedy = sample_of(cfg, res.weights())
    drawn = sample_of(cfg, res.weights(), temperature=0.8)
    assert drawn == sample_of(cfg, res.weights(), temperature=0.8) != greedy  # the run's seed
    for sample in (drawn, greedy):
        assert sample.startswith(licenses.PROMPT) and len(sample) == len(licenses.PROMPT) + 120
    assert text.index("```text\n" + drawn.replace("`", "'") + "\n```") < text.index(
        "```text\n" + greedy.replace("`", "'") + "\n```"
    )
    assert f"- sampled at temperature 0.8 (seed {cfg.seed}) from the prompt 'This License':" in text


def test_generate_draws_from_the_softmax_at_the_temperature():
    model = build_model("gpt-tiny", (S,), VOCAB, seed=0)
    prompt = _ids(1)[:, :8]
    temperature, draws = 0.05, 4000
    logits = model(prompt)[0, :, -1].detach().double()
    expected = torch.softmax(logits / temperature, dim=0)
    tokens = model.generate(prompt.repeat(draws, 1), 1, temperature,
                            torch.Generator().manual_seed(0))[:, -1]  # fmt: skip
    measured = torch.bincount(tokens, minlength=VOCAB).double() / draws
    assert expected.max() > 0.1  # sharp enough that a draw at the wrong temperature shows
    assert (measured - expected).abs().max() < 0.03  # 4000 draws: about 4 standard errors
    # the same seed, the same text; as the temperature falls, the draw becomes the argmax
    seeded = [model.generate(prompt, 20, 1.0, torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert torch.equal(seeded[0], seeded[1]) and not torch.equal(seeded[0], seeded[2])
    cold = model.generate(prompt, 20, 1e-9, torch.Generator().manual_seed(0))
    assert torch.equal(cold, model.generate(prompt, 20))
    with pytest.raises(ValueError, match="temperature=-1 must be 0 \\(greedy\\) or positive"):
        model.generate(prompt, 1, -1)


def test_health_warnings_measure_chance_over_the_vocabulary():
    import pandas as pd

    from scaledl_lab.training.health import run_warnings

    cfg = ExperimentConfig(strategy="allreduce", workers=2, **TEXT)
    summary = pd.DataFrame({"run": [cfg.label] * 2, "test_accuracy": [0.12, 0.01],
                            "test_loss": [3.0, 3 * math.log(VOCAB) + 0.1]})  # fmt: skip
    (warning,) = run_warnings(summary, [cfg])  # 12% is far above chance, 1/96
    chance = f"chance is {1 / VOCAB:.0%}"
    assert f"ends near chance (1.0% test accuracy; {chance})" in warning
    assert f"a uniform guess scores {math.log(VOCAB):.2f}" in warning


def test_memory_plan_predicts_the_ledger_of_a_run():
    from scaledl_lab.strategies.memory.plan import plan

    cfg = ExperimentConfig(strategy="allreduce", workers=2, **{**TEXT, "max_steps": 2})
    frame = run(cfg, progress=False, log=None).frame
    train = frame[frame.kind == "train"]
    predicted = plan(cfg)
    assert predicted.memory.activations == train["mem_activations"].max()
    assert predicted.memory.params == train["mem_params"].max()
    assert predicted.bytes_per_step == train["bytes_sent"].max()


def test_fetch_copies_the_system_files_and_the_copy_loads_the_same(tmp_path, monkeypatch):
    from scaledl_lab.data import fetch

    folder = fetch("licenses", tmp_path)
    assert folder == tmp_path / "licenses" and not licenses.missing_files(folder)
    monkeypatch.setenv("SCALEDL_DATA_NO_DEFAULTS", "1")
    copy = load_dataset("licenses", data_dir=tmp_path, val_size=10)
    monkeypatch.delenv("SCALEDL_DATA_NO_DEFAULTS")
    system = load_dataset("licenses", val_size=10)
    assert torch.equal(copy.train.x, system.train.x) and torch.equal(copy.test.y, system.test.y)
