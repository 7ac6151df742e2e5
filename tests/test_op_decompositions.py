"""Each of our decompositions and lowering fixes (lower/op_decompositions.py,
lower/stablehlo_passes.py) against eager CPU PyTorch, in strict mode: the op must run through
XLA, not fall back, and give eager's numbers (edge cases included: NaN, ties, broadcasting)."""
from __future__ import annotations

import pytest
import torch

from helpers import compile_tpu, configured

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

NAN, INF = float("nan"), float("inf")
aten = torch.ops.aten


def check(fn, *args, rtol=1e-4, atol=1e-5):
    with configured(strict=True, matmul_precision="highest"):
        actual = compile_tpu(fn)(*args)
    expected = fn(*args)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- elementwise -----------------------------------------------------------------------------

def test_remainder_takes_the_divisors_sign():
    a, b = randn(5, 6), randn(5, 6, seed=1)
    check(torch.remainder, a, b)
    check(lambda x: torch.remainder(x, -1.5), a)
    check(lambda x: torch.remainder(2.5, x), b)


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


def test_comparisons_of_shape_only_literals_fold_on_the_host():
    # full_like(x, 4.0) is a literal whatever x holds; torch-mlir folded lt(it, 1) to true
    # and the whole result to NaN.
    check(lambda x: torch.where(torch.full_like(x, 4.0) < 1, NAN, x) + 1, randn(8))


def test_remainder_of_integers():
    check(torch.remainder, torch.tensor([-7, -3, 0, 4, 9, -9]), torch.tensor([3, -4, 5, 2, -3, 7]))


def test_fmod_with_a_scalar():
    check(lambda x: torch.fmod(x, 0.7), randn(4, 3))


def test_fmax_fmin_broadcast_and_ignore_nan():
    a = torch.tensor([[1.0, NAN], [3.0, 4.0]])
    b = torch.tensor([[NAN], [2.0]])
    check(torch.fmax, a, b)
    check(torch.fmin, a, b)
    check(torch.fmax, torch.tensor([1, 5, 3]), torch.tensor([4]))


def test_clamp_with_broadcast_tensor_bounds():
    x = randn(5, 6)
    check(lambda x, lo, hi: torch.clamp(x, lo, hi), x, randn(5, 1) - 1, randn(6) + 1)
    check(torch.clamp_min, x, randn(5, 1))
    check(torch.clamp_max, x, randn(6))


def test_addmv_scales_and_ignores_self_when_beta_is_zero():
    mat, vec = randn(5, 6), randn(6)
    check(lambda s, m, v: torch.addmv(s, m, v, beta=0.5, alpha=2.0), randn(5), mat, vec)
    check(lambda s, m, v: torch.addmv(s, m, v, beta=0), torch.full((5,), NAN), mat, vec)


def test_boolean_and_uint8_comparisons():
    # torch-mlir emits SIGNED comparisons; XLA rejects them on booleans (stablehlo pass fix).
    a, b = randn(5, 6), randn(5, 6, seed=1)
    check(lambda a, b: (a < 0) != (b < 0), a, b)
    check(lambda a, b: (a < 0) < (b < 0), a, b)
    check(lambda a, b: a < b, torch.tensor([0, 200, 100], dtype=torch.uint8),
          torch.tensor([130, 100, 5], dtype=torch.uint8))


# --- scans -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 7, 16])
def test_cumsum_cumprod_logcumsumexp(n):
    x = randn(3, n)
    check(lambda x: torch.cumsum(x, 1), x)
    check(lambda x: torch.cumprod(x, -1), x)
    check(lambda x: torch.logcumsumexp(x, 1), x)


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


# --- diagonals, selection, distances ---------------------------------------------------------

@pytest.mark.parametrize("offset, dim1, dim2", [(0, 0, 1), (1, 0, 1), (-2, 1, 0), (3, 1, 2),
                                                 (9, 0, 1)])
def test_diagonal_and_diagonal_scatter(offset, dim1, dim2):
    x = randn(4, 6, 5)
    check(lambda x: torch.diagonal(x, offset, dim1, dim2) * 2, x)
    src = torch.diagonal(x, offset, dim1, dim2).clone() + 1
    check(lambda x, s: torch.diagonal_scatter(x, s, offset, dim1, dim2), x, src)


def test_diag_of_a_matrix():
    check(lambda x: torch.diag(x, -1), randn(5, 6))


def test_kthvalue_counts_nan_as_largest():
    check(lambda x: torch.kthvalue(x, 2, 1), randn(5, 6))
    check(lambda x: torch.kthvalue(x, 3, 0, True), torch.tensor([[1.0, NAN], [3, 0], [2, 5]]))


TIES_AND_NANS = torch.tensor([[3.0, 1, 3, 1, 2, 2, 2, 5], [NAN, 1, NAN, 0, 0, 0, 0, 0],
                              [2, 2, 2, 2, 1, 1, 1, 1], [NAN, NAN, NAN, NAN, NAN, 4, NAN, NAN]])


def check_on_both_paths(fn, *args, rtol=0.0, atol=0.0):
    """``check`` (compile path), then the eager tpu device, strict; exactly eager's unless
    given tolerances."""
    check(fn, *args, **({"rtol": rtol, "atol": atol} if rtol or atol else {}))
    with configured(strict=True, matmul_precision="highest"):
        actual = fn(*(a.to("tpu") for a in args))
    torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), actual),
                               fn(*args), rtol=rtol, atol=atol, equal_nan=True)


