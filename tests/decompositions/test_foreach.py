"""The foreach decompositions (torchtpu_compile/lower/decompositions/foreach.py) against eager
CPU PyTorch, in strict mode: each ``_foreach_*`` op must run through XLA as one plain op per list
element, not fall back, and give eager's numbers (lists of different shapes, scalar, list and
tensor operands, the in-place forms optimizers call)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import check, randn

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def tensors(seed=0):
    # Different shapes and a 0-d tensor: each element is its own plain op.
    return [randn(3, seed=seed), randn(2, 4, seed=seed + 1), randn(1, seed=seed + 2)[0]]


def test_binary_ops_with_lists_scalars_and_scalar_lists():
    a, b = tensors(0), tensors(10)
    check(lambda a, b: torch._foreach_add(a, b, alpha=2.0), a, b)
    check(lambda a: torch._foreach_add(a, 0.5), a)
    check(lambda a: torch._foreach_mul(a, [2.0, -1.0, 0.25]), a)
    check(lambda a, b: torch._foreach_div(a, b), a, b)
    check(lambda a, b: torch._foreach_maximum(a, b), a, b)
    check(lambda a, b: torch._foreach_sub(a, b), a, b)


def test_maximum_and_minimum_against_numbers_clamp_as_eager():
    # torch.maximum takes no number: the Scalar and ScalarList overloads raised a TypeError
    # in every compiled ASGD foreach step (_foreach_maximum_(etas, 1)), and the eager device
    # ran them on the host.
    from tests.support.decomposition_checks import check_on_both_paths
    a = tensors()

    def clamped(*xs):
        ys = torch._foreach_sub(list(xs), 0.25)
        torch._foreach_maximum_(ys, 0.1)
        return ys + torch._foreach_minimum(list(xs), 0.5) + \
            torch._foreach_maximum(list(xs), [0.2, -0.3, float("nan")])
    check_on_both_paths(clamped, *a)


def test_unary_ops_and_norm():
    a = [t.abs() + 0.1 for t in tensors(0)]
    check(torch._foreach_sqrt, a)
    check(torch._foreach_exp, a)
    check(torch._foreach_neg, a)
    check(torch._foreach_norm, a)
    check(lambda a: torch._foreach_norm(a, 1), a)


def test_addcmul_addcdiv_and_lerp_as_optimizers_call_them():
    a, b, c = tensors(0), tensors(10), [t.abs() + 0.5 for t in tensors(20)]
    check(lambda a, b, c: torch._foreach_addcmul(a, b, c, value=0.5), a, b, c)
    check(lambda a, b, c: torch._foreach_addcdiv(a, b, c, value=-0.1), a, b, c)
    check(lambda a, b, c: torch._foreach_addcdiv(a, b, c, [0.1, 0.2, 0.3]), a, b, c)
    check(lambda a, b: torch._foreach_lerp(a, b, 0.3), a, b)


def test_in_place_forms_write_their_first_list():
    def adam_like_step(params, grads):
        params = [p.clone() for p in params]
        torch._foreach_mul_(params, 0.9)
        torch._foreach_add_(params, grads, alpha=-0.01)
        return params

    def zeroed(params):
        params = [p.clone() for p in params]
        torch._foreach_zero_(params)
        return params

    check(adam_like_step, tensors(0), tensors(10))
    check(zeroed, tensors(0))
