"""The linear-algebra decompositions (torchtpu_compile/lower/decompositions/linalg.py) against
eager CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give eager's
numbers (singular and not positive-definite inputs, LAPACK's info)."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import INF, NAN, check, check_on_both_paths, randn
from tests.support.helpers import compile_tpu, eager_mode
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


# --- matrix products -------------------------------------------------------------------------

def test_addmv_scales_and_ignores_self_when_beta_is_zero():
    mat, vec = randn(5, 6), randn(6)
    check(lambda s, m, v: torch.addmv(s, m, v, beta=0.5, alpha=2.0), randn(5), mat, vec)
    check(lambda s, m, v: torch.addmv(s, m, v, beta=0), torch.full((5,), NAN), mat, vec)
    # Integer tensors: eager truncates the scalars (beta 1.7 is 1, alpha 0.6 is 0) and keeps
    # the dtype; the decomposition returned float32.
    ints = [torch.arange(n).reshape(shape) - 3 for n, shape in ((5, (5,)), (30, (5, 6)),
                                                               (6, (6,)))]
    check(lambda s, m, v: torch.addmv(s, m, v, beta=1.7, alpha=0.6), *ints)
    check(lambda s, m, v: torch.addmv(s, m, v, beta=0.2, alpha=2.5), *ints)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_width_addbmm_runs_through_xla(dtype):
    # torch-mlir's lowering failed for half widths: every addbmm under autocast ran on the host
    x, a, b = randn(4, 6).to(dtype), randn(3, 4, 5).to(dtype), randn(3, 5, 6).to(dtype)
    tol = 2e-2 if dtype == torch.bfloat16 else 2e-3
    check_on_both_paths(lambda x, a, b: (torch.addbmm(x, a, b),
                                         torch.addbmm(x, a, b, beta=0.5, alpha=2)),
                        x, a, b, rtol=tol, atol=tol)


def test_grouped_mm_decomposition_matches_a_loop_over_groups():
    from torchtpu_compile.lower.decompositions.linalg import grouped_mm
    a, w = randn(10, 4), randn(3, 4, 5)
    offs = torch.tensor([3, 3, 8], dtype=torch.int32)
    expected = torch.zeros(10, 5)
    start = 0
    for e, end in enumerate(offs.tolist()):
        expected[start:end] = a[start:end] @ w[e]
        start = end
    torch.testing.assert_close(grouped_mm(a, w, offs), expected)
    batched = randn(3, 2, 4)
    torch.testing.assert_close(grouped_mm(batched, w), torch.bmm(batched, w))


def test_transformers_grouped_mm_fallback_forward_and_backward():
    pytest.importorskip("transformers")
    import transformers.integrations.moe  # noqa: F401  (registers the custom ops)
    grouped = torch.ops.transformers.grouped_mm_fallback
    offs = torch.tensor([2, 2, 7], dtype=torch.int32)
    w = randn(3, 4, 5).requires_grad_()

    def loss(a, w):
        return (grouped(a, w, offs) * torch.arange(5.0)).sum()

    a = randn(8, 4).requires_grad_()
    expected = torch.autograd.grad(loss(a, w), (a, w))
    with config.patch(strict=True, matmul_precision="highest"):
        compiled = compile_tpu(loss)
        actual = torch.autograd.grad(compiled(a, w), (a, w))
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


# --- factorizations and solves, through JAX --------------------------------------------------

def test_cholesky_and_triangular_solves_through_jax():
    m = randn(3, 4, 4)
    a = m @ m.mT + 4 * torch.eye(4)
    b = randn(3, 4, 2, seed=1)
    not_definite = torch.diag(torch.tensor([1.0, 2, -1, 1])).expand(3, 4, 4).clone()
    not_definite[1] = torch.eye(4)
    not_definite[2, :2, :2] = torch.tensor([[4.0, 2], [2, 1]])

    def factor_and_solve(a, b, not_definite):
        lower, info = torch.linalg.cholesky_ex(a)
        return (lower, info, torch.linalg.cholesky_ex(a, upper=True)[0], torch.cholesky(a),
                torch.linalg.cholesky_ex(not_definite)[1],   # LAPACK's info: 3, 0, 2
                torch.linalg.solve_triangular(lower, b, upper=False),
                torch.linalg.solve_triangular(lower.mT, b, upper=True, unitriangular=True),
                torch.linalg.solve_triangular(lower, b.mT, upper=False, left=False),
                torch.triangular_solve(b, lower, upper=False, transpose=True),
                torch.cholesky_solve(b, lower), torch.cholesky_solve(b, lower.mT, upper=True),
                torch.cholesky_inverse(lower), torch.linalg.cholesky_ex(a[:0]))
    check_on_both_paths(factor_and_solve, a, b, not_definite, rtol=1e-4, atol=1e-5)


def matrix_exps(a):
    return torch.linalg.matrix_exp(a), torch.matrix_exp(a[:, :, :0, :0])


#: Batched, norms from small to large (several squarings).
MATRIX_EXP_INPUT = randn(3, 2, 5, 5) * torch.tensor([0.1, 1.0, 3.0]).view(3, 1, 1, 1)


def test_the_inverse_of_one_matrix_returned_twice_trains():
    # CSE merged the two linalg.inv calls; the region before the host error check returned
    # the solve's [0] twice, and torch-mlir could not unpack its result list twice
    # ("failed to legalize operation 'torch.prim.ListUnpack'")
    m = randn(2, 3, 3) + 2 * torch.eye(3)
    grads = []
    for fn in (lambda m: (torch.linalg.inv(m), torch.linalg.inv(m)),
               compile_tpu(lambda m: (torch.linalg.inv(m), torch.linalg.inv(m)))):
        leaf = m.clone().requires_grad_()
        with config.patch(matmul_precision="highest"):
            a, b = fn(leaf)
            (a.sum() + 2 * b.sum()).backward()
        grads.append((a.detach(), b.detach(), leaf.grad))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_matrix_exp_through_jax():
    # Unlowered: nn.utils.parametrizations.orthogonal (square weights) ran matrix_exp on the
    # host every forward. The eager device and the parametrization's gradient:
    # tests/slow/test_decompositions_full.py.
    check(matrix_exps, MATRIX_EXP_INPUT, rtol=2e-5, atol=1e-5)


def test_householder_qr_pieces_through_jax():
    a, c, c2 = randn(3, 5, 4), randn(3, 5, 2, seed=1), randn(3, 2, 5, seed=2)
    check_on_both_paths(lambda a, c, c2: (
        torch.geqrf(a), torch.linalg.householder_product(*torch.geqrf(a)),
        torch.ormqr(*torch.geqrf(a), c), torch.ormqr(*torch.geqrf(a), c, transpose=True),
        torch.ormqr(*torch.geqrf(a), c2, left=False)), a, c, c2, rtol=1e-4, atol=1e-4)


def test_linalg_error_checks_read_info_on_the_host_as_eager():
    # torch.linalg.cholesky = cholesky_ex + a check of info that raises: the check is a host
    # step by design (strict mode allows it), not a fallback, and names eager's minor.
    m = randn(2, 4, 4)
    a = m @ m.mT + 4 * torch.eye(4)
    with config.patch(strict=True, matmul_precision="highest"):
        compiled = compile_tpu(lambda a: torch.linalg.cholesky(a) * 2)
        torch.testing.assert_close(compiled(a), torch.linalg.cholesky(a) * 2)
        with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 3"):
            compiled(torch.diag(torch.tensor([1.0, 2, -1, 1])).expand(2, 4, 4))



@pytest.mark.parametrize("mode", ["strict", "defer_and_fuse"])
def test_linalg_error_checks_raise_on_the_device_as_eager(mode):
    # On the tpu device the check (which returns nothing) was traced into an empty graph and
    # dropped: cholesky of a matrix that is not positive definite returned NaN (a
    # MultivariateNormal's covariance_matrix took it); defer-and-fuse recorded it and raised a
    # LoweringError for every cholesky. torch._assert_async was dropped too.
    m = randn(2, 4, 4)
    a = m @ m.mT + 4 * torch.eye(4)
    bad = torch.diag(torch.tensor([1.0, 2, -1, 1])).expand(2, 4, 4)
    with eager_mode(mode), config.patch(strict=True, matmul_precision="highest"):
        torch.testing.assert_close(torch.linalg.cholesky(a.to("tpu")).cpu(),
                                   torch.linalg.cholesky(a))
        with pytest.raises(torch.linalg.LinAlgError, match="leading minor of order 3"):
            torch.linalg.cholesky(bad.to("tpu")).cpu()
        with pytest.raises(torch.linalg.LinAlgError, match="singular"):
            torch.linalg.inv(torch.zeros(3, 3, device="tpu")).cpu()
        with pytest.raises(RuntimeError, match="a message"):
            torch._assert_async(torch.zeros((), device="tpu") > 1, "a message")
            torch.tpu.synchronize()

def test_lu_determinants_inverse_and_solves_through_jax():
    # getrf's LU, 1-based pivots and info (the first zero pivot of a singular matrix).
    a, b, v = randn(3, 4, 4), randn(3, 4, 2, seed=1), randn(3, 4, seed=2)
    singular = a.clone()
    singular[1, 2] = singular[1, 0] * 2
    singular[2] = 0
    linalg = torch.linalg
    check_on_both_paths(lambda a, b, v, singular: (
        linalg.lu_factor_ex(a), linalg.lu_factor_ex(singular)[2], linalg.det(a),
        linalg.slogdet(a), linalg.inv_ex(a), linalg.solve_ex(a, v),
        linalg.solve_ex(a, b.mT[..., :4], left=False),
        linalg.lu_solve(*linalg.lu_factor_ex(a)[:2], b, adjoint=True), linalg.inv_ex(a[:0]),
        linalg.solve_ex(a[:0], b[:0])), a, b, v, singular,
        rtol=1e-4, atol=1e-4)


def _det_gradients(a):
    a = a.detach().requires_grad_()
    sign, logabsdet = torch.linalg.slogdet(a)
    det = torch.linalg.det(a)
    weights = torch.arange(1.0, det.numel() + 1, device=a.device).reshape(det.shape)
    grads = torch.autograd.grad(((det + sign * logabsdet) * weights).sum(), a)
    return det.detach(), logabsdet.detach(), grads[0], torch._linalg_det(a.detach())[1]


@pytest.mark.parametrize("path", ["compile", "strict", "defer_and_fuse"])
def test_determinant_gradients_of_any_layout_match_eager(path):
    # det and slogdet return an LU that their backward solves with: eager's is of A.mT where
    # A is contiguous. Ours was of A, so every contiguous matrix got its gradient transposed
    # (and, on the tpu device, whose programs see values dense, every transposed one too).
    square = randn(3, 3)
    inputs = [square, square.t(), randn(2, 4, 4, seed=1), randn(2, 4, 4, seed=2).mT]
    for a in inputs:
        want = _det_gradients(a)
        if path == "compile":
            got = compile_tpu(_det_gradients)(a)
        else:
            with eager_mode(path), config.patch(strict=True, matmul_precision="highest"):
                got = [t.cpu() for t in _det_gradients(a.to("tpu"))]
        torch.testing.assert_close(got, list(want), rtol=1e-4, atol=1e-4)


def test_svd_qr_and_lu_unpacking_through_jax():
    a = randn(3, 5, 4)
    linalg = torch.linalg
    check_on_both_paths(lambda a: (
        linalg.svd(a), linalg.svd(a, full_matrices=False), linalg.svdvals(a), linalg.qr(a),
        linalg.qr(a, mode="complete"), linalg.qr(a, mode="r")[1], linalg.lu(a), linalg.lu(a.mT),
        torch.lu_unpack(*linalg.lu_factor_ex(a[:, :4])[:2]), linalg.pinv(a),
        linalg.pinv(a, atol=0.5)), a, rtol=1e-4, atol=1e-4)


# --- distances -------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [0.0, 1.0, 1.5, 2.0, INF])
def test_cdist(p):
    check(lambda a, b: torch.cdist(a, b, p=p), randn(2, 5, 3), randn(2, 4, 3, seed=1))