def test_stable_sorts_keep_ties_in_order_and_every_sort_puts_nan_last():
    # torch-mlir's comparator left NaN unordered; sort(stable=True) did not lower. The
    # default sort stays unstable, as eager's (both are std::sort on the CPU).
    def sorts(x):
        return (torch.sort(x, stable=True), torch.sort(x, dim=0, descending=True, stable=True),
                torch.argsort(x, dim=1, stable=True))
    check_on_both_paths(sorts, TIES_AND_NANS)
    check(sorts, torch.tensor([[3, 1, 3, 1, 2], [0, 0, -1, 0, 5]]))
    # Without ties the default sort has one answer: NaN last ascending, first descending.
    distinct = torch.tensor([[3.0, NAN, -1, 2, INF, 0], [NAN, 1, -INF, 5, 4, -2]])
    check(lambda x: (torch.sort(x), torch.sort(x, descending=True)), distinct)


TOPK_CASES = [  # (k as a fraction of the dim's size, largest, sorted)
    (0, True, True), (1, True, True), (0.5, True, True), (1.0, True, True),
    (1, False, True), (0.5, False, True), (1.0, False, True), (0.5, True, False),
    (0.5, False, False)]


def _topk_sweep(inputs, cases=TOPK_CASES):
    """topk of each input along each dim for each case (k = 1 means one element, a float a
    fraction of the dim): [((x, k, dim, largest, sorted), (values, indices))]."""
    results = []
    for x in inputs:
        for dim in range(x.dim()):
            n = x.shape[dim]
            for k, largest, sorted_ in cases:
                k = min(k, n) if isinstance(k, int) else int(k * n)
                out = torch.topk(x, k, dim - x.dim() if dim else dim, largest=largest,
                                 sorted=sorted_)
                results.append(((x, k, dim, largest, sorted_), tuple(out)))
    return results


def check_topk(*inputs, cases=TOPK_CASES, on_device=False):
    """torchtpu's topk (compiled, all in one graph; with ``on_device`` the eager tpu device
    too) against eager: the values of eager's topk, the indices of eager's stable sort (the
    lowest index first among equal values), each index pointing at its value."""
    with configured(strict=True, matmul_precision="highest"):
        ours = [compile_tpu(lambda *xs: [out for _, out in _topk_sweep(xs, cases)])(*inputs)]
        if on_device:
            ours.append([tuple(t.cpu() for t in out) for _, out in
                         _topk_sweep([x.to("tpu") for x in inputs], cases)])
    for i, ((x, k, dim, largest, sorted_), eager) in enumerate(_topk_sweep(inputs, cases)):
        stable = torch.sort(x, dim=dim, descending=largest, stable=True)
        want_values, want_indices = (t.narrow(dim, 0, k) for t in stable)
        eager_values = eager[0] if sorted_ else \
            torch.sort(eager[0], dim=dim, descending=largest, stable=True).values
        for values, indices in (path[i] for path in ours):
            what = f"topk(k={k}, dim={dim}, largest={largest}, sorted={sorted_}) of {x.dtype}"
            for got, want in ((values, eager_values), (values, want_values),
                              (x.gather(dim, indices), eager_values)):
                torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True,
                                           msg=lambda m: f"{what}: {m}")
            assert torch.equal(indices, want_indices), f"{what}: {indices} != {want_indices}"


def test_topk_of_equal_values_picks_the_lowest_indices():
    # RT-DETR v2 at random init: all 84 encoder scores of an image round to one float32
    # (-log 2), and topk(30) picked among them as the platform's unstable sort happened to
    # (XLA:CPU: 52, 62, 61, ...; eager's nth_element: 56, 83, 81, ...; torch.topk's docs
    # leave it unspecified). Ours is the stable sort's first k on every platform.
    scores = torch.full((3, 84), -0.6931472)
    with configured(strict=True, matmul_precision="highest"):
        values, indices = compile_tpu(lambda s: torch.topk(s, 30, dim=1))(scores)
    assert torch.equal(indices, torch.arange(30).expand(3, 30))
    assert torch.equal(values, torch.topk(scores, 30, dim=1).values)
    check_topk(scores, cases=[(30, True, True), (30, False, True)], on_device=True)


def test_topk_sweep_against_eager_with_ties_nan_infinities_and_signed_zeros():
    gen = torch.Generator().manual_seed(0)
    few_values = torch.randint(0, 3, (5, 40), generator=gen).float()   # long runs of ties
    special = torch.tensor([[NAN, 1, INF, -INF, 0.0, -0.0, 1, NAN, -INF, 2, INF, 0.0],
                            [-0.0, 0.0, -0.0, 0.0, NAN, NAN, NAN, 3, 3, -1, -1, -1]])
    distinct = torch.randn(4, 70, generator=gen)                        # eager's indices too
    check_topk(few_values, few_values.reshape(5, 4, 10).transpose(0, 1), special, distinct)
    check_topk(special, cases=TOPK_CASES[1:3] + TOPK_CASES[4:6], on_device=True)


def test_topk_of_every_dtype_with_ties():
    gen = torch.Generator().manual_seed(1)
    ties = torch.randint(0, 3, (3, 20), generator=gen)
    check_topk(*(ties.to(dtype) for dtype in (torch.float64, torch.bfloat16, torch.float16,
                                              torch.int64, torch.int32, torch.uint8)),
               cases=[(1, True, True), (0.5, True, True), (0.5, False, True)])


def test_topk_of_a_scalar_and_of_nothing_and_its_errors():
    check(lambda x: (torch.topk(x, 1), torch.topk(x, 0)), torch.tensor(2.5))
    check(lambda x: torch.topk(x, 0, dim=1), torch.zeros(3, 0))
    for bad, message in ((lambda x: torch.topk(x > 0, 1), "bool"),
                         (lambda x: torch.topk(x, 5), "k")):
        with pytest.raises(RuntimeError, match=message):
            bad(torch.zeros(4))
        with configured(strict=True), pytest.raises(RuntimeError, match=message):
            compile_tpu(bad)(torch.zeros(4))
        with pytest.raises(RuntimeError, match=message):
            bad(torch.zeros(4, device="tpu"))


