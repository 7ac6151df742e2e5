"""Linear algebra: matrix products torch-mlir does not lower (addmv, the grouped matmuls of
mixture-of-experts layers); factorizations and solves as JAX functions (jax_functions.py:
Cholesky, LU, QR, SVD and what eager builds on them, on LAPACK's routines on the CPU); and
distances (cdist, pdist, dist) as norms of differences.

Example::

    table = decomposition_table()
    table[torch.ops.aten.linalg_cholesky_ex.default](a)   # (L, info), L from jax.lax.linalg
"""
from __future__ import annotations

import math

import torch

from .jax_functions import builds, jax_function
from .registry import decomposition

aten = torch.ops.aten


# --- matrix products -------------------------------------------------------------------------

@decomposition(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    # No torch-mlir lowering. beta == 0 ignores self, NaNs included, as eager does.
    out = torch.mv(mat, vec)
    if not (out.is_floating_point() or out.is_complex()):
        alpha, beta = int(alpha), int(beta)  # eager's integer kernels truncate them: 0.6 is 0
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out.expand(torch.broadcast_shapes(self.shape, out.shape)).clone()
    return out + (self * beta if beta != 1 else self)


@decomposition(aten.addbmm.default)
def addbmm(self, batch1, batch2, *, beta=1, alpha=1):
    # torch-mlir's lowering fails for bf16 and f16 ("failed to legalize torch.constant.int"):
    # every addbmm under autocast ran on the host. The sum of the batch's products is one
    # product of the batches laid side by side, [a_1 .. a_b] @ [b_1; ..; b_b].
    if batch1.dtype not in (torch.bfloat16, torch.float16):
        return NotImplemented
    count, rows, inner = batch1.shape
    left = batch1.permute(1, 0, 2).reshape(rows, count * inner)
    return torch.addmm(self, left, batch2.reshape(count * inner, batch2.shape[2]),
                       beta=beta, alpha=alpha)


# --- grouped matmuls (mixture-of-experts layers) ---------------------------------------------

def _groups(offs, length: int):
    """Group of each of ``length`` positions: how many cumulative ends ``offs`` lie at or
    before it (positions past the last end get ``len(offs)``, no group)."""
    position = torch.arange(length, device=offs.device)
    return (position.unsqueeze(1) >= offs.to(torch.int64).unsqueeze(0)).sum(1)


def _rows_grouped_mm(input, weight, offs):
    # out[t] = input[t] @ weight[group(t)], one masked matmul per group: static shapes, and
    # no (tokens x K x N) gather of weights.
    group = _groups(offs, input.shape[0]).unsqueeze(1)
    out = input.new_zeros(input.shape[0], weight.shape[-1])
    for e in range(weight.shape[0]):
        out = torch.where(group == e, input @ weight[e], out)
    return out


@decomposition(aten._grouped_mm.default)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    # No torch-mlir lowering; transformers' MoE layers call it for bf16 weights.
    if self.dim() == 3 and mat2.dim() == 3 and offs is None:
        out = torch.bmm(self, mat2)
    elif self.dim() == 2 and mat2.dim() == 3 and offs is not None:
        out = _rows_grouped_mm(self, mat2, offs)
    elif self.dim() == 2 and mat2.dim() == 2 and offs is not None:
        # The contraction dim is split into groups: one [M, N] product per group.
        group = _groups(offs, self.shape[1])
        out = torch.stack([(self * (group == e)) @ mat2 for e in range(offs.shape[0])])
    else:
        return NotImplemented
    if bias is not None:
        out = out + (bias.unsqueeze(-2) if bias.dim() == 2 and out.dim() == 3 else bias)
    return out.to(out_dtype) if out_dtype is not None else out


@decomposition("transformers::grouped_mm_fallback")
def transformers_grouped_mm(input, weight, offs):
    # transformers' custom op for fp32 MoE weights under torch.compile: a Python loop over
    # offs.tolist() inside, opaque to Dynamo, and no lowering.
    return _rows_grouped_mm(input, weight, offs)


@decomposition("transformers::grouped_mm_fallback_backward")
def transformers_grouped_mm_backward(input, weight, offs, grad_output):
    group = _groups(offs, input.shape[0]).unsqueeze(1)
    grad_input = input.new_zeros(input.shape)
    grad_weight = []
    for e in range(weight.shape[0]):
        mine = group == e
        grad_input = torch.where(mine, grad_output @ weight[e].transpose(0, 1), grad_input)
        grad_weight.append((input * mine).transpose(0, 1) @ grad_output)
    return grad_input, torch.stack(grad_weight)


# --- factorizations as JAX functions ---------------------------------------------------------

@builds("cholesky")
def _cholesky_fn():
    return _cholesky_with_info


@builds("lu")
def _lu_fn():
    return _lu_with_info


@builds("lu_solve")
def _lu_solve_fn(trans):
    import jax
    return lambda lu, pivots, b: jax.scipy.linalg.lu_solve((lu, pivots - 1), b, trans=trans)


@builds("svd")
def _svd_fn(full, vectors):
    import jax.numpy as jnp
    return lambda a: jnp.linalg.svd(a, full_matrices=full, compute_uv=vectors)


@builds("qr")
def _qr_fn(mode):
    import jax.numpy as jnp
    return lambda a: jnp.linalg.qr(a, mode=mode)


@builds("lu_permutation")
def _lu_permutation_fn(rows):
    import jax
    return lambda pivots: jax.lax.linalg.lu_pivots_to_permutation(pivots - 1, rows)


@builds("geqrf")
def _geqrf_fn():
    import jax.numpy as jnp

    def geqrf(a):  # qr(mode="raw") is geqrf with the reflectors transposed
        raw, taus = jnp.linalg.qr(a, mode="raw")
        return raw.mT, taus
    return geqrf


@builds("ormqr")
def _ormqr_fn(left, transpose):
    import jax
    return lambda a, taus, c: jax.lax.linalg.ormqr(a, taus, c, left=left, transpose=transpose)


@builds("householder_product")
def _householder_product_fn():
    import jax
    return jax.lax.linalg.householder_product


@builds("matrix_exp")
def _matrix_exp_fn():
    import jax.scipy.linalg
    return jax.scipy.linalg.expm


@builds("triangular_solve")
def _triangular_solve_fn(left, lower, unit):
    import jax
    return lambda a, b: jax.lax.linalg.triangular_solve(a, b, left_side=left, lower=lower,
                                                        unit_diagonal=unit)


def _cholesky_with_info(a):
    """(lower factor, LAPACK's info) of a batch of matrices, read from their lower triangles
    (as LAPACK's potrf with "L": the upper triangle is never read).

    JAX's factor is NaN wherever the matrix is not positive definite; LAPACK's info is the
    order of the first leading minor that is not. Only then (one scalar condition: XLA runs
    one branch) is it found, as the first non-positive pivot of an unpivoted LDL^T of the
    symmetric matrix the lower triangle stands for (of the whole matrix, an upper triangle
    that differed gave info 0 beside a NaN factor, and no error).
    """
    import jax
    import jax.numpy as jnp

    lower = jax.lax.linalg.cholesky(a, symmetrize_input=False)
    a = jnp.tril(a) + jnp.swapaxes(jnp.tril(a, -1), -1, -2)
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


# --- Cholesky and triangular solves ----------------------------------------------------------

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
    # upper: eager reads the upper triangle (U^T U = A); it is the lower one of A^T. The
    # lower one was factored, and an upper-only matrix gave a diagonal factor.
    lower, info = jax_function("cholesky")(a.mT if upper else a)
    return (lower.mT if upper else lower), info


@decomposition(aten.linalg_matrix_exp.default)
def linalg_matrix_exp(a):
    # Unlowered (nn.utils.parametrizations.orthogonal's default map for square weights): JAX's
    # scaling and squaring of a Pade approximant, batched; its backward is matrix_exp of a
    # block matrix, so it lowers too.
    if not _is_real_float(a):
        return NotImplemented
    if a.numel() == 0:
        return a.clone()
    return jax_function("matrix_exp")(a)


@decomposition(aten.cholesky.default)
def cholesky(a, upper=False):
    # As eager's kernel: the factor, then its info checked ("cholesky: ... the leading minor
    # of order 2 is not positive-definite"); the info was dropped, and the factor was NaN.
    if not _is_real_float(a):
        return NotImplemented
    factor, info = aten.linalg_cholesky_ex.default(a, upper=upper)
    aten._linalg_check_errors.default(info, "cholesky", is_matrix=a.dim() == 2)
    return factor


def _broadcast_batch(a, b):
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return a.expand(*batch, *a.shape[-2:]), b.expand(*batch, *b.shape[-2:])


@decomposition(aten.linalg_solve_triangular.default)
def linalg_solve_triangular(a, b, *, upper, left=True, unitriangular=False):
    if not _is_real_float(a, b):
        return NotImplemented
    a, b = _broadcast_batch(a, b)
    return jax_function("triangular_solve", bool(left), not upper, bool(unitriangular))(a, b)


@decomposition(aten.triangular_solve.default)
def triangular_solve(b, a, upper=True, transpose=False, unitriangular=False):
    # Solves op(A) X = B, op the transpose if asked; returns (X, a copy of A), as eager.
    if not _is_real_float(a, b):
        return NotImplemented
    a_b, b_b = _broadcast_batch(a, b)
    lower = not upper
    if transpose:
        a_b, lower = a_b.mT, upper
    x = jax_function("triangular_solve", True, lower, bool(unitriangular))(a_b, b_b)
    return x, a.clone()


def _triangular(lower_factor, b, *, left: bool, lower: bool, transpose: bool = False):
    a, b = _broadcast_batch(lower_factor, b)
    if transpose:
        a, lower = a.mT, not lower
    return jax_function("triangular_solve", left, lower, False)(a, b)


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
    return jax_function("lu")(a)


def _pivot_sign(pivots, dtype):
    """(-1) ** (row swaps): pivot i (1-based) differs from i + 1 for each swap."""
    swaps = (pivots != torch.arange(1, pivots.shape[-1] + 1, dtype=torch.int32)).sum(-1)
    return 1 - 2 * (swaps % 2).to(dtype)


@decomposition(aten.linalg_lu_factor_ex.default)
def linalg_lu_factor_ex(a, *, pivot=True, check_errors=False):
    if not _is_real_float(a) or not pivot or check_errors:
        return NotImplemented
    return _lu(a)


def _det_lu(a):
    """The LU eager's det and slogdet return beside their value: of ``a.mT`` where ``a`` is
    contiguous (LAPACK wants columns; det(A^T) = det(A)), else of ``a``. Their backward
    solves with it in that convention: the LU of ``a`` gave every contiguous matrix the
    transpose of its gradient."""
    return _lu(a.mT if a.is_contiguous() else a)


@decomposition(aten._linalg_det.default)
def linalg_det(a):
    if not _is_real_float(a):
        return NotImplemented
    lu, pivots, _ = _det_lu(a)
    diagonal = torch.diagonal(lu, dim1=-2, dim2=-1)
    return diagonal.prod(-1) * _pivot_sign(pivots, a.dtype), lu, pivots


@decomposition(aten._linalg_slogdet.default)
def linalg_slogdet(a):
    if not _is_real_float(a):
        return NotImplemented
    lu, pivots, _ = _det_lu(a)
    diagonal = torch.diagonal(lu, dim1=-2, dim2=-1)
    sign = torch.sign(diagonal).prod(-1) * _pivot_sign(pivots, a.dtype)
    return sign, diagonal.abs().log().sum(-1), lu, pivots


def _lu_solve(lu, pivots, b, *, adjoint=False):
    lu, b = _broadcast_batch(lu, b)
    pivots = pivots.expand(*lu.shape[:-2], pivots.shape[-1])
    return jax_function("lu_solve", 1 if adjoint else 0)(lu, pivots.contiguous(), b)


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
    perm = jax_function("lu_permutation", rows)(pivots.contiguous())
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
    out = jax_function("svd", bool(full_matrices), bool(compute_uv))(a)
    if compute_uv:
        return out
    empty = a.new_empty((0,))
    return empty, out, empty


@decomposition(aten.linalg_qr.default)
def linalg_qr(a, mode="reduced"):
    if not _is_real_float(a) or a.numel() == 0:
        return NotImplemented
    if mode == "r":
        return a.new_empty((0,)), jax_function("qr", "r")(a)
    return jax_function("qr", mode)(a)


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
    return jax_function("geqrf")(a)


@decomposition(aten.linalg_householder_product.default)
def householder_product(reflectors, tau):
    if not _is_real_float(reflectors, tau) or reflectors.numel() == 0 or tau.numel() == 0:
        return NotImplemented
    return jax_function("householder_product")(reflectors, tau)


@decomposition(aten.ormqr.default)
def ormqr(reflectors, tau, other, left=True, transpose=False):
    if not _is_real_float(reflectors, tau, other) or reflectors.numel() == 0 \
            or tau.numel() == 0:
        return NotImplemented
    reflectors, other = _broadcast_batch(reflectors, other)
    tau = tau.expand(*reflectors.shape[:-2], tau.shape[-1])
    return jax_function("ormqr", bool(left), bool(transpose))(
        reflectors.contiguous(), tau.contiguous(), other.contiguous())


# --- distances: norms of differences ---------------------------------------------------------

@decomposition(aten._cdist_forward.default)
def cdist(x1, x2, p, compute_mode=None):
    # No torch-mlir lowering. Differences, not the |a|^2 + |b|^2 - 2ab expansion: exact at
    # p = 2 where eager's matmul form rounds, and any p works the same way.
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    if p == 0:
        return (diff != 0).sum(-1).to(x1.dtype)
    if p == float("inf"):
        return diff.abs().amax(-1)
    if p == 1:
        return diff.abs().sum(-1)
    if p == 2:
        return diff.square().sum(-1).sqrt()
    return diff.abs().pow(p).sum(-1).pow(1.0 / p)


@decomposition(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    # Unlowered: the p-norms of all row differences, then the pairs i < j in eager's order
    # (row-major over the upper triangle). O(n^2 m) memory, as the output is O(n^2).
    n = x.shape[0]
    diff = (x[:, None, :] - x[None, :, :]).abs()
    if p == 0:
        full = (diff != 0).sum(-1).to(x.dtype)
    elif p == math.inf:
        full = diff.amax(-1)
    elif p == 1:
        full = diff.sum(-1)
    else:
        full = diff.pow(p).sum(-1).pow(1.0 / p)
    rows, cols = torch.triu_indices(n, n, 1)
    return full[rows, cols]


@decomposition(aten.dist.default)
def dist(a, b, p=2):
    return torch.linalg.vector_norm(a - b, p)
