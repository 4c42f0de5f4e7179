"""gpt-tiny-moe (#49): the router's top-k, gates, capacity and the order it drops tokens in,
Switch's load-balancing loss and its gradient, the model trained data-parallel equal to its
twins, the moe_* metrics, the load evened by the aux loss, and the config's errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from common import max_diff

from scaledl_lab import ConfigError, ExperimentConfig, run
from scaledl_lab.models import build_model
from scaledl_lab.moe import (
    MoE,
    MoEGPT,
    Routing,
    Settings,
    aux_loss,
    capacity,
    combine,
    dispatch,
    route,
    slots,
)
from scaledl_lab.training.reference import train_sequential, train_worker_mean
from scaledl_lab.training.worker import load_for

TEXT = dict(
    strategy="allreduce", runtime="sim", dataset="licenses", model="gpt-tiny-moe",
    train_subset=160, val_size=8, test_subset=8, batch_size=8, epochs=1, max_steps=10,
    lr=0.05, momentum=0.9, precision="float64", seed=1,
)  # fmt: skip


def _moe(**settings) -> MoE:
    torch.manual_seed(0)
    return MoE(8, Settings(**settings)).double()


def test_shapes_and_every_weight_gets_a_gradient():
    model = build_model("gpt-tiny-moe", (16,), 10, seed=0).double()
    model.configure(Settings(top_k=2, capacity_factor=4.0))
    x = torch.randint(0, 10, (3, 16))
    logits = model(x)
    assert logits.shape == (3, 10, 16)
    F.cross_entropy(logits, x).backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not missing
    names = dict(model.named_parameters())
    assert names["blocks.1.mlp.router.weight"].shape == (4, 64)
    assert names["blocks.0.mlp.experts.3.fc.weight"].shape == (256, 64)


@pytest.mark.parametrize("k", [1, 2])
def test_the_mixture_s_gradient_is_its_derivative(k):
    # some tokens dropped; no aux loss, whose gradient is no derivative of the output
    moe = _moe(experts=3, top_k=k, capacity_factor=0.6, aux_loss_weight=0.0)
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(moe, (x,))


def test_with_room_for_all_nothing_drops_and_each_token_gets_its_gated_experts():
    moe = _moe(experts=4, top_k=2, capacity_factor=2.0)  # 2 x T x 2 / 4 = T places
    x = torch.randn(10, 8, dtype=torch.float64)
    routing = route(moe.router(x), 2, 2.0)
    assert routing.capacity == 10 and bool(routing.kept.all())
    probs = moe.router(x).softmax(-1)
    want = torch.zeros_like(x)
    for t in range(10):
        top, experts = probs[t].topk(2)
        for gate, e in zip(top / top.sum(), experts, strict=True):  # renormalised for k = 2
            want[t] += gate * moe.experts[int(e)](x[t])
    assert torch.allclose(moe(x[None])[0], want, atol=1e-12)


def test_a_tight_capacity_drops_first_choices_in_token_order_then_second_choices():
    expert = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])  # 4 tokens, k = 2, 3 experts
    # first choices in token order: t0, t1 fill expert 0, t2 dropped, t3 takes expert 1's
    # first place; then second choices: t0 expert 1's second, t1 expert 2's first, t2 and
    # t3 find their experts full
    assert slots(expert, 3, 2).tolist() == [[0, 1], [1, 0], [-1, -1], [0, -1]]
    gate = torch.full((4, 2), 0.5, dtype=torch.float64)
    routing = Routing(expert, gate, slots(expert, 3, 2), torch.zeros(4, 3), 2)
    x = torch.arange(1.0, 5.0, dtype=torch.float64)[:, None]  # token t holds t + 1
    buffers = dispatch(x, routing, 3)
    assert buffers[..., 0].tolist() == [[1, 2], [4, 1], [2, 0]]  # 0: an empty place
    out = combine(buffers * 10, routing)  # each expert: x 10
    assert out[:, 0].tolist() == [10.0, 20.0, 0.0, 20.0]  # t3: its first choice only, gated


def test_a_token_dropped_everywhere_passes_through_its_block():
    torch.manual_seed(0)
    model = MoEGPT(10, 8, Settings(experts=2, capacity_factor=0.25)).double()  # 1 place each
    block = model.blocks[0]
    x = torch.randn(1, 8, 64, dtype=torch.float64)
    after_attention = x + block.attn(block.ln1(x))
    routing, _ = block.mlp.routing(block.ln2(after_attention)[0])
    dropped = (~routing.kept).all(1)
    routed = len(set(routing.expert[:, 0].tolist()))  # each expert keeps one token
    assert capacity(8, 1, 2, 0.25) == 1 and int(dropped.sum()) == 8 - routed
    out = block(x)
    assert torch.equal(out[0, dropped], after_attention[0, dropped])


def test_the_aux_loss_is_e_times_the_sum_of_f_times_p():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3]], dtype=torch.float64)
    routing = Routing(torch.tensor([[0], [1]]), probs[:, :1], torch.zeros(2, 1), probs, 1)
    # f = (1/2, 1/2, 0), P = (0.4, 0.4, 0.2): 3 x (0.2 + 0.2)
    assert aux_loss(routing).item() == pytest.approx(1.2, abs=1e-15)
    even = torch.full((4, 4), 0.25, dtype=torch.float64)
    routing = Routing(torch.arange(4)[:, None], even[:, :1], torch.zeros(4, 1), even, 1)
    assert aux_loss(routing).item() == pytest.approx(1.0, abs=1e-15)


def test_the_gradient_is_that_of_the_loss_plus_alpha_times_every_layer_s_aux_loss():
    x = torch.randint(0, 10, (2, 8))
    with_aux = MoEGPT(10, 8, Settings(top_k=2, aux_loss_weight=0.3)).double()
    plain = MoEGPT(10, 8, Settings(top_k=2, aux_loss_weight=0.0)).double()
    plain.load_state_dict(with_aux.state_dict())
    F.cross_entropy(with_aux(x), x).backward()
    auxes = []
    for moe in plain.mixtures():  # the aux losses, added to the loss by hand
        moe.routing = (lambda f: lambda h: auxes.append(f(h)[1]) or f(h))(moe.routing)
    (F.cross_entropy(plain(x), x) + 0.3 * sum(auxes)).backward()
    assert len(auxes) == 2
    grads = zip(with_aux.parameters(), plain.parameters(), strict=True)
    assert max(float((a.grad - b.grad).abs().max()) for a, b in grads) < 1e-14


@pytest.mark.parametrize(
    "fields", [dict(top_k=2, capacity_factor=0.5), dict(top_k=1, capacity_factor=1.0)]
)
def test_data_parallel_training_equals_the_workers_mean_in_one_process(fields):
    """Each worker routes its own batch (its capacity, its aux loss): the twin is every
    worker's gradient at the shared weights, averaged; tokens dropped alike."""
    cfg = ExperimentConfig(**TEXT, workers=2, **fields)
    res = run(cfg, progress=False, log=None)
    assert res.frame.query("kind == 'train'")["moe_dropped"].max() > 0.05
    assert max_diff(res.model_state_dict(), train_worker_mean(cfg, load_for(cfg))) < 1e-10