def test_median_and_nanmedian_pick_the_lower_middle_as_eager():
    # Eager's rules: median is NaN (at the first NaN) if a NaN is present; nanmedian skips them.
    def medians(x):
        return (torch.median(x, 1), torch.nanmedian(x, 1), torch.median(x, 0, keepdim=True),
                torch.median(x), torch.nanmedian(x), torch.nanmedian(x[:3]))
    check_on_both_paths(medians, TIES_AND_NANS)
    check(lambda x: (torch.median(x, 0), torch.median(x)), torch.tensor([[5, 5, 5], [5, 1, 5]]))


def test_mode_is_the_smallest_most_frequent_value_at_its_last_position():
    check_on_both_paths(lambda x: (torch.mode(x), torch.mode(x, 0, keepdim=True)),
                        TIES_AND_NANS[[0, 2]])
    check(lambda x: torch.mode(x), torch.tensor([[1, 2, 2, 1, 3, 3, 0, 0, 0], [7] * 9]))


def test_hurwitz_zeta_and_polygamma_of_every_order():
    # Euler-Maclaurin as Cephes, with a compensated direct sum (terms cancel below q = 0).
    s = torch.tensor([2.0, 3, 4.5, 1.5, 7, 2, 3, 2, 0.5, 1, 2, 20, 40])
    q = torch.tensor([1.0, 0.5, 2, 10, -3.5, -7.3, 100, 0, 1, 1, -2.5, 0.3, 3])
    x = torch.linspace(-8.7, 9, 40)
    check(lambda s, q, x: (torch.special.zeta(s, q), torch.special.zeta(s, 2.0),
                           torch.polygamma(1, x), torch.polygamma(3, x) + 1), s, q, x)


def test_error_function_and_bessel_special_functions():
    x = torch.cat([torch.linspace(-12, 40, 300), torch.tensor([0.0, -0.0, INF, -INF, NAN])])
    unit = torch.cat([torch.linspace(-1, 1, 201), torch.tensor([0.9999999, -1.5, NAN])])
    p = torch.tensor([0.0, 1e-37, 1e-30, 1e-10, 1e-4, 0.02, 0.3, 0.5, 0.7, 0.999, 1 - 1e-7, 1,
                      -0.1, 1.1])
    special = torch.special
    check(lambda x, unit, p: (
        torch.erfinv(unit), special.ndtri(p), special.erfcx(x), special.log_ndtr(x),
        special.i0(x), special.i0e(x), special.i1(x), special.i1e(x)), x, unit, p)
    check(lambda x, unit: (special.i0e(x), torch.erfinv(unit)), x.double(), x.double().tanh())


def test_modified_bessel_aliases_and_incomplete_gamma():
    x = torch.cat([torch.linspace(-12, 40, 50), torch.tensor([0.0, INF, -INF, NAN])])
    special = torch.special
    check(lambda x: (special.modified_bessel_i0(x), special.modified_bessel_i1(x)), x)
    # igamma/igammac: JAX's gammainc/gammaincc, with eager's answers at a = inf and a = 0.
    a = torch.tensor([0.0, 0.0, 1.0, 2.0, INF, 3.0, -1.0, 2.0, 0.5, 1e-3, 50.0, 7.5, INF, NAN,
                      NAN, NAN, 1.0, INF])
    z = torch.tensor([0.0, 1.0, 0.0, INF, 2.0, INF, 1.0, -1.0, 0.3, 2.0, 49.0, 0.1, INF, 1.0,
                      0.0, INF, NAN, NAN])
    check_on_both_paths(lambda a, z: (torch.igamma(a, z), torch.igammac(a, z),
                                      special.gammaincc(a[:, None], z[::2])),
                        a, z, rtol=1e-4, atol=1e-5)
    check(lambda a, z: (torch.igamma(a, z), torch.igammac(a, z)),
          a.bfloat16(), z.bfloat16(), rtol=1.6e-2, atol=1e-3)


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


def test_3d_max_pool_indices_and_adaptive_pools_with_ties_and_nan():
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

    def loss(x):
        return (F.max_pool3d(x, 3, stride=2, padding=1).pow(2).sum()
                + F.adaptive_max_pool3d(x, (2, 4, 3)).pow(2).sum()
                + F.adaptive_avg_pool3d(x, (2, 4, 3)).pow(2).sum())
    x = randn(2, 2, 5, 6, 7).requires_grad_()
    check(lambda x: torch.autograd.grad(loss(x), x)[0], x)


def test_segment_reduce_with_empty_segments_initial_and_offsets():
    data, lengths = torch.tensor([1.0, 2, 3, NAN, 5, 6, 7]), torch.tensor([2, 0, 3, 2])
    rows, offsets = torch.arange(12.0).reshape(2, 6), torch.tensor([[0, 2, 6], [0, 3, 6]])

    def segments(data, lengths, rows, offsets):
        out = []
        for reduce in ("sum", "mean", "max", "min", "prod"):
            out.append(torch.segment_reduce(data, reduce, lengths=lengths))
            out.append(torch.segment_reduce(data, reduce, lengths=lengths, initial=10.0))
            out.append(torch.segment_reduce(rows, reduce, offsets=offsets, axis=1))
        return out
    check(segments, data, lengths, rows, offsets)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nextafter_steps_the_bit_pattern(dtype):
    x = torch.tensor([1.0, -1.0, 0.0, -0.0, 3.5, INF, -INF, 3.4e38, 1.0, NAN, 2.0, -2.5, 0.0])
    y = torch.tensor([2.0, 0.0, 1.0, -1.0, -7, 0.0, 0.0, INF, 1.0, 1.0, NAN, -3.0, -0.0])
    x, y = x.to(dtype), y.to(dtype)
    with configured(strict=True):
        actual = compile_tpu(torch.nextafter)(x, y)
    assert torch.equal(actual.view(torch.int16), torch.nextafter(x, y).view(torch.int16))


