"""The loss decompositions (torchtpu_compile/lower/decompositions/losses.py) against eager CPU
PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's numbers."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import check_on_both_paths, randn
from tests.support.helpers import compile_tpu
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

F = torch.nn.functional
# Rows whose labels end before the last slot (the -1), and a 1-D input.
TARGETS = [torch.tensor([[1, 2, 3, -1], [3, 0, -1, 1], [0, 1, 2, 3]]), torch.tensor([2, -1, 0, 1])]


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("target", TARGETS, ids=["2d", "1d"])
def test_multilabel_margin_loss(target, reduction):
    # PyTorch's reference decomposition counted the slots after a row's -1 as label 0 (a wrong
    # loss, silently) and gave a 1-D input's unreduced loss shape [1] where eager gives [].
    def loss(x, t):
        return F.multilabel_margin_loss(x, t, reduction=reduction)
    x = randn(*target.shape)
    check_on_both_paths(loss, x, target, rtol=1e-5, atol=1e-6)
    assert compile_tpu(loss)(x, target).shape == loss(x, target).shape

    def grad(x, t):
        return torch.autograd.grad(loss(x, t).sum(), x)[0]
    with config.patch(matmul_precision="highest"):
        x_compiled = x.clone().requires_grad_()
        actual = torch.autograd.grad(compile_tpu(loss)(x_compiled, target).sum(), x_compiled)[0]
    torch.testing.assert_close(actual, grad(x.clone().requires_grad_(), target))


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_multilabel_margin_loss_of_a_0d_input(reduction):
    # Eager takes a 0-d input (one row of one class; OpInfo's first sample): our decomposition's
    # shape check parsed as "(...) if input.dim() else False" and refused every 0-d input, so
    # the eager device ran the op on the host.
    def loss(x, t):
        return F.multilabel_margin_loss(x, t, reduction=reduction)
    for target in (torch.tensor(0), torch.tensor(-1)):
        check_on_both_paths(loss, torch.tensor(0.7), target)
