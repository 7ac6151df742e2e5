"""Integer floor division is exact, as eager's on the CPU, on every path (torch.compile, the
eager tpu device strict and fused, AOT): torch-mlir divides integers in float64, which loses
the low digits of int64 beyond 2**53 (and TPUs have no float64)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import PATHS, compile_tpu, run_on_path
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

BIG = 2 ** 60 + 12345  # beyond float64's 53-bit mantissa: its low digits are lost there


def floor_divisions(a, b):
    """The spellings of floor division, with tensor and scalar divisors."""
    return (a // 7, (a * 3) // b, torch.div(a, b, rounding_mode="floor"),
            torch.floor_divide(a, b), a // -1, torch.div(a, -3, rounding_mode="floor"),
            # truncation and the remainders, exact before the fix, stay exact
            torch.div(a, b, rounding_mode="trunc"), a % b, torch.fmod(a, b))


def big_operands():
    a = torch.tensor([BIG, -BIG, 2 ** 55 + 3, -(2 ** 55) - 3, 2 ** 62 + 1, -(2 ** 62) + 1,
                      -7, 7, -6, 6, 0, 1, -1, 2 ** 63 - 1], dtype=torch.int64)
    b = torch.tensor([7, 7, -3, -3, 10, -10, 2, -2, 3, -3, 5, -1, 1, 2], dtype=torch.int64)
    return a, b


@pytest.mark.parametrize("path", PATHS)
def test_int64_floor_division_beyond_float64_is_exact(path, tmp_path):
    a, b = big_operands()
    got = run_on_path(path, floor_divisions, a, b, tmp_dir=tmp_path)
    expected = floor_divisions(a, b)
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype, i
        assert torch.equal(g, e), f"output {i}: {g.tolist()} != {e.tolist()}"


def signed_table(dtype):
    """Every sign combination, exact and inexact quotients, the extremes of ``dtype``, divisor
    -1 (but not MIN // -1, which kills an eager CPU process for int32 and int64)."""
    info = torch.iinfo(dtype)
    a = [info.min, info.min + 1, info.max, info.max - 1, -7, 7, -6, 6, 0, 1, -1, 5, -5, 13]
    b = [3, -3, 7, -7, 2, -2, 3, -3, 4, -4, 1, -1, 5, -5]
    a, b = [x for x in a for _ in b], b * len(a)
    keep = [i for i in range(len(a)) if not (a[i] == info.min and b[i] == -1)]
    return (torch.tensor([a[i] for i in keep], dtype=dtype),
            torch.tensor([b[i] for i in keep], dtype=dtype))


def unsigned_table():
    a = [0, 1, 6, 7, 254, 255, 128, 127]
    b = [1, 2, 3, 7, 255, 128]
    return (torch.tensor([x for x in a for _ in b], dtype=torch.uint8),
            torch.tensor(b * len(a), dtype=torch.uint8))


def floor_division_forms(a, b):
    return (a // b, torch.div(a, b, rounding_mode="floor"), a // 3, torch.floor_divide(a, 5),
            a // b.to(torch.int64), a % b)


@pytest.mark.parametrize("path", ["compile", "eager", "eager_fused"])
@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64,
                                   torch.uint8])
def test_floor_division_of_every_integer_dtype(dtype, path):
    a, b = unsigned_table() if dtype == torch.uint8 else signed_table(dtype)
    got = run_on_path(path, floor_division_forms, a, b)
    for i, (g, e) in enumerate(zip(got, floor_division_forms(a, b))):
        assert g.dtype == e.dtype, i
        assert torch.equal(g, e), f"output {i}: {g.tolist()} != {e.tolist()}"


def test_float_floor_division_is_unchanged():
    # Floats keep torch-mlir's lowering; integer dividends with float divisors are floats.
    a = torch.tensor([7.5, -7.5, 1e20, -3.0, 0.0])
    b = torch.tensor([2.0, 2.0, 3.0, -2.0, 5.0])
    fn = lambda a, b: (a // b, torch.div(a, b, rounding_mode="floor"),  # noqa: E731
                       torch.arange(5) // 2.5)
    with config.patch(strict=True):
        got = compile_tpu(fn)(a, b)
    torch.testing.assert_close(got, fn(a, b))


def _nonzero(dtype):
    info = torch.iinfo(dtype)
    return st.integers(info.min, info.max).filter(lambda v: v != 0)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_floor_division_property(dtype):
    """Random values over the whole range of ``dtype`` (one compiled program per dtype: the
    shapes stay fixed), against eager CPU."""
    info = torch.iinfo(dtype)
    n = 16
    fn = lambda a, b: (a // b, torch.div(a, b, rounding_mode="floor"), a % b)  # noqa: E731
    with config.patch(strict=True):
        compiled = compile_tpu(fn)

        @settings(max_examples=60, deadline=None, derandomize=True,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(st.lists(st.integers(info.min, info.max), min_size=n, max_size=n),
               st.lists(_nonzero(dtype), min_size=n, max_size=n))
        def check(a, b):
            # MIN // -1 overflows: eager CPU dies of SIGFPE for int32 and int64.
            b = [1 if x == info.min and y == -1 else y for x, y in zip(a, b)]
            a, b = torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)
            for g, e in zip(compiled(a, b), fn(a, b)):
                assert torch.equal(g, e), (a.tolist(), b.tolist(), g.tolist(), e.tolist())
        check()
