"""The elementwise decompositions (torchtpu_compile/lower/decompositions/elementwise.py) against
eager CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's
numbers (edge cases included: NaN, signed zeros, broadcasting).

Also the elementwise lowering fixes of lower/fx_passes.py and lower/stablehlo_passes.py
(literals folded on the host, boolean comparisons), and integer floor division on every path."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchtpu_compile
from tests.support import python_env
from tests.support.decomposition_checks import INF, NAN, check, check_on_both_paths, randn
from tests.support.helpers import PATHS, compile_tpu, run_on_path
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- arithmetic ------------------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_an_add_of_bools_is_a_logical_or(path, tmp_path):
    # torch-mlir folded true + true of two compares it had folded to true as integers mod 2:
    # false, on compile and fused eager, no error (fuzz seed 4280).
    x = torch.tensor([1, 2, 3])

    def f(x):
        same = x >= x
        return same + same, same.clone().add_(x > 1), torch.add(same, x < 2, alpha=True)
    got = run_on_path(path, f, x, tmp_dir=tmp_path)
    for g, e in zip(got, f(x)):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("path", PATHS)
def test_a_product_with_a_converted_bool_keeps_eagers_nan(path, tmp_path):
    # XLA's algebraic simplifier made convert(mask) * y a select(mask, y, 0), and x / 0.0 a
    # product with inf: where y is inf or NaN eager's 0 * y is NaN, and XLA gave 0
    # (`bools.float() / 0.0` was [0, inf], eager [nan, inf]: fuzz seed 3588).
    mask = torch.tensor([False, True, False, True, False])
    y = torch.tensor([INF, -INF, NAN, 2.5, -3.0])

    def f(mask, y):
        return (mask.float() * y, mask.float() / 0.0, y * mask.double(), mask.half() * y.half(),
                mask.bfloat16() / -0.0, mask.float() * mask.float())
    got = run_on_path(path, f, mask, y, tmp_dir=tmp_path)
    for g, e in zip(got, f(mask, y)):
        torch.testing.assert_close(g, e, equal_nan=True)


@pytest.mark.parametrize("path", PATHS)
def test_a_number_minus_a_tensor_is_computed_in_the_tensor_s_dtype(path, tmp_path):
    # rsub's number became a float32 literal: 1/3 - x of a float64 x was off by float32's
    # rounding and 1e39 - x was inf; rsub's positional alpha raised a TypeError.
    x = torch.tensor([1.0, 2.5, -0.0], dtype=torch.float64)
    ints = torch.tensor([-128, 5, 0], dtype=torch.int8)

    def f(x, ints):
        return (1 / 3 - x, 1e39 - x, torch.rsub(x, 1 / 3, alpha=2), 1.5 - ints, 200 - ints,
                torch.rsub(x.float(), 1e39), 0.1 - x.bfloat16())
    got = run_on_path(path, f, x, ints, tmp_dir=tmp_path)
    for g, e in zip(got, f(x, ints)):
        assert g.dtype == e.dtype and torch.equal(g, e), (g, e)


@pytest.mark.parametrize("path", PATHS)
def test_relu_keeps_a_negative_zero(path, tmp_path):
    # Eager's relu (and Inductor's) returns x unless x < 0, so relu(-0.0) is -0.0; XLA's
    # maximum(x, 0) gave +0.0, and 1 / relu(x) was inf where eager's is -inf. Its gradient at
    # 0 and -0 stays eager's 0.
    x = torch.tensor([-0.0, 0.0, -1.5, 2.0, NAN, -INF, INF])

    def f(x):
        return 1 / torch.relu(x), torch.relu(x.bfloat16()), torch.relu(x.double()).signbit()
    got = run_on_path(path, f, x, tmp_dir=tmp_path)
    for g, e in zip(got, f(x)):
        torch.testing.assert_close(g, e, equal_nan=True)
        assert torch.equal(g.signbit() & ~g.isnan(), e.signbit() & ~e.isnan())
    assert torch.equal(run_on_path(path, torch.relu, torch.tensor([-3, 0, 7]), tmp_dir=tmp_path),
                       torch.tensor([0, 0, 7]))
    leaf = torch.tensor([-0.0, 0.0, -1.0, 2.0], requires_grad=True)
    (torch.relu(leaf) * torch.arange(4.0)).sum().backward()
    grad_eager = leaf.grad.clone()
    leaf.grad = None
    compile_tpu(lambda t: (torch.relu(t) * torch.arange(4.0)).sum())(leaf).backward()
    torch.testing.assert_close(leaf.grad, grad_eager)


def test_remainder_takes_the_divisors_sign():
    a, b = randn(5, 6), randn(5, 6, seed=1)
    check(torch.remainder, a, b)
    check(lambda x: torch.remainder(x, -1.5), a)
    check(lambda x: torch.remainder(2.5, x), b)


def test_remainder_of_integers():
    check(torch.remainder, torch.tensor([-7, -3, 0, 4, 9, -9]), torch.tensor([3, -4, 5, 2, -3, 7]))


def test_remainder_of_literals_computed_in_the_graph():
    # A remainder of values the graph makes itself (a roll's positions) was folded on the host
    # as eager's remainder while XLA computed C's fmod: its sign fix folded away, -2 for 3.
    fn = lambda x: (x + (torch.arange(10) - 7) % 5, torch.remainder(torch.arange(-4.5, 0), 2))  # noqa: E731
    check(fn, torch.zeros(10, dtype=torch.int64))


def test_float_to_integer_conversion_as_eager_on_the_host():
    # XLA saturates (3e9 -> int32 2**31 - 1, -1.7 -> uint8 0, NaN -> 0); eager on x86 goes
    # through int32 or int64, out of range and NaN their minimum, then wraps.
    if torch.tensor([float("nan")]).to(torch.int32).item() != -2 ** 31:
        pytest.skip("this host saturates as XLA does")
    x = torch.tensor([1.7, -1.7, 300.7, -255.0, 4e4, 3e9, -1e10, NAN, INF, -INF])
    dtypes = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
    fn = lambda x: [x.to(d) for d in dtypes] + [x.double().to(torch.uint8) + 1,  # noqa: E731
                                                 x.bfloat16().to(torch.int8)]
    check_on_both_paths(fn, x)


def test_fmod_with_a_scalar():
    check(lambda x: torch.fmod(x, 0.7), randn(4, 3))


def test_reciprocal_and_erf_of_integers_and_bools():
    # torch-mlir lowers them for floats only; eager computes integer and bool inputs in the
    # default float dtype. AveragedModel's SWA step divides 1 by its int64 count on the device.
    ints = torch.tensor([[1, -2, 0], [7, 3, -1]])
    ops = lambda x: (torch.reciprocal(x), 1 / x, torch.erf(x), torch.erfc(x))  # noqa: E731
    for x in (ints, ints > 0):
        check_on_both_paths(ops, x, rtol=1e-6, atol=1e-6)


def test_lerp_with_a_new_weight_each_call_compiles_once():
    # An EMA or SWA average (AveragedModel: _foreach_lerp_ with 1 / (n + 1)) passes a new
    # Python weight every step: each step compiled a program, as PyTorch's reference picks its
    # formula from the weight in Python. Values: eager's bits, both formulas, inf and NaN.
    start, end = randn(64), randn(64, seed=1)
    start[:3], end[1], end[2] = INF, NAN, -INF
    end[3] = NAN  # a finite start: NaN (XLA made the product with 0 a select: 0 at weight 1)
    for weight in (0.3, 0.7, -0.6, 0.5, 1.7, 0.49999997, 1.0):
        check(lambda a, b, w=weight: torch.lerp(a, b, w), start, end, rtol=0, atol=0)
        got = torch.lerp(start.to("tpu"), end.to("tpu"), weight).cpu()
        torch.testing.assert_close(got, torch.lerp(start, end, weight), rtol=0, atol=0,
                                   equal_nan=True)
    averaged = [torch.zeros(3, device="tpu"), torch.zeros(2, device="tpu")]
    current = [torch.ones(3, device="tpu"), torch.ones(2, device="tpu")]
    torch._foreach_lerp_(averaged, current, 1.0)
    torch._foreach_lerp_(averaged, current, 0.5)   # the second weight: traced with it lifted
    before = torchtpu_compile.stats()["eager_programs_compiled"]
    for n in range(2, 6):
        torch._foreach_lerp_(averaged, current, 1 / (n + 1))
    assert torchtpu_compile.stats()["eager_programs_compiled"] == before
    torch.testing.assert_close(averaged[1].cpu(), torch.ones(2))


def test_fmax_fmin_broadcast_and_ignore_nan():
    a = torch.tensor([[1.0, NAN], [3.0, 4.0]])
    b = torch.tensor([[NAN], [2.0]])
    check(torch.fmax, a, b)
    check(torch.fmin, a, b)
    check(torch.fmax, torch.tensor([1, 5, 3]), torch.tensor([4]))


def test_clamp_of_integers_with_a_float_bound_lowers():
    # Eager clamps in the promoted float dtype; torch-mlir's clamp wants one dtype, and the op
    # ran in eager PyTorch (an error under TORCHTPU_STRICT=1).
    check(lambda x: (x.clamp(min=2.5), x.clamp(-1.5, 1), x.clamp(max=0.5)),
          torch.tensor([1, 2, 3, -5]))


def test_clamp_with_broadcast_tensor_bounds():
    x = randn(5, 6)
    check(lambda x, lo, hi: torch.clamp(x, lo, hi), x, randn(5, 1) - 1, randn(6) + 1)
    check(torch.clamp_min, x, randn(5, 1))
    check(torch.clamp_max, x, randn(6))


def test_copies_hypot_angle_dist():
    x = randn(4, 5)
    check(lambda x: torch.narrow_copy(x, 1, 1, 3), x)
    check(lambda x: torch.permute_copy(x, (1, 0)), x)
    check(torch.hypot, x, randn(5, seed=1))
    check(torch.angle, torch.tensor([-1.0, 0.0, 2.0, NAN, -0.0]))
    check(torch.angle, torch.tensor([-1, 0, 2]))
    check(lambda a, b: torch.dist(a, b, 3), x, randn(4, 5, seed=1))


def test_hypot_and_angle_at_extreme_values_are_eagers():
    # hypot was sqrt(a*a + b*b): inf from |a| ~ 1.8e19 in float32, 0 below ~1e-19, and NaN for
    # hypot(inf, nan) where C gives inf. angle of an infinity was NaN (pi below zero * 0), and
    # a float64 angle took float32's pi.
    from tests.support.decomposition_checks import check_on_both_paths
    inf = float("inf")
    a = torch.tensor([3e30, 1e38, 3e-30, inf, NAN, -inf, 3.0, 0.0, -0.0, -7e-20])
    b = torch.tensor([4e30, 1e38, 4e-30, NAN, inf, 1.0, -4.0, 0.0, 5.0, 2e-20])
    for dtype, rtol in ((torch.float32, 3e-7), (torch.float64, 1e-15)):
        check_on_both_paths(torch.hypot, a.to(dtype), b.to(dtype), rtol=rtol, atol=1e-300)
        x = torch.tensor([NAN, inf, -inf, 0.0, -0.0, 1.5, -2.0, -1e-30], dtype=dtype)
        check_on_both_paths(torch.angle, x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64])
def test_copysign_of_integers_takes_the_magnitude_as_a_float(dtype):
    # copysign(int8 -128, 2) was -128.0: the magnitude was taken in int8, where -128 has none.
    smallest = torch.iinfo(dtype).min
    a = torch.tensor([smallest, -5, 7, 0, smallest], dtype=dtype)
    b = torch.tensor([2, 3, -1, -4, -2], dtype=dtype)
    check_on_both_paths(torch.copysign, a, b)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.int64])
def test_a_number_before_the_tensor_keeps_the_tensors_precision(dtype):
    # torch.add(s, x) is add.Tensor(s, x): the number in the first place became a float32
    # literal, so float64 add, sub, mul and div were off by 1e-7 (s = 5.576059452216908).
    s = 5.576059452216908 if dtype.is_floating_point else 7
    x = (randn(4, 5, seed=3) * 9).to(dtype)
    for fn in (lambda t: torch.add(s, t), lambda t: torch.sub(s, t),
               lambda t: torch.mul(s, t), lambda t: torch.div(s, t + 100),
               lambda t: torch.add(s, t, alpha=3)):
        check_on_both_paths(fn, x)


@pytest.mark.parametrize("mode", ["trunc", "floor"])
def test_a_rounding_division_of_two_numbers_is_eagers(mode):
    # torch.div(-8, 6, rounding_mode="trunc") compiled to a division of two int64 literals,
    # which the lowering took as unsigned: 3074457345618258432, and div(8, -6) gave 0.
    for a, b in ((-8, 6), (8, -6), (7, 2), (-7, -2), (-7.5, 2.0), (9, 0.5)):
        want = torch.div(a, b, rounding_mode=mode)
        torch._dynamo.reset()
        got = compile_tpu(lambda a=a, b=b: torch.div(a, b, rounding_mode=mode), dynamic=False)()
        assert got.dtype == want.dtype and torch.equal(got, want), (a, b, got, want)


def test_a_size_divided_by_a_number_shapes_a_view_in_the_program():
    # Longformer's chunking: x.view(b, torch.div(x.size(1), w, rounding_mode="trunc"), w).
    # The quotient, made from a scalar_tensor, had no value while traced: aot_autograd raised
    # "_local_scalar_dense" and the whole graph ran in eager PyTorch (15 times a forward).
    def chunk(x):
        y = x * 2
        return y.view(y.size(0), torch.div(y.size(1), 4, rounding_mode="trunc"), 4).sum(-1)

    x = torch.randn(2, 16)
    with config.patch(strict=True):   # a graph break raises
        torch.testing.assert_close(compile_tpu(chunk, dynamic=False)(x), chunk(x))
    assert torchtpu_compile.stats()["graph_breaks"] == {}


# --- floats bit by bit -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_ldexp_by_integer_exponents_past_the_dtype_range_is_exact(dtype):
    # It was x * 2**e: 2**200 overflowed in float32 (ldexp(0, 200) NaN) and 2**-200 flushed
    # (ldexp(1e30, -200) 0). Results below the normal range are left out (XLA flushes them).
    big = 1e300 if dtype == torch.float64 else 1e30
    x = torch.tensor([0.0, -0.0, big, 3.0, INF, -2.5, 1.0, 7.0]).to(dtype)
    reach = 1500 if dtype == torch.float64 else 200
    e = torch.tensor([reach, reach, -reach, -1, -reach, 3, 0, 1 << 40])
    for exponents in (e, e.to(torch.int32)):
        check_on_both_paths(torch.ldexp, x, exponents.clamp(-2**31, 2**31 - 1).to(
            exponents.dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nextafter_steps_the_bit_pattern(dtype):
    x = torch.tensor([1.0, -1.0, 0.0, -0.0, 3.5, INF, -INF, 3.4e38, 1.0, NAN, 2.0, -2.5, 0.0])
    y = torch.tensor([2.0, 0.0, 1.0, -1.0, -7, 0.0, 0.0, INF, 1.0, 1.0, NAN, -3.0, -0.0])
    x, y = x.to(dtype), y.to(dtype)
    with config.patch(strict=True):
        actual = compile_tpu(torch.nextafter)(x, y)
    assert torch.equal(actual.view(torch.int16), torch.nextafter(x, y).view(torch.int16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_frexp_from_the_bit_pattern_subnormals_included(dtype):
    x = torch.tensor([0.0, -0.0, 1.0, -3.5, 1e-40, -1e-42, INF, -INF, NAN, 0.75, 1e30, 3e-38],
                     dtype=dtype)
    if dtype is torch.float64:
        x = torch.cat([x, torch.tensor([1e-310, -4e-320], dtype=dtype)])
    with config.patch(strict=True):
        mantissa, exponent = compile_tpu(torch.frexp)(x)
    expected = torch.frexp(x)
    assert torch.equal(exponent, expected.exponent)
    torch.testing.assert_close(mantissa, expected.mantissa, rtol=0, atol=0, equal_nan=True)


# --- lowering fixes: literals and comparisons ------------------------------------------------

def test_expressions_of_literals_fold_on_the_host():
    # torch-mlir folds these wrongly (ge to false, add of a negative int to 2**64) or crashes
    # (an int literal against a float); fx_passes folds them with eager PyTorch first.
    def literals(x):
        half = torch.ops.aten.scalar_tensor.default(-1.5, dtype=torch.float32)
        three = torch.ops.aten.scalar_tensor.default(-3, dtype=torch.int64)
        row = torch.ops.aten.full.default([4], 2.5, dtype=torch.float32)
        return torch.stack([x + torch.ops.aten.ge.Scalar(half, -2),
                            x + torch.ops.aten.lt.Scalar(half, 0),
                            x + torch.ops.aten.add.Scalar(half, -2),
                            x * torch.ops.aten.mul.Scalar(row, -2),
                            x + torch.ops.aten.lt.Scalar(three, 0.5),
                            x + torch.ops.aten.remainder.Scalar(row, -1.5)])
    check(literals, randn(4))


def test_literal_float_positions_converted_to_indices_are_eagers():
    # Source rows computed from arange and a float32 ratio (an upsampling backward's taps),
    # read only by a scatter-add: XLA:CPU contracted 4.5 * r - r into one FMA, the position
    # became 8.0 instead of eager's 7.9999995, and row 7's gradient went to row 8.
    ratio = 2.1428570747375488  # float32(15 / 7)

    def scatter_to_rows(g):
        position = (torch.arange(8).to(torch.float32) + 0.5) * ratio - ratio + 0.5
        return torch.zeros(16, 3).index_add(0, position.to(torch.int64), g)

    def rows(g):  # the same literal returned, and used in the program as well
        position = (torch.arange(8).to(torch.float32) + 0.5) * ratio - ratio + 0.5
        return position.to(torch.int64), position.to(torch.int64) + g.to(torch.int64)

    check(scatter_to_rows, randn(8, 3))
    check(rows, randn(8))


@pytest.mark.parametrize("path", PATHS)
def test_float_positions_of_data_converted_to_indices_are_eagers(path, tmp_path):
    # The same arithmetic on data (fuzz seed 3711): XLA:CPU fused a * r - r into one FMA and
    # its simplifier folded -r + 0.5, so position 4 was 8.0 where eager's rounding after each
    # op gives 7.9999995, and the lookup read row 8 for eager's 7. (v + 1) - 1 is v there.
    ratio = 15 / 7
    a, v = torch.arange(9).float(), torch.arange(20.0)
    small = torch.tensor([0.1, 1e-8, 3.3e-8, -0.4])

    def positions(a, v, small):
        index = ((a + 0.5) * ratio - ratio + 0.5).long()
        return index, v[index], ((small + 1) - 1).mul(1e8).long(), (a * 0.1 * 3).floor().int()
    got = run_on_path(path, positions, a, v, small, tmp_dir=tmp_path)
    for g, e in zip(got, positions(a, v, small)):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    with config.patch(exact_index_arithmetic=False):  # XLA's rounding, as before
        if path == "compile":
            assert compile_tpu(positions)(a, v, small)[0][4] == 8


def test_comparisons_of_shape_only_literals_fold_on_the_host():
    # full_like(x, 4.0) is a literal whatever x holds; torch-mlir folded lt(it, 1) to true
    # and the whole result to NaN.
    check(lambda x: torch.where(torch.full_like(x, 4.0) < 1, NAN, x) + 1, randn(8))


@pytest.mark.parametrize("path", PATHS)
def test_bools_compared_with_a_number_are_compared_as_integers(path, tmp_path):
    # eager promotes a bool tensor beside a Python int to int64; the number was made a bool
    # (300 and 2 became True), so bools == 300 was True where the bool was (fuzz seed 3830).
    x = torch.tensor([[False, True, False], [True, False, True]]).t()
    u = torch.tensor([44, 1], dtype=torch.uint8)

    def f(x, u):
        return (x == 300, x == 2, x != 2, x < 2, x > -1, x.le(-7), x >= 0.5, x == 1, u == 300,
                u.lt(-1), u > 2.5)
    got = run_on_path(path, f, x, u, tmp_dir=tmp_path)
    for g, e in zip(got, f(x, u)):
        torch.testing.assert_close(g, e)


def test_boolean_and_uint8_comparisons():
    # torch-mlir emits SIGNED comparisons; XLA rejects them on booleans (stablehlo pass fix).
    a, b = randn(5, 6), randn(5, 6, seed=1)
    check(lambda a, b: (a < 0) != (b < 0), a, b)
    check(lambda a, b: (a < 0) < (b < 0), a, b)
    check(lambda a, b: a < b, torch.tensor([0, 200, 100], dtype=torch.uint8),
          torch.tensor([130, 100, 5], dtype=torch.uint8))


def test_comparisons_and_logical_ops_read_a_0d_tensor_in_the_promoted_dtype():
    # A 0-d tensor does not promote a dimensioned tensor of its kind: eager reads it in the
    # dimensioned one's dtype (int64 256 beside uint8 is 0, float64 1e-50 beside float32 is 0).
    # torch-mlir compared in the left operand's dtype: 256 == uint8 0 was False. Found by the
    # fuzzer (tests/support/fuzz.py, seed 129).
    def compare(u, big, f32, tiny, i64, f32_0d):
        i8 = u.to(torch.int8)
        return (big == u, u != big, big > i8, i8 <= big, tiny == f32, f32 >= tiny,
                torch.logical_and(big, u), torch.logical_or(u, big), torch.logical_xor(big, u),
                torch.logical_and(big, u.to(torch.complex64)), i64 == f32_0d, f32_0d < i64)
    args = (torch.tensor([0, 1, 200], dtype=torch.uint8), torch.tensor(256),
            torch.tensor([0.0, 1.0, -0.0]), torch.tensor(1e-50, dtype=torch.float64),
            torch.tensor([2 ** 24 + 1, 3]), torch.tensor(float(2 ** 24)))
    check_on_both_paths(compare, *args)


def test_division_and_remainder_read_a_0d_tensor_in_the_promoted_dtype():
    # An int64 0-d -130 beside int8 is 126 in eager's kernels: int8 1 // it is 0 and 1 % it is
    # 1; computed in int64 they were -1 and 127. A float64 0-d 70000 beside float16 is inf.
    # Found by the fuzzer's 0-d probe (tests/support/fuzz.py).
    def divide(i8, m130, half, big):
        return (i8 // m130, m130 // i8.clamp(min=1), i8 % m130, m130 % i8.clamp(min=1),
                torch.fmod(i8, m130), torch.div(i8, m130, rounding_mode="floor"), big // half,
                half // big, half % big)
    check_on_both_paths(divide, torch.tensor([0, 1, -7, 100, 127], dtype=torch.int8),
                        torch.tensor(-130), torch.tensor([0.0, 1.0, -7.5, INF, 3.0],
                                                         dtype=torch.float16),
                        torch.tensor(70000.0, dtype=torch.float64))


def test_integer_powers_wrap_as_eager():
    # torch-mlir's integer power was wrong past small exponents (int16 (-7) ** 4464 gave
    # 14465; eager and exact arithmetic mod 2**16: 1665), and read an int64 0-d exponent
    # beside int16 in int64. Found by the fuzzer's 0-d probe.
    def powers(i16, e, i64, u8, e64):
        return (torch.pow(i16, e), torch.pow(e, i16.abs()), i16 ** 4464, i64 ** 3, i64 ** e64,
                u8 ** u8, torch.pow(i16, -i16.abs()), i16 ** 0, u8 ** 7)
    check_on_both_paths(powers, torch.tensor([0, 1, -7, 3, 2, -1, -1], dtype=torch.int16),
                        torch.tensor(70000), torch.tensor([2 ** 40, -3, 5, 7, 0]),
                        torch.tensor([0, 1, 3, 255, 16], dtype=torch.uint8),
                        torch.tensor([63, 62, 100, 21, 0]))


def test_comparisons_of_a_value_with_itself_see_nan():
    # torch-mlir folded eq(x, x) to true: isfinite(nan) was True.
    x = torch.tensor([1.0, NAN, INF, -INF, 0.0])
    check(lambda x: (torch.isfinite(x), x == x, x >= x, x <= x, x != x), x)


# --- integer floor division on every path ----------------------------------------------------
# Integer floor division is exact, as eager's on the CPU, on every path (torch.compile, the
# eager tpu device strict and fused, AOT): torch-mlir divides integers in float64, which loses
# the low digits of int64 beyond 2**53 (and TPUs have no float64).


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


# Dividends and divisors where a remainder from a rounded quotient goes wrong: large quotients,
# an infinite divisor or dividend, signed zeros, a quotient that rounds up to the next integer.
FLOAT_DIVIDENDS = torch.tensor([1e20, 7.0, -1e30, 1.0, -1.0, 3.0, -0.0, INF, 7.5, NAN, 5.0])
FLOAT_DIVISORS = torch.tensor([3.0, 0.1, 7.0, 0.1, 0.1, INF, -3.0, 2.0, -2.0, 1.0, 0.0])


def _float_divisions(a, b):
    return (torch.fmod(a, b), torch.remainder(a, b), a // b,
            torch.div(a, b, rounding_mode="floor"), a // 0.1, torch.arange(5) // 2.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_float_fmod_remainder_and_floor_division_as_the_cpu_kernel(dtype):
    # torch-mlir's fmod is a - trunc(a / b) * b: fmod(1e20, 3) gave 2.2e12 (eager 2),
    # fmod(3, inf) NaN (eager 3); its floor division floor(a / b): 1.0 // 0.1 gave 10 (eager
    # 9), inf // 2 inf (eager NaN). Now StableHLO's exact remainder and the kernel's formula.
    a, b = FLOAT_DIVIDENDS.to(dtype), FLOAT_DIVISORS.to(dtype)
    with config.patch(strict=True):
        got = compile_tpu(_float_divisions, dynamic=dtype == torch.float32)(a, b)
    torch.testing.assert_close(got, _float_divisions(a, b), rtol=0, atol=0, equal_nan=True)
    got = torch.fmod(a.to("tpu"), b.to("tpu")).cpu()
    torch.testing.assert_close(got, torch.fmod(a, b), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_round_to_decimals_of_half_widths_computes_in_float32(dtype):
    # round(bf16 0.35, 1) gave 0.4: 0.35 is 0.3496 in bf16, but 3.496 rounds to 3.5 in bf16.
    x = torch.tensor([0.35, 0.25, 2.675, -0.05, 15.0, 25.0, 1234.5, -0.0, INF, NAN]).to(dtype)
    fn = lambda x: (torch.round(x, decimals=1), torch.round(x, decimals=2),  # noqa: E731
                    torch.round(x, decimals=-1))
    check_on_both_paths(fn, x)


def test_pow_by_half_and_minus_two_as_the_cpu_kernel():
    # The kernel takes x ** 0.5 as sqrt and x ** -0.5 as rsqrt (not for float16): (-inf) **
    # 0.5 gave inf (eager NaN), (-0) ** 0.5 gave 0 (eager -0), (-0) ** -0.5 inf (eager -inf).
    x = torch.tensor([-INF, -0.0, 0.0, INF, NAN, -2.0, 4.0, 0.25])
    fn = lambda x: (x ** 0.5, x ** -0.5, torch.pow(x, -2), x.bfloat16() ** 0.5,  # noqa: E731
                    x.half() ** 0.5)
    check_on_both_paths(fn, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_width_times_a_python_number_uses_the_number_unrounded(dtype):
    # Eager's mul and div kernels take the Python number as a float32 (bf16 0.1 is 0.1001):
    # x * 0.1 was 1 ulp off in about a quarter of the elements.
    x = torch.linspace(-3, 3, 97).to(dtype)
    check_on_both_paths(lambda x: (x * 0.1, x / 0.3, x * 257), x)


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


_BROADCAST_SHIFTS = """
import torch
from tests.support.decomposition_checks import check_on_both_paths
x = torch.tensor([-8, 6, 9, 0, 1]).reshape(5, 1)
shift = torch.tensor([4, 2, 5, 63, 0])
small = torch.tensor([[200], [7]], dtype=torch.uint8)
check_on_both_paths(lambda x, shift, small: (x >> shift, x << shift, shift >> x,
                                            small >> shift[:3].to(torch.uint8), x.int() << shift),
                    x, shift, small)