def test_comparisons_of_a_value_with_itself_see_nan():
    # torch-mlir folded eq(x, x) to true: isfinite(nan) was True.
    x = torch.tensor([1.0, NAN, INF, -INF, 0.0])
    check(lambda x: (torch.isfinite(x), x == x, x >= x, x <= x, x != x), x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_frexp_from_the_bit_pattern_subnormals_included(dtype):
    x = torch.tensor([0.0, -0.0, 1.0, -3.5, 1e-40, -1e-42, INF, -INF, NAN, 0.75, 1e30, 3e-38],
                     dtype=dtype)
    if dtype is torch.float64:
        x = torch.cat([x, torch.tensor([1e-310, -4e-320], dtype=dtype)])
    with configured(strict=True):
        mantissa, exponent = compile_tpu(torch.frexp)(x)
    expected = torch.frexp(x)
    assert torch.equal(exponent, expected.exponent)
    torch.testing.assert_close(mantissa, expected.mantissa, rtol=0, atol=0, equal_nan=True)


# --- through JAX (lower/jax_decompositions.py) ------------------------------------------------

def test_fft_family_through_jax():
    # torch-mlir lowers no FFT and no complex arithmetic; JAX's stablehlo.fft is spliced in.
    x, z = randn(4, 6), torch.complex(randn(4, 6, seed=1), randn(4, 6, seed=2))
    fft = torch.fft
    check_on_both_paths(lambda x, z: (
        fft.fft(x), fft.rfft(x, norm="ortho"), fft.ifft(z, norm="forward"), fft.irfft(z, n=9),
        fft.fft2(z), fft.rfftn(x), fft.hfft(z), fft.ifftn(z, dim=(0,)), torch.view_as_real(z),
        torch.view_as_complex(torch.stack([x, x.flip(0)], -1)), torch.complex(x, x[:1]),
        torch.polar(x.abs(), x[:1]),
        torch.stft(x.flatten(), 4, window=torch.ones(4, device=x.device),
                   return_complex=True)), x, z,
        rtol=1e-4, atol=1e-4)


def test_cholesky_and_triangular_solves_through_jax():
    m = randn(3, 4, 4)
    a = m @ m.mT + 4 * torch.eye(4)
    b = randn(3, 4, 2, seed=1)
    not_definite = torch.diag(torch.tensor([1.0, 2, -1, 1])).expand(3, 4, 4).clone()
    not_definite[1] = torch.eye(4)
    not_definite[2, :2, :2] = torch.tensor([[4.0, 2], [2, 1]])

    def factor_and_solve(a, b, not_definite):
        lower, info = torch.linalg.cholesky_ex(a)
        return (lower, info, torch.linalg.cholesky_ex(a, upper=True)[0], torch.cholesky(a),
                torch.linalg.cholesky_ex(not_definite)[1],   # LAPACK's info: 3, 0, 2
                torch.linalg.solve_triangular(lower, b, upper=False),
                torch.linalg.solve_triangular(lower.mT, b, upper=True, unitriangular=True),
                torch.linalg.solve_triangular(lower, b.mT, upper=False, left=False),
                torch.triangular_solve(b, lower, upper=False, transpose=True),
                torch.cholesky_solve(b, lower), torch.cholesky_solve(b, lower.mT, upper=True),
                torch.cholesky_inverse(lower), torch.linalg.cholesky_ex(a[:0]))
    check_on_both_paths(factor_and_solve, a, b, not_definite, rtol=1e-4, atol=1e-5)


def test_householder_qr_pieces_through_jax():
    a, c, c2 = randn(3, 5, 4), randn(3, 5, 2, seed=1), randn(3, 2, 5, seed=2)
    check_on_both_paths(lambda a, c, c2: (
        torch.geqrf(a), torch.linalg.householder_product(*torch.geqrf(a)),
        torch.ormqr(*torch.geqrf(a), c), torch.ormqr(*torch.geqrf(a), c, transpose=True),
        torch.ormqr(*torch.geqrf(a), c2, left=False)), a, c, c2, rtol=1e-4, atol=1e-4)


def test_linalg_error_checks_read_info_on_the_host_as_eager():
    # torch.linalg.cholesky = cholesky_ex + a check of info that raises: the check is a host
    # step by design (strict mode allows it), not a fallback, and names eager's minor.
    m = randn(2, 4, 4)
    a = m @ m.mT + 4 * torch.eye(4)
    with configured(strict=True, matmul_precision="highest"):
        compiled = compile_tpu(lambda a: torch.linalg.cholesky(a) * 2)
        torch.testing.assert_close(compiled(a), torch.linalg.cholesky(a) * 2)
        with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 3"):
            compiled(torch.diag(torch.tensor([1.0, 2, -1, 1])).expand(2, 4, 4))


def test_lu_determinants_inverse_and_solves_through_jax():
    # getrf's LU, 1-based pivots and info (the first zero pivot of a singular matrix).
    a, b, v = randn(3, 4, 4), randn(3, 4, 2, seed=1), randn(3, 4, seed=2)
    singular = a.clone()
    singular[1, 2] = singular[1, 0] * 2
    singular[2] = 0
    linalg = torch.linalg
    check_on_both_paths(lambda a, b, v, singular: (
        linalg.lu_factor_ex(a), linalg.lu_factor_ex(singular)[2], linalg.det(a),
        linalg.slogdet(a), linalg.inv_ex(a), linalg.solve_ex(a, v),
        linalg.solve_ex(a, b.mT[..., :4], left=False),
        linalg.lu_solve(*linalg.lu_factor_ex(a)[:2], b, adjoint=True), linalg.inv_ex(a[:0]),
        linalg.solve_ex(a[:0], b[:0])), a, b, v, singular,
        rtol=1e-4, atol=1e-4)


def test_svd_qr_and_lu_unpacking_through_jax():
    a = randn(3, 5, 4)
    linalg = torch.linalg
    check_on_both_paths(lambda a: (
        linalg.svd(a), linalg.svd(a, full_matrices=False), linalg.svdvals(a), linalg.qr(a),
        linalg.qr(a, mode="complete"), linalg.qr(a, mode="r")[1], linalg.lu(a), linalg.lu(a.mT),
        torch.lu_unpack(*linalg.lu_factor_ex(a[:, :4])[:2]), linalg.pinv(a),
        linalg.pinv(a, atol=0.5)), a, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, INF])
