"""Arithmetic on complex64 tensors as JAX functions (jax_functions.py): torch-mlir lowers none
("only floating-point or integer datatype legalization supported"), so every complex mul, sum
or matmul ran on the host, the rotary embedding of Llama-style models among them.

One ``@complex_rule`` per op (registry.py): where the op computes in complex64 it returns the
JAX function's result, else None and the op's usual decomposition runs. Operands are read as
eager's kernels read them: promoted to complex64 (a real tensor or Python number is a complex
number with a zero imaginary part, so ``inf * (1+0j)`` has a NaN part, as in eager), Python
numbers rounded to float32 parts. complex128 is left alone (it falls back, as before).

Example::

    table = decomposition_table()
    z = torch.tensor([1 + 2j])
    table[torch.ops.aten.mul.Tensor](z, 1j)   # [-2+1j], one JAX multiply
"""
from __future__ import annotations

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from .fft_complex import complex_
from .jax_functions import builds, jax_function
from .registry import Registry, complex_rule

aten = torch.ops.aten


# --- the JAX functions -----------------------------------------------------------------------

@builds("complex_elementwise")
def _elementwise_fn(name):
    import jax.numpy as jnp
    at_edges = _AT_EDGES.get(name)
    return getattr(jnp, name) if at_edges is None else at_edges(getattr(jnp, name))


@builds("complex_reduction")
def _reduction_fn(name, dims, keepdim):
    import jax.numpy as jnp
    reduce = getattr(jnp, name)
    return lambda z: reduce(z, axis=dims, keepdims=keepdim)


@builds("complex_scaled")
def _scaled_fn():
    # eager's product (_multiply), where XLA's own would fold a product by the constant 1+0j
    # to its other operand, where eager's has inf * 0 = NaN in it
    return _multiply


def _jnp(name, *tensors):
    return jax_function("complex_elementwise", name)(*tensors)


# --- eager's values at infinities and NaNs ---------------------------------------------------
# Eager's complex functions are C99's (std::exp, std::log, ...), whose Annex G fixes their
# values where a part is infinite or NaN; XLA's formulas give NaNs there. Each entry takes
# jax.numpy's function and returns it with those values put back.

_AT_EDGES = Registry("edge value patch")


def _at_edges(name):
    def register(patch):
        _AT_EDGES.register(name, patch)
        return patch
    return register


def _c(real, imag):
    import jax
    import jax.numpy as jnp
    return jax.lax.complex(jnp.float32(real), jnp.float32(imag))


@_at_edges("exp")
def _exp_at_edges(exp):
    import jax.numpy as jnp

    def at_edges(z):
        x, y = jnp.real(z), jnp.imag(z)
        edge = jnp.where(x > 0, _c(jnp.inf, jnp.nan), _c(0, 0))   # exp(+-inf + (inf|nan)j)
        return jnp.where(jnp.isinf(x) & ~jnp.isfinite(y), edge, exp(z))
    return at_edges


@_at_edges("log")
def _log_at_edges(log):
    import jax.numpy as jnp

    def at_edges(z):
        x, y = jnp.real(z), jnp.imag(z)
        infinite_and_nan = (jnp.isinf(x) | jnp.isinf(y)) & (jnp.isnan(x) | jnp.isnan(y))
        return jnp.where(infinite_and_nan, _c(jnp.inf, jnp.nan), log(z))
    return at_edges


@_at_edges("sqrt")
def _sqrt_at_edges(sqrt):
    import jax
    import jax.numpy as jnp

    def at_edges(z):
        x, y = jnp.real(z), jnp.imag(z)
        out = jnp.where(jnp.isinf(x) & jnp.isnan(y),
                        jnp.where(x > 0, _c(jnp.inf, jnp.nan), _c(jnp.nan, jnp.inf)), sqrt(z))
        out = jnp.where(jnp.isinf(y), jax.lax.complex(jnp.full_like(y, jnp.inf), y), out)
        # csqrt is conj-symmetric: sqrt(-inf-0j) is -infj (jax.numpy's is +infj)
        imag = jnp.imag(out)
        return jax.lax.complex(jnp.real(out),
                               jnp.where(jnp.isnan(imag), imag, jnp.copysign(imag, y)))
    return at_edges


