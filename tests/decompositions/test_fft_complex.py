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
