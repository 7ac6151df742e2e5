"""Orthogonal polynomials torch-mlir does not lower (Chebyshev T, U, V, W and their shifted forms,
Hermite H and He, Laguerre L, Legendre P) as JAX functions (jax_functions.py): the three-term
recurrence in a while loop up to the largest degree, with eager's closed forms.

Example::

    table = decomposition_table()
    table[torch.ops.aten.special_legendre_polynomial_p.default](
        torch.tensor([0.5]), torch.tensor([2.0]))   # [-0.125]
"""
from __future__ import annotations

import torch

from .jax_functions import builds, jax_function
from .registry import decomposition

aten = torch.ops.aten


# --- orthogonal polynomials -------------------------------------------------------------------
# Eager evaluates P_n(x) per element with n truncated to an integer (a NaN n, or one past
# int64's range, becomes int64's minimum on the CPU: negative, so 0), a closed form at |x| == 1,
# for Chebyshev a trigonometric form inside (-1, 1) from some n on, and otherwise the
# three-term recurrence up to n. n differs per element, so the recurrence is a while loop up to
# the largest n that needs it, each element keeping the value at its own n. Eager stops an
# element's recurrence at the first NaN (NaN stays NaN); the loop stops once every element
# still running is NaN, which a huge n against a large |x| soon reaches.

#: kind -> (P_1(x), P_k(x) from k, x, P_{k-2}, P_{k-1}), both in eager's order of operations.
_POLYNOMIALS = {
    "chebyshev_t": (lambda x: x, lambda k, x, p, q: (x + x) * q - p),
    "chebyshev_u": (lambda x: x + x, lambda k, x, p, q: (x + x) * q - p),
    "chebyshev_v": (lambda x: x + x - 1, lambda k, x, p, q: (x + x) * q - p),
    "chebyshev_w": (lambda x: x + x + 1, lambda k, x, p, q: (x + x) * q - p),
    "hermite_h": (lambda x: x + x, lambda k, x, p, q: (x + x) * q - (2 * (k - 1)) * p),
    "hermite_he": (lambda x: x, lambda k, x, p, q: x * q - (k - 1) * p),
    "laguerre_l": (lambda x: 1 - x,
                   lambda k, x, p, q: ((2 * k - 1 - x) * q - (k - 1) * p) / k),
    "legendre_p": (lambda x: x, lambda k, x, p, q: ((2 * k - 1) * x * q - (k - 1) * p) / k),
}


#: Chebyshev kinds: eager's trigonometric form takes over inside (-1, 1) for n above this.
_TRIGONOMETRIC_FROM = {"chebyshev_t": 6, "chebyshev_u": 8, "chebyshev_v": 8, "chebyshev_w": 8}


def _chebyshev_trigonometric(kind, x, n, even):
    """Eager's closed forms in theta = acos(x), with its fallbacks where the denominator is
    exactly 0 (or the half-angle sine/cosine rounds to 1)."""
    import jax.numpy as jnp
    theta = jnp.arccos(x)
    if kind == "chebyshev_t":
        return jnp.cos(n * theta)
    if kind == "chebyshev_u":
        s = jnp.sin(theta)
        return jnp.where(s != 0, jnp.sin((n + 1) * theta) / s,
                         (n + 1) * jnp.cos((n + 1) * theta) / x)
    odd_value = jnp.where(even, 1, -1)
    if kind == "chebyshev_v":
        limit = jnp.sin(theta / 2) == 1
        return jnp.where(limit, odd_value * (n + n + 1),
                         jnp.cos((n + 0.5) * theta) / jnp.cos(theta / 2))
    limit = jnp.cos(theta / 2) == 1
    return jnp.where(limit, jnp.where(x > 0, n + n + 1, odd_value),
                     jnp.sin((n + 0.5) * theta) / jnp.sin(theta / 2))


def _at_unit(kind, x, n, even):
    """Eager's values at x = +-1 (None: the kind has none)."""
    import jax.numpy as jnp
    sign = jnp.where((x > 0) | even, 1, -1)
    if kind in ("chebyshev_t", "legendre_p"):
        return sign.astype(x.dtype)
    if kind == "chebyshev_u":
        return sign * (n + 1)
    if kind == "chebyshev_v":
        return jnp.where(x > 0, 1, sign * (n + n + 1))
    if kind == "chebyshev_w":
        return jnp.where(x > 0, n + n + 1, sign)
    return None


