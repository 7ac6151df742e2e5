"""Bessel functions torch-mlir does not lower: modified of the first kind (i0, i1, scaled or not),
of the first and second kind (J, Y), modified of the second kind (K, scaled or not) and the
spherical j0; evaluated as special.py's functions are (fixed-length series, in float32 for
float32 and narrower inputs, in float64 for float64).

Example::

    table = decomposition_table()
    table[torch.ops.aten.special_bessel_j0.default](torch.tensor([0.0, 1.0]))  # [1., 0.7652]
"""
from __future__ import annotations

import math

import torch

from .common import float_dtypes
from .registry import decomposition

aten = torch.ops.aten


# --- modified Bessel functions of the first kind ---------------------------------------------

#: Power-series terms up to |x| = _BESSEL_SERIES_LIMIT, asymptotic-series terms beyond.
_BESSEL_SERIES_LIMIT = 15.0
_BESSEL_SERIES_TERMS = 32
_BESSEL_ASYMPTOTIC_TERMS = 12


def _bessel_i_scaled(x, order: int):
    """I_order(|x|) exp(-|x|) for order 0 or 1: the power series sum (x^2/4)^k / (k! (k +
    order)!) times (|x|/2)^order near 0, Hankel's asymptotic series far from it."""
    a = x.abs()
    near = torch.where(a <= _BESSEL_SERIES_LIMIT, a, 0.0)
    quarter = near * near / 4
    term = torch.ones_like(near)
    series = term
    for k in range(1, _BESSEL_SERIES_TERMS):
        term = term * quarter / (k * (k + order))
        series = series + term
    if order:
        series = series * near / 2
    series = series * torch.exp(-near)
    far = torch.where(a <= _BESSEL_SERIES_LIMIT, _BESSEL_SERIES_LIMIT, a)
    mu = 4.0 * order * order
    coefficient, asymptotic = 1.0, torch.ones_like(far)
    for k in range(1, _BESSEL_ASYMPTOTIC_TERMS):
        coefficient *= -(mu - (2 * k - 1) ** 2) / (k * 8)
        asymptotic = asymptotic + coefficient / far ** k
    # sqrt(2 pi) apart: 2 pi x overflows near float32's largest values (i0e(1e38) was 0)
    asymptotic = asymptotic / (math.sqrt(2 * math.pi) * torch.sqrt(far))
    return torch.where(a <= _BESSEL_SERIES_LIMIT, series, asymptotic)


def _bessel(x, order: int, scaled: bool):
    compute, result = float_dtypes(x)
    x = x.to(compute)
    out = _bessel_i_scaled(x, order)
    if not scaled:
        out = out * torch.exp(x.abs())
    if order:  # I_1 is odd
        out = torch.where(x < 0, -out, out)
    return out.to(result)


@decomposition(aten.i0.default, aten.special_modified_bessel_i0.default)
def i0(x):
    return _bessel(x, 0, scaled=False)


@decomposition(aten.special_i0e.default)
def i0e(x):
    return _bessel(x, 0, scaled=True)


@decomposition(aten.special_i1.default, aten.special_modified_bessel_i1.default)
def i1(x):
    return _bessel(x, 1, scaled=False)


@decomposition(aten.special_i1e.default)
def i1e(x):
    return _bessel(x, 1, scaled=True)


# --- Bessel functions of the first and second kind, modified of the second kind ---------------
# float32 series lose digits to cancellation (the largest term of J's power series at x = 8 is
# ~100 times the sum), so each function has three ranges: its power series near 0; in the
# middle J and Y from Miller's backward recurrence (stable, with J_0 + 2 sum J_2k = 1 and
# Neumann's series for Y) and K from the trapezoid rule on e^x K(x) = int_0^inf exp(-2x
# sinh^2(t/2)) cosh(nu t) dt (exponentially accurate for this analytic integrand); beyond,
# Hankel's asymptotic expansions. Eager's values at 0, at +-inf and for Y, K at x < 0.

_EULER_GAMMA = 0.57721566490153286061
_JY_SERIES_LIMIT, _JY_MILLER_LIMIT = 5.0, 12.0
_JY_SERIES_TERMS, _JY_MILLER_START = 13, 26
_K_SERIES_LIMIT, _K_QUADRATURE_LIMIT = 2.0, 8.0
_K_SERIES_TERMS, _K_QUADRATURE_STEP, _K_QUADRATURE_POINTS = 9, 0.25, 22
_HANKEL_TERMS = 8
#: K in float64: eight Hankel terms from x = 8 are float32's accuracy (1e-7 at 8.5, 4e-11 at
#: 40). A finer trapezoid to x = 20, then 24 terms: 1e-15 against eager's kernel.
_K_FLOAT64_QUADRATURE = (20.0, 0.125, 48)   # limit, step, points
_K_FLOAT64_HANKEL_TERMS = 24


def _hankel_coefficients(order: int, terms: int = _HANKEL_TERMS):
    """a_k(nu) = prod_{j<=k} (4 nu^2 - (2j - 1)^2) / (k! 8^k)."""
    mu, coefficient, out = 4.0 * order * order, 1.0, [1.0]
    for k in range(1, terms):
        coefficient *= (mu - (2 * k - 1) ** 2) / (k * 8)
        out.append(coefficient)
    return out


