"""Which nodes of a graph can go through the lowering, and how to name the ones that cannot.

Two sources of truth: rules for ops that must never reach the importer (it would crash the
process or cannot express them), and probing, which imports a one-op graph and caches the answer.
"""
from __future__ import annotations

import operator
import re

import torch
import torch.fx as fx

from ..errors import LoweringError

_RULES: list = []


def never_lower(fn):
    """Register ``fn(node) -> reason or None``: a reason keeps the node out of XLA.

    Example::

        @never_lower
        def no_prints(node):
            return "prints" if node.target is print else None
    """
    _RULES.append(fn)
    return fn


@never_lower
def writes_its_arguments(node):
    # out= and in-place overloads: the FX importer segfaults on some (aten.arange.start_out),
    # and after functionalization they only remain in hand-built graphs.
    schema = node.target._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments):
        return "writes to its arguments (out= or in-place)"
    return None


_DATA_DEPENDENT_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)


def _has_static_shapes(value) -> bool:
    if isinstance(value, torch.Tensor):
        return all(isinstance(s, int) for s in value.shape)
    if isinstance(value, (tuple, list)):
        return all(_has_static_shapes(v) for v in value)
    return False  # a Python scalar read out of a tensor (.item(), aten.equal)


@never_lower
def data_dependent(node):
    # The tags mark ops that *may* have data-dependent shapes (aten.index.Tensor does only
    # with boolean masks); what was traced says whether this instance does.
    if not any(tag in node.target.tags for tag in _DATA_DEPENDENT_TAGS):
        return None
    if _has_static_shapes(node.meta.get("val")):
        return None
    return "its output shape or value depends on tensor data"


@never_lower
def random_from_graph_values(node):
    from .calling_convention import can_draw_on_host, is_random
    if is_random(node) and not can_draw_on_host(node):
        return "a random op whose parameters are computed by the graph"
    return None


def _is_op(node: fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)


def is_host_scalar(node: fx.Node) -> bool:
    """A node computing Python scalars (size arithmetic, shape asserts), not tensors.

    Such nodes run on the host next to the XLA program; they are not eager fallbacks.
    """
    if node.op != "call_function" or node.target is operator.getitem:
        return False
    from .calling_convention import is_rng_state_op
    if is_rng_state_op(node):  # a random op with its generator state (no "val" of its own)
        return False
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        return False
    return not isinstance(val, torch.Tensor) and not _is_op_with_tensor_output(node)


def _is_op_with_tensor_output(node: fx.Node) -> bool:
    if not _is_op(node):
        return False
    returns = node.target._schema.returns
    return any(isinstance(r.type, torch.TensorType) for r in returns)


def rule_violation(node: fx.Node) -> str | None:
    """Why ``node`` must run in eager PyTorch, or None if it may be lowered."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return None
    from .calling_convention import can_draw_on_host, is_rng_state_op
    if is_rng_state_op(node):  # drawn on the host by the calling convention
        return None if can_draw_on_host(node) else \
            "a random op whose parameters are computed by the graph"
    if not _is_op(node):
        return f"{getattr(node.target, '__name__', node.target)} is not an ATen op"
    for rule in _RULES:
        reason = rule(node)
        if reason:
            return reason
    return None


def _meta_signature(value):
    if isinstance(value, fx.Node):
        meta = value.meta.get("val")
        if isinstance(meta, torch.Tensor):
            return ("T", tuple(meta.shape), meta.dtype)
        return ("N", repr(meta))
    if isinstance(value, (list, tuple)):
        return tuple(_meta_signature(v) for v in value)
    return repr(value)


_probe_cache: dict = {}


def single_op_graph(node: fx.Node) -> fx.GraphModule:
    """A graph holding only ``node``, its graph inputs turned into placeholders."""
    graph = fx.Graph()
    env: dict = {}

    def placeholder_for(arg: fx.Node) -> fx.Node:
        if arg not in env:
            ph = graph.placeholder(f"in_{len(env)}")
            ph.meta["val"] = arg.meta.get("val")
            env[arg] = ph
        return env[arg]

    copied = graph.node_copy(node, placeholder_for)
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        outs = []
        for i, item in enumerate(val):
            if isinstance(item, torch.Tensor):
                get = graph.call_function(operator.getitem, (copied, i))
                get.meta["val"] = item
                outs.append(get)
        graph.output(tuple(outs))
    else:
        graph.output((copied,))
    return fx.GraphModule(torch.nn.Module(), graph)


def probe(node: fx.Node, lower) -> str | None:
    """Lower ``node`` alone with ``lower(gm)``; the failure reason, or None when it lowers."""
    if not _is_op(node):
        return None
    key = (node.target, _meta_signature(list(node.args)), _meta_signature(dict(node.kwargs)))
    if key in _probe_cache:
        return _probe_cache[key]
    try:
        lower(single_op_graph(node))
        reason = None
    except LoweringError as exc:
        reason = str(exc)
    except Exception as exc:  # a probe must never take the compile down
        reason = f"{type(exc).__name__}: {exc}"
    _probe_cache[key] = reason
    return reason


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def source_line(node: fx.Node) -> str:
    """The user's source line that produced ``node`` ("file.py:12: code"), if known."""
    trace = node.meta.get("stack_trace") or ""
    lines = trace.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        m = _FRAME.search(lines[i])
        if m:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return f"{m.group(1)}:{m.group(2)}: {code}".rstrip(": ")
    return "unknown source line"


def describe(node: fx.Node) -> str:
    """The op, its input shapes and dtypes, and where it came from, for error messages."""
    def fmt(value):
        if isinstance(value, fx.Node):
            meta = value.meta.get("val")
            if isinstance(meta, torch.Tensor):
                dtype = str(meta.dtype).replace("torch.", "")
                return f"{dtype}{list(meta.shape)}"
            return repr(meta)
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(fmt(v) for v in value) + "]"
        return repr(value)

    args = ", ".join([fmt(a) for a in node.args] + [f"{k}={fmt(v)}" for k, v in node.kwargs.items()])
    return f"{op_name(node)}({args}) at {source_line(node)}"


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))