"""


def test_shifts_broadcast_their_operands():
    # torch-mlir's shifts do not broadcast: an int64[5, 1] >> int64[5] built StableHLO that
    # aborted the process (SIGABRT, no Python error). In a child process: that abort must fail
    # this test, not end the test run.
    done = subprocess.run([sys.executable, "-c", _BROADCAST_SHIFTS], env=python_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def test_shifts_gcd_and_lcm():
    # The shift operators, gcd and lcm ran on the host; bitwise_right_shift shifted uint8
    # arithmetically (200 >> 3 gave 249). Shifts past the width give eager's 0 or -1. A uint8
    # literal (a where's 0, a full_like) did not lower either.
    x = torch.tensor([1, 3, -8, -1, 2**20], dtype=torch.int32)
    shift = torch.tensor([31, 32, 1, 40, 5], dtype=torch.int32)
    small = torch.tensor([200, 255, 7], dtype=torch.uint8)
    a = torch.tensor([12, -18, 0, 7, -4, 0, 2**40])
    b = torch.tensor([18, 12, 0, 0, -6, -5, 3 * 2**20])

    def integer_ops(x, shift, small, a, b):
        return (x << shift, x >> shift, x << 3, x >> 33, small >> small.remainder(9),
                torch.bitwise_right_shift(small, 3), small << 1, torch.gcd(a, b),
                torch.lcm(a, b), torch.gcd(a.int(), b.int()), torch.where(small > 100, small, 0),
                torch.full_like(small, 255) - small)
    check_on_both_paths(integer_ops, x, shift, small, a, b)


def test_gcd_and_lcm_of_integer_extremes_are_eagers():
    # Fuzz seed 6173: jnp.gcd's loop never ended for -2**63 (its own absolute value); the lcm of
    # int8 values whose product wraps is eager's, narrowed from int (-103 for -85 and -53).
    low = -2**63
    a = torch.tensor([low, low, 0, 5, low, -12])
    b = torch.tensor([low, 0, low, low, 6, 18])
    c = torch.tensor([-85, 64, -128, -128], dtype=torch.int8)
    d = torch.tensor([-53, -102, -128, 3], dtype=torch.int8)
    # (the compile path: the eager device runs the same decomposition, a program per op)
    check(lambda a, b, c, d: (torch.gcd(a, b), torch.lcm(a, b), torch.gcd(c, d), torch.lcm(c, d)),
          a, b, c, d)


def test_bitwise_ops_with_a_number():
    # torch-mlir lowers bitwise_and.Scalar only: generate()'s assisted decoding (a bool mask
    # | True) stopped in strict mode, and a number on the left of &, | or ^ ran on the host.
    # A bool tensor with an int is int64, as in eager.
    mask = torch.tensor([True, False, True])
    x = torch.tensor([1, -6, 2**20], dtype=torch.int32)
    small = torch.tensor([200, 255, 7], dtype=torch.uint8)

    def with_numbers(mask, x, small):
        return (mask | True, mask ^ True, mask | 6, torch.bitwise_and(True, mask),
                torch.bitwise_or(5, x), torch.bitwise_xor(250, small))
    check_on_both_paths(with_numbers, mask, x, small)


def test_copysign_xlogy_and_shifts_with_a_number_run_through_xla():
    # PyTorch's references for copysign.Scalar and the Scalar overloads of xlogy and xlog1py
    # build the number with prims.scalar_tensor, and a number shifted by a tensor has no
    # lowering: each ran on the host (OpInfo's reference inputs). Result dtypes as eager's:
    # an int with a float is float32, xlogy of ints float32.
    x = torch.tensor([1.5, -2.0, 0.0, -0.0, NAN])
    ints = torch.tensor([0, 1, 3, 7])
    shifts = torch.tensor([0, 1, 5, 63])

    def with_numbers(x, ints, shifts):
        return (torch.copysign(x, -1.0), torch.copysign(ints, 2.5), torch.copysign(x, -0.0),
                torch.xlogy(2.0, x.abs()), torch.xlogy(3, ints), torch.xlogy(x, 0.5),
                torch.xlogy(ints, 0), torch.special.xlog1py(2.0, x.abs()),
                torch.special.xlog1py(x, 3), torch.bitwise_left_shift(3, shifts),
                torch.bitwise_right_shift(-64, shifts), torch.bitwise_left_shift(2, ints.int()))
    check_on_both_paths(with_numbers, x, ints, shifts)


@pytest.mark.parametrize("dtype, rtol", [(torch.bfloat16, 2 ** -8), (torch.float16, 2 ** -10)])
def test_half_width_gelu_and_elu_round_once_as_eager(dtype, rtol):
    # Their lowerings computed step by step in the half width, where eager's kernels compute
    # in float32 and round once: bf16 gelu(-3) was 45% off, elu(-1e-3) 0 (exp(x) - 1 in bf16).
    x = torch.tensor([-6.0, -3.0, -1.0, -0.1, -1e-3, 0.0, 1e-3, 0.5, 2.0, 7.0]).to(dtype)
    grad = torch.linspace(-2, 2, 10).to(dtype)
    aten = torch.ops.aten

    F = torch.nn.functional

    def activations(x, grad):
        return (F.gelu(x), F.gelu(x, approximate="tanh"), F.elu(x), F.selu(x),
                F.elu(x, alpha=0.5), aten.gelu_backward(grad, x),
                aten.gelu_backward(grad, x, approximate="tanh"),
                aten.elu_backward(grad, 1.0, 1.0, 1.0, False, x))
    check_on_both_paths(activations, x, grad, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("op", ["hardshrink_backward", "softshrink_backward"])
def test_shrink_backward(op):
    # torch-mlir lowers neither: nn.Hardshrink's and nn.Softshrink's backwards ran on the host
    # on the eager device. Values at the thresholds, inside, outside, and NaN.
    x = torch.tensor([-1.0, -0.5, -0.2, 0.0, 0.5, 0.7, NAN, INF, -INF])
    grad = randn(9)
    backward = getattr(torch.ops.aten, op).default
    check_on_both_paths(lambda g, x: backward(g, x, 0.5), grad, x)


@pytest.mark.parametrize("path", PATHS)
def test_where_of_one_value_broadcasts_it_to_the_condition(path, tmp_path):
    # torch-mlir folds where(c, x, x) to x without the broadcast: a 0-d x under a [1]
    # condition came back [] and the fused program failed to build (fuzz seed 1509).
    def fn(x):
        low = x.min(dim=0)[0]
        return torch.where(x > 0, low, low), torch.where(x < 0, x.sum(), x.sum())[1:]
    x = torch.tensor([-9, -7])[1:]
    actual = run_on_path(path, fn, x, tmp_dir=tmp_path)
    expected = fn(x)
    for a, e in zip(actual, expected):
        assert a.shape == e.shape and torch.equal(a, e), (a, e)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_truncated_division_by_a_python_number_keeps_the_number(dtype):
    # torch's decomposition of div.Scalar_mode took the number as a float32: float64
    # 2.0 / 1e-3 truncated to 1999 (eager 2000), silently (fuzz seed 3136).
    def trunc(x, d):
        return (torch.div(x, 1e-3, rounding_mode="trunc"), torch.div(x, 3, rounding_mode="trunc"),
                torch.div(x, -0.0, rounding_mode="trunc"), torch.div(x, d, rounding_mode="trunc"),
                torch.div(7.5, d, rounding_mode="trunc"))
    x = torch.tensor([2.0, 3.25, -1.0, 0.3, -2.9, 1e-3, 0.0, -0.0, INF, NAN, 57.0, 100.25],
                     dtype=dtype)
    d = torch.tensor([0.1, 1e-3, 0.7, -0.3, 0.0, 2.0, 1.5, -3.0, 0.1, 1.0, 0.57, 0.01],
                     dtype=dtype)
    check_on_both_paths(trunc, x, d)


@pytest.mark.parametrize("path", PATHS)
def test_where_of_a_value_and_its_view_broadcasts_them(path, tmp_path):
    # x and x.view(-1) of a [1] x are one value to torch-mlir, which folded the where to it:
    # LoweringError on compile (fuzz seed 3315, generation 2)
    def fn(x, y):
        return torch.where(y > 0, x, x.view(-1)), torch.where(y > 0, y, x.view(-1))
    x, y = torch.tensor([5], dtype=torch.int32), torch.tensor([4, -7, -3, 3], dtype=torch.int16)
    actual = run_on_path(path, fn, x, y, tmp_dir=tmp_path)
    for a, e in zip(actual, fn(x, y)):
        assert a.dtype == e.dtype and torch.equal(a, e), (a, e)


def test_rrelu_in_eval_mode_has_eagers_gradient():
    # torch-mlir's lowering of rrelu_with_noise_backward (eval mode) gave grad + x * slope
    # for negative x: F.rrelu(training=False)'s gradient was 0.6 where eager's is 0.2.
    def grad_of_rrelu(x, g):
        out = torch.nn.functional.rrelu(x, 0.1, 0.3, training=False)
        return out.detach(), torch.autograd.grad(out, x, g)[0]
    x = torch.tensor([-2.0, -1.0, -0.0, 1.0, 2.0], requires_grad=True)
    g = torch.tensor([1.0, 10, 7, 100, 1000])
    check_on_both_paths(grad_of_rrelu, x, g)


def test_trunc_and_frac_keep_eagers_sign_of_zero():
    # torch-mlir's trunc gave +0.0 for -0.0, and frac(-0.0) = x - trunc(x) came out -0.0.
    x = torch.tensor([-0.0, 0.0, -0.5, 0.5, -1.5, 2.7, INF, -INF, NAN])
    for fn in (torch.trunc, torch.frac):
        check_on_both_paths(lambda t, fn=fn: (fn(t), torch.signbit(fn(t))), x)
