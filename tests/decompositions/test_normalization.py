"""The normalization decompositions (torchtpu_compile/lower/decompositions/normalization.py)
against eager CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give
eager's numbers."""
from __future__ import annotations

import re

import pytest
import torch

from tests.support.decomposition_checks import check, randn
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_group_norm_with_affine_parameters():
    F = torch.nn.functional
    check(lambda x, w, b: F.group_norm(x, 2, w, b, 0.5), randn(1, 6, 3), randn(6), randn(6))


def test_layer_norm_of_a_permuted_input_is_contiguous_as_eager():
    # The decomposition computed elementwise in the input's layout: a permuted input gave a
    # permuted result (Whisper's encoder output), and eager's contiguous one takes .view where
    # that one raised.
    from tests.support.helpers import compile_tpu
    F = torch.nn.functional
    w, b = randn(8, seed=1), randn(8, seed=2)

    def normed(x):
        return F.layer_norm(x.permute(0, 2, 1), (8,), w, b).view(2, -1)
    x = randn(2, 8, 6)
    check(normed, x, rtol=1e-6, atol=1e-6)
    assert compile_tpu(normed)(x).stride() == normed(x).stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_and_group_norm_compute_in_float32_as_eager(dtype):
    # Their moments were torch.var_mean, which torch-mlir computes in float64 for float32: a
    # transformer's every layer norm was float64 arithmetic (three times the time of the
    # float32 one on CPU; no float64 units on a TPU). Eager computes them in float32, and
    # overflows there as float32 does (the squares of 1e30).
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower import lower_graph
    from torchtpu_compile.lower.decompositions import decomposition_table
    F = torch.nn.functional

    def norms(x, w, b, wide, grouped, gw, gb):
        return [F.layer_norm(x, (8,), w, b), F.layer_norm(x, (3, 8)), F.layer_norm(x, (8,), w),
                F.layer_norm(wide, (4,)), F.group_norm(grouped, 2, gw, gb),
                F.group_norm(grouped, 3), F.group_norm(grouped, 2, None, gb)]
    args = (randn(2, 3, 8).to(dtype) * 10 + 3, randn(8, seed=1).to(dtype),
            randn(8, seed=2).to(dtype), torch.tensor([[1e30, -1e30, 0.0, 5.0]]).to(dtype),
            randn(2, 6, 5, seed=3).to(dtype), randn(6, seed=4).to(dtype),
            randn(6, seed=5).to(dtype))
    tolerance = {} if dtype == torch.float32 else {"rtol": 1.6e-2, "atol": 1e-2}
    check(norms, *args, **tolerance)
    graph = make_fx(norms, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)
    text = lower_graph(graph, platform="cpu", precision="highest").text
    # The one float64 left is each eps, a literal converted to float32 (XLA folds it).
    assert set(re.findall(r"tensor<([0-9x]*)f64>", text)) <= {"", "1x"}, text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_batch_norm_in_inference(dtype):
    # Eval mode returns empty saved statistics, which torch-mlir's lowering failed to cast into.
    x = randn(3, 4, 5).to(dtype)
    w, b, mean = (randn(4, seed=i).to(dtype) for i in (1, 2, 3))
    var = randn(4, seed=4).abs().to(dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype is torch.bfloat16 else {}
    check(lambda *a: torch.ops.aten.native_batch_norm(*a, False, 0.1, 1e-5), x, w, b, mean, var,
          **tol)
    check(lambda *a: torch.ops.aten.native_batch_norm(*a, False, 0.1, 1e-5), x, None, None,
          mean, var, **tol)
    with config.patch(strict=True):  # the eager device calls the op itself: no fallback
        out = torch.ops.aten.native_batch_norm(*(t.to("tpu") for t in (x, w, b, mean, var)),
                                               False, 0.1, 1e-5)
    expected = torch.ops.aten.native_batch_norm(x, w, b, mean, var, False, 0.1, 1e-5)
    for a, e in zip(out, expected):
        torch.testing.assert_close(a.cpu(), e, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_norm_with_update_outputs_and_running_stats(dtype):
    x = randn(5, 5, 5).to(dtype)
    stats = [randn(5, seed=i).to(dtype) for i in range(3)] + [randn(5, seed=3).abs().to(dtype)]

    def step(x, w, b, mean, var):
        mean, var = mean.clone(), var.clone()
        out = torch.ops.aten._batch_norm_with_update(x, w, b, mean, var, 0.5, 0.6)
        return out[0], out[1], out[2], mean, var
    tol = dict(rtol=2e-2, atol=2e-2) if dtype is torch.bfloat16 else {}
    check(step, x, *stats, **tol)


@pytest.mark.parametrize("dim, g_shape", [(2, (1, 1, 5)), (0, (4, 1, 1))])
def test_weight_norm_backward(dim, g_shape):
    def grads(v, g, x):
        w, _ = torch._weight_norm_interface(v, g, dim)
        return torch.autograd.grad((w * x).sum(), (v, g))
    check(grads, randn(4, 3, 5).requires_grad_(), randn(*g_shape, seed=1).requires_grad_(),
          randn(4, 3, 5, seed=2))