@builds("polynomial")
def _polynomial_fn(kind):
    import jax
    import jax.numpy as jnp
    first, step = _POLYNOMIALS[kind]

    def polynomial(x, n):
        dtype = x.dtype
        n = jnp.trunc(n)
        valid = (n >= 0) & (n < 2.0 ** 63)  # False for NaN too
        count = jnp.where(valid, n, -1).astype(jnp.int64)
        n = jnp.where(valid, n, -1)
        even = jnp.fmod(n, 2) == 0
        one = jnp.ones_like(x)
        closed = jnp.zeros(x.shape, bool)
        out = jnp.zeros_like(x)

        def take(where, value):  # the first closed form that applies wins
            nonlocal closed, out
            where = where & ~closed
            out = jnp.where(where, jnp.asarray(value).astype(dtype), out)
            closed = closed | where

        take(~valid, 0)
        unit = _at_unit(kind, x, n, even)
        if unit is not None:
            take(jnp.abs(x) == 1, unit)
        if kind == "laguerre_l":
            take(x == 0, one)
        if kind in _TRIGONOMETRIC_FROM:
            take((count > _TRIGONOMETRIC_FROM[kind]) & (jnp.abs(x) < 1),
                 _chebyshev_trigonometric(kind, x, n, even))
        take(count == 0, one)
        take(count == 1, first(x))

        running = jnp.where(closed, 0, count)

        def unfinished(state):
            k, _, q = state
            return jnp.any((running >= k) & ~jnp.isnan(q))

        def advance(state):
            k, p, q = state
            r = step(k.astype(dtype), x, p, q)
            on = running >= k
            return k + 1, jnp.where(on, q, p), jnp.where(on, r, q)

        _, _, value = jax.lax.while_loop(unfinished, advance,
                                         (jnp.asarray(2, jnp.int64), one, first(x)))
        return jnp.where(closed, out, value)
    return polynomial


def _polynomial(kind, x, n, shifted: bool = False):
    dtype = torch.result_type(x, n)
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    if dtype not in (torch.float32, torch.float64):  # eager has no half-precision kernels
        return NotImplemented
    x = x.to(dtype) if isinstance(x, torch.Tensor) else torch.scalar_tensor(x, dtype=dtype)
    n = n.to(dtype) if isinstance(n, torch.Tensor) else torch.scalar_tensor(n, dtype=dtype)
    if shifted:  # eager's shifted polynomials are the plain ones at x + x - 1 in x's dtype
        x = x + x - 1
    x, n = torch.broadcast_tensors(x, n)
    return jax_function("polynomial", kind)(x.contiguous(), n.contiguous())


#: op -> (kind, shifted). Each op's three overloads (tensor x and n, scalar x, scalar n) get the
#: same decomposition; the shifted Chebyshev polynomials are the plain ones at x + x - 1.
_POLYNOMIAL_OPS = {
    aten.special_chebyshev_polynomial_t: ("chebyshev_t", False),
    aten.special_chebyshev_polynomial_u: ("chebyshev_u", False),
    aten.special_chebyshev_polynomial_v: ("chebyshev_v", False),
    aten.special_chebyshev_polynomial_w: ("chebyshev_w", False),
    aten.special_hermite_polynomial_h: ("hermite_h", False),
    aten.special_hermite_polynomial_he: ("hermite_he", False),
    aten.special_laguerre_polynomial_l: ("laguerre_l", False),
    aten.special_legendre_polynomial_p: ("legendre_p", False),
    aten.special_shifted_chebyshev_polynomial_t: ("chebyshev_t", True),
    aten.special_shifted_chebyshev_polynomial_u: ("chebyshev_u", True),
    aten.special_shifted_chebyshev_polynomial_v: ("chebyshev_v", True),
    aten.special_shifted_chebyshev_polynomial_w: ("chebyshev_w", True),
}


def _register_polynomial(op, kind: str, shifted: bool) -> None:
    @decomposition(op.default, op.x_scalar, op.n_scalar)
    def polynomial(x, n):
        return _polynomial(kind, x, n, shifted)


for _op, (_kind, _shifted) in _POLYNOMIAL_OPS.items():
    _register_polynomial(_op, _kind, _shifted)
