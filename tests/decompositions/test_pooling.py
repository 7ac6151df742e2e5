"""The pooling decompositions (torchtpu_compile/lower/decompositions/pooling.py) against eager
CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's
numbers (ceil mode, divisors, ties and NaN in windows)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.support import python_env
from tests.support.decomposition_checks import NAN, aten, check, check_on_both_paths, randn

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- max pooling -----------------------------------------------------------------------------

@pytest.mark.parametrize("shape, kernel, stride", [((1, 2, 3, 6), 3, 2), ((1, 2, 7, 6), 3, 2),
                                                   ((2, 3, 7), 2, 2)])
def test_max_pool_ceil_mode_values_and_indices(shape, kernel, stride):
    F = torch.nn.functional
    pool = F.max_pool1d if len(shape) == 3 else F.max_pool2d
    check(lambda x: pool(x, kernel, stride, ceil_mode=True, return_indices=True), randn(*shape))


def test_max_pools_of_large_images_holding_nan_are_nan_at_eagers_index():
    # XLA:CPU's vector max skipped NaN in large inputs' windows: the window was its largest
    # number, at that number's index. Eager's is NaN, at the window's last NaN.
    F = torch.nn.functional
    x = (torch.arange(2 * 3 * 64 * 64) % 5).float().reshape(2, 3, 64, 64)
    x[0, 1, 10, 10] = x[1, 2, 33, 40] = x[1, 2, 33, 41] = x[1, 2, 34, 40] = NAN
    x.requires_grad_()

    def pools(x):
        values, indices = F.max_pool2d(x, 2, return_indices=True)
        ceil, ceil_indices = F.max_pool2d(x, 3, stride=2, padding=1, ceil_mode=True,
                                          return_indices=True)
        line = F.max_pool1d(x.reshape(1, 2, -1), 4)
        grad = torch.autograd.grad((values.nan_to_num() * 2).sum() + ceil.nan_to_num().sum(),
                                   x)[0]
        return values, indices, ceil, ceil_indices, line, grad

    check_on_both_paths(pools, x)


def test_3d_max_pool_indices_and_adaptive_pools_with_ties_and_nan():
    # their gradients: tests/slow/test_decompositions_full.py
    F = torch.nn.functional
    x = randn(2, 2, 5, 6, 7)
    x[1, 1, 2, 3, :3] = NAN
    ties = torch.randint(0, 3, x.shape, generator=torch.Generator().manual_seed(0))

    def pools(x):
        return (F.max_pool3d(x, 2, return_indices=True),
                F.max_pool3d(x, 3, stride=2, padding=1, return_indices=True),
                F.max_pool3d(x, 2, dilation=2, ceil_mode=True, return_indices=True),
                F.adaptive_max_pool3d(x, (2, 4, 3), return_indices=True),
                F.adaptive_avg_pool3d(x, (2, 4, 3)), F.adaptive_avg_pool3d(x[0], (3, 5, 2)))
    check_on_both_paths(pools, x, rtol=1e-5, atol=1e-6)
    check(pools, ties.float(), rtol=1e-5, atol=1e-6)  # eager's pick among equal maxima


def check_3d_pool_gradients():
    """The 3-d pools' backward against eager (tests/slow/test_decompositions_full.py)."""
    F = torch.nn.functional

    def loss(x):
        return (F.max_pool3d(x, 3, stride=2, padding=1).pow(2).sum()
                + F.adaptive_max_pool3d(x, (2, 4, 3)).pow(2).sum()
                + F.adaptive_avg_pool3d(x, (2, 4, 3)).pow(2).sum())
    x = randn(2, 2, 5, 6, 7).requires_grad_()
    check(lambda x: torch.autograd.grad(loss(x), x)[0], x)