def test_cdist(p):
    check(lambda a, b: torch.cdist(a, b, p=p), randn(2, 5, 3), randn(2, 4, 3, seed=1))


def test_histc_fixed_and_data_range():
    check(lambda x: torch.histc(x, 4, 0, 3), torch.tensor([0.0, 1, 1, 3, 2, 2, 2, 3.5, -1, NAN]))
    check(lambda x: torch.histc(x, 10), randn(100))
    check(lambda x: torch.histc(x, 3), torch.full((4,), 2.0))


# --- grouped matmuls -------------------------------------------------------------------------

def test_grouped_mm_decomposition_matches_a_loop_over_groups():
    from torchtpu_compile.lower.op_decompositions import grouped_mm
    a, w = randn(10, 4), randn(3, 4, 5)
    offs = torch.tensor([3, 3, 8], dtype=torch.int32)
    expected = torch.zeros(10, 5)
    start = 0
    for e, end in enumerate(offs.tolist()):
        expected[start:end] = a[start:end] @ w[e]
        start = end
    torch.testing.assert_close(grouped_mm(a, w, offs), expected)
    batched = randn(3, 2, 4)
    torch.testing.assert_close(grouped_mm(batched, w), torch.bmm(batched, w))


def test_transformers_grouped_mm_fallback_forward_and_backward():
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the custom ops)
    grouped = torch.ops.transformers.grouped_mm_fallback
    offs = torch.tensor([2, 2, 7], dtype=torch.int32)
    w = randn(3, 4, 5).requires_grad_()

    def loss(a, w):
        return (grouped(a, w, offs) * torch.arange(5.0)).sum()

    a = randn(8, 4).requires_grad_()
    expected = torch.autograd.grad(loss(a, w), (a, w))
    with configured(strict=True, matmul_precision="highest"):
        compiled = compile_tpu(loss)
        actual = torch.autograd.grad(compiled(a, w), (a, w))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


# --- views and pooling -----------------------------------------------------------------------

def test_as_strided_of_a_computed_tensor():
    # torch-mlir lowers as_strided through a constant XLA rejects; group_norm emits it.
    check(lambda x: torch.as_strided(x + 1, (3, 2), (1, 3), 1), randn(12))
    check(lambda x: torch.as_strided(x * 2, (4, 3), (3, 1)), randn(12))


def test_group_norm_with_affine_parameters():
    F = torch.nn.functional
    check(lambda x, w, b: F.group_norm(x, 2, w, b, 0.5), randn(1, 6, 3), randn(6), randn(6))


@pytest.mark.parametrize("shape, kernel, stride", [((1, 2, 3, 6), 3, 2), ((1, 2, 7, 6), 3, 2),
                                                   ((2, 3, 7), 2, 2)])
def test_max_pool_ceil_mode_values_and_indices(shape, kernel, stride):
    F = torch.nn.functional
    pool = F.max_pool1d if len(shape) == 3 else F.max_pool2d
    check(lambda x: pool(x, kernel, stride, ceil_mode=True, return_indices=True), randn(*shape))


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=2, stride=1, padding=1, count_include_pad=False),
    dict(kernel_size=2, stride=1, padding=1, divisor_override=3),
])
def test_avg_pool2d_ceil_mode_and_divisors(kwargs):
    check(lambda x: torch.nn.functional.avg_pool2d(x, **kwargs), randn(1, 2, 6, 7))


def test_avg_pool3d_divisor_override():
    F = torch.nn.functional
    check(lambda x: F.avg_pool3d(x, 2, stride=1, padding=1, ceil_mode=True,
                                 count_include_pad=False, divisor_override=2), randn(1, 2, 4, 4, 4))


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


def test_grid_sampler_backward_every_mode_at_borders_and_pixel_centres():
    # Unlowered: training deformable attention (RT-DETR, Deformable DETR: grid_sample,
    # bilinear, zeros) ran it in eager PyTorch, a host round trip per layer and step. The
    # grid hits borders, pixel centres and edges of both conventions, and lies outside.
    x = randn(2, 3, 5, 7)
    marks = torch.tensor([-1.0, 1, 0, -1.5, 1.5, -1 + 1 / 7, 1 - 1 / 7, -1 + 2 / 7, 3, -3.2, 2])
    special = torch.stack(torch.meshgrid(marks, marks, indexing="xy"), -1)
    grid = torch.cat([special.expand(2, -1, -1, -1), randn(2, 11, 4, 2) * 1.5], 2)
    grad = randn(2, 3, 11, 15, seed=1)

    def backwards(grad, x, grid):
        out = [aten.grid_sampler_2d_backward.default(grad, x, grid, mode, padding, align,
                                                     [True, True])
               for mode in (0, 1) for padding in (0, 1, 2) for align in (False, True)]
        return out + [aten.grid_sampler_2d_backward.default(grad, x, grid, 0, 0, False,
                                                            [False, True])[1]]
    check_on_both_paths(backwards, grad, x, grid, rtol=1e-5, atol=1e-5)


