"""Decompositions into JAX functions: ATen ops torch-mlir does not lower that StableHLO has
(fft, cholesky, triangular_solve) or JAX writes for each platform (LU, SVD, QR on LAPACK custom
calls on the CPU), and arithmetic on complex tensors, which torch-mlir does not lower at all.

Each op becomes a call of a ``jax_op`` (kernels/jax_op.py) whose StableHLO JAX writes for the
program's platform, spliced into the program by the one lowering (lower/splice.py): compiled
graphs, the eager device and AOT artifacts run the same code. The JAX function for each set
of non-tensor arguments (dims, norm, upper, ...) is registered once, on first use.

Example::

    table = decomposition_table()
    table[torch.ops.aten.linalg_cholesky_ex.default](a)   # (L, info), L from jax.lax.linalg
"""
from __future__ import annotations

import functools
import math

import torch

from .decompositions import decomposition

aten = torch.ops.aten


#: kind -> builder(*params) returning the JAX function; one ``@_builds`` per kind.
_BUILDERS: dict = {}


def _builds(kind: str):
    def register(builder):
        _BUILDERS[kind] = builder
        return builder
    return register


@functools.lru_cache(maxsize=None)
def _jax_function(kind: str, *params):
    """The ``jax_op`` computing ``kind`` with ``params`` bound, registered once."""
    from ..kernels.jax_op import jax_op

    name = "aten_" + kind + "".join(f"_{_name_part(p)}" for p in params)
    return jax_op(_BUILDERS[kind](*params), name=name)


@_builds("fft_c2c")
def _fft_c2c_fn(dims, mode, forward):
    import jax.numpy as jnp
    if forward:
        return lambda x: _scaled(jnp.fft.fftn(x, axes=dims), mode, _size(x.shape, dims))
    return lambda x: _scaled(jnp.fft.ifftn(x, axes=dims) * _size(x.shape, dims), mode,
                             _size(x.shape, dims))


@_builds("fft_r2c")
def _fft_r2c_fn(dims, mode, onesided):
    import jax.numpy as jnp
    if onesided:
        return lambda x: _scaled(jnp.fft.rfftn(x, axes=dims), mode, _size(x.shape, dims))
    return lambda x: _scaled(jnp.fft.fftn(x.astype(jnp.complex64), axes=dims), mode,
                             _size(x.shape, dims))


@_builds("fft_c2r")
def _fft_c2r_fn(dims, mode, sizes):
    import jax.numpy as jnp
    return lambda x: _scaled(jnp.fft.irfftn(x, s=sizes, axes=dims) * math.prod(sizes), mode,
                             math.prod(sizes))


@_builds("conj")
def _conj_fn():
    import jax.numpy as jnp
    return jnp.conj


@_builds("view_as_real")
def _view_as_real_fn():
    import jax.numpy as jnp
    return lambda z: jnp.stack([jnp.real(z), jnp.imag(z)], axis=-1)


@_builds("complex")
def _complex_fn():
    import jax
    return jax.lax.complex


@_builds("cholesky")
def _cholesky_fn():
    return _cholesky_with_info


@_builds("lu")
def _lu_fn():
    return _lu_with_info


@_builds("lu_solve")
def _lu_solve_fn(trans):
    import jax
    return lambda lu, pivots, b: jax.scipy.linalg.lu_solve((lu, pivots - 1), b, trans=trans)


@_builds("svd")
def _svd_fn(full, vectors):
    import jax.numpy as jnp
    return lambda a: jnp.linalg.svd(a, full_matrices=full, compute_uv=vectors)


@_builds("qr")
def _qr_fn(mode):
    import jax.numpy as jnp
    return lambda a: jnp.linalg.qr(a, mode=mode)


@_builds("lu_permutation")
def _lu_permutation_fn(rows):
    import jax
    return lambda pivots: jax.lax.linalg.lu_pivots_to_permutation(pivots - 1, rows)


@_builds("geqrf")
def _geqrf_fn():
    import jax.numpy as jnp

    def geqrf(a):  # qr(mode="raw") is geqrf with the reflectors transposed
        raw, taus = jnp.linalg.qr(a, mode="raw")
        return raw.mT, taus
    return geqrf


@_builds("ormqr")
def _ormqr_fn(left, transpose):
    import jax
    return lambda a, taus, c: jax.lax.linalg.ormqr(a, taus, c, left=left, transpose=transpose)


@_builds("householder_product")
def _householder_product_fn():
    import jax
    return jax.lax.linalg.householder_product


