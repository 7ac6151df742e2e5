"""Special functions torch-mlir does not lower, written with ops that do.

Each is a fixed-length series, continued fraction or polynomial (no data-dependent loops: one
static program), evaluated in float32 for float32 and reduced-precision inputs and in float64
for float64, to float32 tolerance against the CPU kernels (Cephes). Registered with
``@decomposition`` like lower/op_decompositions.py; tests in tests/test_op_decompositions.py.

Example::

    table = decomposition_table()
    table[torch.ops.aten.special_zeta.default](torch.tensor([2.0]), torch.tensor([1.0]))  # pi^2/6
"""
from __future__ import annotations

import math

import torch

from .decompositions import decomposition
from .op_decompositions import _computing_dtype, _gamma_input, digamma

aten = torch.ops.aten


def _compute_dtype(*tensors):
    """(computing dtype, result dtype): integers give the default float, as eager does."""
    result = torch.result_type(*tensors) if len(tensors) > 1 else tensors[0].dtype
    if not result.is_floating_point:
        result = torch.get_default_dtype()
    return _computing_dtype(result), result


# --- Hurwitz zeta and polygamma --------------------------------------------------------------

# Euler-Maclaurin tail coefficients (2k)!/B_2k, as in Cephes' zeta.c.
_ZETA_A = (12.0, -720.0, 30240.0, -1209600.0, 47900160.0, -1.8924375803183791606e9,
           7.47242496e10, -2.950130727918164224e12, 1.1646782814350067249e14,
           -4.5979787224074726105e15, 1.8152105401943546773e17, -7.1661652561756670113e18)
#: Direct terms summed before the tail: Cephes sums at least 9 and until q + k > 9, so a q
#: below 9 - _ZETA_TERMS would need more; such elements are NaN rather than a cut sum.
_ZETA_TERMS = 64


def _signed_power(base, s):
    """base ** -s for an integral s where base < 0 (|base| ** -s with the sign of an odd s)."""
    magnitude = torch.pow(base.abs(), -s)
    odd = (s % 2 == 1) if isinstance(s, float) else (torch.remainder(s, 2) == 1)
    return torch.where((base < 0) & odd, -magnitude, magnitude)


def _hurwitz_zeta(s, q):
    """zeta(s, q) = sum over k >= 0 of (q + k) ** -s, as Cephes computes it: direct terms up
    to q + k > 9, then the Euler-Maclaurin tail, stopped once a term no longer counts.

    ``s`` is a tensor or a Python float (polygamma's order): a float keeps the domain checks
    on s out of the graph.
    """
    eps = torch.finfo(q.dtype).eps
    # Cephes: i = 0..n with n the first count >= 9 at which q + n > 9. The direct terms along
    # a new last dim, one masked power and one sum (a loop of adds was ~20 ops a term).
    n = torch.clamp(torch.floor(9 - q) + 1, min=9)
    k = torch.arange(_ZETA_TERMS + 1, dtype=q.dtype)
    power = s.unsqueeze(-1) if isinstance(s, torch.Tensor) else s
    terms = _signed_power(q.unsqueeze(-1) + k, power)
    total = torch.where(k <= n.unsqueeze(-1), terms, 0.0).sum(-1)
    w = q + torch.clamp(n, max=_ZETA_TERMS)
    b = _signed_power(w, s)
    total = total + b * w / (s - 1) - 0.5 * b
    term_scale = b / w * s        # a * b of Cephes, kept as one product (a alone overflows)
    done = torch.zeros_like(total, dtype=torch.bool)
    for i, coefficient in enumerate(_ZETA_A):
        term = term_scale / coefficient
        total = torch.where(done, total, total + term)
        done = done | (torch.abs(term / total) < eps)
        term_scale = term_scale * (s + 2 * i + 1) / w * (s + 2 * i + 2) / w
    # Cephes' domain: q a non-positive integer is a pole, q < 0 with a fractional s undefined;
    # s == 1 a pole, s < 1 undefined.
    total = torch.where(n > _ZETA_TERMS, float("nan"), total)
    if isinstance(s, float):
        if s == 1 or s < 1:
            return torch.full_like(total, float("inf") if s == 1 else float("nan"))
        if s != math.floor(s):
            total = torch.where(q < 0, float("nan"), total)
        return torch.where((q <= 0) & (q == torch.floor(q)), float("inf"), total)
    total = torch.where((q < 0) & (s != torch.floor(s)), float("nan"), total)
    total = torch.where((q <= 0) & (q == torch.floor(q)), float("inf"), total)
    total = torch.where(s < 1, float("nan"), total)
    return torch.where(s == 1, float("inf"), total)


