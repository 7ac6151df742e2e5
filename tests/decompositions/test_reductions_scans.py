"""The reduction and scan decompositions
(torchtpu_compile/lower/decompositions/reductions_scans.py) against eager CPU PyTorch, in strict
mode: the op must run through XLA, not fall back, and give eager's numbers (edge cases included:
NaN, ties, -inf, 0-d inputs)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import INF, NAN, check, check_on_both_paths, randn
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- scans -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_cumsum_cumprod_logcumsumexp(n):
    x = randn(3, n)
    check(lambda x: torch.cumsum(x, 1), x)
    check(lambda x: torch.cumprod(x, -1), x)
    check(lambda x: torch.logcumsumexp(x, 1), x)


def test_cumsum_returns_no_negative_zero_as_eager():
    # Fuzz seed 3882: eager's sums start from +0.0 (1e5 // cumsum of [-0.0] is inf, not -inf).
    x = torch.tensor([[-0.0, -0.0, 2.0], [-0.0, 1.0, -0.0], [-0.0, -1.0, -0.0]])
    check_on_both_paths(lambda x: (torch.cumsum(x, 0).signbit(), torch.cumsum(x, 1).signbit(),
                                   torch.cumsum(x[:, :1], 1).signbit()), x)


def test_cumsum_of_integers_accumulates_in_int64():
    x = torch.randint(0, 5, (9, 2), dtype=torch.int32)
    check(lambda x: torch.cumsum(x, 0), x)
    check(lambda x: torch.cumsum(x, 0, dtype=torch.float32), x)


def test_logcumsumexp_with_minus_infinity():
    check(lambda x: torch.logcumsumexp(x, 0), torch.tensor([-INF, -INF, 0.0, -INF, 3.0]))


def test_cummax_cummin_ties_and_nan():
    check(lambda x: torch.cummax(x, 1), torch.tensor([[1.0, 3, 3, NAN, 2, 5, NAN, 1]]))
    check(lambda x: torch.cummin(x, 0), torch.randint(0, 3, (9, 3)).float())
    check(lambda x: torch.cummax(x, 0), torch.randint(-5, 5, (6,)))


# --- histograms (and pdist, as_strided_copy) -------------------------------------------------

def test_pdist_histogram_and_as_strided_copy():
    x = randn(7, 4)
    x[3] = x[1]  # a zero distance
    check_on_both_paths(lambda x: tuple(torch.nn.functional.pdist(x, p)
                                        for p in (0.0, 0.5, 1.0, 2.0, 3.0, INF)), x,
                        rtol=1e-5, atol=1e-6)
    data = torch.cat([randn(200) * 3, torch.tensor([-2.0, 2.0, 0.0, 2.5, -2.5])])  # on edges
    weights = randn(205, seed=1).abs()
    edges = torch.tensor([-3.0, -1.0, 0.0, 0.5, 4.0])
    check_on_both_paths(lambda d, w, e: (
        torch.histogram(d, bins=10), torch.histogram(d, bins=8, range=(-2.0, 2.0)),
        torch.histogram(d, bins=5, weight=w, density=True), torch.histogram(d, bins=e),
        torch.histogram(d[:3] * 0 + 1.5, bins=4), torch.histogram(d, bins=e, weight=w)),
        data, weights, edges, rtol=1e-5, atol=1e-6)
    check(lambda x: torch.as_strided_copy(x, (3, 2), (1, 3), 2), randn(12))


def test_histc_fixed_and_data_range():
    check(lambda x: torch.histc(x, 4, 0, 3), torch.tensor([0.0, 1, 1, 3, 2, 2, 2, 3.5, -1, NAN]))
    check(lambda x: torch.histc(x, 10), randn(100))
    check(lambda x: torch.histc(x, 3), torch.full((4,), 2.0))


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32])
def test_histc_of_integer_images_counts_as_of_their_float_values(dtype):
    # The CPU refuses integers and CUDA takes them (Mixtral's router counts experts so): the
    # bin of a uint8 pixel was computed in uint8, x - lo and its product by the bin count
    # wrapping (a 2346-pixel image's counts were [35, 0, ..., 7]). Counts are in the input's
    # dtype, as CUDA's (a uint8 count past 255 wraps).
    image = torch.randint(0, 256, (2, 3, 17, 23), generator=torch.Generator().manual_seed(0))
    x = image.to(dtype)
    with config.patch(strict=True):
        for args in ((10,), (4, 0, 255), (3, 7, 7)):
            actual = torch.histc(x.to("tpu"), *args).cpu()
            assert actual.dtype == dtype
            assert torch.equal(actual, torch.histc(image.float(), *args).to(torch.int64).to(dtype))


# --- reductions of 0-d tensors (torch-mlir crashed the process on several) -------------------

ZERO_DIM_REDUCTIONS = {
    "sum_keepdim": lambda x: torch.sum(x, 0, keepdim=True),
    "sum_dtype": lambda x: torch.sum(x, [0], dtype=torch.float64),
    "mean_keepdim": lambda x: torch.mean(x, 0, keepdim=True),
    "amax_keepdim": lambda x: torch.amax(x, 0, keepdim=True),
    "amin_keepdim": lambda x: torch.amin(x, -1, keepdim=True),
    "aminmax_keepdim": lambda x: torch.aminmax(x, dim=0, keepdim=True),
    "logsumexp": lambda x: torch.logsumexp(x, 0),
    "var": lambda x: torch.var(x, 0),
    "std": lambda x: torch.std(x, 0, correction=0),
    "var_mean": lambda x: torch.var_mean(x, 0, correction=0),
    "softmax": lambda x: torch.softmax(x, 0),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "prod": lambda x: torch.prod(x, 0),
    "argmax": lambda x: torch.argmax(x, 0),
    "any": lambda x: torch.any(x > 0, 0),
    "max_dim": lambda x: torch.max(x, 0),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, 2, 0),
}


@pytest.mark.parametrize("name", list(ZERO_DIM_REDUCTIONS))
def test_reduction_of_a_0d_tensor(name):
    check(ZERO_DIM_REDUCTIONS[name], torch.tensor(1.5))


def test_reductions_of_nd_tensors_keep_their_lowering():
    check(lambda x: (torch.logsumexp(x, 1), torch.var(x, 0), torch.softmax(x, -1)), randn(4, 5))


def test_norm_without_a_dim_as_weight_and_spectral_norm_call_it():
    # C++ callers (weight norm over every dim, spectral norm's power iteration) reach
    # aten.norm.Scalar, which did not lower: it ran on the host (parametrizations tutorial).
    v, g = randn(5, 3, 2), randn(1, seed=1).abs().reshape(())
    check_on_both_paths(lambda v, g: (torch._weight_norm(v, g, -1),) + tuple(
        torch.ops.aten.norm.Scalar(v, p) for p in (2, 1, 3.5, INF, 0)) + (
        torch.ops.aten.norm.ScalarOpt_dtype(v, 2, dtype=torch.float64),
        torch.ops.aten.norm.ScalarOpt_dim_dtype(v, 3, [0, 2], True, dtype=torch.float64)),
        v, g, rtol=1e-5, atol=1e-6)


def test_all_and_any_true_and_a_distribution_built_on_the_device():
    # torch._assert on a tensor and torch.distributions' argument checks call _is_all_true:
    # it ran on the host (a round trip per Normal(...) on the eager device).
    masks = [torch.tensor([True, True]), torch.tensor([True, False]), torch.zeros(0, 3) > 0,
             torch.tensor(False), randn(2, 3) > 0]
    check_on_both_paths(lambda *m: [f(x) for x in m for f in (torch.ops.aten._is_all_true,
                                                               torch.ops.aten._is_any_true)],
                        *masks)
    loc, scale, value = randn(4), randn(4).exp(), randn(4, seed=1)
    with config.patch(strict=True):
        normal = torch.distributions.Normal(loc.to("tpu"), scale.to("tpu"))
        log_prob = normal.log_prob(value.to("tpu")).cpu()
    torch.testing.assert_close(log_prob, torch.distributions.Normal(loc, scale).log_prob(value))


def test_extrema_and_truth_of_uint8_and_bool_tensors():
    # torch-mlir started uint8 and bool extrema from the signed extreme (uint8 amax of [0, 1]
    # was 128, bool max.dim's index 0 whatever the data: cumprod's gradient after a zero was
    # 0) and any/all of uint8 from its bits (any of [200] was 200, all of [200, 130] 0).
    # Every such op on both paths, and cumprod's gradient: tests/slow/test_decompositions_full.py
    u8 = torch.tensor([[0, 1, 0], [200, 255, 130]], dtype=torch.uint8)
    b = torch.tensor([[False, False, True], [True, False, True]])
    check(lambda u, b: (u.amax(1), u.max(1), u.amin(1), u.any(1), u.all(1), b.max(1), b.min(1)),
          u8, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_extrema_of_large_inputs_holding_nan_are_nan(dtype):
    # XLA:CPU's vector max and min skip NaN from 4096 elements on: max of these was 4.0 and
    # amax over rows of two lost the NaN row, where eager's (and XLA's below 4096) is NaN
    x = (torch.arange(8192) % 5).to(dtype)
    x[3001] = NAN
    rows = x.view(-1, 2)
    check_on_both_paths(lambda x, rows: (
        x.max(), x.min(), x.amax(), x.amin(0, keepdim=True), torch.aminmax(x),
        torch.aminmax(rows, dim=1), rows.amax(1), rows.amin(-1),
        torch.linalg.vector_norm(x, float("inf")), torch.linalg.vector_norm(rows, -INF, 1)),
        x, rows)


def test_half_width_sums_accumulate_in_float32():
    # Eager sums bf16 and f16 in float32 and rounds once; the XLA reduce in bf16 rounded at
    # every addition: a bf16 sum of 4096 values in [0.5, 1.5) was off by ~16x eager's error.
    x = torch.rand(3, 4096, generator=torch.Generator().manual_seed(0)) + 0.5

    def reductions(x):
        b = x.bfloat16()
        return (b.sum(1), b.mean(1), b.nansum(1), torch.linalg.vector_norm(b, dim=1),
                b.sum(), x.sum(1, dtype=torch.bfloat16),
                x.half().mean(1))
    # One rounding apart at most: eager's and ours add in different orders.
    check_on_both_paths(reductions, x, rtol=4e-3, atol=0)


def test_half_width_scans_accumulate_in_float32():
    # Eager scans bf16 in float32 and rounds each result once; the scan in bf16 rounded at
    # every step (a cumsum of 3000 values ~3x eager's error). One bf16 step apart at most.
    x = torch.rand(2, 3000, generator=torch.Generator().manual_seed(0)) + 0.5

    def scans(x):
        b = x.bfloat16()
        return (b.cumsum(1), b.logcumsumexp(1), b[:, :200].cumprod(1), x.half().cumsum(1))
    check_on_both_paths(scans, x, rtol=2 ** -7, atol=0)


def test_deviations_of_values_whose_float32_squares_overflow():
    # Fuzz seed 1857: eager's CPU kernel accumulates a float32 (or bf16) variance in float64,
    # so the std of values near 1e30 is finite; in float32 the squares overflowed to inf.
    x = torch.tensor([[1.25, -1e30, -7.0], [-2.1875, -1.5e30, -21.0], [3e37, 2.0, INF],
                      [3e38, -1e30, 5.0]])

    def deviations(x):
        b = x.bfloat16()
        return (x[:2].std(), b[:2].std(), x.std(1), x.std(0, keepdim=True),
                torch.std_mean(x[:2], dim=[0, 1]), torch.var_mean(b, 1, correction=0),
                x.var(1), x[:2, 1:].var(), x[3].std(), x[[0, 3]].std(0),
                torch.std(x[:2] * 1e-3, dim=None, correction=2))
    check_on_both_paths(deviations, x, rtol=1.3e-6, atol=1e-5)


def test_deviations_of_an_empty_input_under_dynamic_shapes():
    # Fuzz seed 4778: std over the zero-size dim of an empty (0, 3) input is NaN in eager;
    # under dynamic=True the input's numel is symbolic, the overflow scaling above did not
    # see that it was empty and its amax raised "Expected reduction dim 0 to have non-zero
    # size" (a second input makes Dynamo keep the sizes symbolic).
    def deviations(x, y):
        v = x * -0.0
        return (torch.std(v, dim=(0,), correction=1, keepdim=True), v.var(0), v.std(1),
                torch.std_mean(v, dim=0))

    x = torch.tensor([[0, 0, 8]], dtype=torch.int8).expand(0, 3)
    y = torch.tensor([9]).expand(1)
    with config.patch(strict=True):
        got = torch.compile(deviations, backend="torchtpu", dynamic=True)(x, y)
    torch.testing.assert_close(got, deviations(x, y), equal_nan=True)


@pytest.mark.parametrize("op", [torch.cumsum, torch.cumprod])
def test_a_scan_along_a_dim_of_one_element_returns_a_new_tensor(op):
    # Fuzz seed 1613: along a dim of one element the scan is a no-op, the decomposition
    # returned its input, and aot_autograd then returned the caller's tensor itself, so a
    # later in-place write to the input changed the result (eager's is a new tensor).
    def fn(x):
        return op(x, 0)

    compiled = torch.compile(fn, backend="torchtpu")
    for x in (torch.tensor([[3.0, -3.75, 0.5]]),
              torch.tensor([[3.0, -5.0, -3.75, -4.5, 0.5, 1.0]], dtype=torch.float64)[..., ::2]):
        result = compiled(x)
        expected = fn(x)
        assert result is not x and not torch._C._is_alias_of(result, x)
        x.neg_()
        assert torch.equal(result, expected)


def test_all_over_a_list_of_dims_runs_through_xla():
    # torch-mlir lowers any.dims but not all.dims: torch.all(x, dim=(0, 1)) ran on the host.
    # Over no dims it is each element's truth; uint8 gives uint8.
    x = torch.tensor([[1.0, 0.0, 2.0], [3.0, NAN, 4.0]])

    def alls(x):
        return (torch.all(x, dim=(0, 1)), torch.all(x, dim=(1,)), torch.all(x, dim=(-1, 0),
                keepdim=True), torch.all(x, dim=()), torch.all(x.to(torch.uint8), dim=(0,)),
                torch.all(x > 0, dim=(0,)))
    check_on_both_paths(alls, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_var_mean_of_half_widths_accumulates_in_float32(dtype):
    # var_mean's mean was summed in the half width (1.3 to 9.6 ulp from the truth where eager,
    # summing in float32 and rounding once, is within 0.5).
    x = (randn(4, 1000) + 1).to(dtype)
    check_on_both_paths(lambda x: torch.var_mean(x, dim=1), x, rtol=1e-3, atol=1e-30)
    check_on_both_paths(lambda x: torch.var_mean(x), x, rtol=1e-3, atol=1e-30)


def test_a_sum_over_every_dim_kept_compiles():
    # sum(dim=None, keepdim=True) is sum.dim_IntList(x, None, True): a graph pass read the
    # dims' length, and compiling raised "object of type 'NoneType' has no len()"
    # (torch.masked.var over all dims reached it).
    x = randn(3, 4, 5)
    check_on_both_paths(lambda t: torch.sum(t, dim=None, keepdim=True), x, rtol=1e-6)
    check_on_both_paths(lambda t: torch.masked.var(t, mask=t > 0), x, rtol=1e-5)


def test_a_histogram_of_no_data_spans_zero_to_one():
    # Its edges were [-0.5, 0.5]: [0, 0] widened as for equal values, where eager's are [0, 1].
    empty = torch.zeros(0, dtype=torch.float64)
    check_on_both_paths(lambda t: tuple(torch.histogram(t, bins=4)), empty)


def test_a_histogram_range_eager_refuses_raises_its_error_on_the_device():
    # A range running backwards or not finite, or no bins, gave all-zero counts on the device
    # (the range's ends are program inputs there, so they are checked in the program).
    x = torch.rand(5)
    for bins, bad in [(3, (1.0, 0.0)), (3, (3.0, 2.5)), (3, (float("nan"), 1.0)),
                      (3, (0.5, float("inf"))), (0, None)]:
        with pytest.raises(RuntimeError) as expected:
            torch.histogram(x, bins=bins, range=bad)
        with pytest.raises(RuntimeError) as got:
            torch.histogram(x.to("tpu"), bins=bins, range=bad).hist.cpu()
        assert str(got.value).startswith(str(expected.value)), (got.value, expected.value)
    for good in [(0.2, 0.8), (0.1, 0.7), (0.5, 0.5)]:
        want = torch.histogram(x, bins=3, range=good)
        got = torch.histogram(x.to("tpu"), bins=3, range=good)
        torch.testing.assert_close(got.hist.cpu(), want.hist)
        torch.testing.assert_close(got.bin_edges.cpu(), want.bin_edges)