@_builds("triangular_solve")
def _triangular_solve_fn(left, lower, unit):
    import jax
    return lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=left, lower=lower,
                                                        unit_diagonal=unit)


def _cholesky_with_info(a):
    """(lower factor, LAPACK's info) of a batch of symmetric matrices.

    JAX's factor is NaN wherever the matrix is not positive definite; LAPACK's info is the
    order of the first leading minor that is not. Only then (one scalar condition: XLA runs
    one branch) is it found, as the first non-positive pivot of an unpivoted LDL^T.
    """
    import jax
    import jax.numpy as jnp

    lower = jax.lax.linalg.cholesky(a, symmetrize_input=False)
    n = a.shape[-1]
    ok = jnp.isfinite(jnp.diagonal(lower, axis1=-2, axis2=-1)).all(-1)
    zeros = jnp.zeros(a.shape[:-2], jnp.int32)

    def first_bad_pivot(_):
        later = jnp.arange(n)

        def step(k, state):
            m, info = state
            pivot = m[..., k, k]
            info = jnp.where((info == 0) & ~(pivot > 0), k + 1, info)
            column = jnp.where(later > k, m[..., :, k] / pivot[..., None], 0)
            m = m - column[..., :, None] * m[..., None, k, :]
            return m, info
        return jax.lax.fori_loop(0, n, step, (a, zeros))[1]

    info = jax.lax.cond(ok.all(), lambda _: zeros, first_bad_pivot, None)
    return lower, info


def _lu_with_info(a):
    """LAPACK getrf's (LU, 1-based pivots, info) of a batch of matrices, from JAX's LU (on the
    CPU, getrf itself): info is the first zero on U's diagonal."""
    import jax
    import jax.numpy as jnp

    lu, pivots, _ = jax.lax.linalg.lu(a)
    diagonal = jnp.diagonal(lu, axis1=-2, axis2=-1)
    k = diagonal.shape[-1]
    first = jnp.where(diagonal == 0, jnp.arange(k), k).min(-1, initial=k)
    info = jnp.where(first < k, first + 1, 0).astype(jnp.int32)
    return lu, (pivots + 1).astype(jnp.int32), info


def _name_part(value) -> str:
    if isinstance(value, (tuple, list)):
        return "x".join(str(v) for v in value) or "none"
    return str(int(value)) if isinstance(value, bool) else str(value)


def _size(shape, dims) -> int:
    return math.prod(shape[d] for d in dims)


# --- FFT and complex values -------------------------------------------------------------------
# ATen passes the normalization resolved: 0 none, 1 by 1/sqrt(n), 2 by 1/n, n the signal size.
# It is applied inside the JAX function: torch-mlir lowers no arithmetic on complex tensors.

def _scaled(out, mode: int, n: int):
    if mode == 1:
        return out * (1 / math.sqrt(n))
    if mode == 2:
        return out * (1 / n)
    return out


def _fft_dims(x, dim) -> tuple:
    return tuple(d % x.dim() for d in dim)


@decomposition(aten._fft_c2c.default)
def fft_c2c(x, dim, normalization, forward):
    if x.dtype != torch.complex64:
        return NotImplemented
    return _jax_function("fft_c2c", _fft_dims(x, dim), normalization, bool(forward))(x)


@decomposition(aten._fft_r2c.default)
def fft_r2c(x, dim, normalization, onesided):
    if x.dtype != torch.float32:
        return NotImplemented
    return _jax_function("fft_r2c", _fft_dims(x, dim), normalization, bool(onesided))(x)


@decomposition(aten._fft_c2r.default)
def fft_c2r(x, dim, normalization, last_dim_size):
    if x.dtype != torch.complex64:
        return NotImplemented
    dims = _fft_dims(x, dim)
    sizes = tuple(x.shape[d] for d in dims[:-1]) + (int(last_dim_size),)
    return _jax_function("fft_c2r", dims, normalization, sizes)(x)


@decomposition(aten._conj.default, aten._conj_physical.default, aten.conj_physical.default)
def conj(x):
    # The conjugate view of a complex tensor, as a value (a functional graph has no views).
    if x.dtype != torch.complex64:
        return NotImplemented if x.is_complex() else x
    return _jax_function("conj")(x)


@decomposition(aten.view_as_real.default)
def view_as_real(z):
    if z.dtype != torch.complex64:
        return NotImplemented
    return _jax_function("view_as_real")(z)


@decomposition(aten.view_as_complex.default)
def view_as_complex(x):
    if x.dtype != torch.float32:
        return NotImplemented
    return _jax_function("complex")(x[..., 0].contiguous(), x[..., 1].contiguous())