def _jy_series(a, order: int, second: bool):
    """J or Y of order 0 or 1 at a > 0 from the power series (DLMF 10.8.1 for Y: its log term
    and the digamma sums psi(k + 1) + psi(k + 1 + order), psi(k + 1) = H_k - gamma)."""
    half = a / 2
    minus_q = -half * half
    term = torch.ones_like(a) if order == 0 else half
    j = term
    digamma_sum = -2 * _EULER_GAMMA + (1.0 if order else 0.0)  # psi(1) + psi(1 + order)
    y_sum = digamma_sum * term
    harmonic = 0.0
    for k in range(1, _JY_SERIES_TERMS):
        term = term * (minus_q / (k * (k + order)))
        j = j + term
        if second:
            harmonic += 1.0 / k
            digamma_sum = 2 * (harmonic - _EULER_GAMMA) + (1.0 / (k + 1) if order else 0.0)
            y_sum = y_sum + digamma_sum * term
    if not second:
        return j
    y = (2 / math.pi) * torch.log(half) * j - y_sum / math.pi
    return y - 2 / (math.pi * a) if order else y


def _jy_miller(a, order: int, second: bool):
    """J or Y at moderate a: J_k by the backward recurrence J_{k-1} = (2k/a) J_k - J_{k+1}
    from a tiny start, normalized by J_0 + 2 sum J_2k = 1; Y by Neumann's series
    Y_0 = (2/pi) ((log(a/2) + gamma) J_0 - 2 sum (-1)^m J_2m / m) or its derivative
    (Y_1 = -Y_0', with J_2m' = (J_2m-1 - J_2m+1) / 2)."""
    two_over_a = 2 / a
    upper, current = torch.zeros_like(a), torch.full_like(a, 1e-30)
    norm, y_sum = torch.zeros_like(a), torch.zeros_like(a)
    for k in range(_JY_MILLER_START, 0, -1):  # current is J_k, upper J_{k+1}
        lower = (k * two_over_a) * current - upper
        if k % 2 == 0:
            m = k // 2
            weight = (-1.0 if m % 2 else 1.0) / m
            norm = norm + 2 * current
            if second and order == 0:
                y_sum = y_sum + weight * current
            elif second:
                y_sum = y_sum + weight * (lower - upper)
        upper, current = current, lower
    norm = norm + current
    j0, j1 = current / norm, upper / norm
    if not second:
        return j1 if order else j0
    log = torch.log(a / 2) + _EULER_GAMMA
    if order == 0:
        return (2 / math.pi) * (log * j0 - 2 * y_sum / norm)
    return -(2 / math.pi) * (j0 / a - log * j1 - y_sum / norm)


