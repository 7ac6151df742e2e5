"""The tolerance policy: how far torchtpu may be from the reference, per precision mode and dtype.

A tensor passes when ``max_abs <= atol + rtol * scale``, where ``scale`` is the reference's
largest magnitude (``max |ref|``; for gradients, the largest over all gradients). Errors are
measured against the tensor as a whole, not element by element: an element near zero may carry
the rounding noise of much larger neighbours.

==========  =====================  =====================  =====================
dtype       highest                high                   medium
==========  =====================  =====================  =====================
float64     rtol 1e-7, atol 1e-12  rtol 1e-7, atol 1e-12  rtol 1e-7, atol 1e-12
float32     rtol 1e-4, atol 1e-6   rtol 1e-3, atol 1e-6   rtol 3e-2, atol 1e-5
bfloat16    rtol 5e-2, atol 1e-5   rtol 5e-2, atol 1e-5   rtol 5e-2, atol 1e-5
float16     rtol 5e-3, atol 1e-5   rtol 5e-3, atol 1e-5   rtol 5e-3, atol 1e-5
integer     exact                  exact                  exact
bool        exact                  exact                  exact
==========  =====================  =====================  =====================

The modes only change float32 matmuls and convolutions, so only float32 rows differ. docs/
precision.md explains each number.

Example::

    tol = tolerance("medium", torch.float32)      # Tolerance(rtol=0.03, atol=1e-05)
    check = compare_tensors("output", actual, expected, tol)
    check.passed
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..lower.precision import MODES


@dataclass(frozen=True)
class Tolerance:
    """Pass when ``max_abs <= atol + rtol * scale`` (``scale``: the reference's max magnitude)."""
    rtol: float
    atol: float

    def allows(self, max_abs: float, scale: float) -> bool:
        return max_abs <= self.atol + self.rtol * scale


EXACT = Tolerance(0.0, 0.0)

_FP32 = {"highest": Tolerance(1e-4, 1e-6), "high": Tolerance(1e-3, 1e-6),
         "medium": Tolerance(3e-2, 1e-5)}
_SAME_IN_EVERY_MODE = {
    torch.float64: Tolerance(1e-7, 1e-12),
    torch.bfloat16: Tolerance(5e-2, 1e-5),
    torch.float16: Tolerance(5e-3, 1e-5),
}

#: Relative-error denominators are floored at this fraction of the tensor's scale, so elements
#: near zero do not dominate ``max_rel``.
REL_FLOOR = 1e-3


def tolerance(precision: str, dtype: torch.dtype) -> Tolerance:
    """The tolerance for a tensor of ``dtype`` computed under matmul precision ``precision``.

    Example::

        tolerance("highest", torch.float32)   # Tolerance(rtol=0.0001, atol=1e-06)
    """
    if precision not in MODES:
        raise ValueError(f"precision={precision!r}: expected one of {', '.join(MODES)}")
    if dtype in (torch.float32, torch.complex64):
        return _FP32[precision]
    if dtype is torch.complex128:
        return _SAME_IN_EVERY_MODE[torch.float64]
    if dtype in _SAME_IN_EVERY_MODE:
        return _SAME_IN_EVERY_MODE[dtype]
    if dtype.is_floating_point:  # float8 and other narrow types: a few units in the last place
        eps = torch.finfo(dtype).eps
        return Tolerance(4 * eps, eps * eps)
    return EXACT


@dataclass
class TensorCheck:
    """One compared tensor: its errors, the tolerance applied, and the verdict.

    ``max_rel`` is ``max |a - r| / max(|r|, REL_FLOOR * scale)``; ``rel_max_abs`` is
    ``max_abs / scale``, the number the tolerance's ``rtol`` bounds.
    """
    name: str
    shape: tuple
    dtype: str
    max_abs: float
    max_rel: float
    mean_abs: float
    rel_max_abs: float
    scale: float
    rtol: float
    atol: float
    passed: bool
    note: str = ""

    def summary(self) -> str:
        verdict = "ok  " if self.passed else "FAIL"
        line = (f"{verdict} {self.name} {self.dtype}{list(self.shape)}: max_abs {self.max_abs:.3g}"
                f" (limit {self.atol + self.rtol * self.scale:.3g}), max_abs/scale "
                f"{self.rel_max_abs:.3g}, max_rel {self.max_rel:.3g}, mean_abs {self.mean_abs:.3g}")
        return f"{line}; {self.note}" if self.note else line


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _failed(name: str, actual, expected, note: str) -> TensorCheck:
    shape = tuple(expected.shape) if isinstance(expected, torch.Tensor) else ()
    dtype = _dtype_name(expected.dtype) if isinstance(expected, torch.Tensor) else "?"
    inf = float("inf")
    return TensorCheck(name, shape, dtype, inf, inf, inf, inf, 0.0, 0.0, 0.0, False, note)


def compare_tensors(name: str, actual: torch.Tensor, expected: torch.Tensor, tol: Tolerance,
                    scale: float | None = None) -> TensorCheck:
    """Errors of ``actual`` against ``expected`` and whether they are within ``tol``.

    ``scale`` defaults to ``max |expected|``. NaN matches NaN and an infinity the same infinity;
    any other non-finite difference fails.

    Example::

        compare_tensors("y", torch.ones(3) * 1.001, torch.ones(3), Tolerance(1e-2, 0)).passed
    """
    if actual is None:
        return _failed(name, actual, expected, "missing on the torchtpu side")
    if not isinstance(actual, torch.Tensor):
        return _failed(name, actual, expected, f"torchtpu returned {type(actual).__name__}")
    if tuple(actual.shape) != tuple(expected.shape):
        return _failed(name, actual, expected,
                       f"shape {list(actual.shape)} instead of {list(expected.shape)}")
    if actual.dtype != expected.dtype:
        return _failed(name, actual, expected,
                       f"dtype {_dtype_name(actual.dtype)} instead of "
                       f"{_dtype_name(expected.dtype)}")
    a = actual.detach().cpu()
    r = expected.detach().cpu()
    if a.is_complex():
        a, r = torch.view_as_real(a), torch.view_as_real(r)
    a, r = a.double(), r.double()
    same = (a == r) | (a.isnan() & r.isnan())
    diff = torch.where(same, torch.zeros_like(a), (a - r).abs().nan_to_num(nan=float("inf")))
    magnitude = torch.where(r.isfinite(), r.abs(), torch.zeros_like(r))
    if scale is None:
        scale = magnitude.max().item() if r.numel() else 0.0
    if r.numel() == 0:
        max_abs = max_rel = mean_abs = 0.0
    else:
        max_abs = diff.max().item()
        mean_abs = diff.mean().item()
        floor = max(REL_FLOOR * scale, torch.finfo(torch.float64).tiny)
        max_rel = (diff / magnitude.clamp(min=floor)).max().item()
    rel_max_abs = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    passed = tol.allows(max_abs, scale)
    if tol == EXACT:  # integers beyond 2**53 are not exact in float64
        passed = torch.equal(actual.detach().cpu(), expected.detach().cpu())
    return TensorCheck(name, tuple(r.shape), _dtype_name(expected.dtype), max_abs, max_rel,
                       mean_abs, rel_max_abs, scale, tol.rtol, tol.atol, passed)