@decomposition(aten.special_zeta.default, aten.special_zeta.self_scalar,
               aten.special_zeta.other_scalar)
def special_zeta(s, q):
    compute, result = _compute_dtype(*(v for v in (s, q) if isinstance(v, torch.Tensor)))
    if not isinstance(q, torch.Tensor):
        q = torch.full_like(s, q)
    q = q.to(compute)
    s = s.to(compute) if isinstance(s, torch.Tensor) else float(s)
    if isinstance(s, torch.Tensor):
        s, q = torch.broadcast_tensors(s, q)
    return _hurwitz_zeta(s, q).to(result)


@decomposition(aten.polygamma.default)
def polygamma(n, x):
    # Order 0 is digamma; order n, (-1)^(n+1) n! zeta(n + 1, x), as the CPU kernel computes it.
    if n == 0:
        return digamma(x)
    x, result = _gamma_input(x)
    sign = 1.0 if n % 2 else -1.0
    return (sign * math.factorial(n) * _hurwitz_zeta(float(n + 1), x)).to(result)


# --- error-function family -------------------------------------------------------------------

# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision:
# erfinv(x) = x * p(w), w = -log((1 - x)(1 + x)), one polynomial for w < 5, one in sqrt(w).
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06,
                   0.00021858087, -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844,
                0.00573950773, -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _horner(coefficients, w):
    p = torch.full_like(w, coefficients[0])
    for c in coefficients[1:]:
        p = p * w + c
    return p


def _erfinv_from(x, w):
    """erfinv(x) given w = -log((1 - x)(1 + x)), which callers can form without the rounding
    of 1 - x (ndtri's 4p(1 - p))."""
    central = _horner(_ERFINV_CENTRAL, torch.where(w < 5, w, 5.0) - 2.5)
    tail = _horner(_ERFINV_TAIL, torch.sqrt(torch.where(w < 5, 5.0, w)) - 3)
    out = torch.where(w < 5, central, tail) * x
    return torch.where(x.abs() == 1, x * float("inf"), out)


@decomposition(aten.erfinv.default)
def erfinv(x):
    compute, result = _compute_dtype(x)
    x = x.to(compute)
    w = -torch.log((1 - x) * (1 + x))
    out = _erfinv_from(x, w)
    if compute == torch.float64:
        # Past Giles' float32 fit (w >= 16: |x| within 1e-7 of 1, which float32 cannot hold
        # short of 1 itself): ndtri's tail, erfinv(x) = -ndtri((1 - |x|) / 2) / sqrt(2).
        tail = -_ndtri_lower(torch.where(w < 16, 0.25, (1 - x.abs()) / 2)) * math.sqrt(0.5)
        out = torch.where((w >= 16) & (x.abs() < 1), torch.copysign(tail, x), out)
    return out.to(result)


#: Newton steps that take ndtri's first estimate to float32 accuracy in the far tails.
_NDTRI_NEWTON_STEPS = 3


@decomposition(aten.special_ndtri.default)
def ndtri(p):
    # As Cephes, the lower tail q = min(p, 1 - p) (1 - p is exact above 1/2), negated for the
    # upper one.
    compute, result = _compute_dtype(p)
    p = p.to(compute)
    z = _ndtri_lower(torch.where(p > 0.5, 1 - p, p))
    out = torch.where(p > 0.5, -z, z)
    return torch.where((p < 0) | (p > 1), float("nan"), out).to(result)


def _ndtri_lower(q):
    """ndtri(q) for 0 <= q <= 1/2. A first estimate, sqrt(2) erfinv(2q - 1) with 1 - (2q - 1)^2
    = 4q(1 - q) formed from q where Giles' fit holds (w < 16), else the asymptote
    z^2 = t - log(2 pi t), t = -2 log q; then Newton steps on log_ndtr(z) = log q, whose slope
    is sqrt(2/pi) / erfcx(-z/sqrt2)."""
    w = -torch.log(4 * q * (1 - q))
    fitted = math.sqrt(2) * _erfinv_from(2 * q - 1, torch.where(w < 16, w, 16.0))
    t = -2 * torch.log(torch.where(w < 16, 1e-3, q))
    asymptote = -torch.sqrt(t - torch.log(2 * math.pi * t))
    z = torch.where(w < 16, fitted, asymptote)
    log_q = torch.log(q)
    for _ in range(_NDTRI_NEWTON_STEPS):
        slope = math.sqrt(2 / math.pi) / _erfcx(-z * math.sqrt(0.5))
        z = z - (_log_ndtr(z) - log_q) / slope
    return torch.where(q == 0, float("-inf"), z)


