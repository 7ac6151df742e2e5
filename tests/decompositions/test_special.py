"""The special-function decompositions (torchtpu_compile/lower/decompositions/special.py,
bessel.py and polynomials.py) against eager CPU PyTorch, in strict mode: the op must run through
XLA, not fall back, and give eager's numbers (poles, zeros, infinities, NaN)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import INF, NAN, check, check_on_both_paths, randn
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- gamma functions -------------------------------------------------------------------------

def test_lgamma_digamma_and_friends_over_poles_and_large_values():
    # No lowering; Lanczos and the asymptotic series with reflection below 1/2. Poles as
    # eager has them (lgamma +inf, digamma -inf at 0 and nan at negative integers).
    x = torch.cat([torch.linspace(-20, 30, 401),
                   torch.tensor([0.0, -1.0, -2.0, 0.5, 1.0, 2.0, 1e-3, -1e-3, 1e4, -3.5])])
    check(lambda x: [torch.lgamma(x), torch.digamma(x), torch.polygamma(0, x),
                     torch.mvlgamma(x.abs() + 2, 3)], x)
    check(lambda i: [torch.lgamma(i), torch.digamma(i)], torch.arange(1, 9))
    with config.patch(strict=True):  # the eager device too
        out = torch.lgamma(x.to("tpu")).cpu()
    torch.testing.assert_close(out, torch.lgamma(x), rtol=1e-4, atol=1e-5)


def test_hurwitz_zeta_and_polygamma_of_every_order():
    # Euler-Maclaurin as Cephes, with a compensated direct sum (terms cancel below q = 0).
    s = torch.tensor([2.0, 3, 4.5, 1.5, 7, 2, 3, 2, 0.5, 1, 2, 20, 40])
    q = torch.tensor([1.0, 0.5, 2, 10, -3.5, -7.3, 100, 0, 1, 1, -2.5, 0.3, 3])
    x = torch.linspace(-8.7, 9, 40)
    check(lambda s, q, x: (torch.special.zeta(s, q), torch.special.zeta(s, 2.0),
                           torch.polygamma(1, x), torch.polygamma(3, x) + 1), s, q, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zeta_polygamma_and_scaled_bessel_at_huge_and_infinite_arguments(dtype):
    # w ** -s underflowed before w ** (1 - s) was formed (zeta(2, 1e20) and polygamma(1, 1e30)
    # were 0), 0 * inf made polygamma(1, inf) NaN, -inf counted as a pole (+inf, eager NaN),
    # zeta(inf, q) was NaN for every q, and sqrt(2 pi x) overflowed: i0e(1e38) was 0
    big = 1e30 if dtype == torch.float32 else 1e200
    x = torch.tensor([INF, -INF, big, 1e15], dtype=dtype)
    q = torch.tensor([0.5, 1.0, 2.0, -0.5, 1e20, 1e30], dtype=dtype)
    s = torch.tensor([INF, INF, INF, INF, 2.0, 2.0], dtype=dtype)
    huge = torch.tensor([3e38, -3e38, 1e38, 2e37, 1e30], dtype=dtype)
    check_on_both_paths(lambda x, q, s, huge: (
        torch.polygamma(1, x), torch.special.zeta(s, q), torch.special.i0e(huge),
        torch.special.i1e(huge), torch.special.i0(huge)), x, q, s, huge, rtol=1e-6, atol=0)


# --- error functions and Bessel functions ----------------------------------------------------

def test_erfc():
    check(torch.erfc, randn(5, 6) * 3)


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 2e-5), (torch.float64, 1e-13),
                                         (torch.bfloat16, 2 ** -8), (torch.float16, 2 ** -10)])
def test_erfc_keeps_its_relative_accuracy_in_the_tail(dtype, rtol):
    # It was 1 - erf(x): 0 from x ~ 3.9 in float32 (erfc(5) is 1.5e-12), and computed in the
    # half width, 17% off at x = 2 in bf16 and 0 from 2.7. (Not past 9: float32's erfc(10)
    # is a denormal, which XLA CPU flushes to zero.)
    x = torch.tensor([-3.0, -0.5, 0.0, 0.3, 1.0, 2.0, 2.5, 3.0, 4.0, 5.0, 7.0, 9.0, INF, -INF,
                      NAN], dtype=dtype)
    check_on_both_paths(torch.erfc, x, rtol=rtol, atol=1e-300)


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
    a, z = IGAMMA_EDGES
    check_on_both_paths(lambda a, z: (torch.igamma(a, z), torch.igammac(a, z),
                                      special.gammaincc(a[:, None], z[::2])),
                        a, z, rtol=1e-4, atol=1e-5)


def test_incomplete_gamma_for_large_a_near_x_is_eagers():
    # JAX's series lose their prefactor exp(a log x - x - lgamma(a)) to cancellation in
    # float32 for large a: gammainc(1e5, 1e5) was 0.458 (eager 0.5004), at a = 4980736 0.00056.
    a = torch.tensor([1e5, 4980736.0, 300.0, 1000.0, 1e7, 50.0])
    z = torch.tensor([1e5, 4980736.0, 290.0, 1000.0, 1.001e7, 52.0])
    # (atol: eager's own float32 igammac(1e7, 1.001e7) is 1e-7 from the float64 answer.)
    check_on_both_paths(lambda a, z: (torch.igamma(a, z), torch.igammac(a, z)), a, z,
                        rtol=2e-6, atol=3e-7)


def test_float64_incomplete_gamma_for_large_a_keeps_float64_accuracy():
    # JAX's gammainc had no asymptotic branch: its prefactor lost float64 accuracy as a grew
    # (3e-7 off at a = 1e8, 6e-3 at 1e12) and its series ran uncapped (a = 1e16: 45 s, 6e19).
    # Points up to six standard deviations from a: eager takes Temme's expansion near a, and
    # a series or a continued fraction beyond. Eager's own kernel is up to 2e-10 off the exact
    # value here (its expansion divides by sqrt(2 pi a) with a float32 pi; from a = 1e12 its
    # prefactor drifts too), where scipy agrees with ours to 4e-16.
    deviations = torch.tensor([-6.0, -3.0, -1.0, 0.0, 1.0, 3.0, 6.0], dtype=torch.float64)
    for sizes, rtol in (([1e4, 1e6, 1e8], 1e-9), ([1e12, 1e14], 1e-8)):
        a = torch.tensor(sizes, dtype=torch.float64)[:, None]
        z = a + deviations * a.sqrt()
        check_on_both_paths(lambda a, z: (torch.igamma(a, z), torch.igammac(a, z)),
                            a.expand_as(z).contiguous(), z, rtol=rtol, atol=1e-300)


#: igamma's arguments at the edges: a = 0 and inf, z = 0 and inf, NaN (bf16 in the slow suite).
IGAMMA_EDGES = (
    torch.tensor([0.0, 0.0, 1.0, 2.0, INF, 3.0, -1.0, 2.0, 0.5, 1e-3, 50.0, 7.5, INF, NAN, NAN,
                  NAN, 1.0, INF]),
    torch.tensor([0.0, 1.0, 0.0, INF, 2.0, INF, 1.0, -1.0, 0.3, 2.0, 49.0, 0.1, INF, 1.0, 0.0,
                  INF, NAN, NAN]))


def check_igamma_in_bf16():
    a, z = IGAMMA_EDGES
    check(lambda a, z: (torch.igamma(a, z), torch.igammac(a, z)),
          a.bfloat16(), z.bfloat16(), rtol=1.6e-2, atol=1e-3)


# --- orthogonal polynomials and Bessel functions ---------------------------------------------

def _on_the_eager_device(fn, *args):
    # Each op is its own program there (~0.5 s to build): a few stand for the rest.
    with config.patch(strict=True, matmul_precision="highest"):
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


def test_float64_erfinv_and_digamma_keep_float64_accuracy():
    # erfinv used Giles' single-precision fit for float64 too (1e-7 off everywhere), and
    # digamma's asymptotic series stopped where its first dropped term is 1e-11 (at its root,
    # 1.4616..., it gave -3.6e-12 for -4e-16).
    x = torch.tensor([-0.79, -0.5, 0.1, 0.3, 0.7, 0.99, 0.99999, 1 - 1e-12, -1.0, 1.0, NAN],
                     dtype=torch.float64)
    check_on_both_paths(torch.erfinv, x, rtol=4e-15, atol=1e-300)
    y = torch.tensor([1.4616321449683622, 2.0, 3.3, 5.9, 6.0, 9.5, 40.0, -0.5, -2.7, 1e-3],
                     dtype=torch.float64)
    check_on_both_paths(torch.digamma, y, rtol=4e-15, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_lgamma_of_infinities_is_infinite_as_eager(dtype):
    # (z + 1/2) log(t) - t at z = inf was inf - inf: NaN, and mvlgamma(inf) with it.
    x = torch.tensor([INF, -INF, NAN, 3.5, 0.0], dtype=dtype)
    check_on_both_paths(torch.lgamma, x, rtol=2e-6 if dtype is torch.float32 else 1e-14)
    check_on_both_paths(lambda v: torch.mvlgamma(v, 2), x[:1], rtol=1e-6)


@pytest.mark.parametrize("fn", [torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
                                torch.special.scaled_modified_bessel_k0,
                                torch.special.scaled_modified_bessel_k1],
                         ids=lambda fn: fn.__name__)
def test_float64_bessel_k_keeps_float64_accuracy_past_eight(fn):
    # Eight terms of Hankel's expansion from x = 8 are float32's accuracy: 1.7e-7 off at 8.5,
    # 4e-11 at 40, in float64.
    x = torch.tensor([2.5, 7.9, 8.5, 9.0, 11.3, 15.0, 19.9, 20.1, 27.0, 40.0, 300.0],
                     dtype=torch.float64)
    check_on_both_paths(fn, x, rtol=5e-15, atol=1e-300)
