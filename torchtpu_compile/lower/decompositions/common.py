"""Helpers shared by the decomposition families: the dtypes a decomposition computes in, and
PyTorch's own decomposition of an op (where it is what we need).

Example::

    computing_dtype(torch.bfloat16)          # torch.float32, as eager's CPU kernels compute
    float_dtypes(torch.tensor([1, 2]))       # (torch.float32, torch.float32)
    in_common_dtype(torch.tensor(256), torch.zeros(2, dtype=torch.uint8))   # (0, [0, 0]) uint8
    torch_decomposition(torch.ops.aten.norm.Scalar)(x, 2)   # torch._refs.norm: vector_norm
"""
from __future__ import annotations

import threading

import torch

from .registry import torch_mlir_table

#: The ops a decomposition is calling as themselves (``as_itself``), per thread.
_calling = threading.local()


def calling_itself(op) -> bool:
    """Whether ``op``'s decomposition is running inside its own call of ``op``
    (``as_itself``): it then leaves the op to what is below it.

    Example::

        if calling_itself(aten.index.Tensor):
            return NotImplemented
    """
    return op in getattr(_calling, "ops", ())


def as_itself(op, *args, **kwargs):
    """``op`` called from its own decomposition, which this call finds ``calling_itself``: a
    decomposition that only adjusts arguments or results traces the op itself inside.

    Example::

        return aten.index.Tensor(x, wrapped) if ... else as_itself(aten.index.Tensor, x, wrapped)
    """
    before = getattr(_calling, "ops", frozenset())
    _calling.ops = before | {op}
    try:
        return op(*args, **kwargs)
    finally:
        _calling.ops = before


def has_symbolic_size(*tensors) -> bool:
    """Whether a size of ``tensors`` is symbolic. A decomposition that would turn a size's
    remainder into a pad by a dynamic amount leaves its op whole there: a padded bucket serves
    the whole op (``buckets/spatial_rules.py``), and the op is decomposed once its sizes are
    static (a bucket's trace, an exact-shape program).

    Example::

        if has_symbolic_size(grad_out, x):
            return NotImplemented
    """
    return any(isinstance(s, torch.SymInt) for t in tensors for s in t.shape)


def computing_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for the half-width floats, which eager's CPU kernels compute in; else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def as_before(op, inner, *args, **kwargs):
    """What a wrapping decomposition does with inputs it leaves alone: ``inner`` (a
    decomposition of ``op``), or, where there is none, torch-mlir's own decomposition of ``op``
    if it has one (registering ours replaced it), else ``op`` stays whole.

    Example::

        if not x.is_complex():
            return as_before(op, inner, x, *args, **kwargs)
    """
    if inner is not None:
        return inner(*args, **kwargs)
    base = torch_mlir_table().get(op)
    return base(*args, **kwargs) if base is not None else NotImplemented


def rounded_once(op, inner=None):
    """A decomposition of ``op`` that computes half-width floats in float32 and rounds the
    result once to their dtype, as eager's CPU kernels do (a step-by-step lowering in bf16
    rounds at every step: bf16 gelu(-3) was 45% off, a bf16 sum rounded at every addition).
    The dtype is the first tensor argument's, or a ``dtype=`` keyword's, which casts the
    inputs first, as eager's does. Other dtypes go to ``inner`` (see ``as_before``).

    Example::

        decomposition(aten.gelu.default)(rounded_once(aten.gelu.default))
    """
    def decompose(*args, **kwargs):
        first = next(a for a in args if isinstance(a, torch.Tensor))
        dtype = kwargs.get("dtype") or first.dtype
        if computing_dtype(dtype) == dtype or not first.is_floating_point():
            return as_before(op, inner, *args, **kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
        wide = [a.to(dtype).to(computing_dtype(dtype))
                if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        out = op(*wide, **kwargs)
        return tuple(o.to(dtype) for o in out) if isinstance(out, tuple) else out.to(dtype)
    decompose.__name__ = f"{op.__name__.replace('.', '_')}_rounded_once"
    return decompose


def float_dtypes(*tensors):
    """(computing dtype, result dtype): integers give the default float, as eager does."""
    result = torch.result_type(*tensors) if len(tensors) > 1 else tensors[0].dtype
    if not result.is_floating_point:
        result = torch.get_default_dtype()
    return computing_dtype(result), result


def in_common_dtype(a, b):
    """``a`` and ``b`` cast to their promoted dtype, as eager's kernels read them before they
    compare or combine (a 0-d int64 256 beside a uint8 tensor is read as uint8: 0), or None
    where they have that dtype already.

    Example::

        in_common_dtype(torch.tensor(256), torch.zeros(2, dtype=torch.uint8))  # (0, [0, 0])
    """
    dtype = torch.result_type(a, b)
    if a.dtype == dtype and b.dtype == dtype:
        return None
    return a.to(dtype), b.to(dtype)


def torch_decomposition(op):
    """PyTorch's own decomposition of ``op`` (torch._decomp's table)."""
    from torch._decomp import decomposition_table
    return decomposition_table[op]
