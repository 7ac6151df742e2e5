"""Special functions torch-mlir does not lower: the gamma family (lgamma, digamma, polygamma,
Hurwitz zeta) and the error-function family (erfc, erfinv, ndtri, erfcx, log_ndtr). Bessel
functions: bessel.py; orthogonal polynomials: polynomials.py.

Each is a fixed-length series, continued fraction or polynomial (no data-dependent loops: one
static program), evaluated in float32 for float32 and reduced-precision inputs and in float64
for float64, to float32 tolerance against the CPU kernels (Cephes). The incomplete gammas:
incomplete_gamma.py.

Example::

    table = decomposition_table()
    table[torch.ops.aten.special_zeta.default](torch.tensor([2.0]), torch.tensor([1.0]))  # pi^2/6
"""
from __future__ import annotations

import math

import torch

from .common import computing_dtype, float_dtypes
from .registry import decomposition

aten = torch.ops.aten


# --- gamma functions -------------------------------------------------------------------------
# torch-mlir lowers none of lgamma, digamma, polygamma; mvlgamma is written with lgamma.


_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)


def _gamma_input(x):
    """(x in its computing dtype, result dtype): integers give float32, as eager does;
    reduced-precision floats compute in float32 as the CPU kernels do."""
    result = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    compute = computing_dtype(result)
    return x.to(compute), result


def _sin_pi(x):
    # sin(pi x) from the distance to the nearest integer: exact zeros, no loss for large x.
    return torch.sin(torch.pi * (x - torch.round(x)))


