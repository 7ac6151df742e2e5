"""Casts (``prims.convert_element_type``, which ``.to(dtype)`` and ``_to_copy`` become, and
``copy_`` into a tensor of another dtype) that XLA converts otherwise than eager: the truth
value of complex elements, and float8.

- float8 to an integer or bool: XLA:CPU's direct conversion gave INT32_MIN for every
  e4m3fn element cast to int32 (zeros to int8), where eager gives the truncated value;
  through float32, which holds every float8 value exactly, it is eager's.
- to float8_e4m3fn: eager's conversion saturates, values past its largest (448) and
  infinities becoming +-448; XLA's rounds them to NaN. Clamped first (NaN stays NaN). The
  other float8 types are as eager (e5m2 has infinities; the fnuz types give NaN in both).

Example::

    torch.tensor([1e4, 2.5]).to(torch.float8_e4m3fn).to(torch.int32)   # [448, 2]
"""
from __future__ import annotations

import threading

import torch

from .fft_complex import truth_value
from .registry import decomposition

_FLOAT8 = frozenset({torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
                     torch.float8_e5m2fnuz})
_FNUZ = frozenset({torch.float8_e4m3fnuz, torch.float8_e5m2fnuz})


def _ours(source: torch.dtype, target: torch.dtype) -> bool:
    """Whether a cast from ``source`` to ``target`` takes a rule here."""
    return (source.is_complex and target is torch.bool) or \
        (source != target and (source in _FLOAT8 or target in _FLOAT8))


@decomposition(torch.ops.aten.copy.default)
def copy(x, src, non_blocking=False):
    # ``dst.copy_(src)`` of another dtype (the eager device's, and a compiled graph's): cast by
    # the rules here; torch-mlir converts it directly.
    if not _ours(src.dtype, x.dtype):
        return NotImplemented
    return src.to(x.dtype).expand(x.shape).clone()


@decomposition(torch.ops.prims.convert_element_type.default)
def convert_element_type(x, dtype):
    if x.is_complex() and dtype is torch.bool:
        return truth_value(x)
    if x.dtype in _FLOAT8 and not dtype.is_floating_point and not dtype.is_complex:
        wide = x.to(torch.float32)
        if x.dtype in _FNUZ and dtype is not torch.bool:
            # eager's integer of a fnuz NaN is 0 (of any other float's NaN, INT_MIN)
            wide = torch.where(wide.isnan(), 0.0, wide)
        return wide.to(dtype)
    if dtype is torch.float8_e4m3fn and x.dtype not in _FLOAT8 and x.is_floating_point() \
            and not _saturating.active:
        largest = torch.finfo(dtype).max
        _saturating.active = True  # the cast below comes back here
        try:
            return torch.ops.prims.convert_element_type.default(x.clamp(-largest, largest),
                                                                dtype)
        finally:
            _saturating.active = False
    return NotImplemented


class _Saturating(threading.local):
    active = False


_saturating = _Saturating()
