"""argmax, argmin, max/min over a dim and the other selecting reductions treat NaN as eager
does on the CPU, on every path: NaN is the extreme in both directions, the first NaN's index
wins, and among equal values the first index wins. torch-mlir's (value, index) reducer
compared with >= / <=, for which NaN is unordered, so the answer depended on XLA's reduction
order (lower/stablehlo_passes.py: arg_reductions_pick_nan)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tests.support.helpers import PATHS, compile_tpu, run_on_path
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

NAN, INF = float("nan"), float("inf")
FLOATS = [torch.float32, torch.bfloat16, torch.float16]

# Rows: NaN after a number, NaN first, no NaN with ties of the max and the min, all NaN, NaN
# among infinities, NaN last.
TABLE = torch.tensor([[1.0, NAN, 3.0, NAN, 3.0, -1.0],
                      [NAN, NAN, 0.0, 0.0, 5.0, -5.0],
                      [5.0, 2.0, 5.0, 1.0, 1.0, 5.0],
                      [NAN, NAN, NAN, NAN, NAN, NAN],
                      [-INF, INF, NAN, INF, -INF, 0.0],
                      [2.0, 2.0, 2.0, 2.0, 2.0, NAN]])


def index_reductions(x):
    """Every index-returning reduction, over each dim, the flattened tensor and a 3-d view."""
    cube = x.reshape(2, 3, 6)
    return (x.argmax(), x.argmin(), x.argmax(0), x.argmax(1), x.argmin(0), x.argmin(1),
            x.argmax(-1, keepdim=True), x.argmin(0, keepdim=True),
            *torch.max(x, 0), *torch.max(x, 1), *torch.min(x, 0), *torch.min(x, 1),
            *torch.max(x, 1, keepdim=True), *torch.ops.aten.max.dim(x, 0),
            cube.argmax(1), cube.argmin(2), *torch.min(cube, 1))


def value_reductions(x):
    """NaN-propagating reductions and scans whose values (and scan indices) eager defines."""
    return (x.amax(1), x.amin(0), x.max(), x.min(), torch.aminmax(x, dim=1),
            *torch.cummax(x, 1), *torch.cummin(x, 0), *torch.sort(x, dim=1, stable=True),
            *torch.sort(x, dim=0, descending=True, stable=True))


def assert_same(got, expected):
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(g, e, rtol=0, atol=0, equal_nan=True,
                                   msg=lambda m, i=i: f"output {i}: {m}")


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", FLOATS)
def test_argmax_argmin_and_max_dim_pick_the_first_nan(dtype, path, tmp_path):
    x = TABLE.to(dtype)
    assert_same(run_on_path(path, index_reductions, x, tmp_dir=tmp_path), index_reductions(x))


@pytest.mark.parametrize("path", ["compile", "eager", "eager_fused"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_value_reductions_scans_and_sorts_with_nan(dtype, path):
    x = TABLE.to(dtype)
    assert_same(run_on_path(path, value_reductions, x), value_reductions(x))


@pytest.mark.parametrize("path", ["compile", "eager"])
def test_topk_with_nan_gives_eagers_values_at_their_indices(path):
    # Eager leaves the order of equal values (NaNs included) to std::nth_element: the values
    # are defined, and each index must point at its value, once.
    x = TABLE
    fn = lambda x: (torch.topk(x, 3, 1), torch.topk(x, 2, 0, largest=False),  # noqa: E731
                    torch.topk(x.flatten(), 5))
    got, expected = run_on_path(path, fn, x), fn(x)
    for (values, indices), (want, _), dim, source in zip(got, expected, (1, 0, 0),
                                                         (x, x, x.flatten())):
        torch.testing.assert_close(values, want, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(source.gather(dim, indices), want, rtol=0, atol=0,
                                   equal_nan=True)
        assert torch.equal(indices.sort(dim).values.unique_consecutive(dim=dim),
                           indices.sort(dim).values)


def test_integer_argmax_ties_take_the_first_index():
    x = torch.tensor([[3, 1, 3, 0], [0, 0, -1, 0], [7, 7, 7, 7]], dtype=torch.int32)
    fn = lambda x: (x.argmax(1), x.argmin(1), x.argmax(0), *torch.max(x, 1))  # noqa: E731
    with config.patch(strict=True):
        assert_same(compile_tpu(fn)(x), fn(x))


@pytest.mark.parametrize("dtype", FLOATS)
def test_nan_reductions_property(dtype):
    """Random 4x6 tensors of NaN, infinities and a few repeated numbers (many ties), one
    compiled program per dtype, against eager CPU."""
    fn = lambda x: (x.argmax(), x.argmin(), x.argmax(0), x.argmin(1),  # noqa: E731
                    *torch.max(x, 1), *torch.min(x, 0))
    with config.patch(strict=True):
        compiled = compile_tpu(fn)
        elements = st.sampled_from([NAN, INF, -INF, 0.0, -0.5, 1.0, 2.0])

        @settings(max_examples=80, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(hnp.arrays("float32", (4, 6), elements=elements))
        def check(values):
            x = torch.from_numpy(values).to(dtype)
            assert_same(compiled(x), fn(x))
        check()