def test_nearest_upsampling_backward_with_and_without_scales():
    # Unlowered with scales: every nearest interpolation's backward on the eager device (RT-DETR's
    # FPN) ran on the host. Eager's source positions: float32 arithmetic, 1 / the scale given
    # (else in / out), in == out and out == 2 in as shortcuts (not for the exact variant).
    cases = [(3, 7, 2.5), (3, 7, None), (4, 8, 2.0), (5, 3, 0.6), (7, 7, 1.3), (3, 10, 3.3)]
    grads, calls = [], []
    for exact in (False, True):
        for dims in (1, 2, 3):
            name = ("_upsample_nearest_exact%dd_backward" if exact else
                    "upsample_nearest%dd_backward") % dims
            for n_in, n_out, scale in cases:
                out_size = [n_out + d for d in range(dims)]
                in_size = [2, 3] + [n_in + d for d in range(dims)]
                calls.append((getattr(aten, name).default, out_size, in_size, [scale] * dims))
                grads.append(randn(2, 3, *out_size, seed=len(grads)))

    def backwards(*grads):
        return [op(g, out_size, in_size, *scales)
                for (op, out_size, in_size, scales), g in zip(calls, grads)]
    check_on_both_paths(backwards, *grads, rtol=1e-5, atol=1e-5)


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


def test_take_wraps_negative_indices():
    check(torch.take, randn(3, 4), torch.tensor([[0, -1], [5, -12]]))


# --- indexing --------------------------------------------------------------------------------

def test_index_put_rows_negative_and_accumulated():
    x = randn(5, 5)
    check(lambda x, i, v: torch.index_put(x, [i], v), x, torch.tensor([3]), randn(1, 5))
    check(lambda x, i, v: torch.index_put(x, [i], v), x, torch.tensor([4, 0, -1, 2, 1]), randn(5))
    check(lambda x, i, j, v: torch.index_put(x, [i, j], v, accumulate=True), x,
          torch.tensor([4, 0, 4]), torch.tensor([1, 1, 1]), randn(3))


@pytest.mark.parametrize("shifts, dims", [(2, 0), ((-1, 7), (1, 2)), (3, ()), (0, 1)])
def test_roll(shifts, dims):
    check(lambda x: torch.roll(x, shifts, dims), randn(5, 4, 3))


# --- small gaps ------------------------------------------------------------------------------

def test_erfc():
    check(torch.erfc, randn(5, 6) * 3)


@pytest.mark.parametrize("dim, size, step", [(1, 2, 2), (0, 3, 1), (-1, 3, 2)])
def test_unfold_windows(dim, size, step):
    check(lambda x: x.unfold(dim, size, step) + 1, randn(5, 4, 6))


def test_searchsorted_left_right_and_isin():
    s = torch.sort(randn(4, 7)).values
    check(lambda s, v: torch.searchsorted(s, v), s, randn(4, 3, seed=1))
    check(lambda s, v: torch.searchsorted(s, v, right=True, out_int32=True), s[0],
          torch.cat([s[0, :3], randn(3, seed=2)]))
    check(torch.isin, torch.randint(0, 9, (10,)), torch.tensor([1, 3, 5]))
    empty = torch.tensor([])
    check(lambda s, v, i: torch.searchsorted(s, v, sorter=i), empty, empty,
          torch.tensor([], dtype=torch.int64))


def test_view_copy_and_unbind_copy():
    x = randn(5, 6)
    check(lambda x: torch.ops.aten.view_copy(x, [3, 10]), x)
    check(lambda x: torch.ops.aten.unbind_copy(x, 1), x)


def test_copies_hypot_angle_dist():
    x = randn(4, 5)
    check(lambda x: torch.narrow_copy(x, 1, 1, 3), x)
    check(lambda x: torch.permute_copy(x, (1, 0)), x)
    check(torch.hypot, x, randn(5, seed=1))
    check(torch.angle, torch.tensor([-1.0, 0.0, 2.0, NAN, -0.0]))
    check(torch.angle, torch.tensor([-1, 0, 2]))
    check(lambda a, b: torch.dist(a, b, 3), x, randn(4, 5, seed=1))


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
    with configured(strict=True):  # the eager device calls the op itself: no fallback
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


def test_advanced_indexing_with_negative_indices():
    # torch-mlir read the wrong elements for these (Falcon's fused QKV split), silently.
    x = randn(2, 8, 6, 4)
    check(lambda x: x[..., [-2], :] * 1, x)
    check(lambda x, i: x[:, i] * 1, x, torch.tensor([-1, 0, -3]))
    check(lambda x, i, j: x[i, :, j] * 1, x, torch.tensor([[-1], [0]]), torch.tensor([-6, 5]))


def test_index_put_with_gaps_and_negative_indices():
    def update(x, v):
        y = x.clone()
        y[:, [-2]] = v  # index_put with a None gap, then the negative index
        return y
    check(update, randn(4, 5), randn(4, 1))

    def grad_of_negative_index(x):  # backward: index_put(accumulate=True) with a gap
        return torch.autograd.grad((x[..., [-2], :] * 2).sum(), x)[0]
    check(grad_of_negative_index, randn(2, 3, 4, 5).requires_grad_())


@pytest.mark.parametrize("dim, g_shape", [(2, (1, 1, 5)), (0, (4, 1, 1))])
def test_weight_norm_backward(dim, g_shape):
    def grads(v, g, x):
        w, _ = torch._weight_norm_interface(v, g, dim)
        return torch.autograd.grad((w * x).sum(), (v, g))
    check(grads, randn(4, 3, 5).requires_grad_(), randn(*g_shape, seed=1).requires_grad_(),
          randn(4, 3, 5, seed=2))