def test_adaptive_avg_pool2d_backward_of_sizes_that_do_not_divide():
    # torch-mlir lowers only output sizes that divide the input's: a 7x7 pool of a 10x10 map
    # ran on the host in every training step. Batched, unbatched, and a size that divides.
    calls = [((2, 3, 10, 10), (7, 7)), ((3, 5, 9), (3, 4)), ((1, 2, 8, 6), (4, 3))]
    xs = [randn(*shape, seed=i) for i, (shape, _) in enumerate(calls)]
    grads = [randn(*shape[:-2], *out, seed=10 + i) for i, (shape, out) in enumerate(calls)]

    def backwards(*tensors):
        return [aten._adaptive_avg_pool2d_backward.default(g, x)
                for g, x in zip(tensors[:3], tensors[3:])]
    check_on_both_paths(backwards, *grads, *xs, rtol=1e-6, atol=1e-6)


_EIGHT_BIT_MAX_POOLS = """
import torch
import torch.nn.functional as F
from tests.support.decomposition_checks import check_on_both_paths
for dtype in (torch.uint8, torch.int8):
    x = torch.randint(-100, 100, (1, 2, 6, 7)).to(dtype)
    check_on_both_paths(lambda x: F.max_pool2d(x, 2), x)
    check_on_both_paths(lambda x: F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True,
                                               return_indices=True), x)
"""


def test_eight_bit_max_pools():
    # XLA's CPU backend crashed the process (SIGSEGV, no Python error) on torch-mlir's max
    # pool of uint8 and int8 images, on both paths. In a child process: a crash must fail this
    # test, not end the test run.
    done = subprocess.run([sys.executable, "-c", _EIGHT_BIT_MAX_POOLS], env=python_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_a_cnn_trained_at_many_image_sizes_matches_eager():
    # max pooling's backward took the plane's size with Size.numel(), which specialized the
    # symbolic sizes: every image size compiled again, and the fifth size got a backward traced
    # for an earlier one ("shape '[2, 4, 22, 30]' is invalid for input of size 4176").
    import copy

    import torchtpu_compile
    from tests.support.helpers import compile_tpu
    from torchtpu_compile import config
    nn = torch.nn
    torch.manual_seed(0)
    eager = nn.Sequential(nn.Conv2d(3, 4, 7, 2, 3), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                          nn.Conv2d(4, 4, 3, 1, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    model = copy.deepcopy(eager)
    compiled = compile_tpu(model)
    with config.patch(matmul_precision="highest"):
        for i, (b, h, w) in enumerate(((2, 32, 32), (2, 41, 47), (3, 57, 36), (1, 64, 63),
                                       (2, 44, 60))):
            x = torch.randn(b, 3, h, w)
            if i == 1:
                torch._dynamo.mark_dynamic(x, 2)
                torch._dynamo.mark_dynamic(x, 3)
            actual, expected = compiled(x).square().sum(), eager(x).square().sum()
            actual.backward()
            expected.backward()
            torch.testing.assert_close(actual, expected)
            for mine, theirs in zip(model.parameters(), eager.parameters()):
                torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-4)
                mine.grad = theirs.grad = None
    # the static first size, dynamic sizes, then a dynamic batch too, and a batch of 1 (which
    # Dynamo specializes); not one per size
    assert len([g for g in torchtpu_compile.stats()["graphs"] if g.endswith("forward")]) <= 4


# --- average pooling -------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, stride=1, padding=1, count_include_pad=False),
    dict(kernel_size=2, stride=1, padding=1, divisor_override=3),
])
def test_avg_pool2d_ceil_mode_and_divisors(kwargs):
    check(lambda x: torch.nn.functional.avg_pool2d(x, **kwargs), randn(1, 2, 6, 7))


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=6, stride=3, padding=2, ceil_mode=True),
    dict(kernel_size=3, stride=1, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, stride=1, padding=1, divisor_override=3),
])
def test_integer_average_pools_keep_the_dtype_and_truncate(kwargs):
    # Eager sums integer windows exactly and divides in integers, truncating (-30 / 4 is -7):
    # the decomposition returned float32, and averaged ones for its counts (0 for a partial
    # window).
    x = torch.randint(-9, 9, (1, 2, 9), generator=torch.Generator().manual_seed(0))
    F = torch.nn.functional
    if "divisor_override" not in kwargs:  # 2-d and 3-d only
        check_on_both_paths(lambda x: F.avg_pool1d(x, **kwargs), x)
    check_on_both_paths(lambda x: F.avg_pool2d(x, **kwargs), x.reshape(1, 2, 3, 3) * 7)