@decomposition(aten.complex.default)
def complex_(real, imag):
    if real.dtype != torch.float32 or imag.dtype != torch.float32:
        return NotImplemented
    real, imag = torch.broadcast_tensors(real, imag)
    return _jax_function("complex")(real.contiguous(), imag.contiguous())


@decomposition(aten.polar.default)
def polar(magnitude, angle):
    # torch-mlir's polar does not broadcast its operands.
    if magnitude.dtype != torch.float32 or angle.dtype != torch.float32:
        return NotImplemented
    return complex_(magnitude * torch.cos(angle), magnitude * torch.sin(angle))


# --- linear algebra --------------------------------------------------------------------------

def _is_real_float(*tensors) -> bool:
    return all(t.dtype in (torch.float32, torch.float64) for t in tensors)


@decomposition(aten.linalg_cholesky_ex.default)
def linalg_cholesky_ex(a, upper=False, check_errors=False):
    # Where the matrix is not positive definite the factor is NaN (LAPACK leaves a partial
    # one; eager documents neither): callers read info, which is LAPACK's.
    if not _is_real_float(a) or check_errors:
        return NotImplemented
    if a.numel() == 0:  # JAX's loop over columns indexes the empty matrix
        return a.clone(), torch.zeros(a.shape[:-2], dtype=torch.int32)
    lower, info = _jax_function("cholesky")(a)
    return (lower.mT if upper else lower), info


@decomposition(aten.cholesky.default)
def cholesky(a, upper=False):
    if not _is_real_float(a):
        return NotImplemented
    if a.numel() == 0:
        return a.clone()
    lower, _ = _jax_function("cholesky")(a)
    return lower.mT if upper else lower


def _broadcast_batch(a, b):
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])