@pytest.mark.parametrize("dims, kwargs", [
    (2, dict(stride=2, padding=1, output_padding=1, groups=2, dilation=(1, 2))),
    (2, dict(stride=2)),
    (1, dict(stride=3, padding=2)),
])
def test_transposed_convolution_backward(dims, kwargs):
    # convolution_backward with transposed=True (decompositions.py): gradients of input,
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


def test_convolution_backward_with_one_padding_for_all_dims():
    # padding="valid" reaches convolution_backward as [0] for a 2-d convolution (SigLIP).
    def grads(x, w):
        y = torch.nn.functional.conv2d(x, w, stride=2, padding="valid")
        return torch.autograd.grad((y * y.detach().cos()).sum(), (x, w))
    check(grads, randn(2, 3, 8, 8).requires_grad_(), randn(4, 3, 2, 2, seed=1).requires_grad_())


def test_as_strided_scatter():
    check(lambda x, s: torch.as_strided_scatter(x * 1, s, (3, 2), (1, 3), 1), randn(12),
          randn(3, 2, seed=1))


def test_index_put_with_a_boolean_mask_and_a_broadcast_value():
    mask = torch.tensor([True, True, False, True, False])
    check(lambda x, v: torch.index_put(x, (mask,), v), randn(5, 5), randn(5, seed=1))
    check(lambda x, v: torch.index_put(x, (mask,), v, accumulate=True), randn(5, 5),
          torch.tensor(2.0))



# --- resampling ------------------------------------------------------------------------------

def test_upsample_output_size_overloads():
    # The eager tpu device meets these overloads (interpolate's .vec is resolved before
    # dispatch); they fell back to the host there. Strict: a fallback is an error.
    aten = torch.ops.aten
    x, v = randn(2, 3, 4, 5), randn(1, 2, 3, 4, 5)
    check(lambda x, v: [out for corners in (False, True) for out in (
        aten.upsample_bilinear2d.default(x, [7, 9], corners),
        aten.upsample_bicubic2d.default(x, [7, 9], corners, 1.5, None),
        aten.upsample_trilinear3d.default(v, [4, 5, 7], corners))], x, v)
    with configured(strict=True, matmul_precision="highest"):
        actual = torch.nn.functional.interpolate(x.to("tpu"), (7, 9), mode="bicubic").cpu()
    torch.testing.assert_close(actual, torch.nn.functional.interpolate(x, (7, 9), mode="bicubic"),
                               rtol=1e-4, atol=1e-5)


# --- scatter reductions ----------------------------------------------------------------------

REDUCTIONS = ("sum", "mean", "prod", "amax", "amin")


def test_scatter_reduce_every_reduction():
    # No lowering; every reduction, with and without self, a source larger than the index,
    # repeated targets and targets never hit; an integer case for the floor-dividing mean.
    # One graph per dtype: each compile costs seconds.
    x, src = randn(4, 5), randn(3, 6, seed=1)
    index = torch.tensor([[0, 1, 3, 0, 1], [0, 0, 3, 2, 1], [2, 0, 0, 0, 1]])
    check(lambda x, i, s: [x.scatter_reduce(dim, i.clamp(max=4), s, r, include_self=inc)
                           for r in REDUCTIONS for dim in (0, 1) for inc in (True, False)],
          x, index, src)
    ints = torch.arange(20).reshape(4, 5) - 7
    check(lambda x, i, s: [x.scatter_reduce(0, i, s, r) for r in REDUCTIONS], ints, index,
          (src * 10).long())
    with configured(strict=True):  # the eager device: no fallback either
        out = x.to("tpu").scatter_reduce(0, index.to("tpu"), src.to("tpu"), "amax").cpu()
    torch.testing.assert_close(out, x.scatter_reduce(0, index, src, "amax"))


def test_scatter_with_add_and_multiply():
    x, src = randn(4, 5), randn(3, 6, seed=1)
    index = torch.tensor([[0, 1, 3, 0, 1], [0, 0, 3, 2, 1], [2, 0, 0, 0, 1]])
    check(lambda x, i, s: [x.scatter(0, i, s, reduce=r) for r in ("add", "multiply")] +
          [x.scatter(1, i, 1.5, reduce=r) for r in ("add", "multiply")], x, index, src)


def test_index_reduce_every_reduction():
    x, src = randn(4, 5), randn(4, 3, seed=1)
    index = torch.tensor([4, 0, 4])
    check(lambda x, i, s: [x.index_reduce(1, i, s, r, include_self=inc)
                           for r in ("prod", "mean", "amax", "amin") for inc in (True, False)],
          x, index, src)
    scalar = torch.tensor(2.0)  # 0-dim self, index and source
    check(lambda x, s: [x.index_reduce(0, torch.tensor([0]), s, r) for r in ("prod", "amax")] +
          [x.scatter_reduce(0, torch.tensor(0), s, "sum")], scalar, torch.tensor(3.0))


# --- gamma functions -------------------------------------------------------------------------

def test_lgamma_digamma_and_friends_over_poles_and_large_values():
    # No lowering; Lanczos and the asymptotic series with reflection below 1/2. Poles as
    # eager has them (lgamma +inf, digamma -inf at 0 and nan at negative integers).
    x = torch.cat([torch.linspace(-20, 30, 401),
                   torch.tensor([0.0, -1.0, -2.0, 0.5, 1.0, 2.0, 1e-3, -1e-3, 1e4, -3.5])])
    check(lambda x: [torch.lgamma(x), torch.digamma(x), torch.polygamma(0, x),
                     torch.mvlgamma(x.abs() + 2, 3)], x)
    check(lambda i: [torch.lgamma(i), torch.digamma(i)], torch.arange(1, 9))
    with configured(strict=True):  # the eager device too
        out = torch.lgamma(x.to("tpu")).cpu()
    torch.testing.assert_close(out, torch.lgamma(x), rtol=1e-4, atol=1e-5)


