"""The long decomposition checks behind tests/decompositions/: the medians of empty inputs
(each lowering once took torch-mlir down, so they run in a child process), topk over a strided
3-d view of long runs of ties, the 3-d pools' gradients (the fast suite runs the 2-d
inputs and the 3-d pools' forward), and stacked, projected LSTMs and GRUs on the device (the
fast suite runs single layers and cells), igamma in bf16."""
import subprocess
import sys

import pytest
import torch

from tests.decompositions.test_indexing_scatter import (BAG_INDICES, BAG_OFFSETS, bag_weights,
                                                        every_bag, every_bag_backward)
from tests.decompositions.test_linalg import MATRIX_EXP_INPUT, matrix_exps
from tests.decompositions.test_pooling import check_3d_pool_gradients
from tests.decompositions.test_recurrent import MORE_CASES, check_recurrent
from tests.decompositions.test_sorting import check_topk, topk_sweep_inputs
from tests.decompositions.test_special import check_igamma_in_bf16
from tests.support import python_env
from tests.support.decomposition_checks import check_on_both_paths, randn
from torchtpu_compile import config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("fresh_dynamo")]


MEDIANS_CHILD = """
import torch
import tests.decompositions.test_checks as t
from tests.support.helpers import compile_tpu
for name in t.MEDIANS:
    for path, check in (("tpu", t.check_eager_device), ("compile", t.check_compile_path)):
        try:
            check(name)
            print(path, name, "ok")
        except AssertionError as exc:
            print(path, name, "FAIL", str(exc).splitlines()[0])
for dtype in (torch.float32, torch.float16, torch.float64, torch.int64, torch.int32,
              torch.int16, torch.uint8):
    for fn in (torch.median, torch.nanmedian):
        x = torch.empty(0, 3, dtype=dtype)
        want = fn(x)
        for path, got in (("tpu", lambda: fn(x.to("tpu")).cpu()),
                          ("compile", lambda: compile_tpu(fn, dynamic=False)(x))):
            got = got()
            same = torch.equal(got, want) or bool(want.isnan() and got.isnan())
            print(path, fn.__name__, dtype, "ok" if same else f"FAIL got {got}, eager {want}")
"""


def test_medians_in_a_subprocess():
    """Medians over an empty dim raise eager's IndexError; the median of nothing is eager's
    NaN, converted to the dtype as the host converts it."""
    done = subprocess.run([sys.executable, "-c", MEDIANS_CHILD], capture_output=True,
                          text=True, timeout=600, env=python_env())
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and len(lines) == 34, \
        f"exit status {done.returncode}\n{done.stdout}{done.stderr[-2000:]}"
    assert all(line.endswith(" ok") for line in lines), done.stdout


def test_topk_sweep_of_a_strided_view_with_long_runs_of_ties():
    few_values, strided, special, distinct = topk_sweep_inputs()
    check_topk(few_values, strided, special, distinct)


def test_3d_pool_gradients():
    check_3d_pool_gradients()


@pytest.mark.parametrize("name", list(MORE_CASES))
def test_stacked_recurrent_layers_on_the_device(name):
    check_recurrent(*MORE_CASES[name])


def test_embedding_bag_every_mode_and_gradient_on_both_paths():
    # Every mode with and without padding, and every gradient (the fast suite: a few).
    check_on_both_paths(every_bag, bag_weights(), BAG_INDICES, BAG_OFFSETS, randn(14, seed=1),
                        rtol=1e-6, atol=1e-6)
    check_on_both_paths(every_bag_backward, randn(7, 3, seed=2), randn(7, 3),
                        BAG_INDICES.long(), BAG_OFFSETS[:-1].long(), randn(14, seed=1),
                        rtol=1e-6, atol=1e-6)


def test_matrix_exp_and_the_orthogonal_parametrization_on_the_device():
    check_on_both_paths(matrix_exps, MATRIX_EXP_INPUT, rtol=2e-5, atol=1e-5)
    torch.manual_seed(0)
    layer = torch.nn.utils.parametrizations.orthogonal(torch.nn.Linear(6, 6))
    x = randn(3, 6)
    layer(x).square().sum().backward()
    want = layer.parametrizations.weight.original.grad.clone()
    layer.to("tpu").parametrizations.weight.original.grad = None
    with config.patch(matmul_precision="highest", strict=True):  # matrix_exp of a block matrix
        layer(x.to("tpu")).square().sum().backward()
    torch.testing.assert_close(layer.parametrizations.weight.original.grad.cpu(), want,
                               rtol=1e-4, atol=1e-5)


def test_igamma_in_bf16():
    check_igamma_in_bf16()


def test_every_extremum_and_truth_of_uint8_and_bool_tensors_on_both_paths():
    # torch-mlir started uint8 and bool extrema from the signed extreme (uint8 amax of [0, 1]
    # was 128, bool max.dim's index 0 whatever the data) and any/all of uint8 from its bits
    # (any of [200] was 200, all of [200, 130] 0).
    u8 = torch.tensor([[0, 1, 0], [200, 255, 130]], dtype=torch.uint8)
    b = torch.tensor([[False, False, True], [True, False, True]])
    check_on_both_paths(lambda u, b: (
        u.amax(1), u.amin(1), u.max(), u.min(), u.max(1), u.min(1), u.aminmax(dim=1),
        u.argmax(1), u.argmin(1), u.any(1), u.all(1), u.any(), u.all(),
        b.amax(1), b.amin(1), b.max(1), b.min(1), b.aminmax(dim=1)), u8, b)


def test_cumprod_gradient_at_a_zero():
    # cumprod's backward finds the first zero with max.dim over a bool mask; that index was
    # 0, so the gradient at and after the zero was 0.
    def grad(d):
        x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [2.0, 0.0, 5.0, 1.0]], device=d,
                         requires_grad=True)
        return torch.autograd.grad(x.cumprod(1).sum(), x)[0].cpu()
    with config.patch(strict=True):
        torch.testing.assert_close(grad("tpu"), grad("cpu"), rtol=0, atol=0)
