"""Casts XLA converts otherwise than eager (lower/decompositions/casts.py), on every path:
float8 to integers, saturation into float8_e4m3fn, complex to bool, and ``copy_`` between
dtypes, which the eager device runs as ``aten.copy``."""
from __future__ import annotations

import pytest
import torch

from tests.support.helpers import PATHS, run_on_path

INF, NAN = float("inf"), float("nan")
FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz]
VALUES = torch.tensor([0.0, 1.0, 2.5, -3.0, 100.0, 224.0, -0.75, float("nan")])


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("source", FLOAT8, ids=str)
def test_float8_to_integers_is_eagers(source, path, tmp_path):
    # XLA:CPU's direct conversion gave INT32_MIN for every e4m3fn element cast to int32,
    # INT64_MIN to int64, 0 to int8.
    def cast(x):
        f8 = x.to(source)
        return [f8.to(t) for t in (torch.int32, torch.int64, torch.int8, torch.uint8,
                                    torch.bool)]
    got = run_on_path(path, cast, VALUES, tmp_dir=tmp_path)
    for g, want in zip(got, cast(VALUES)):
        assert torch.equal(g, want), (g, want)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_float8_e4m3fn_saturates_as_eager(source, path, tmp_path):
    # Eager saturates past 448, infinities included; XLA gave NaN from 480. NaN stays NaN.
    x = torch.tensor([448.0, 470.0, 480.0, 1e4, INF, -INF, -500.0, 3.0, NAN]).to(source)
    got = run_on_path(path, lambda v: v.to(torch.float8_e4m3fn), x, tmp_dir=tmp_path)
    want = x.to(torch.float8_e4m3fn)
    torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("path", ["eager", "eager_fused", "compile"])
def test_copies_into_another_dtype_cast_as_eager(path, tmp_path):
    # The eager device's copy_ between dtypes lowered aten.copy as XLA's convert: 500 into a
    # float8_e4m3fn tensor was NaN, 1j into a bool tensor False (its real part).
    def copies(x, z):
        f8 = torch.zeros(x.shape, dtype=torch.float8_e4m3fn, device=x.device).copy_(x)
        truth = torch.zeros(z.shape, dtype=torch.bool, device=z.device).copy_(z)
        return f8.float(), truth
    x = torch.tensor([500.0, -INF, 1.0])
    z = torch.tensor([1j, 0j, 2 + 0j])
    got = run_on_path(path, copies, x, z, tmp_dir=tmp_path)
    for g, want in zip(got, copies(x, z)):
        assert torch.equal(g, want), (g, want)
