"""The one optimizer step every update takes (:func:`comlrl.trainers.update.optimizer_step`), on a model small enough
to check by hand: Linear(2 -> 1) without bias, input (3, 4), loss = the output, so the gradient is (3, 4), norm 5."""

import pytest
import torch

from comlrl.trainers import update as optim
from comlrl.trainers.update import OptimizerStep, optimizer_step


def model_with_gradient() -> torch.nn.Linear:
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    model(torch.tensor([[3.0, 4.0]])).sum().backward()
    return model


def sgd(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5**step)  # lr halves at every step


def test_clipping_scales_as_torch_does_and_returns_the_norm_before_it() -> None:
    model = model_with_gradient()
    opt, sched = sgd(model)
    step = optimizer_step(optimizer=opt, params=list(model.parameters()), max_grad_norm=1.0, scheduler=sched)
    assert isinstance(step, OptimizerStep)
    assert step.grad_norm == pytest.approx(5.0)  # before clipping
    # the gradient (3, 4) scaled to norm 1 is (0.6, 0.8); SGD at lr 1 moves the weight from 0 by minus that
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[-0.6, -0.8]]), rtol=0, atol=1e-6)
    # the same step with torch's own clip gives the same weight
    reference = model_with_gradient()
    torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
    torch.optim.SGD(reference.parameters(), lr=1.0).step()
    torch.testing.assert_close(model.weight.detach(), reference.weight.detach())


def test_the_scheduler_steps_once_and_the_gradients_are_zeroed() -> None:
    model = model_with_gradient()
    opt, sched = sgd(model)
    step = optimizer_step(optimizer=opt, params=list(model.parameters()), max_grad_norm=1.0, scheduler=sched)
    assert sched.last_epoch == 1
    assert step.lr == pytest.approx(0.5) == opt.param_groups[0]["lr"]  # the lr of the next step
    assert model.weight.grad is None  # set to None, not to zeros


@pytest.mark.parametrize("off", [0.0, None, -1.0])
def test_no_clipping_when_max_grad_norm_is_not_positive(off) -> None:
    model = model_with_gradient()
    opt, _ = sgd(model)
    step = optimizer_step(optimizer=opt, params=list(model.parameters()), max_grad_norm=off)
    assert step.grad_norm == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[-3.0, -4.0]]))  # the whole gradient
    assert step.lr == 1.0  # no scheduler: the optimizer's own lr


def test_a_norm_below_the_clip_leaves_the_gradient_whole() -> None:
    model = model_with_gradient()
    opt, _ = sgd(model)
    step = optimizer_step(optimizer=opt, params=list(model.parameters()), max_grad_norm=10.0)
    assert step.grad_norm == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([[-3.0, -4.0]]))


def test_a_mix_of_sharded_and_whole_parameters_is_clipped_over_both(monkeypatch) -> None:
    """Sharded (FSDP) and whole parameters together take the mesh-aware norm: over all gradients at once."""
    model = torch.nn.Module()
    model.weight = torch.nn.Parameter(torch.zeros(2))
    model.bias = torch.nn.Parameter(torch.zeros(1))
    ((model.weight * torch.tensor([3.0, 0.0])).sum() + 4 * model.bias.sum()).backward()  # gradients (3, 0) and 4
    monkeypatch.setattr(optim, "is_shard", lambda p: p is model.weight)  # the weight stands for a shard
    called = []
    clip = optim.sharding.clip_grad_norm_
    monkeypatch.setattr(optim.sharding, "clip_grad_norm_", lambda *a: called.append(a) or clip(*a))
    opt, _ = sgd(model)
    step = optimizer_step(optimizer=opt, params=list(model.parameters()), max_grad_norm=1.0)
    assert called and step.grad_norm == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.detach(), torch.tensor([-0.6, 0.0]), rtol=0, atol=1e-6)
    torch.testing.assert_close(model.bias.detach(), torch.tensor([-0.8]), rtol=0, atol=1e-6)


def test_parameters_without_gradient_have_norm_zero() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    opt, _ = sgd(model)
    before = model.weight.detach().clone()
    step = optimizer_step(optimizer=opt, params=list(model.parameters()), max_grad_norm=1.0)
    assert step.grad_norm == 0.0
    torch.testing.assert_close(model.weight.detach(), before)