def _jy_hankel(a, order: int):
    p_q = _hankel_coefficients(order)
    inverse = 1 / a
    p, q, power = torch.zeros_like(a), torch.zeros_like(a), torch.ones_like(a)
    for k, c in enumerate(p_q):
        # P takes the even terms and Q the odd ones, with alternating signs within each.
        signed = c * (-1.0 if (k // 2) % 2 else 1.0)
        if k % 2:
            q = q + signed * power
        else:
            p = p + signed * power
        power = power * inverse
    cos, sin = torch.cos(a), torch.sin(a)
    root_half = math.sqrt(0.5)
    if order == 0:  # chi = a - pi/4
        cos_chi, sin_chi = (cos + sin) * root_half, (sin - cos) * root_half
    else:  # chi = a - 3 pi/4
        cos_chi, sin_chi = (sin - cos) * root_half, -(sin + cos) * root_half
    scale = torch.sqrt((2 / math.pi) * inverse)
    return scale * (p * cos_chi - q * sin_chi), scale * (p * sin_chi + q * cos_chi)


def _bessel_jy(x, order: int, second: bool):
    compute, result = float_dtypes(x)
    if result not in (torch.float32, torch.float64):  # eager has no half-precision kernels
        return NotImplemented
    x = x.to(compute)
    a = x.abs()
    near = a <= _JY_SERIES_LIMIT
    middle = (a > _JY_SERIES_LIMIT) & (a <= _JY_MILLER_LIMIT)
    series = _jy_series(torch.where(near & (a > 0), a, 1.0), order, second)
    miller = _jy_miller(torch.where(middle, a, 8.0), order, second)
    far = torch.where(a > _JY_MILLER_LIMIT, a, 2 * _JY_MILLER_LIMIT)
    hankel = _jy_hankel(far, order)[1 if second else 0]
    out = torch.where(near, series, torch.where(middle, miller, hankel))
    if second:
        out = torch.where(x == 0, -math.inf, out)
        out = torch.where((x < 0) | torch.isinf(x), math.nan, out)
    else:
        out = torch.where(x == 0, 0.0 if order else 1.0, out)
        if order:  # J_1 is odd
            out = torch.where(x < 0, -out, out)
        out = torch.where(torch.isinf(x), math.nan, out)
    return torch.where(torch.isnan(x), x, out).to(result)


@decomposition(aten.special_bessel_j0.default)
def bessel_j0(x):
    return _bessel_jy(x, 0, second=False)


@decomposition(aten.special_bessel_j1.default)
def bessel_j1(x):
    return _bessel_jy(x, 1, second=False)


@decomposition(aten.special_bessel_y0.default)
def bessel_y0(x):
    return _bessel_jy(x, 0, second=True)


@decomposition(aten.special_bessel_y1.default)
def bessel_y1(x):
    return _bessel_jy(x, 1, second=True)


def _k_scaled_series(a, order: int):
    """e^a K(a) near 0 (DLMF 10.31.1): -log(a/2) I_0 + sum psi(k+1) q^k/k!^2 for K_0, 1/a +
    log(a/2) I_1 - (a/4) sum (psi(k+1) + psi(k+2)) q^k/(k!(k+1)!) for K_1, q = a^2/4."""
    half = a / 2
    q = half * half
    term = torch.ones_like(a)
    i_sum = term
    digamma_sum = -2 * _EULER_GAMMA + 1.0 if order else -_EULER_GAMMA
    psi_sum = digamma_sum * term
    harmonic = 0.0
    for k in range(1, _K_SERIES_TERMS):
        term = term * q / (k * (k + order))
        harmonic += 1.0 / k
        if order:
            digamma_sum = 2 * (harmonic - _EULER_GAMMA) + 1.0 / (k + 1)
        else:
            digamma_sum = harmonic - _EULER_GAMMA
        i_sum = i_sum + term
        psi_sum = psi_sum + digamma_sum * term
    log = torch.log(half)
    if order:
        out = 1 / a + log * half * i_sum - half * psi_sum / 2
    else:
        out = -log * i_sum + psi_sum
    return out * torch.exp(a)


def _k_scaled_quadrature(a, order: int, step: float = _K_QUADRATURE_STEP,
                         points: int = _K_QUADRATURE_POINTS):
    out = torch.zeros_like(a)
    for j in range(points):
        t = j * step
        value = torch.exp(-2 * math.sinh(t / 2) ** 2 * a) * (math.cosh(order * t))
        out = out + (value / 2 if j == 0 else value)
    return out * step


def _k_scaled_asymptotic(a, order: int, terms: int = _HANKEL_TERMS):
    inverse = 1 / a
    out, power = torch.zeros_like(a), torch.ones_like(a)
    for c in _hankel_coefficients(order, terms):
        out = out + c * power
        power = power * inverse
    return out * torch.sqrt((math.pi / 2) * inverse)


def _bessel_k(x, order: int, scaled: bool):
    compute, result = float_dtypes(x)
    if result not in (torch.float32, torch.float64):  # eager has no half-precision kernels
        return NotImplemented
    x = x.to(compute)
    limit, step, points = (_K_FLOAT64_QUADRATURE if compute == torch.float64 else
                           (_K_QUADRATURE_LIMIT, _K_QUADRATURE_STEP, _K_QUADRATURE_POINTS))
    terms = _K_FLOAT64_HANKEL_TERMS if compute == torch.float64 else _HANKEL_TERMS
    near = x <= _K_SERIES_LIMIT
    middle = (x > _K_SERIES_LIMIT) & (x <= limit)
    series = _k_scaled_series(torch.where(near & (x > 0), x, 1.0), order)
    quadrature = _k_scaled_quadrature(torch.where(middle, x, 4.0), order, step, points)
    asymptotic = _k_scaled_asymptotic(torch.where(x > limit, x, 2 * limit), order, terms)
    out = torch.where(near, series, torch.where(middle, quadrature, asymptotic))
    if not scaled:
        out = out * torch.exp(-x)
    out = torch.where(x == 0, math.inf, out)
    out = torch.where(x == math.inf, 0.0, out)
    return torch.where((x < 0) | torch.isnan(x), math.nan, out).to(result)


@decomposition(aten.special_modified_bessel_k0.default)
def modified_bessel_k0(x):
    return _bessel_k(x, 0, scaled=False)


@decomposition(aten.special_modified_bessel_k1.default)
def modified_bessel_k1(x):
    return _bessel_k(x, 1, scaled=False)


@decomposition(aten.special_scaled_modified_bessel_k0.default)
def scaled_modified_bessel_k0(x):
    return _bessel_k(x, 0, scaled=True)


@decomposition(aten.special_scaled_modified_bessel_k1.default)
def scaled_modified_bessel_k1(x):
    return _bessel_k(x, 1, scaled=True)


# --- spherical Bessel functions --------------------------------------------------------------

@decomposition(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(x):
    # sin(x) / x: exact enough in float32 down to 0 (where it is 1); eager gives 0 at +-inf.
    compute, result = float_dtypes(x)
    if result not in (torch.float32, torch.float64):  # eager has no half-precision kernels
        return NotImplemented
    x = x.to(compute)
    safe = torch.where((x == 0) | x.isinf(), 1.0, x)
    out = torch.where(x == 0, 1.0, torch.sin(safe) / safe)
    return torch.where(x.isinf(), 0.0, out).to(result)