@_at_edges("tanh")
def _tanh_at_edges(tanh):
    import jax
    import jax.numpy as jnp

    def at_edges(z):
        x, y = jnp.real(z), jnp.imag(z)
        return jnp.where((x == 0) & ~jnp.isfinite(y),
                         jax.lax.complex(x, jnp.full_like(y, jnp.nan)), tanh(z))
    return at_edges


@_at_edges("reciprocal")
def _reciprocal_as_eager(_):
    # Eager's is c10::complex's 1 / z (1 / 0j is inf+nanj, 1 / (0+infj) is -0j; XLA's
    # reciprocal gives nan+nanj and NaNs).
    import jax.numpy as jnp
    return lambda z: _divide(jnp.ones_like(z), z)


@_at_edges("multiply")
def _multiply_as_eager(_):
    return _multiply


@_at_edges("divide")
def _divide_as_eager(_):
    return _divide


@_at_edges("exp2")
def _exp2_as_eager(_):
    # eager's is exp(ln 2 * z), each part scaled by the real ln 2 (no inf * 0 in it), so it
    # has exp's values at infinities: 2 ** (inf+0j) is inf+0j, where jax.numpy's gives NaNs
    import jax
    import jax.numpy as jnp
    exp = _AT_EDGES["exp"](jnp.exp)
    ln_2 = jnp.float32(0.6931471805599453)
    return lambda z: exp(jax.lax.complex(jnp.real(z) * ln_2, jnp.imag(z) * ln_2))


@_at_edges("arctanh")
def _arctanh_at_edges(arctanh):
    # C99's catanh is odd and conj-symmetric: its imaginary part has y's sign, also for y = -0
    # (atanh(inf-0j) is -pi/2 j; jax.numpy's is +pi/2 j), and atanh(+-inf+nanj) is +-0+nanj.
    import jax
    import jax.numpy as jnp

    def at_edges(z):
        x, y = jnp.real(z), jnp.imag(z)
        out = arctanh(z)
        real = jnp.where(jnp.isinf(x) & jnp.isnan(y), jnp.copysign(jnp.zeros_like(x), x),
                         jnp.real(out))
        imag = jnp.where(jnp.isnan(y), y, jnp.copysign(jnp.imag(out), y))
        return jax.lax.complex(real, imag)
    return at_edges


@_at_edges("power")
def _power_as_eager(_):
    # eager's is std::pow, glibc's cpowf: exp(w * log(z)) with C's complex product (_c_product)
    import jax.numpy as jnp
    exp, log = _AT_EDGES["exp"](jnp.exp), _AT_EDGES["log"](jnp.log)
    def power(z, w):   # a real base is a complex one: (-1.5) ** 0j is 1, not NaN
        z, w = (jnp.asarray(v, jnp.complex64) for v in (z, w))
        return exp(_c_product(*jnp.broadcast_arrays(w, log(z))))
    return power


# --- eager's products and quotients ----------------------------------------------------------
# JAX functions of complex64 arrays computing what eager's kernels compute, rounding for
# rounding where they can.

def _rounded_product(x, y):
    """``x * y``, rounded before any sum reads it, as in eager's kernels: XLA's CPU compiler
    fuses a product into the sum that reads it (one FMA, one rounding), so ``a*d - b*c`` of
    parts that cancel was a rounding error, not eager's 0. A select between them keeps them
    apart; an optimization barrier does not (the CPU pipeline removes it). ``x == x`` is False
    for a NaN x only, where the product is NaN too.

    Example::

        _rounded_product(a, d) - _rounded_product(b, c)   # 0 where a*d and b*c round alike
    """
    import jax.numpy as jnp
    return jnp.where(x == x, x * y, x)


