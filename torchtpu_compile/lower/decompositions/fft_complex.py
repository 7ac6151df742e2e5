"""FFTs and complex values as JAX functions (jax_functions.py): torch-mlir lowers no FFT and no
arithmetic on complex tensors; JAX's stablehlo.fft and complex ops are spliced in.

Example::

    table = decomposition_table()
    table[torch.ops.aten._fft_r2c.default](torch.ones(4), [0], 0, True)   # [4, 0, 0]
"""
from __future__ import annotations

import math

import torch

from .common import in_common_dtype
from .jax_functions import builds, jax_function
from .registry import decomposition

aten = torch.ops.aten


# --- FFT -------------------------------------------------------------------------------------
# ATen passes the normalization resolved: 0 none, 1 by 1/sqrt(n), 2 by 1/n, n the signal size.
# It is applied inside the JAX function: torch-mlir lowers no arithmetic on complex tensors.


def _scaled(out, mode: int, n: int):
    if mode == 1:
        return out * (1 / math.sqrt(n))
    if mode == 2:
        return out * (1 / n)
    return out


def _size(shape, dims) -> int:
    return math.prod(shape[d] for d in dims)


def _fft_dims(x, dim) -> tuple:
    return tuple(d % x.dim() for d in dim)


@builds("fft_c2c")
def _fft_c2c_fn(dims, mode, forward):
    import jax.numpy as jnp
    if forward:
        return lambda x: _scaled(jnp.fft.fftn(x, axes=dims), mode, _size(x.shape, dims))
    return lambda x: _scaled(jnp.fft.ifftn(x, axes=dims) * _size(x.shape, dims), mode,
                             _size(x.shape, dims))


@builds("fft_r2c")
def _fft_r2c_fn(dims, mode, onesided):
    import jax.numpy as jnp
    if onesided:
        return lambda x: _scaled(jnp.fft.rfftn(x, axes=dims), mode, _size(x.shape, dims))
    return lambda x: _scaled(jnp.fft.fftn(x.astype(jnp.complex64), axes=dims), mode,
                             _size(x.shape, dims))


@builds("fft_c2r")
def _fft_c2r_fn(dims, mode, sizes):
    import jax.numpy as jnp
    return lambda x: _scaled(jnp.fft.irfftn(x, s=sizes, axes=dims) * math.prod(sizes), mode,
                             math.prod(sizes))


