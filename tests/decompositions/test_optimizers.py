"""The fused optimizer decompositions (torchtpu_compile/lower/decompositions/optimizers.py)
against eager CPU PyTorch's kernels, compiled in strict mode: lists of different shapes, each
optional path (weight decay, amsgrad, maximize, momentum, nesterov, lr decay, grad_scale,
found_inf).
The eager tpu device's in-place steps: tests/test_fused_optimizers.py."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import check, randn

pytestmark = pytest.mark.usefixtures("fresh_dynamo")
aten = torch.ops.aten


def tensors(seed):
    return [randn(3, 2, seed=seed), randn(4, seed=seed + 1)]


def adam_state():
    params, grads, exp_avgs = tensors(0), tensors(10), tensors(20)
    exp_avg_sqs = [t.abs() for t in tensors(30)]
    max_exp_avg_sqs = [t.abs() + 0.5 for t in tensors(40)]
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    return params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps


@pytest.mark.parametrize("op", [aten._fused_adamw.default, aten._fused_adam.default],
                         ids=["adamw", "adam"])
@pytest.mark.parametrize("amsgrad,maximize,found_inf", [
    (False, False, None), (True, True, None), (False, False, 0.0), (False, False, 1.0)])
def test_fused_adam(op, amsgrad, maximize, found_inf):
    params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps = adam_state()
    scaling = {} if found_inf is None else {"found_inf": torch.tensor(found_inf)}

    def step(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, grad_scale):
        return op(params, grads, exp_avgs, exp_avg_sqs,
                  max_exp_avg_sqs if amsgrad else [], steps, lr=0.01, beta1=0.9,
                  beta2=0.99, weight_decay=0.1, eps=1e-6, amsgrad=amsgrad,
                  maximize=maximize, grad_scale=grad_scale if scaling else None, **scaling)
    check(step, params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps,
          torch.tensor(2.0))


@pytest.mark.parametrize("momentum,nesterov,is_first_step", [
    (0.0, False, False), (0.9, False, True), (0.9, True, False)])
def test_fused_sgd(momentum, nesterov, is_first_step):
    params, grads, buffers = tensors(0), tensors(10), tensors(20)

    def step(params, grads, buffers):
        return aten._fused_sgd.default(
            params, grads, buffers if momentum else [], weight_decay=0.01, momentum=momentum,
            lr=0.1, dampening=0.1, nesterov=nesterov, maximize=False,
            is_first_step=is_first_step)
    check(step, params, grads, buffers)


@pytest.mark.parametrize("maximize,found_inf", [(True, None), (False, 0.0), (False, 1.0)])
def test_fused_adagrad(maximize, found_inf):
    params, grads = tensors(0), tensors(10)
    state_sums = [t.abs() for t in tensors(20)]
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    scaling = {} if found_inf is None else {"found_inf": torch.tensor(found_inf)}

    def step(params, grads, state_sums, steps, grad_scale):
        return aten._fused_adagrad.default(
            params, grads, state_sums, steps, lr=0.1, lr_decay=0.05, weight_decay=0.1,
            eps=1e-6, maximize=maximize, grad_scale=grad_scale if scaling else None, **scaling)
    check(step, params, grads, state_sums, steps, torch.tensor(2.0))