def _multiply(z, w):
    """Eager's ``z * w`` (its vectorized kernel): ``(ac - bd) + (ad + bc)j``, each product
    rounded (inf * (1+0j) has a NaN part).

    Example::

        _multiply(jnp.complex64(1 + 2j), jnp.complex64(3j))   # -6+3j
    """
    import jax
    import jax.numpy as jnp
    a, b, c, d = jnp.real(z), jnp.imag(z), jnp.real(w), jnp.imag(w)
    p = _rounded_product
    return jax.lax.complex(p(a, c) - p(b, d), p(a, d) + p(b, c))


def _divide(z, w):
    """Eager's ``z / w``: c10::complex's quotient (Smith's, scaled by the larger part of w, as
    numpy's), which its vectorized kernel runs element by element. 0j / (inf+infj) is nan+nanj
    there (the ratio inf / inf is NaN), where XLA's gives 0j; 1 / 0j is inf+nanj.

    Example::

        _divide(jnp.complex64(0j), jnp.complex64(complex("inf+infj")))   # nan+nanj
    """
    import jax
    import jax.numpy as jnp
    z, w = jnp.broadcast_arrays(z, w)
    a, b, c, d = jnp.real(z), jnp.imag(z), jnp.real(w), jnp.imag(w)
    p = _rounded_product
    real_larger = jnp.abs(c) >= jnp.abs(d)   # False where either is NaN, as in C++
    rat = jnp.where(real_larger, d / c, c / d)
    scale = 1 / jnp.where(real_larger, c + p(d, rat), d + p(c, rat))
    real = p(jnp.where(real_larger, a + p(b, rat), p(a, rat) + b), scale)
    imag = p(jnp.where(real_larger, b - p(a, rat), p(b, rat) - a), scale)
    both_zero = (c == 0) & (d == 0)
    real = jnp.where(both_zero, a / jnp.abs(c), real)
    imag = jnp.where(both_zero, b / jnp.abs(d), imag)
    return jax.lax.complex(real, imag)


def _c_product(z, w):
    """C's ``z * w`` (GCC's, C99 Annex G): ``_multiply``, except where both parts are NaN and
    an operand or a product is infinite: the infinite operand counts as a unit of its signs,
    the other's NaN parts as zeros, and the result is inf times that product (glibc's cpowf
    multiplies so: 0j ** (1+1j) is 0j in eager, exp(-inf-infj)).

    Example::

        _c_product(jnp.complex64(complex("inf+nanj")), jnp.complex64(1))   # inf+nanj
    """
    import jax
    import jax.numpy as jnp
    a, b, c, d = jnp.real(z), jnp.imag(z), jnp.real(w), jnp.imag(w)
    p = _rounded_product
    ac, bd, ad, bc = p(a, c), p(b, d), p(a, d), p(b, c)
    x, y = ac - bd, ad + bc
    inf, isinf, isnan = jnp.float32(jnp.inf), jnp.isinf, jnp.isnan

    def unit(v):
        return jnp.copysign(jnp.where(isinf(v), 1.0, 0.0).astype(v.dtype), v)

    def zero_if_nan(v, where):
        return jnp.where(where & isnan(v), jnp.copysign(jnp.zeros_like(v), v), v)

    z_infinite = isinf(a) | isinf(b)
    a, b = jnp.where(z_infinite, unit(a), a), jnp.where(z_infinite, unit(b), b)
    c, d = zero_if_nan(c, z_infinite), zero_if_nan(d, z_infinite)
    w_infinite = isinf(c) | isinf(d)
    c, d = jnp.where(w_infinite, unit(c), c), jnp.where(w_infinite, unit(d), d)
    a, b = zero_if_nan(a, w_infinite), zero_if_nan(b, w_infinite)
    overflowed = ~(z_infinite | w_infinite) & (isinf(ac) | isinf(bd) | isinf(ad) | isinf(bc))
    a, b, c, d = (zero_if_nan(v, overflowed) for v in (a, b, c, d))
    recover = isnan(x) & isnan(y) & (z_infinite | w_infinite | overflowed)
    x = jnp.where(recover, inf * (p(a, c) - p(b, d)), x)
    y = jnp.where(recover, inf * (p(a, d) + p(b, c)), y)
    return jax.lax.complex(x, y)