def test_without_drops_nor_aux_loss_data_parallel_equals_single_process_training():
    """Capacity and the aux loss are per batch: with room for every token and α = 0 the
    mixture is a function of each token alone, and two workers train the combined batch."""
    cfg = ExperimentConfig(**TEXT, workers=2, top_k=2, capacity_factor=2.0, aux_loss_weight=0.0)
    res = run(cfg, progress=False, log=None)
    assert res.frame.query("kind == 'train'")["moe_dropped"].max() == 0
    assert max_diff(res.model_state_dict(), train_sequential(cfg, load_for(cfg))) < 1e-10


def test_the_load_balancing_loss_evens_the_experts_load():
    """Switch's claim: without the aux loss the router collapses onto few experts (the load of
    the busiest grows); with it, the load stays near even and fewer tokens drop."""

    def last_steps(weight):
        cfg = ExperimentConfig(
            **{**TEXT, "max_steps": 30, "train_subset": 480, "lr": 0.1},
            workers=1, experts=4, aux_loss_weight=weight,
        )  # fmt: skip
        train = run(cfg, progress=False, log=None).frame.query("kind == 'train'")
        return train.tail(10)[["moe_load_max", "moe_dropped", "moe_aux_loss"]].mean()

    free, balanced = last_steps(0.0), last_steps(1.0)
    assert balanced.moe_load_max < free.moe_load_max
    assert balanced.moe_dropped < free.moe_dropped


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(experts=0), r"experts=0 must be a positive integer"),
        (dict(top_k=3), r"top_k=3 must be 1 or 2"),
        (dict(experts=1, top_k=2), r"top_k=2 is above experts=1"),
        (dict(capacity_factor=0.0), r"capacity_factor=0.0 must be a positive number"),
        (dict(aux_loss_weight=-0.1), r"aux_loss_weight=-0.1 must be a non-negative number"),
        (dict(model="gpt-tiny", experts=8), r"experts=8 applies only to model='gpt-tiny-moe'"),
        (dict(accumulate=2), r"does not take accumulate=2 yet: the aux loss would count"),
        (dict(precision="float16"), r"does not take precision='float16' yet"),
        (dict(recompute=True), r"does not take recompute=True yet"),
        (dict(strategy="gpipe"), r"strategy='gpipe' splits the model"),
    ],
)
def test_config_errors_before_any_work(fields, message):
    with pytest.raises(ConfigError, match=message):
        ExperimentConfig(**{**TEXT, "workers": 2, **fields})


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(experts=0), r"experts=0 must be at least 1"),
        (dict(top_k=3), r"top_k=3 must be 1 or 2, at most experts=4"),
        (dict(experts=1, top_k=2), r"top_k=2 must be 1 or 2, at most experts=1"),
        (dict(capacity_factor=0.0), r"capacity_factor must be positive and aux_loss_weight not"),
        (dict(aux_loss_weight=-1.0), r"capacity_factor must be positive and aux_loss_weight not"),
    ],
)
def test_a_mixture_built_by_hand_refuses_bad_settings(fields, message):
    with pytest.raises(ValueError, match=message):
        Settings(**fields)


def test_a_model_routes_with_new_settings_but_keeps_its_experts():
    model = MoEGPT(10, 8)
    model.configure(Settings(top_k=2, capacity_factor=3.0))
    assert {m.settings.top_k for m in model.mixtures()} == {2}
    with pytest.raises(ValueError, match=r"the model has 4 experts, not Settings\(experts=8"):
        model.configure(Settings(experts=8))
