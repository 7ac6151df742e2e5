"""``nonzero`` on the device, with one sync for its length, as CUDA runs it.

The indices of every element, nonzero ones first in order, come from one static program per
input shape (a stable sort of the zero flags); the count of nonzeros is read back once, and
the result is the first ``count`` rows of that table: a view, so no program per count.
``torch.where(cond)``, ``argwhere`` and ``nonzero(as_tuple=True)`` reach the device through it
(Hugging Face's prompt lookup decoding calls it every step). It ran on a host copy before, a
counted fallback and an error under ``TORCHTPU_STRICT=1``.

Example::

    torch.tensor([[0.0, 1.5], [2.0, 0.0]], device="tpu").nonzero()
    # tensor([[0, 1], [1, 0]], device='tpu:0'), no host fallback
"""
from __future__ import annotations

import torch

from .dispatch import handles, run_data_dependent
from .tensor import TpuTensor

aten = torch.ops.aten


@handles(aten.nonzero.default)
def nonzero(func, args, kwargs):
    x = args[0]
    if kwargs or type(x) is not TpuTensor or x.is_complex():
        return run_data_dependent(func, args, kwargs)
    if x.dim() == 0 or x.numel() == 0:  # no index table to build: count rows of dim() columns
        count = int(aten.ne.Scalar(x, 0).item()) if x.numel() else 0
        return aten.empty.memory_format([count, x.dim()], dtype=torch.int64, device=x.device)
    zero = aten.clone.default(aten.eq.Scalar(x, 0), memory_format=torch.contiguous_format)
    flat = aten.view.default(zero, [-1])
    count = x.numel() - int(aten.sum.default(flat).item())  # the sync CUDA's nonzero has too
    # Stable: the nonzero elements (flag 0) first, each group in element order.
    order = aten.sort.stable(aten._to_copy.default(flat, dtype=torch.uint8), stable=True)[1]
    coords, step = [], 1
    for size in reversed(x.shape):
        coords.append(aten.remainder.Scalar(aten.floor_divide.Scalar(order, step), size))
        step *= size
    table = aten.stack.default(coords[::-1], 1)
    return aten.slice.Tensor(table, 0, 0, count)