def test_take_of_any_rank_with_negative_indices():
    x = randn(3, 4)
    check(lambda x, i: torch.take(x, i), x, torch.tensor([[0, -1], [5, -12]]))
    check(lambda x, i: torch.take(x, i), torch.tensor(2.5), torch.tensor(0))
    with configured(strict=True):  # the eager device: a 0-dim index no longer falls back
        out = torch.take(torch.tensor(2.5, device="tpu"), torch.tensor(-1, device="tpu"))
    assert out.cpu().item() == 2.5


def test_put_with_and_without_accumulate():
    # Without accumulate, distinct targets (which duplicate wins is unspecified); with it, -12
    # and 0 are the same element and add up.
    x, values = randn(3, 4), randn(2, 2, seed=1)
    check(lambda x, i, v: x.put(i, v), x, torch.tensor([[0, -1], [5, -11]]), values)
    check(lambda x, i, v: x.put(i, v, accumulate=True), x, torch.tensor([[0, -1], [5, -12]]),
          values)


# --- orthogonal polynomials and Bessel functions ----------------------------------------------

def _on_the_eager_device(fn, *args):
    # Each op is its own program there (~0.5 s to build): a few stand for the rest.
    with configured(strict=True, matmul_precision="highest"):
        actual = fn(*(a.to("tpu") for a in args))
    torch.testing.assert_close([t.cpu() for t in actual], list(fn(*args)), rtol=1e-4,
                               atol=1e-5, equal_nan=True)


def test_orthogonal_polynomials_with_per_element_degrees():
    # A while loop up to the largest n (JAX), eager's closed forms at |x| = 1 and its
    # trigonometric Chebyshev forms inside (-1, 1); n truncated, negative/NaN/inf n give 0.
    # (NaN x is left out: for U, W, Laguerre and Legendre with n >= 2 eager returns an
    # uninitialized value there.) Scalar n or x are the n_scalar/x_scalar overloads; integer
    # tensors compute in float32.
    x = torch.cat([torch.linspace(-1.1, 1.1, 23),
                   torch.tensor([-1.0, 1.0, 0.0, 0.9999999, -0.9999999, 2.0, -3.0, INF])])
    n = torch.tensor([0.0, 1, 2, 3, 7, 9, 30, -1, -2.5, 2.7, 9.9, NAN, INF, 1e19])
    x, n = x[:, None].expand(-1, len(n)), n.expand(len(x), -1)
    special = torch.special
    check(lambda x, n, i: (
        special.chebyshev_polynomial_t(x, n), special.chebyshev_polynomial_u(x, n),
        special.chebyshev_polynomial_v(x, n), special.chebyshev_polynomial_w(x, n),
        special.hermite_polynomial_h(x, n), special.hermite_polynomial_he(x, n),
        special.laguerre_polynomial_l(x, n), special.legendre_polynomial_p(x, n),
        special.chebyshev_polynomial_t(x, 5), special.hermite_polynomial_h(x, 4),
        special.legendre_polynomial_p(0.5, n), special.laguerre_polynomial_l(x[:3, :3], i)),
        x, n, torch.tensor([3, 0, 1]))
    _on_the_eager_device(lambda x, n: (special.chebyshev_polynomial_v(x, n),
                                       special.laguerre_polynomial_l(x, n)), x, n)


def test_bessel_j_y_k_over_zeros_ranges_and_edges():
    # Power series near 0, Miller's recurrence (J, Y) or the trapezoid rule (K) in the middle,
    # Hankel's expansions far out; the dense grid crosses the zeros of J and Y, where only
    # the absolute tolerance holds. Eager: Y, K are NaN below 0, J, Y NaN at +-inf.
    x = torch.cat([torch.linspace(-30, 60, 900),
                   torch.tensor([0.0, -0.0, 1e-30, 2.0, 5.0, 8.0, 12.0, 100.0, INF, -INF, NAN])])
    special = torch.special
    check(lambda x: (
        special.bessel_j0(x), special.bessel_j1(x), special.bessel_y0(x), special.bessel_y1(x),
        special.modified_bessel_k0(x), special.modified_bessel_k1(x),
        special.scaled_modified_bessel_k0(x), special.scaled_modified_bessel_k1(x)), x)
    _on_the_eager_device(lambda x: (special.bessel_y1(x), special.scaled_modified_bessel_k1(x)),
                         x)


def test_shifted_chebyshev_polynomials_are_the_plain_ones_at_2x_minus_1():
    x = torch.cat([torch.linspace(-0.5, 1.5, 81), torch.tensor([0.0, 1.0, 0.5, INF, -INF])])
    n = torch.tensor([0.0, 1, 2, 3, 5, 7, 9, 12, -1, 2.5, INF])
    special = torch.special
    check(lambda x, n: (special.shifted_chebyshev_polynomial_t(x, n),
                        special.shifted_chebyshev_polynomial_u(x, n),
                        special.shifted_chebyshev_polynomial_v(x, n),
                        special.shifted_chebyshev_polynomial_w(x, n),
                        special.shifted_chebyshev_polynomial_t(x, 4)), x[:, None], n)


def test_spherical_bessel_j0():
    x = torch.cat([torch.linspace(-20, 20, 401),
                   torch.tensor([0.0, -0.0, 1e-8, 1e6, INF, -INF, NAN])])
    check_on_both_paths(torch.special.spherical_bessel_j0, x, rtol=1e-4, atol=1e-5)
    check(torch.special.spherical_bessel_j0, torch.arange(-3, 4))  # integers give float32