def test_avg_pool3d_divisor_override():
    F = torch.nn.functional
    check(lambda x: F.avg_pool3d(x, 2, stride=1, padding=1, ceil_mode=True,
                                 count_include_pad=False, divisor_override=2), randn(1, 2, 4, 4, 4))


def test_half_width_average_pools_sum_in_float32():
    # Eager sums each window in float32; a bf16 reduce_window rounded at every addition (6x
    # eager's error for an 8x8 window of values in [0.5, 1.5)). One rounding apart at most.
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(0)) + 0.5
    F = torch.nn.functional
    check_on_both_paths(lambda x: (F.avg_pool2d(x.bfloat16(), 8),
                                   F.avg_pool2d(x.half(), 8, ceil_mode=True, stride=6)),
                        x, rtol=4e-3, atol=0)


AVG_POOL_BACKWARDS = [  # (dims, kernel, stride, padding, ceil_mode, count_include_pad, divisor)
    (2, 2, 2, 0, True, True, None),      # RT-DETR's ResNet shortcut, on an odd size
    (2, 3, 2, 1, True, False, None), (2, 3, 2, 1, False, True, None),
    (2, 2, 1, 1, False, False, None), (2, 3, 3, 1, True, True, 4), (2, 1, 2, 0, False, True, None),
    (3, 2, 2, 0, True, True, None), (3, 3, 2, 1, True, False, None), (3, 2, 1, 1, False, True, 3)]


def test_avg_pool_backward_every_divisor_rule():
    # Unlowered: training a model with average pooling (RT-DETR's backbone) ran it in eager
    # PyTorch, a host round trip per step. Eager's divisors: the window clipped to the padded
    # input, or to the input (count_include_pad=False), or the override.
    F = torch.nn.functional
    inputs = {2: randn(2, 3, 7, 6), 3: randn(1, 2, 5, 6, 7)}
    cases = []
    for dims, k, s, p, ceil, include_pad, divisor in AVG_POOL_BACKWARDS:
        pool = F.avg_pool2d if dims == 2 else F.avg_pool3d
        out = pool(inputs[dims], k, s, p, ceil, include_pad, divisor)
        cases.append((dims, [k] * dims, [s] * dims, [p] * dims, ceil, include_pad, divisor,
                      randn(*out.shape, seed=len(cases))))

    def backwards(x2, x3, *grads):
        return [(aten.avg_pool2d_backward.default if dims == 2 else
                 aten.avg_pool3d_backward.default)(g, x2 if dims == 2 else x3, *args)
                for (dims, *args, _), g in zip(cases, grads)]
    check_on_both_paths(backwards, inputs[2], inputs[3], *(case[-1] for case in cases),
                        rtol=1e-5, atol=1e-6)


def test_adaptive_max_pool_1d_2d_of_sizes_that_do_not_divide_and_their_backward():
    # PyTorch's reference handles only output sizes that divide the input's ("condition must
    # be true"): nn.AdaptiveMaxPool1d/2d ran in eager PyTorch, forward and backward.
    F = torch.nn.functional
    x = randn(2, 3, 5, 7)
    x[1, 2, 1, :3] = NAN

    def pools(x):
        return (F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
                F.adaptive_max_pool2d(x[0], 3, return_indices=True),
                F.adaptive_max_pool1d(x[:, :, 0], 3, return_indices=True))
    check_on_both_paths(pools, x, rtol=1e-5, atol=1e-6)

    def grad(x):
        loss = (F.adaptive_max_pool2d(x, (3, 4)).pow(2).sum()
                + F.adaptive_max_pool1d(x[:, :, 0], 3).pow(2).sum())
        return torch.autograd.grad(loss, x)[0]
    check(grad, randn(2, 3, 5, 7).requires_grad_())
