"""The regularized incomplete gamma functions ``igamma`` (P) and ``igammac`` (Q), computed as
eager's CPU kernel computes them (Cephes' igam, DLMF chapter 8), in float64 and rounded once.

Which method an element takes is eager's choice, so the answer is eager's where a method is
truncated: for large ``a`` near ``x``, Temme's uniform asymptotic expansion (DLMF 8.12.3/4);
elsewhere the power series of P (8.11.4), the continued fraction of Q (8.9.2) or, for small
``x``, the series of Q (8.7.3), each capped at 2000 terms as eager's. JAX's ``gammainc``
(which this replaced) had no asymptotic branch: its series ran uncapped, so ``igamma(1e16,
0.99999999e16)`` took 45 s and returned 6e19, and its prefactor, ``exp(a log x - x -
lgamma(a))``, lost float64 accuracy as ``a`` grew (3e-7 at ``a = 1e8``, 6e-3 at 1e12).

The expansion's coefficients are derived here, exactly, on first use (``_temme_coefficients``).
Eager's own kernel differs from the exact value by up to about 1e-9 relative for ``a`` in (20,
200): it divides by ``sqrt(2 * pi * a)`` with a float32 pi. We do not copy that error.

Example::

    table = decomposition_table()
    table[torch.ops.aten.igammac.default](torch.tensor([1e8], dtype=torch.float64),
                                          torch.tensor([1.0001e8], dtype=torch.float64))
    # tensor([0.1587]): the normal tail one standard deviation out
"""
from __future__ import annotations

import decimal
import functools
from fractions import Fraction

import torch

from .jax_functions import builds, jax_function
from .registry import decomposition

aten = torch.ops.aten

#: Eager's limits: terms of every series and continued fraction, and its float64 epsilon.
_MAX_TERMS = 2000
_MACHEP = 2.0 ** -53
#: Temme's expansion is taken for 20 < a < 200 and |x - a| / a < 0.3, or for a > 200 and
#: |x - a| / a < 4.5 / sqrt(a) (eager's SMALL, LARGE, SMALLRATIO, LARGERATIO).
_TEMME_ORDERS = 25  # powers of 1/a, and of eta in each coefficient


# --- Temme's coefficients, derived exactly ---------------------------------------------------

def _bernoulli_even(count: int) -> list:
    """B_2, B_4, ..., B_2count, from sum_j C(n + 1, j) B_j = 0."""
    numbers = [Fraction(1)]
    for n in range(1, 2 * count + 1):
        total, binomial = Fraction(0), 1
        for j in range(n):
            total += binomial * numbers[j]
            binomial = binomial * (n + 1 - j) // (j + 1)
        numbers.append(-total / (n + 1))
    return numbers[2::2]


