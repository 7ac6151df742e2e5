"""Decompositions applied while aot_autograd traces: torch-mlir's table plus our own.

Ours are registered one per op with ``@decomposition(op)`` and win over torch-mlir's.
"""
from __future__ import annotations

import functools

import torch

aten = torch.ops.aten
_OURS: dict = {}


def decomposition(*ops):
    """Register the decorated function as the decomposition of each op in ``ops``.

    Example::

        @decomposition(aten.silu.default)
        def silu(x):
            return x * torch.sigmoid(x)
    """
    def register(fn):
        for op in ops:
            _OURS[op] = fn
        return fn
    return register


@functools.lru_cache(maxsize=None)
def _base_table() -> dict:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    return dict(get_decomposition_table())


def decomposition_table() -> dict:
    """The table given to aot_autograd."""
    table = dict(_base_table())
    table.update(_OURS)
    return table


@decomposition(aten.native_dropout.default)
def native_dropout(input, p, train):
    # torch-mlir's table keeps native_dropout, a random op fed by a graph value. Written with
    # rand_like, the mask is drawn on the host from torch's generator (see calling_convention).
    if not train or p == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(input), torch.zeros_like(input, dtype=torch.bool)
    keep = torch.rand_like(input) < (1 - p)
    return input * keep * (1.0 / (1 - p)), keep