# --- operands, as eager's kernels read them --------------------------------------------------

def _is_complex(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_complex()
    return isinstance(value, complex)


def _in_complex64(*operands):
    """The operands of an op computing in complex64, as tensors JAX reads the same way: complex
    ones as they are, real tensors as float32 (JAX promotes them to complex64 as eager does),
    Python numbers as 0-d tensors with float32 parts; None where the op does not compute in
    complex64 (no complex operand, or complex128).

    Example::

        _in_complex64(torch.ones(2, dtype=torch.complex64), 2)   # (z, tensor(2.))
    """
    if not any(_is_complex(v) for v in operands):
        return None
    _, result = elementwise_dtypes(*operands,
                                   type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)
    if result != torch.complex64:
        return None
    # numbers only (torch.add(1j, 2j)): 0-d tensors on the default device
    device = next((v.device for v in operands if isinstance(v, torch.Tensor)), None)
    return tuple(_as_tensor(v, device) for v in operands)


def _as_tensor(value, device):
    if isinstance(value, torch.Tensor):
        return value if value.is_complex() else value.to(torch.float32)
    if isinstance(value, complex):
        return complex_(*(torch.scalar_tensor(part, dtype=torch.float32, device=device)
                          for part in (value.real, value.imag)))
    return torch.scalar_tensor(float(value), dtype=torch.float32, device=device)


def _complex(x):
    """``x`` in complex64: a real tensor as a complex one with zero imaginary parts."""
    return x if x.is_complex() else complex_(x, torch.zeros_like(x))


def _scaled(x, factor):
    """``factor * x`` for the alpha, beta and value arguments, a complex product even where the
    factor is 1, as eager's kernels compute it (``a + alpha * b``): there ``(0+infj) + (3.5+nanj)``
    is ``nan+nanj``, ``inf * 0`` reaching the real part."""
    return jax_function("complex_scaled")(_as_tensor(factor, x.device), x)


# --- elementwise -----------------------------------------------------------------------------

def _binary(name):
    def rule(a, b):
        operands = _in_complex64(a, b)
        return None if operands is None else _jnp(name, *operands)
    rule.__name__ = f"complex_{name}"
    return rule


complex_rule(aten.pow.Tensor_Tensor)(_binary("power"))


@complex_rule(aten.pow.Tensor_Scalar)
def pow_tensor_scalar(z, exponent):
    # eager's kernel picks a cheaper formula for these exponents, with its own values at
    # infinities (z ** 2 is z * z, no log in it)
    operands = _in_complex64(z, exponent)
    if operands is None:
        return None
    z = _complex(operands[0])
    if exponent == 0:
        return _jnp("ones_like", z)
    if exponent == 1:
        return _jnp("positive", z)   # a new tensor, as eager's copy
    special = _POWERS.get(exponent)
    return special(z) if special is not None else _jnp("power", z, operands[1])


def _square(z):
    return _jnp("multiply", z, z)


_POWERS = {
    0.5: lambda z: _jnp("sqrt", z), -0.5: lambda z: _jnp("reciprocal", _jnp("sqrt", z)),
    -1: lambda z: _jnp("reciprocal", z), 2: _square,
    3: lambda z: _jnp("multiply", _square(z), z), -2: lambda z: _jnp("reciprocal", _square(z)),
}


@complex_rule(aten.pow.Scalar)
def pow_scalar(base, exponent):
    operands = _in_complex64(base, exponent)
    if operands is None:
        return None
    if base == 1:   # eager fills ones, whatever the exponent (1 ** nan is 1)
        return _jnp("ones_like", _complex(operands[1]))
    return _jnp("power", *operands)


@complex_rule(aten.mul.Tensor, aten.mul.Scalar)
def mul(a, b):
    operands = _in_complex64(a, b)
    if operands is None:
        return None
    if not isinstance(b, torch.Tensor):   # z * 1 must not fold to z (_scaled)
        return _scaled(operands[0], b)
    return _jnp("multiply", *operands)


@complex_rule(aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div.Scalar_mode)
def div(a, b, *, rounding_mode=None):
    # eager rounds no complex quotient (it raises): those calls keep their usual path
    operands = _in_complex64(a, b) if rounding_mode is None else None
    return None if operands is None else _jnp("divide", *operands)


@complex_rule(aten.add.Tensor, aten.add.Scalar)
def add(a, b, *, alpha=1):
    # alpha takes no part in the promotion (eager rejects a complex one beside real tensors)
    operands = _in_complex64(a, b)
    return None if operands is None else _jnp("add", operands[0], _scaled(operands[1], alpha))


@complex_rule(aten.sub.Tensor, aten.sub.Scalar)
def sub(a, b, *, alpha=1):
    # eager subtracts as it adds, by -alpha
    operands = _in_complex64(a, b)
    return None if operands is None else _jnp("add", operands[0], _scaled(operands[1], -alpha))


@complex_rule(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(a, b, alpha=1):  # (rsub's alpha is positional, unlike sub's)
    operands = _in_complex64(a, b)
    return None if operands is None else _jnp("add", operands[1], _scaled(operands[0], -alpha))


# eager's order: value * a first, then * b (/ b)

@complex_rule(aten.addcmul.default)
def addcmul(x, a, b, *, value=1):
    operands = _in_complex64(x, a, b)
    if operands is None:
        return None
    x, a, b = operands
    return _jnp("add", x, _jnp("multiply", _scaled(a, value), b))


@complex_rule(aten.addcdiv.default)
def addcdiv(x, a, b, *, value=1):
    operands = _in_complex64(x, a, b)
    if operands is None:
        return None
    x, a, b = operands
    return _jnp("add", x, _jnp("divide", _scaled(a, value), b))


def _unary(name):
    def rule(x):
        return _jnp(name, x) if x.dtype == torch.complex64 else None
    rule.__name__ = f"complex_{name}"
    return rule


#: The complex functions of one operand that jax.numpy computes as eager does (to float32
#: rounding away from branch cuts: tests/decompositions/test_complex_arithmetic.py).
_UNARY = {
    aten.neg.default: "negative", aten.reciprocal.default: "reciprocal",
    aten.exp.default: "exp", aten.log.default: "log", aten.sqrt.default: "sqrt",
    aten.sin.default: "sin", aten.cos.default: "cos", aten.tanh.default: "tanh",
    aten.sinh.default: "sinh", aten.cosh.default: "cosh", aten.tan.default: "tan",
    aten.log1p.default: "log1p", aten.expm1.default: "expm1", aten.sgn.default: "sign",
    aten.exp2.default: "exp2", aten.asin.default: "arcsin", aten.acos.default: "arccos",
    aten.atan.default: "arctan", aten.asinh.default: "arcsinh", aten.acosh.default: "arccosh",
    aten.atanh.default: "arctanh",
}
for _op, _name in _UNARY.items():
    complex_rule(_op)(_unary(_name))


@complex_rule(aten.rsqrt.default)
def rsqrt(x):
    return _jnp("reciprocal", _jnp("sqrt", x)) if x.dtype == torch.complex64 else None


@complex_rule(aten.sigmoid.default)
def sigmoid(x):
    if x.dtype != torch.complex64:
        return None
    one = _as_tensor(1.0, x.device)
    return _jnp("reciprocal", _jnp("add", one, _jnp("exp", _jnp("negative", x))))


@complex_rule(aten.sinc.default)
def sinc(x):
    return jax_function("complex_sinc")(x) if x.dtype == torch.complex64 else None


@builds("complex_sinc")
def _sinc_fn():
    # eager's: 1 at 0, else sin(pi z) / (pi z), pi z a complex product (pi * (inf+0j) has a
    # NaN part)
    import jax.numpy as jnp
    sin = _elementwise_fn("sin")

    def sinc(z):
        product = _multiply(jnp.complex64(jnp.pi), z)
        return jnp.where(z == 0, jnp.ones_like(z), _divide(sin(product), product))
    return sinc


@complex_rule(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(start, end, weight):
    # eager's vectorized kernel: a weight under 0.5 in magnitude steps from start, the others
    # back from end: start + w * (end - start), end + (w - 1) * (end - start)
    operands = _in_complex64(start, end, weight)
    return None if operands is None else jax_function("complex_lerp")(*operands)


@builds("complex_lerp")
def _lerp_fn():
    import jax.numpy as jnp

    def lerp(start, end, weight):
        weight = jnp.asarray(weight, jnp.complex64)
        small = jnp.abs(weight) < 0.5
        coefficient = jnp.where(small, weight, weight - 1)
        return _multiply(coefficient, end - start) + jnp.where(small, start, end)
    return lerp


# --- reductions ------------------------------------------------------------------------------

def _reduction(name):
    def rule(x, dim=None, keepdim=False, *, dtype=None):
        if x.dtype != torch.complex64 or dtype not in (None, torch.complex64):
            return None
        if isinstance(dim, int):
            dim = [dim]
        dims = tuple(range(x.dim())) if not dim else tuple(d % max(x.dim(), 1) for d in dim)
        if x.dim() == 0:
            dims = ()
        return jax_function("complex_reduction", name, dims, bool(keepdim))(x)
    rule.__name__ = f"complex_{name}"
    return rule


for _ops, _name in (((aten.sum.default, aten.sum.dim_IntList), "sum"),
                    ((aten.mean.default, aten.mean.dim), "mean"),
                    ((aten.prod.default, aten.prod.dim_int), "prod")):
    complex_rule(*_ops)(_reduction(_name))


# --- matrix products -------------------------------------------------------------------------

# Matrix products promote nothing: eager raises for a real operand beside a complex one (so
# does the usual path they are left to).

def _all_complex64(*tensors) -> bool:
    return all(t.dtype == torch.complex64 for t in tensors)


def _product(a, b):
    return _jnp("matmul", a, b) if _all_complex64(a, b) else None


for _op in (aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default):
    complex_rule(_op)(_product)


@complex_rule(aten.vdot.default)
def vdot(a, b):
    return _jnp("vdot", a, b) if _all_complex64(a, b) else None


def _accumulated(product):
    """``beta * x + alpha * product(a, b)``, as the addmm family computes it: ``x`` is not read
    where beta is 0 (its NaNs do not reach the result)."""
    def rule(x, a, b, *, beta=1, alpha=1):
        if not _all_complex64(x, a, b):
            return None
        out = _scaled(_jnp("matmul", a, b), alpha)
        if product == "sum":
            out = jax_function("complex_reduction", "sum", (0,), False)(out)
        if not isinstance(beta, torch.Tensor) and beta == 0:
            return _jnp("add", out, _jnp("zeros_like", x))
        return _jnp("add", out, _scaled(x, beta))
    rule.__name__ = f"complex_add{product}"
    return rule


complex_rule(aten.addmm.default, aten.baddbmm.default, aten.addmv.default)(_accumulated("mm"))
complex_rule(aten.addbmm.default)(_accumulated("sum"))
