"""Arithmetic on complex64 tensors (torchtpu_compile/lower/decompositions/complex_arithmetic.py)
against eager CPU PyTorch, in strict mode: torch-mlir lowers none of it, so each op ran on the
host (eager device) or cut the compiled graph, with a warning; strict mode raised."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import INF, NAN, check_on_both_paths, randn
from tests.support.helpers import compile_tpu, eager_mode
from torchtpu_compile import config

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def crandn(*shape, seed=0):
    return torch.complex(randn(*shape, seed=seed), randn(*shape, seed=seed + 100))


# --- the rotary embedding of Meta's Llama reference model (also torchtitan, Mistral's) -------

def _freqs_cis(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def _apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def test_rotary_embedding_of_llama_reference_runs_through_xla():
    xq, xk = randn(2, 8, 4, 16), randn(2, 8, 4, 16, seed=1)
    check_on_both_paths(_apply_rotary_emb, xq, xk, _freqs_cis(16, 8), rtol=1e-6, atol=1e-6)


def test_rotary_embedding_of_llama_reference_defers_and_fuses():
    xq, xk = randn(2, 8, 4, 16), randn(2, 8, 4, 16, seed=1)
    with eager_mode("defer_and_fuse"), config.patch(strict=True):
        freqs = _freqs_cis(16, 8).to("tpu")   # polar on the device too
        actual = _apply_rotary_emb(xq.to("tpu"), xk.to("tpu"), freqs)
        actual = [t.cpu() for t in actual]
    torch.testing.assert_close(actual, _apply_rotary_emb(xq, xk, _freqs_cis(16, 8)),
                               rtol=1e-6, atol=1e-6)


def test_rotary_embedding_trains_compiled():
    # Its backward multiplies by the conjugate and goes back through view_as_complex/real.
    xq, xk, w = randn(2, 8, 4, 16), randn(2, 8, 4, 16, seed=1), randn(16, 16, seed=2)
    freqs = _freqs_cis(16, 8)

    def loss(xq, xk, w):
        q, k = _apply_rotary_emb(xq @ w, xk @ w, freqs)
        return (q * k).sum()

    def grads(fn):
        inputs = [t.clone().requires_grad_() for t in (xq, xk, w)]
        fn(*inputs).backward()
        return [t.grad for t in inputs]

    with config.patch(strict=True, matmul_precision="highest"):
        actual = grads(compile_tpu(loss))
    torch.testing.assert_close(actual, grads(loss), rtol=1e-4, atol=5e-5)


# --- breadth ---------------------------------------------------------------------------------

def test_complex_sums_and_products_with_real_operands_python_scalars_and_alpha():
    z, w, x = crandn(3, 4), crandn(3, 4, seed=1), randn(4, seed=2)
    check_on_both_paths(lambda z, w, x: (
        z + w, torch.add(z, w, alpha=2 - 1j), z - x, torch.sub(x, z, alpha=0.5), 1j - z,
        torch.rsub(z, w, alpha=3), z * w, z * x, x * (1 + 2j), z * 2, z * w[0, 0]),
        z, w, x, rtol=1e-5, atol=1e-6)


def test_complex_quotients_with_real_operands_and_python_scalars():
    z, w, x = crandn(3, 4), crandn(3, 4, seed=1), randn(4, seed=2)
    check_on_both_paths(lambda z, w, x: (
        z / w, x / z, z / (2 - 1j), torch.div(z, w, rounding_mode=None), -z, 1 / z,
        torch.addcmul(z, w, x, value=0.5j), torch.addcdiv(x, z, w, value=2)), z, w, x,
        rtol=1e-5, atol=1e-6)


def test_complex_powers():
    z, w = crandn(3, 4), crandn(3, 4, seed=1)
    check_on_both_paths(lambda z, w: (
        z ** 2, z ** 0.5, torch.pow(z, w), 2 ** z, z.reciprocal(), z.sqrt(), z.rsqrt()), z, w,
        rtol=1e-4, atol=1e-5)


def test_complex_functions():
    z = crandn(3, 4)
    check_on_both_paths(lambda z: (
        z.exp(), z.log(), z.sin(), z.cos(), z.tanh(), z.sigmoid(), z.sgn()), z,
        rtol=1e-4, atol=1e-5)


def test_complex_sums_means_and_products():
    z = crandn(3, 4, 5)
    check_on_both_paths(lambda z: (
        z.sum(), z.sum(1), z.sum((0, 2), keepdim=True), z.mean(), z.mean(-1), z[0].prod(),
        z.prod(2, keepdim=True), z[0, 0, 0].sum()), z, rtol=1e-5, atol=1e-5)


def test_complex_matrix_products():
    a, b, v = crandn(2, 3, 4), crandn(2, 4, 5, seed=1), crandn(4, seed=2)
    x = crandn(3, 5, seed=3)
    check_on_both_paths(lambda a, b, v, x: (
        a[0] @ b[0], torch.bmm(a, b), a @ b, a[0] @ v, v @ v, torch.dot(v, v), torch.vdot(v, v),
        torch.addmm(x, a[0], b[0], beta=0.5j, alpha=2 + 1j),
        torch.baddbmm(a[:, :, :1], a, b, beta=0), torch.addbmm(x, a, b, alpha=1j),
        torch.addmv(v[:3], a[0], v, beta=2)), a, b, v, x, rtol=1e-5, atol=1e-5)


_SPECIAL = [0j, 1j, complex(0, float("inf")), complex(float("inf"), 0), complex(0, float("nan")),
            complex(float("nan"), 1), complex(float("inf"), float("inf")), complex(-3, 0.5),
            complex(1e30, -1e-30)]


def test_complex_sums_and_products_of_infinities_and_nans():
    # Eager adds b times alpha, a complex product even for alpha 1: (0+infj) + (3.5+nanj) is
    # nan+nanj there; XLA folds the product by the constant 1+0j away (so z * 1 is z).
    z = torch.tensor(_SPECIAL, dtype=torch.complex64)
    a, b = z.repeat_interleave(len(_SPECIAL)), z.repeat(len(_SPECIAL))
    check_on_both_paths(lambda a, b: (
        a + b, a - b, torch.rsub(a, b), torch.add(a, b, alpha=2), a * b, a * 1, a + 1,
        torch.addcmul(a, a, b)), a, b, rtol=1e-6, atol=1e-30)


def test_complex_functions_at_infinities_and_nans_as_eager():
    # Eager's are C99's (std::exp, ...; reciprocal is c10::complex's 1 / z): XLA's formulas gave
    # NaNs where a part is infinite or NaN (exp(inf+infj) is inf+nanj in eager, 1 / 0j inf+nanj).
    parts = [0.0, 1.0, -2.5, 1e-30, float("inf"), -float("inf"), float("nan")]
    z = torch.tensor([complex(a, b) for a in parts for b in parts], dtype=torch.complex64)
    check_on_both_paths(lambda z: (
        z.exp(), z.log(), z.sqrt(), z.tanh(), z.reciprocal(), z.rsqrt(), z.sigmoid()), z,
        rtol=1e-6, atol=1e-30)


# --- eager's values at infinities, NaNs and cancelling parts ---------------------------------
# Eager's complex kernels run a vectorized body and a scalar remainder, which its compiler fuses
# into FMAs (docs/reliability.md): the grids below have a multiple of 16 elements, so that each
# element takes eager's vectorized path.

_PARTS = [0.0, -0.0, 1.0, INF, -INF, NAN, 1e30]
_GRID = [complex(a, b) for a in _PARTS for b in _PARTS]


def _padded(values):
    return torch.tensor(values + values[:-len(values) % 16], dtype=torch.complex64)


def test_complex_sinc_and_lerp_run_through_xla():
    z, w = crandn(4, 8), crandn(4, 8, seed=1)
    special = _padded(_GRID)
    check_on_both_paths(lambda z, w: (
        torch.sinc(z), torch.lerp(z, w, 0.3), torch.lerp(z, w, 0.8 - 0.1j),
        torch.lerp(z, w, w * 0.4)), z, w, rtol=1e-5, atol=1e-6)
    check_on_both_paths(lambda s: (torch.sinc(s), torch.lerp(s, s.flip(0), 0.25),
                                   torch.lerp(s.flip(0), s, 0.75 + 0j)), special,
                        rtol=1e-6, atol=1e-30)


def test_complex_atanh_and_exp2_at_infinities_as_eager():
    # C99's catanh is conj-symmetric (atanh(inf-0j) is -pi/2 j, jax.numpy's +pi/2 j); eager's
    # exp2 is exp(ln 2 * z) (2 ** (inf+0j) is inf+0j, jax.numpy's nan+nanj)
    check_on_both_paths(lambda z: (z.atanh(), z.exp2()), _padded(_GRID), rtol=1e-5, atol=1e-30)


def test_complex_powers_by_numbers_at_infinities_as_eager():
    # eager's kernel: z * z for 2, sqrt for 0.5, ones for 0, else glibc's cpowf
    check_on_both_paths(lambda z: (
        z ** 2, z ** -2, z ** 0.5, z ** 2.5, z ** 1j, z ** 0, 2 ** z, (-1.5) ** z, 1 ** z),
        _padded(_GRID), rtol=1e-5, atol=1e-30)


def test_complex_powers_at_infinities_as_eager():
    # glibc's cpowf is exp(w * log(z)) with C's product (0j ** (1+1j) is 0j, jax.numpy's NaN;
    # 0j ** 0j is NaN, jax.numpy's 1)
    base, exponent = _padded([a for a in _GRID for _ in _GRID]), _padded(_GRID * len(_GRID))
    check_on_both_paths(torch.pow, base, exponent, rtol=1e-5, atol=1e-30)


def test_complex_quotients_at_infinities_as_eager():
    # c10::complex's quotient (Smith's): 0j / (inf+infj) is nan+nanj (inf / inf in the ratio),
    # where XLA's gives 0j
    a, b = _padded([a for a in _GRID for _ in _GRID]), _padded(_GRID * len(_GRID))
    check_on_both_paths(torch.div, a, b, rtol=1e-6, atol=1e-30)
    zero, infinite = torch.zeros(16, dtype=torch.complex64), torch.full(
        (16,), complex(INF, INF), dtype=torch.complex64)
    check_on_both_paths(torch.div, zero, infinite)


def test_complex_product_of_cancelling_parts_is_eager_bit_for_bit():
    # z * conj(z): eager rounds a*(-b) and b*a alike, so the imaginary part is exactly 0; XLA's
    # CPU compiler fused one product into the sum (an FMA), leaving its rounding error.
    z = crandn(64)
    check_on_both_paths(torch.mul, z, z.conj().resolve_conj())


@pytest.mark.parametrize("fn", [
    lambda x: (torch.polar(x, x) * torch.polar(x, x).conj()).real.sum(),
    lambda x: torch.polar(x, x).conj().imag.sum(),
    lambda x: torch.view_as_complex(torch.stack([x, x * 2], -1)).conj().abs().sum(),
], ids=["product_with_conj", "conj_imag", "view_as_complex_conj"])
def test_complex128_runs_and_differentiates_as_eager(fn):
    # complex128 runs on the host (torch-mlir lowers it only op by op): conj, _neg_view and
    # view_as_complex passed their probes alone, and the graph failed to compile.
    x = torch.linspace(0.5, 2.0, 4, dtype=torch.float64, requires_grad=True)
    got = compile_tpu(fn)(x)
    (grad,) = torch.autograd.grad(got, x)
    expected = fn(x)
    (expected_grad,) = torch.autograd.grad(expected, x)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(grad, expected_grad)