@decomposition(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    if x.dtype != torch.complex64:
        return NotImplemented
    return jax_function("fft_c2c", _fft_dims(x, dim), normalization, bool(forward))(x)


@decomposition(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    if x.dtype != torch.float32:
        return NotImplemented
    return jax_function("fft_r2c", _fft_dims(x, dim), normalization, bool(onesided))(x)


@decomposition(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    if x.dtype != torch.complex64:
        return NotImplemented
    dims = _fft_dims(x, dim)
    sizes = tuple(x.shape[d] for d in dims[:-1]) + (int(last_dim_size),)
    return jax_function("fft_c2r", dims, normalization, sizes)(x)


# --- complex values --------------------------------------------------------------------------

@builds("conj")
def _conj_fn():
    import jax.numpy as jnp
    return jnp.conj


@builds("view_as_real")
def _view_as_real_fn():
    import jax.numpy as jnp
    return lambda z: jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


@builds("complex")
def _complex_fn():
    import jax
    return jax.lax.complex


@builds("abs")
def _abs_fn():
    import jax.numpy as jnp
    return jnp.abs


@decomposition(aten.abs.default)
def abs_(x):
    # The modulus: torch-mlir converts a complex operand to its real part before its abs.
    if x.dtype != torch.complex64:
        return NotImplemented
    return jax_function("abs")(x)


@decomposition(aten._conj.default, aten._conj_physical.default, aten.conj_physical.default)
def conj(x):
    # The conjugate view of a complex tensor, as a value (a functional graph has no views).
    if x.dtype != torch.complex64:
        return NotImplemented if x.is_complex() else x
    return jax_function("conj")(x)


@decomposition(aten.view_as_real.default)
def view_as_real(z):
    if z.dtype != torch.complex64:
        return NotImplemented
    return jax_function("view_as_real")(z)


@decomposition(aten.view_as_complex.default)
def view_as_complex(x):
    if x.dtype != torch.float32:
        return NotImplemented
    return jax_function("complex")(x[..., 0].contiguous(), x[..., 1].contiguous())


@decomposition(aten.complex.default)
def complex_(real, imag):
    if real.dtype != torch.float32 or imag.dtype != torch.float32:
        return NotImplemented
    real, imag = torch.broadcast_tensors(real, imag)
    return jax_function("complex")(real.contiguous(), imag.contiguous())


@decomposition(aten.polar.default)
def polar(magnitude, angle):
    # torch-mlir's polar does not broadcast its operands.
    if magnitude.dtype != torch.float32 or angle.dtype != torch.float32:
        return NotImplemented
    return complex_(magnitude * torch.cos(angle), magnitude * torch.sin(angle))


# --- truth values and logarithms of complex values -------------------------------------------
# torch-mlir converts a complex operand to its real part first: the cast to bool and the
# logical ops took 1j as False. Eager's truth value of a complex element: either part nonzero.


def truth_value(z):
    return (torch.real(z) != 0) | (torch.imag(z) != 0)


def _as_truth(x):
    return truth_value(x) if isinstance(x, torch.Tensor) and x.is_complex() else x


def _truths(a, b):
    """The operands of a logical op as eager reads them: cast to their promoted dtype (a 0-d
    int64 256 beside uint8 is 0, False), complex ones as their truth; (None, None) where the
    usual lowering reads them so already."""
    cast = in_common_dtype(a, b)
    if cast is None and not _any_complex(a, b):
        return None, None
    a, b = cast or (a, b)
    return _as_truth(a), _as_truth(b)


def _any_complex(*tensors) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_complex() for t in tensors)


@decomposition(aten.logical_not.default)
def logical_not(x):
    if not x.is_complex():
        return NotImplemented
    return torch.logical_not(truth_value(x))


@decomposition(aten.logical_and.default)
def logical_and(a, b):
    a, b = _truths(a, b)
    return NotImplemented if a is None else torch.logical_and(a, b)


@decomposition(aten.logical_or.default)
def logical_or(a, b):
    a, b = _truths(a, b)
    return NotImplemented if a is None else torch.logical_or(a, b)


@decomposition(aten.logical_xor.default)
def logical_xor(a, b):
    a, b = _truths(a, b)
    return NotImplemented if a is None else torch.logical_xor(a, b)


# torch-mlir divides the complex log by log(base) as a complex number: (-inf + 0j) / (c + 0j)
# has a NaN imaginary part, so log10(0) was -inf+nanj (eager: -inf+0j), log10(inf) inf+nanj.
# Both parts of the natural log are scaled by the real 1 / log(base) instead.

@builds("log_base")
def _log_base_fn(base):
    import jax
    import jax.numpy as jnp

    scale = 1 / math.log(base)

    def log_base(z):
        natural = jnp.log(z)
        return jax.lax.complex(jnp.real(natural) * scale, jnp.imag(natural) * scale)
    return log_base


@decomposition(aten.log10.default)
def log10(x):
    if x.dtype != torch.complex64:
        return NotImplemented
    return jax_function("log_base", 10)(x)


@decomposition(aten.log2.default)
def log2(x):
    if x.dtype != torch.complex64:
        return NotImplemented
    return jax_function("log_base", 2)(x)


# torch-mlir's nan_to_num (PyTorch's reference) raises for a complex input ("Complex dtype is
# not supported for isneginf"), so compiling it failed; eager replaces in each part.

@decomposition(aten.nan_to_num.default)
def nan_to_num(x, nan=None, posinf=None, neginf=None):
    from .registry import torch_mlir_table
    base = torch_mlir_table().get(aten.nan_to_num.default)
    if x.dtype != torch.complex64 or base is None:
        return base(x, nan, posinf, neginf) if base is not None else NotImplemented
    real, imag = (base(part, nan, posinf, neginf) for part in (torch.real(x), torch.imag(x)))
    return complex_(real, imag)
