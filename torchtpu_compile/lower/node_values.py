"""The example value a pass gives a node it adds or retypes.

torch-mlir's FX importer types a node from its ``val`` (a FakeTensor) or, for a placeholder or
constant without one, from its ``tensor_meta``; a node with neither fails the import with
"Could not deduce type". Every pass that makes a node sets both, here.
"""
from __future__ import annotations

import torch
from torch import fx
from torch.fx.passes.shape_prop import _extract_tensor_metadata


def set_value(node: fx.Node, val) -> None:
    """Give ``node`` the example value ``val`` and, for a tensor, the matching ``tensor_meta``.

    Example::

        x = graph.placeholder("x")
        set_value(x, torch.empty(4, 3))   # x.meta["val"], x.meta["tensor_meta"]
    """
    node.meta["val"] = val
    if isinstance(val, torch.Tensor):
        node.meta["tensor_meta"] = _extract_tensor_metadata(val)