def _lgamma_positive(x):
    # Lanczos (g = 7, 9 terms) for x >= 0.5: relative error ~1e-15 in exact arithmetic.
    z = x - 1
    series = torch.full_like(z, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        series = series + c / (z + i)
    t = z + _LANCZOS_G + 0.5
    return 0.5 * math.log(2 * math.pi) + (z + 0.5) * torch.log(t) - t + torch.log(series)


@decomposition(aten.lgamma.default)
def lgamma(x):
    x, result = _gamma_input(x)
    reflected = math.log(math.pi) - torch.log(torch.abs(_sin_pi(x))) - \
        _lgamma_positive(torch.where(x < 0.5, 1 - x, 1.0))
    out = torch.where(x < 0.5, reflected, _lgamma_positive(torch.where(x < 0.5, 1.0, x)))
    # As eager (C's lgamma): inf at the poles and at both infinities (inf - inf above).
    pole = ((x <= 0) & (x == torch.floor(x))) | torch.isinf(x)
    return torch.where(pole, float("inf"), out).to(result)


#: The asymptotic series of digamma: B_2k / 2k, from k = 1 (1/12, -1/120, 1/252, ...).
_DIGAMMA_SERIES = (1 / 12, -1 / 120, 1 / 252, -1 / 240, 1 / 132, -691 / 32760, 1 / 12)


def _digamma_at_least_half(y):
    # Recurrence psi(y) = psi(y + 1) - 1/y up to y >= 6 and five terms of the asymptotic
    # series (the first left out is 1e-11 there: float32's accuracy); float64 goes on to
    # y >= 10 and seven terms (4e-17), where six steps had left digamma's root 1e-11 off.
    start, terms = (10, 7) if y.dtype == torch.float64 else (6, 5)
    acc = torch.zeros_like(y)
    for _ in range(start):
        small = y < start
        acc = acc - torch.where(small, 1 / y, 0.0)
        y = torch.where(small, y + 1, y)
    inv = 1 / (y * y)
    tail = torch.full_like(y, _DIGAMMA_SERIES[terms - 1])
    for c in reversed(_DIGAMMA_SERIES[:terms - 1]):
        tail = c + inv * tail
    return acc + torch.log(y) - 0.5 / y - inv * tail


@decomposition(aten.digamma.default)
def digamma(x):
    x, result = _gamma_input(x)
    reflected = _digamma_at_least_half(torch.where(x < 0.5, 1 - x, 1.0)) - \
        torch.pi * torch.cos(torch.pi * (x - torch.round(x))) / _sin_pi(x)
    out = torch.where(x < 0.5, reflected, _digamma_at_least_half(torch.where(x < 0.5, 1.0, x)))
    # As eager: -inf at 0, nan at the negative integers.
    out = torch.where((x < 0) & (x == torch.floor(x)), float("nan"), out)
    return torch.where(x == 0, float("-inf"), out).to(result)


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
    total = direct = torch.where(k <= n.unsqueeze(-1), terms, 0.0).sum(-1)
    w = q + torch.clamp(n, max=_ZETA_TERMS)
    b = _signed_power(w, s)
    # b * w as one power: b alone underflows first (zeta(2, 1e20) was 0 in float32, 1e-20),
    # and at q = inf, b * w was 0 * inf
    total = total + _signed_power(w, s - 1) / (s - 1) - 0.5 * b
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
        return torch.where(_pole(q), float("inf"), total)
    total = torch.where((q < 0) & (s != torch.floor(s)), float("nan"), total)
    total = torch.where(_pole(q), float("inf"), total)
    total = torch.where(s < 1, float("nan"), total)
    # At s = inf the direct terms (0, 1 or inf each) are the sum, where they are not all 0:
    # Cephes stops on its first terms then, and otherwise meets 0 * inf in the tail (NaN).
    total = torch.where(s == float("inf"), torch.where(direct == 0, float("nan"), direct),
                        total)
    return torch.where(s == 1, float("inf"), total)


def _pole(q):
    """Where zeta(s, q) has a pole: q a non-positive integer (-inf is none: eager's NaN)."""
    return (q <= 0) & (q == torch.floor(q)) & torch.isfinite(q)


@decomposition(aten.special_zeta.default, aten.special_zeta.self_scalar,
               aten.special_zeta.other_scalar)
def special_zeta(s, q):
    compute, result = float_dtypes(*(v for v in (s, q) if isinstance(v, torch.Tensor)))
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

@decomposition(aten.erfc.default)
def erfc(x):
    # No lowering. 1 - erf(x) is 0 from x ~ 3.9 in float32 (erfc(5) is 1.5e-12): from x = 2
    # it is exp(-x^2) erfcx(x). The half widths in float32, rounded once, as eager's kernel:
    # 1 - erf in bf16 was 17% off at x = 2 and 0 from 2.7.
    compute, result = float_dtypes(x)
    x = x.to(compute)
    return torch.where(x < 2, 1 - torch.erf(x), torch.exp(-x * x) * _erfcx(x)).to(result)


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
    compute, result = float_dtypes(x)
    x = x.to(compute)
    w = -torch.log((1 - x) * (1 + x))
    out = _erfinv_from(x, w)
    if compute == torch.float64:
        # Past Giles' float32 fit (w >= 16: |x| within 1e-7 of 1, which float32 cannot hold
        # short of 1 itself): ndtri's tail, erfinv(x) = -ndtri((1 - |x|) / 2) / sqrt(2).
        tail = -_ndtri_lower(torch.where(w < 16, 0.25, (1 - x.abs()) / 2)) * math.sqrt(0.5)
        out = torch.where((w >= 16) & (x.abs() < 1), torch.copysign(tail, x), out)
        out = _erfinv_refined(x, out)
    return out.to(result)


def _erfinv_refined(x, y):
    """Two Newton steps on erf(y) = x from Giles' float32-accurate estimate ``y``: float64
    erfinv was 1e-7 off everywhere. For |x| >= 1/2 the residual is (1 - |x|) - erfc(|y|),
    both exact or accurate near 1 where erf(y) - x would cancel."""
    a = x.abs()
    inner = a < 1  # +-1 (infinite results) and NaN stay as they are
    ya = torch.where(inner, y.abs(), 0.5)
    for _ in range(2):
        residual = torch.where(a < 0.5, torch.erf(ya) - a, (1 - a) - torch.erfc(ya))
        ya = ya - residual / (2 / math.sqrt(math.pi) * torch.exp(-ya * ya))
    return torch.where(inner, torch.copysign(ya, x), y)


#: Newton steps that take ndtri's first estimate to float32 accuracy in the far tails.
_NDTRI_NEWTON_STEPS = 3


@decomposition(aten.special_ndtri.default)
def ndtri(p):
    # As Cephes, the lower tail q = min(p, 1 - p) (1 - p is exact above 1/2), negated for the
    # upper one.
    compute, result = float_dtypes(p)
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
    compute, result = float_dtypes(x)
    return _erfcx(x.to(compute)).to(result)


@decomposition(aten.special_log_ndtr.default)
def log_ndtr(x):
    # As the CPU kernel: log(erfcx(-x/sqrt2) / 2) - x^2/2 in the lower tail, else
    # log1p(-erfc(x/sqrt2) / 2).
    compute, result = float_dtypes(x)
    return _log_ndtr(x.to(compute)).to(result)


def _log_ndtr(x):
    t = x * math.sqrt(0.5)
    lower = torch.log(_erfcx(-t) / 2) - t * t
    upper = torch.log1p(-(1 - torch.erf(t)) / 2)
    return torch.where(x < -1, lower, upper)