#: Terms of the continued fraction for erfcx at x >= 2: converged there to float32 (1e-9)
#: and to float64 (5e-16).
_ERFCX_TERMS = {torch.float32: 20, torch.float64: 60}


def _erfcx(x):
    # exp(x^2) erfc(x): directly below x = 2, where 1 - erf(x) keeps 5 digits; above, the
    # continued fraction erfc(x) = exp(-x^2) / sqrt(pi) / (x + 1/2 / (x + 1 / (x + 3/2 / ...))).
    large = torch.where(x < 2, 2.0, x)
    t = large
    for k in range(_ERFCX_TERMS[x.dtype], 0, -1):
        t = large + (k / 2) / t
    fraction = 1 / (math.sqrt(math.pi) * t)
    small = torch.where(x < 2, x, 0.0)
    direct = torch.exp(small * small) * (1 - torch.erf(small))
    return torch.where(x < 2, direct, fraction)


@decomposition(aten.special_erfcx.default)
def erfcx(x):
    compute, result = _compute_dtype(x)
    return _erfcx(x.to(compute)).to(result)


@decomposition(aten.special_log_ndtr.default)
def log_ndtr(x):
    # As the CPU kernel: log(erfcx(-x/sqrt2) / 2) - x^2/2 in the lower tail, else
    # log1p(-erfc(x/sqrt2) / 2).
    compute, result = _compute_dtype(x)
    return _log_ndtr(x.to(compute)).to(result)


def _log_ndtr(x):
    t = x * math.sqrt(0.5)
    lower = torch.log(_erfcx(-t) / 2) - t * t
    upper = torch.log1p(-(1 - torch.erf(t)) / 2)
    return torch.where(x < -1, lower, upper)


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
    asymptotic = asymptotic / torch.sqrt(2 * math.pi * far)
    return torch.where(a <= _BESSEL_SERIES_LIMIT, series, asymptotic)


def _bessel(x, order: int, scaled: bool):
    compute, result = _compute_dtype(x)
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


def _hankel_coefficients(order: int):
    """a_k(nu) = prod_{j<=k} (4 nu^2 - (2j - 1)^2) / (k! 8^k)."""
    mu, coefficient, out = 4.0 * order * order, 1.0, [1.0]
    for k in range(1, _HANKEL_TERMS):
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
    compute, result = _compute_dtype(x)
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


def _k_scaled_quadrature(a, order: int):
    out = torch.zeros_like(a)
    for j in range(_K_QUADRATURE_POINTS):
        t = j * _K_QUADRATURE_STEP
        value = torch.exp(-2 * math.sinh(t / 2) ** 2 * a) * (math.cosh(order * t))
        out = out + (value / 2 if j == 0 else value)
    return out * _K_QUADRATURE_STEP


def _k_scaled_asymptotic(a, order: int):
    inverse = 1 / a
    out, power = torch.zeros_like(a), torch.ones_like(a)
    for c in _hankel_coefficients(order):
        out = out + c * power
        power = power * inverse
    return out * torch.sqrt((math.pi / 2) * inverse)


def _bessel_k(x, order: int, scaled: bool):
    compute, result = _compute_dtype(x)
    if result not in (torch.float32, torch.float64):  # eager has no half-precision kernels
        return NotImplemented
    x = x.to(compute)
    near = x <= _K_SERIES_LIMIT
    middle = (x > _K_SERIES_LIMIT) & (x <= _K_QUADRATURE_LIMIT)
    series = _k_scaled_series(torch.where(near & (x > 0), x, 1.0), order)
    quadrature = _k_scaled_quadrature(torch.where(middle, x, 4.0), order)
    asymptotic = _k_scaled_asymptotic(
        torch.where(x > _K_QUADRATURE_LIMIT, x, 2 * _K_QUADRATURE_LIMIT), order)
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


@decomposition(aten.special_spherical_bessel_j0.default)
def spherical_bessel_j0(x):
    # sin(x) / x: exact enough in float32 down to 0 (where it is 1); eager gives 0 at +-inf.
    compute, result = _compute_dtype(x)
    if result not in (torch.float32, torch.float64):  # eager has no half-precision kernels
        return NotImplemented
    x = x.to(compute)
    safe = torch.where((x == 0) | x.isinf(), 1.0, x)
    out = torch.where(x == 0, 1.0, torch.sin(safe) / safe)
    return torch.where(x.isinf(), 0.0, out).to(result)
