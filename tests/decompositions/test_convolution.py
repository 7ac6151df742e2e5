"""The convolution decompositions (torchtpu_compile/lower/decompositions/convolution.py) against
eager CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's
numbers (strides, padding, groups, dilation; gradients too)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import check, randn

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


@pytest.mark.parametrize("dims, kwargs", [
    (2, dict(stride=2, padding=1, output_padding=1, groups=2, dilation=(1, 2))),
    (2, dict(stride=2)),
    (1, dict(stride=3, padding=2)),
    (3, dict(stride=(1, 2, 1))),
])
def test_transposed_convolution(dims, kwargs):
    F = torch.nn.functional
    conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}[dims]
    groups = kwargs.get("groups", 1)
    x = randn(2, 4, *[5, 6, 4][:dims])
    w = randn(4, 3, *[3, 2, 2][:dims], seed=1)
    check(lambda x, w, b: conv(x, w, b, **kwargs), x, w, randn(3 * groups, seed=2))


@pytest.mark.parametrize("dims, kwargs", [
    (2, dict(stride=2, padding=1, output_padding=1, groups=2, dilation=(1, 2))),
    (2, dict(stride=2)),
    (1, dict(stride=3, padding=2)),
    # output_padding not below the stride (allowed: it is below the dilation): the forward
    # convolution of the output gradient is longer than the input (fuzz seeds 6015, 6016)
    (1, dict(stride=1, padding=2, output_padding=1, dilation=2)),
    (2, dict(stride=(3, 1), padding=2, output_padding=(2, 1), dilation=(3, 2))),
])
def test_transposed_convolution_backward(dims, kwargs):
    # convolution_backward with transposed=True (convolution.py): gradients of input,
    # weight and bias all through XLA.
    F = torch.nn.functional
    conv = {1: F.conv_transpose1d, 2: F.conv_transpose2d}[dims]
    groups = kwargs.get("groups", 1)

    def grads(x, w, b):
        y = conv(x, w, b, **kwargs)
        return torch.autograd.grad((y * y.detach().sin()).sum(), (x, w, b))
    x = randn(2, 4, *[5, 6][:dims]).requires_grad_()
    w = randn(4, 3, *[3, 2][:dims], seed=1).requires_grad_()
    check(grads, x, w, randn(3 * groups, seed=2).requires_grad_())


def test_a_transposed_convolution_with_no_output_position_is_empty_as_eager():
    # a padding of 2 on both sides eats a width of 3 - 1 + 2: eager returns a (2, 4, 3, 0)
    # result and zero gradients; the forward convolution it decomposed to refused a kernel
    # wider than its input (fuzz seeds 7152, 7214)
    def step(x, w, b):
        y = torch.nn.functional.conv_transpose2d(x, w, b, padding=2, groups=2)
        return (y, *torch.autograd.grad((y * 2).sum(), (x, w, b)))
    x = randn(2, 2, 7, 3).requires_grad_()
    w = randn(2, 2, 1, 2, seed=1).requires_grad_()
    check(step, x, w, randn(4, seed=2).requires_grad_())


def test_convolution_backward_with_one_padding_for_all_dims():
    # padding="valid" reaches convolution_backward as [0] for a 2-d convolution (SigLIP).
    def grads(x, w):
        y = torch.nn.functional.conv2d(x, w, stride=2, padding="valid")
        return torch.autograd.grad((y * y.detach().cos()).sum(), (x, w))
    check(grads, randn(2, 3, 8, 8).requires_grad_(), randn(4, 3, 2, 2, seed=1).requires_grad_())
