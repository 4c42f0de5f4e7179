"""``clip_gradient``: MXNet's element-wise gradient clipping, applied before every step."""

import pytest
import torch

from scaledl_lab.cli import _config_from_args, _parser
from scaledl_lab.config import ConfigError, ExperimentConfig
from scaledl_lab.training.plan import make_optimizer


def _stepped(cfg: ExperimentConfig, grad: torch.Tensor) -> torch.Tensor:
    param = torch.nn.Parameter(torch.zeros(4))
    optimizer = make_optimizer(cfg, [param])
    param.grad = grad.clone()
    optimizer.step()
    return param.detach()


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adagrad"])
def test_each_element_is_clipped_before_the_step(optimizer):
    grad = torch.tensor([25.0, -0.5, -40.0, 3.0])
    cfg = ExperimentConfig(optimizer=optimizer, lr=0.1, momentum=0.0, clip_gradient=10.0)
    clipped = _stepped(cfg, grad)
    by_hand = _stepped(cfg.replace(clip_gradient=None), grad.clamp(-10.0, 10.0))
    unclipped = _stepped(cfg.replace(clip_gradient=None), grad)
    assert torch.equal(clipped, by_hand)
    if optimizer == "sgd":  # Adam and AdaGrad normalise the step: only SGD's moves differ
        assert not torch.equal(clipped, unclipped)
        assert clipped.tolist() == pytest.approx([-1.0, 0.05, 1.0, -0.3])


def test_gradients_inside_the_bound_are_untouched():
    grad = torch.tensor([9.0, -0.5, -10.0, 3.0])
    cfg = ExperimentConfig(optimizer="adam", lr=1e-3, clip_gradient=10.0)
    assert torch.equal(_stepped(cfg, grad), _stepped(cfg.replace(clip_gradient=None), grad))


@pytest.mark.parametrize("bad", [0, -1.0, "10"])
def test_a_bound_that_is_not_positive_is_refused(bad):
    with pytest.raises(ConfigError, match=r"clip_gradient=.* must be a positive number"):
        ExperimentConfig(clip_gradient=bad)


def test_the_cli_sets_it():
    args = _parser().parse_args(["run", "--strategy", "ps-async", "--clip-gradient", "10"])
    assert _config_from_args(args).clip_gradient == 10.0
