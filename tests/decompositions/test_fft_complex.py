"""The FFT and complex decompositions (torchtpu_compile/lower/decompositions/fft_complex.py)
against eager CPU PyTorch, in strict mode: the op must run through XLA, not fall back, and give
eager's numbers."""
from __future__ import annotations

import pytest
import torch

from tests.support.decomposition_checks import check_on_both_paths, randn

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def test_fft_family_through_jax():
    # torch-mlir lowers no FFT and no complex arithmetic; JAX's stablehlo.fft is spliced in.
    x, z = randn(4, 6), torch.complex(randn(4, 6, seed=1), randn(4, 6, seed=2))
    fft = torch.fft
    check_on_both_paths(lambda x, z: (
        fft.fft(x), fft.rfft(x, norm="ortho"), fft.ifft(z, norm="forward"), fft.irfft(z, n=9),
        fft.fft2(z), fft.rfftn(x), fft.hfft(z), fft.ifftn(z, dim=(0,)), torch.view_as_real(z),
        torch.view_as_complex(torch.stack([x, x.flip(0)], -1)), torch.complex(x, x[:1]),
        torch.polar(x.abs(), x[:1]),
        torch.stft(x.flatten(), 4, window=torch.ones(4, device=x.device),
                   return_complex=True)), x, z,
        rtol=1e-4, atol=1e-4)


def test_moduli_of_complex_tensors():
    # torch-mlir converted each complex element to its real part before abs and vector_norm:
    # |re| for the modulus, wrong norms, no error.
    z = torch.complex(randn(3, 5, seed=3), randn(3, 5, seed=4))
    check_on_both_paths(lambda z: (
        z.abs(), torch.linalg.vector_norm(z, dim=1), torch.linalg.norm(z), z.norm(),
        torch.nn.functional.l1_loss(z.abs(), z.real)), z, rtol=1e-5, atol=1e-5)
    check_on_both_paths(lambda z: (
        torch.linalg.vector_norm(z, ord=1),
        torch.linalg.vector_norm(z, ord=float("inf"), dim=0, keepdim=True)), z,
        rtol=1e-5, atol=1e-5)


_SPECIAL = [0j, 1j, -2j, complex(0, float("nan")), complex(float("nan"), 0),
            complex(0, float("inf")), complex(float("inf"), 0), complex(1, 1), complex(-3, 0.5),
            complex(0.0, -0.0), complex(2, -1), complex(-float("inf"), float("inf"))]


def test_truth_values_of_complex_elements():
    # torch-mlir converted each complex element to its real part before the cast to bool and
    # the logical ops: 1j was False (z.bool(), logical_not(1j) True), no error.
    z = torch.tensor(_SPECIAL, dtype=torch.complex64)
    w = torch.tensor(_SPECIAL[::-1], dtype=torch.complex64)
    check_on_both_paths(lambda z, w, x: (
        z.bool(), torch.logical_not(z), torch.logical_and(z, w), torch.logical_or(z, w),
        torch.logical_xor(z, w), torch.logical_and(z, x), torch.logical_xor(x, z)),
        z, w, randn(12).round())


def test_base_10_and_base_2_logarithms_of_complex_zero_and_infinity():
    # torch-mlir divided the complex log by log(base) as a complex number: log10(0) was
    # -inf+nanj (eager: -inf+0j), log10(inf) and log10(1j * inf) had NaN imaginary parts.
    z = torch.tensor(_SPECIAL, dtype=torch.complex64)
    check_on_both_paths(lambda z: (torch.log10(z), torch.log2(z)), z, rtol=1e-5, atol=1e-6)


def test_nan_to_num_of_complex_tensors():
    # torch-mlir's nan_to_num (PyTorch's reference) raised for a complex input: compiling it
    # failed ("Complex dtype is not supported for isneginf"); eager replaces in each part.
    z = torch.tensor(_SPECIAL, dtype=torch.complex64)
    check_on_both_paths(lambda z: (torch.nan_to_num(z), torch.nan_to_num(z, 1.0, 2.0, -3.0),
                                   torch.nan_to_num(z.real)), z)


def test_complex_operand_to_real_result_stays_out_of_xla_unless_known_right():
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchtpu_compile.lower.support import rule_violation
    aten = torch.ops.aten
    z = torch.complex(randn(4), randn(4, seed=1))
    real = torch.float32
    graph = make_fx(lambda z: (aten.abs.default(z), aten.angle.default(z),
                               aten._to_copy.default(z, dtype=real),
                               aten.abs.default(aten._to_copy.default(z, dtype=real)),
                               aten.logical_not.default(z), aten.ne.Scalar(z, 0),
                               aten._to_copy.default(z, dtype=torch.bool)))(z).graph
    reasons = {n.target: rule_violation(n) for n in graph.nodes if n.op == "call_function"}
    abs_nodes = [n for n in graph.nodes if n.target is aten.abs.default]
    assert "imaginary part" in rule_violation(abs_nodes[0])
    assert rule_violation(abs_nodes[1]) is None            # abs of a real tensor
    assert "imaginary part" in reasons[aten.angle.default]
    casts = [n for n in graph.nodes if n.target is aten._to_copy.default]
    assert rule_violation(casts[0]) is None                # to float: the real part, as eager
    # A bool result too: eager's truth value of a complex element takes both parts.
    assert "imaginary part" in rule_violation(casts[2])
    assert "imaginary part" in reasons[aten.logical_not.default]
    assert "imaginary part" in reasons[aten.ne.Scalar]


def test_complex_constants_are_made_on_the_host():
    # torch-mlir cannot legalize a complex literal: a complex graph holding zeros or ones
    # (block_diag's, circular padding's) failed to lower as a whole, with an error.
    a = torch.complex(randn(2, 2, seed=5), randn(2, 2, seed=6))
    b = torch.complex(randn(1, 3, seed=7), randn(1, 3, seed=8))
    check_on_both_paths(lambda a, b: (
        torch.block_diag(a, b), torch.nn.functional.pad(a.unsqueeze(0), (1, 1), mode="circular"),
        torch.cat([b, torch.ones(1, 3, dtype=b.dtype, device=b.device)])), a, b)
