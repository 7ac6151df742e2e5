"""Graph rewrites applied before lowering, one registered function each.

They work around gaps of the FX importer on valid graphs, in place, without changing results.
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten
_PASSES: list = []


def fx_pass(fn):
    """Register ``fn(gm) -> None`` to run on every static graph before lowering.

    Example::

        @fx_pass
        def nothing(gm):
            pass
    """
    _PASSES.append(fn)
    return fn


def normalize(gm: fx.GraphModule) -> None:
    """Run every registered rewrite on ``gm``."""
    for fn in _PASSES:
        fn(gm)
    gm.recompile()


def _dim_size(node: fx.Node, dim: int):
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    return val.shape[dim]


@fx_pass
def clamp_slice_bounds(gm):
    # Llama's rotate_half backward slices with end=INT64_MAX; the importer then builds huge
    # index tensors and runs out of memory. The clamped slice is the same slice.
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is aten.slice.Tensor:
            source, dim_pos = node.args[0], 1
        elif node.target is aten.slice_scatter.default:
            source, dim_pos = node.args[0], 2
        else:
            continue
        args = list(node.args)
        dim = args[dim_pos] if len(args) > dim_pos else node.kwargs.get("dim", 0)
        size = _dim_size(source, dim)
        if not isinstance(size, int):
            continue
        for pos in (dim_pos + 1, dim_pos + 2):  # start, end
            if len(args) > pos and isinstance(args[pos], int) and args[pos] > size:
                args[pos] = size
        node.args = tuple(args)
        for key in ("start", "end"):
            value = node.kwargs.get(key)
            if isinstance(value, int) and value > size:
                node.kwargs = {**node.kwargs, key: size}
