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


def _normalized_bound(value, size: int):
    # Python slice semantics: a negative bound counts from the end; both clamp to [0, size].
    if value is None:
        return None
    if value < 0:
        value += size
    return min(max(value, 0), size)


@fx_pass
def clamp_slice_bounds(gm):
    # Llama's rotate_half backward slices with end=INT64_MAX (the importer then runs out of
    # memory) and Mistral's sliding-window cache with start=-4095 on a dim of 8 (which
    # legalizes to a scatter with bad bounds). Normalized bounds select the same elements.
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
        kwargs = dict(node.kwargs)
        dim = args[dim_pos] if len(args) > dim_pos else kwargs.get("dim", 0)
        size = _dim_size(source, dim)
        if not isinstance(size, int):
            continue
        for offset, key in ((1, "start"), (2, "end")):
            pos = dim_pos + offset
            if len(args) > pos and isinstance(args[pos], int):
                args[pos] = _normalized_bound(args[pos], size)
            elif isinstance(kwargs.get(key), int):
                kwargs[key] = _normalized_bound(kwargs[key], size)
        node.args = tuple(args)
        node.kwargs = kwargs


_EMPTY_OPS = {aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
              aten.new_empty.default, aten.new_empty_strided.default}


@fx_pass
def empty_as_zeros(gm):
    # torch-mlir lowers empty to tensor.empty, which XLA cannot compile when it reaches an
    # output. Its contents are unspecified, so zeros are a valid value.
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _EMPTY_OPS:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
            continue
        with gm.graph.inserting_before(node):
            zeros = gm.graph.call_function(
                aten.zeros.default, (list(val.shape),),
                {"dtype": val.dtype, "device": val.device, "pin_memory": False})
        zeros.meta = dict(node.meta)
        node.replace_all_uses_with(zeros)
        gm.graph.erase_node(node)


def _host_device(value):
    if isinstance(value, torch.device) and value.type != "cpu":
        return torch.device("cpu")
    if isinstance(value, (list, tuple)):
        return type(value)(_host_device(v) for v in value)
    return value


@fx_pass
def device_literals_as_host(gm):
    # Graphs traced from tpu tensors carry device="tpu:0" in factory kwargs, which the importer
    # does not know. The program runs on the PJRT device whatever the literal says.
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        node.args = _host_device(node.args)
        node.kwargs = {k: _host_device(v) for k, v in node.kwargs.items()}


_COMPARISONS = {getattr(aten, name).Scalar for name in ("lt", "le", "gt", "ge", "eq", "ne")}


def _literal_scalar(node):
    """The Python number a node is made of, when it is ``scalar_tensor(number)``; else None."""
    if (isinstance(node, fx.Node) and node.op == "call_function"
            and node.target is aten.scalar_tensor.default
            and isinstance(node.args[0], (bool, int, float))):
        return node.args[0]
    return None


@fx_pass
def fold_comparisons_of_literals(gm):
    # torch-mlir's canonicalizer folds a comparison of a float literal with an integer scalar
    # wrongly, and not even the same way in every process: ge(scalar_tensor(-1.5), -2) folds to
    # false. remainder(x, -1.5) decomposes into exactly that. We fold such comparisons here, with
    # eager PyTorch, so the importer only ever sees the answer.
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in _COMPARISONS:
            continue
        value = _literal_scalar(node.args[0])
        other = node.args[1]
        if value is None or not isinstance(other, (bool, int, float)):
            continue
        source = node.args[0]
        literal = torch.scalar_tensor(value, dtype=source.kwargs.get("dtype"))
        answer = bool(node.target(literal, other))
        with gm.graph.inserting_before(node):
            folded = gm.graph.call_function(
                aten.scalar_tensor.default, (answer,),
                {"dtype": torch.bool, "device": source.kwargs.get("device"), "pin_memory": False})
        folded.meta = dict(node.meta)
        node.replace_all_uses_with(folded)
        gm.graph.erase_node(node)