@decomposition(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    if not _is_real_float(a, b):
        return NotImplemented
    a, b = _broadcast_batch(a, b)
    return _jax_function("triangular_solve", bool(left), not upper, bool(unitriangular))(a, b)


@decomposition(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    # Solves op(A) X = B, op the transpose if asked; returns (X, a copy of A), as eager.
    if not _is_real_float(a, b):
        return NotImplemented
    a_b, b_b = _broadcast_batch(a, b)
    lower = not upper
    if transpose:
        a_b, lower = a_b.mT, upper
    x = _jax_function("triangular_solve", True, lower, bool(unitriangular))(a_b, b_b)
    return x, a.clone()


def _triangular(lower_factor, b, *, left: bool, lower: bool, transpose: bool = False):
    a, b = _broadcast_batch(lower_factor, b)
    if transpose:
        a, lower = a.mT, not lower
    return _jax_function("triangular_solve", left, lower, False)(a, b)


@decomposition(aten.cholesky_solve.default)
def cholesky_solve(b, factor, upper=False):
    # A X = B with A = L L^T (or U^T U): two triangular solves.
    if not _is_real_float(b, factor):
        return NotImplemented
    lower = not upper
    y = _triangular(factor, b, left=True, lower=lower, transpose=upper)
    return _triangular(factor, y, left=True, lower=lower, transpose=lower)


@decomposition(aten.cholesky_inverse.default)
def cholesky_inverse(factor, upper=False):
    if not _is_real_float(factor):
        return NotImplemented
    eye = torch.eye(factor.shape[-1], dtype=factor.dtype).expand(factor.shape)
    return cholesky_solve(eye, factor, upper)


# LU: JAX's factorization (getrf on the CPU), and everything eager builds on it.

def _lu(a):
    if a.numel() == 0:
        k = min(a.shape[-2], a.shape[-1])
        return (a.clone(), torch.zeros(*a.shape[:-2], k, dtype=torch.int32),
                torch.zeros(a.shape[:-2], dtype=torch.int32))
    return _jax_function("lu")(a)


def _pivot_sign(pivots, dtype):
    """(-1) ** (row swaps): pivot i (1-based) differs from i + 1 for each swap."""
    swaps = (pivots != torch.arange(1, pivots.shape[-1] + 1, dtype=torch.int32)).sum(-1)
    return 1 - 2 * (swaps % 2).to(dtype)


@decomposition(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not _is_real_float(a) or not pivot or check_errors:
        return NotImplemented
    return _lu(a)


@decomposition(aten._linalg_det.default)
def linalg_det(a):
    if not _is_real_float(a):
        return NotImplemented
    lu, pivots, _ = _lu(a)
    diagonal = torch.diagonal(lu, dim1=-2, dim2=-1)
    return diagonal.prod(-1) * _pivot_sign(pivots, a.dtype), lu, pivots


@decomposition(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    if not _is_real_float(a):
        return NotImplemented
    lu, pivots, _ = _lu(a)
    diagonal = torch.diagonal(lu, dim1=-2, dim2=-1)
    sign = torch.sign(diagonal).prod(-1) * _pivot_sign(pivots, a.dtype)
    return sign, diagonal.abs().log().sum(-1), lu, pivots


def _lu_solve(lu, pivots, b, *, adjoint=False):
    lu, b = _broadcast_batch(lu, b)
    pivots = pivots.expand(*lu.shape[:-2], pivots.shape[-1])
    return _jax_function("lu_solve", 1 if adjoint else 0)(lu, pivots.contiguous(), b)


@decomposition(aten.linalg_inv_ex.default)
def linalg_inv_ex(a, *, check_errors=False):
    if not _is_real_float(a) or check_errors:
        return NotImplemented
    lu, pivots, info = _lu(a)
    if a.numel() == 0:
        return a.clone(), info
    eye = torch.eye(a.shape[-1], dtype=a.dtype).expand(a.shape)
    return _lu_solve(lu, pivots, eye), info


@decomposition(aten._linalg_solve_ex.default)
def linalg_solve_ex(a, b, *, left=True, check_errors=False):
    # B is a batch of vectors when it has one dim less than A and A's leading shape (eager's
    # rule); X A = B (left=False) is A^T X^T = B^T, solved with the same factors.
    if not _is_real_float(a, b) or check_errors:
        return NotImplemented
    lu, pivots, info = _lu(a)
    vector = b.dim() == 1 or (b.dim() == a.dim() - 1 and b.shape == a.shape[:-1])
    rhs = b.unsqueeze(-1) if vector else b
    if a.numel() == 0 or b.numel() == 0:
        batch = torch.broadcast_shapes(a.shape[:-2], rhs.shape[:-2])
        x = rhs.new_zeros(*batch, *rhs.shape[-2:])
        return (x.squeeze(-1) if vector else x), lu, pivots, info
    if left:
        x = _lu_solve(lu, pivots, rhs)
    else:
        x = _lu_solve(lu, pivots, rhs.mT, adjoint=True).mT
    return (x.squeeze(-1) if vector else x), lu, pivots, info


@decomposition(aten.linalg_lu_solve.default)
def linalg_lu_solve(lu, pivots, b, *, left=True, adjoint=False):
    if not _is_real_float(lu, b) or b.numel() == 0:
        return NotImplemented
    if left:
        return _lu_solve(lu, pivots, b, adjoint=adjoint)
    return _lu_solve(lu, pivots, b.mT, adjoint=not adjoint).mT



def _permutation_matrix(pivots, rows: int, dtype):
    """P with A = P L U from getrf's 1-based pivots: row i of L U is row perm[i] of A."""
    perm = _jax_function("lu_permutation", rows)(pivots.contiguous())
    return torch.nn.functional.one_hot(perm.to(torch.int64), rows).to(dtype).mT


@decomposition(aten.lu_unpack.default)
def lu_unpack(lu, pivots, unpack_data=True, unpack_pivots=True):
    if not _is_real_float(lu) or lu.numel() == 0 or not (unpack_data and unpack_pivots):
        return NotImplemented
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)
    lower = torch.tril(lu[..., :, :k], -1) + torch.eye(m, k, dtype=lu.dtype)
    upper = torch.triu(lu[..., :k, :])
    return _permutation_matrix(pivots, m, lu.dtype), lower, upper


@decomposition(aten.linalg_lu.default)
def linalg_lu(a, *, pivot=True):
    if not _is_real_float(a) or not pivot or a.numel() == 0:
        return NotImplemented
    lu, pivots, _ = _lu(a)
    return lu_unpack(lu, pivots)


# Singular value and QR decompositions: JAX calls the same LAPACK routines on the CPU (gesdd,
# geqrf/orgqr), and the signs of singular vectors and Q agree with eager's. (eigh's do not:
# JAX's syevd picks other eigenvector signs than eager's, so eigh stays on the host.)

@decomposition(aten._linalg_svd.default)
def linalg_svd(a, full_matrices=False, compute_uv=True, *, driver=None):
    if not _is_real_float(a) or a.numel() == 0:
        return NotImplemented
    out = _jax_function("svd", bool(full_matrices), bool(compute_uv))(a)
    if compute_uv:
        return out
    empty = a.new_empty((0,))
    return empty, out, empty


@decomposition(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if not _is_real_float(a) or a.numel() == 0:
        return NotImplemented
    if mode == "r":
        return a.new_empty((0,)), _jax_function("qr", "r")(a)
    return _jax_function("qr", mode)(a)


@decomposition(aten.linalg_pinv.atol_rtol_tensor)
def linalg_pinv(a, *, atol=None, rtol=None, hermitian=False):
    # Eager's formula from the SVD: singular values at most max(atol, rtol * the largest) count
    # as zero; rtol defaults to eps * max(m, n) (to 0 where a positive atol is given).
    # hermitian=True goes through eigh, which stays on the host.
    if not _is_real_float(a) or hermitian:
        return NotImplemented
    m, n = a.shape[-2], a.shape[-1]
    if a.numel() == 0:
        return a.new_zeros(*a.shape[:-2], n, m)
    default_rtol = torch.finfo(a.dtype).eps * max(m, n)
    zero = torch.zeros((), dtype=a.dtype)
    if rtol is None:
        rtol = torch.full((), default_rtol, dtype=a.dtype) if atol is None else \
            torch.where(atol > 0, zero, default_rtol)
    atol = zero if atol is None else atol
    u, s, vh = linalg_svd(a, False, True)
    tol = torch.maximum(atol.unsqueeze(-1), rtol.unsqueeze(-1) * s.narrow(-1, 0, 1))
    s_inv = torch.where(s > tol, 1 / s, torch.zeros_like(s))
    return (vh.mT * s_inv.unsqueeze(-2)) @ u.mT


# Householder QR: LAPACK's geqrf/orgqr (JAX calls them on the CPU), and ormqr from them.

@decomposition(aten.geqrf.default)
def geqrf(a):
    if not _is_real_float(a) or a.numel() == 0:
        return NotImplemented
    return _jax_function("geqrf")(a)


@decomposition(aten.linalg_householder_product.default)
def householder_product(reflectors, tau):
    if not _is_real_float(reflectors, tau) or reflectors.numel() == 0 or tau.numel() == 0:
        return NotImplemented
    return _jax_function("householder_product")(reflectors, tau)


@decomposition(aten.ormqr.default)
def ormqr(reflectors, tau, other, left=True, transpose=False):
    if not _is_real_float(reflectors, tau, other) or reflectors.numel() == 0 \
            or tau.numel() == 0:
        return NotImplemented
    reflectors, other = _broadcast_batch(reflectors, other)
    tau = tau.expand(*reflectors.shape[:-2], tau.shape[-1])
    return _jax_function("ormqr", bool(left), bool(transpose))(
        reflectors.contiguous(), tau.contiguous(), other.contiguous())


# --- regularized incomplete gamma -------------------------------------------------------------

@_builds("igamma")
def _igamma_fn(upper):
    import jax.numpy as jnp
    from jax.scipy.special import gammainc, gammaincc

    def igamma(a, x):
        dtype = a.dtype
        compute = jnp.promote_types(dtype, jnp.float32)  # bf16/f16 as eager: in float32
        a, x = a.astype(compute), x.astype(compute)
        nan, low, high = (jnp.asarray(v, compute) for v in (jnp.nan, 0.0, 1.0))
        if upper:
            low, high = high, low
        # Eager's ladder of special cases, in its order (NaN passes the comparisons that
        # come before it): JAX differs at a = inf and where a or x is NaN.
        out = (gammaincc if upper else gammainc)(a, x)
        out = jnp.where(jnp.isinf(x), high, out)
        out = jnp.where(jnp.isinf(a), jnp.where(jnp.isinf(x), nan, low), out)
        out = jnp.where(x == 0, low, out)
        out = jnp.where(a == 0, jnp.where(x > 0, high, nan), out)
        return jnp.where((x < 0) | (a < 0), nan, out).astype(dtype)
    return igamma


def _incomplete_gamma(a, x, upper: bool):
    dtype = torch.result_type(a, x)
    if not dtype.is_floating_point:
        return NotImplemented
    a, x = torch.broadcast_tensors(a.to(dtype), x.to(dtype))
    return _jax_function("igamma", upper)(a, x)


@decomposition(aten.igamma.default)
def igamma(a, x):
    return _incomplete_gamma(a, x, upper=False)


@decomposition(aten.igammac.default)
def igammac(a, x):
    return _incomplete_gamma(a, x, upper=True)


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


@_builds("polynomial")
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
    return _jax_function("polynomial", kind)(x.contiguous(), n.contiguous())


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