def _stirling_gammas(count: int) -> list:
    """gamma_0 .. gamma_{count-1} of Gamma*(z) ~ sum gamma_k z^-k (DLMF 5.11.3): the exponential
    of log Gamma*(z) = sum_m B_2m / (2m (2m - 1)) z^(1 - 2m)."""
    log_series = [Fraction(0)] * count
    for m, b in enumerate(_bernoulli_even(count // 2 + 1), start=1):
        if 2 * m - 1 < count:
            log_series[2 * m - 1] = b / (2 * m * (2 * m - 1))
    gammas = [Fraction(1)]  # e' = l' e, term by term
    for n in range(1, count):
        gammas.append(sum(j * log_series[j] * gammas[n - j] for j in range(1, n + 1)) / n)
    return gammas


@functools.cache
def _temme_coefficients() -> tuple:
    """d[k][n], the coefficient of eta^n in c_k(eta) of DLMF 8.12.8, as float64.

    With lambda = x / a, mu = lambda - 1 and eta^2 / 2 = mu - log(1 + mu): mu(eta)'s series
    follows from eta (1 + mu) = mu mu' (the derivative of the definition); with h = eta / mu,
    c_0 = (h - 1) / eta and c_k = (c_(k-1)' + (-1)^k gamma_k h) / eta (DLMF 8.12.11), whose
    constant terms cancel. In 50-digit decimals (float64 loses 1e-4 of the later ones to
    cancellation; fractions take 100 times as long), exact once rounded."""
    orders = _TEMME_ORDERS
    length = 3 * orders + 2  # each step of the recurrence uses two more of h's terms
    with decimal.localcontext(prec=50):
        one = decimal.Decimal(1)
        mu = [0 * one, one]
        for n in range(2, length + 1):
            mixed = sum((n - i + 1) * mu[i] * mu[n - i + 1] for i in range(2, n))
            mu.append((mu[n - 1] - mixed) / (n + 1))
        ratio = mu[1:]  # mu / eta
        h = [one]  # its reciprocal
        for n in range(1, length):
            h.append(-sum(ratio[j] * h[n - j] for j in range(1, n + 1)))
        gammas = [one * g.numerator / g.denominator for g in _stirling_gammas(orders)]
        c = h[1:]
        table = [c[:orders]]
        for k in range(1, orders):
            sign = -1 if k % 2 else 1
            c = [(n + 2) * c[n + 2] + sign * gammas[k] * h[n + 1] for n in range(len(c) - 2)]
            table.append(c[:orders])
    return tuple(tuple(float(v) for v in row) for row in table)


# --- the kernel, in JAX ----------------------------------------------------------------------

@builds("incomplete_gamma")
def _incomplete_gamma_fn(upper: bool):
    import jax
    import jax.numpy as jnp
    from jax.scipy.special import erfc, gammaln

    coefficients = _temme_coefficients()
    stirling_log_terms = [float(b / (2 * m * (2 * m - 1)))
                          for m, b in enumerate(_bernoulli_even(8), start=1)]

    def log1pmx(s):
        # log(1 + s) - s; near 0 through atanh's series in u = s / (2 + s), without the
        # cancellation of log1p(s) - s (which loses a digit per decade of s).
        u = s / (2 + s)
        u2 = u * u
        odd = jnp.zeros_like(u)
        for k in range(14, 0, -1):
            odd = odd * u2 + 2.0 / (2 * k + 1)
        small = -s * u + odd * u2 * u
        return jnp.where(jnp.abs(s) < 0.3, small, jnp.log1p(s) - s)

    def prefactor(a, x):
        # x^a e^-x / Gamma(a). Near a (eager's |a - x| <= 0.4 a) through Stirling's series:
        # a log1pmx((x - a) / a) + log(a / 2 pi) / 2 - (lgamma(a) - Stirling's leading terms).
        plain = a * jnp.log(x) - x - gammaln(a)
        w = 1.0 / jnp.maximum(a, 10.0)
        stirling_tail = jnp.zeros_like(w)  # sum_m B_2m / (2m (2m - 1)) w^(2m - 1), Horner in w^2
        for term in reversed(stirling_log_terms):
            stirling_tail = stirling_tail * w * w + term
        stirling_tail = stirling_tail * w
        near = a * log1pmx((x - a) / a) + 0.5 * jnp.log(a / (2 * jnp.pi)) - stirling_tail
        exponent = jnp.where((jnp.abs(a - x) <= 0.4 * a) & (a >= 10), near, plain)
        return jnp.where(exponent < -709.782712893384, 0.0, jnp.exp(exponent))

    def capped_loop(step, state, active):
        def more(carry):
            return (carry[0] < _MAX_TERMS) & jnp.any(carry[1])

        def body(carry):
            i, active, state = carry
            new_state, still = step(i, state)
            state = tuple(jnp.where(active, n, o) for n, o in zip(new_state, state))
            return i + 1, active & still, state
        return jax.lax.while_loop(more, body, (0, active, state))[2]

    def series_p(a, x, active):  # DLMF 8.11.4
        def step(i, state):
            r, c, total = state
            r = r + 1
            c = c * (x / r)
            total = total + c
            return (r, c, total), c > _MACHEP * total
        ones = jnp.ones_like(a)
        _, _, total = capped_loop(step, (a, ones, ones), active)
        return total * prefactor(a, x) / a

    def fraction_q(a, x, active):  # DLMF 8.9.2, with eager's rescaling of big convergents
        big, big_inverse = 4.503599627370496e15, 2.0 ** -52

        def step(i, state):
            c, y, z, p1, q1, p2, q2, answer = state
            c, y, z = c + 1, y + 1, z + 2
            yc = y * c
            p, q = p1 * z - p2 * yc, q1 * z - q2 * yc
            safe_q = jnp.where(q != 0, q, 1.0)
            r = p / safe_q
            change = jnp.where(q != 0, jnp.abs((answer - r) / r), 1.0)
            answer = jnp.where(q != 0, r, answer)
            scale = jnp.where(jnp.abs(p) > big, big_inverse, 1.0)
            state = (c, y, z, p * scale, q * scale, p1 * scale, q1 * scale, answer)
            return state, ~(change <= _MACHEP)
        y = 1 - a
        z = x + y + 1
        p1, q1 = x + 1, z * x
        state = (jnp.zeros_like(a), y, z, p1, q1, jnp.ones_like(a), x, p1 / q1)
        return capped_loop(step, state, active)[-1] * prefactor(a, x)

    def series_q(a, x, active):  # DLMF 8.7.3, for small x: no cancellation in 1 - P
        def step(i, state):
            factor, total = state
            n = (i + 1).astype(a.dtype)
            factor = factor * (-x / n)
            term = factor / (a + n)
            total = total + term
            return (factor, total), jnp.abs(term) > _MACHEP * jnp.abs(total)
        zeros = jnp.zeros_like(a)
        _, total = capped_loop(step, (jnp.ones_like(a), zeros), active)
        log_x = jnp.log(x)
        return -jnp.expm1(a * log_x - gammaln(1 + a)) - jnp.exp(a * log_x - gammaln(a)) * total

    def temme(a, x, lower: bool):  # DLMF 8.12.3 (P) and 8.12.4 (Q)
        sigma = (x - a) / a
        eta = jnp.sign(sigma) * jnp.sqrt(-2 * log1pmx(sigma))
        sign = -1.0 if lower else 1.0

        def order(k, state):
            # A loop, not unrolled: XLA fused 25 unrolled orders into one expression and
            # duplicated the shared sums into it, 2^25-fold (its compile took 20 GB).
            total, previous, going, power = state
            row = jax.lax.dynamic_index_in_dim(table, k, keepdims=False)
            ck = jnp.zeros_like(a)
            for n in range(_TEMME_ORDERS - 1, -1, -1):
                ck = ck * eta + row[n]
            term = ck * power
            # eager's stopping: before a term larger than the last (the series diverges from
            # there), after one below epsilon of the sum
            going = going & (jnp.abs(term) <= previous)
            total = jnp.where(going, total + term, total)
            going = going & (jnp.abs(term) >= _MACHEP * jnp.abs(total))
            return total, jnp.abs(term), going, power / a

        table = jnp.asarray(coefficients, jnp.float64)
        state = (jnp.zeros_like(a), jnp.full_like(a, jnp.inf), jnp.ones(a.shape, bool),
                 jnp.ones_like(a))
        total = jax.lax.fori_loop(0, _TEMME_ORDERS, order, state)[0]
        return (0.5 * erfc(sign * eta * jnp.sqrt(a / 2))
                + sign * jnp.exp(-0.5 * a * eta * eta) * total / jnp.sqrt(2 * jnp.pi * a))

    def incomplete_gamma(a, x):
        dtype = a.dtype
        a, x = a.astype(jnp.float64), x.astype(jnp.float64)
        edge = ~(jnp.isfinite(a) & jnp.isfinite(x) & (a > 0) & (x > 0))
        a_, x_ = jnp.where(edge, 1.0, a), jnp.where(edge, 1.0, x)
        ratio = jnp.abs(x_ - a_) / a_
        asymptotic = (((a_ > 20) & (a_ < 200) & (ratio < 0.3))
                      | ((a_ > 200) & (ratio < 4.5 / jnp.sqrt(a_))))
        # Eager's ladder for Q; P takes Q's continued fraction or small-x series for x > 1
        # and x > a, else P's series.
        above = (x_ > 1) & (x_ > a_)
        small_x_q = jnp.where(x_ <= 0.5, -0.4 / jnp.log(x_) >= a_, x_ * 1.1 >= a_) & (x_ <= 1.1)
        if upper:
            by_series_q = ~asymptotic & small_x_q
            by_fraction = ~asymptotic & (x_ > 1.1) & (x_ >= a_)
        else:
            by_series_q = ~asymptotic & above & (x_ <= 1.1)
            by_fraction = ~asymptotic & above & (x_ > 1.1)
        by_series_p = ~asymptotic & ~by_series_q & ~by_fraction
        p = series_p(a_, jnp.where(by_series_p, x_, 0.5 * a_), by_series_p)
        q = jnp.where(by_fraction, fraction_q(a_, jnp.where(by_fraction, x_, 2 * a_ + 2),
                                              by_fraction),
                      series_q(a_, jnp.where(by_series_q, x_, 0.5), by_series_q))
        out = jnp.where(asymptotic, temme(a_, x_, lower=not upper),
                        jnp.where(by_series_p, 1 - p if upper else p, q if upper else 1 - q))
        return _eagers_edges(a, x, out, upper, jnp).astype(dtype)
    return incomplete_gamma


def _eagers_edges(a, x, out, upper: bool, jnp):
    """Eager's ladder of special cases, in its order (NaN passes the comparisons that come
    before it)."""
    nan, low, high = jnp.nan, 0.0, 1.0
    if upper:
        low, high = high, low
    out = jnp.where(jnp.isnan(a) | jnp.isnan(x), nan, out)
    out = jnp.where(jnp.isinf(x), high, out)
    out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, low), out)
    out = jnp.where(x == 0, low, out)
    out = jnp.where(a == 0, jnp.where(x > 0, high, nan), out)
    return jnp.where((x < 0) | (a < 0), nan, out)


def _incomplete_gamma(a, x, upper: bool):
    # In float64 for every float dtype, rounded once (a rare op: float64's cost on a TPU is
    # accepted); eager computes float32 in float32, to float32's accuracy.
    dtype = torch.result_type(a, x)
    if not dtype.is_floating_point:
        return NotImplemented
    a, x = torch.broadcast_tensors(a.to(torch.float64), x.to(torch.float64))
    return jax_function("incomplete_gamma", upper)(a, x).to(dtype)


@decomposition(aten.igamma.default)
def igamma(a, x):
    return _incomplete_gamma(a, x, upper=False)


@decomposition(aten.igammac.default)
def igammac(a, x):
    return _incomplete_gamma(a, x, upper=True)
