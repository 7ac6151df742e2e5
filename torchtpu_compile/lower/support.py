"""Which nodes of a graph can go through the lowering, and why the others cannot: one analysis.

``analyze`` returns, for every node that must not be lowered, the reason. The builder
(``program/build.py``) uses it for every front end: a compiled graph is cut at those nodes (they
run in eager PyTorch between XLA regions); the eager device and AOT export refuse the graph (the
eager device then runs the op on the host). The reasons come from

- rules (``never_lower``): ops the importer must never see (it would crash the process, or
  cannot express them);
- nodes that run next to the program by design, not as fallbacks (``is_fallback`` is False):
  host scalar arithmetic (``HOST_SCALAR``), functional collectives the program cannot hold
  (``COLLECTIVE``), linalg's error checks (``ERROR_CHECK``);
- probes (with ``lower_one``): each op lowered alone, the answer cached per op and signature.

``is_written`` and ``written_arguments`` (which arguments an op writes) serve the rule here and
the eager device.

Example::

    reasons = analyze(gm, collectives_lowered=False)
    {op_name(node): reason for node, reason in reasons.items() if is_fallback(reason)}
"""
from __future__ import annotations

import operator
import re

import torch
import torch.fx as fx

from ..errors import LoweringError
from .collective_graphs import is_collective

_RULES: list = []

#: The reason of nodes that compute host scalars (sizes, asserts) rather than tensors.
HOST_SCALAR = "host scalar arithmetic"
#: The reason of functional collectives a program cannot hold: the graph is cut there and the
#: collective runs through its process group (tpu_dist), by design rather than as a fallback.
COLLECTIVE = "collective through the process group"
#: The reason of linalg's error checks (torch.linalg.cholesky raising for a matrix that is not
#: positive definite): they read the op's info on the host and raise, as eager does.
ERROR_CHECK = "error check on the host"
_BY_DESIGN = (HOST_SCALAR, COLLECTIVE, ERROR_CHECK)
_ERROR_CHECKS = (torch.ops.aten._linalg_check_errors.default,)


def never_lower(fn):
    """Register ``fn(node) -> reason or None``: a reason keeps the node out of XLA.

    Example::

        @never_lower
        def no_prints(node):
            return "prints" if node.target is print else None
    """
    _RULES.append(fn)
    return fn


def is_written(argument) -> bool:
    """Whether a schema argument (``torch.Argument``) is written by its op (in-place, out=)."""
    return argument.alias_info is not None and argument.alias_info.is_write


def written_arguments(op, args, kwargs) -> list:
    """``[(position, value)]`` of the arguments ``op`` writes in this call (in-place and out=
    arguments, by its schema); position is an index into ``args`` or a keyword name.

    Example::

        written_arguments(torch.ops.aten.add_.Tensor, (x, y), {})     # [(0, x)]
        written_arguments(torch.ops.aten.add.out, (x, y), {"out": z})  # [("out", z)]
    """
    schema_args = op._schema.arguments
    written = [(i, value) for i, (argument, value) in enumerate(zip(schema_args, args))
               if is_written(argument)]
    if kwargs:
        by_name = {a.name: a for a in schema_args}
        written += [(name, value) for name, value in kwargs.items()
                    if name in by_name and is_written(by_name[name])]
    return written


@never_lower
def writes_its_arguments(node):
    # out= and in-place overloads: the FX importer segfaults on some (aten.arange.start_out),
    # and after functionalization they only remain in hand-built graphs.
    # By schema, not by call: an overload that may write is refused even where this call
    # leaves the written argument out.
    if any(is_written(argument) for argument in node.target._schema.arguments):
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


#: ATen ops with a complex operand and a real result that torch-mlir lowers right: the parts,
#: and the cast to a number (which keeps the real part, as eager's does; not the cast to bool,
#: which eager takes from both parts: fft_complex.py decomposes it).
_COMPLEX_TO_REAL_LOWERED_RIGHT = frozenset({
    torch.ops.aten.real.default, torch.ops.aten.imag.default, torch.ops.aten._to_copy.default,
    torch.ops.prims.convert_element_type.default})


@never_lower
def complex_to_real(node):
    # torch-mlir lowers abs and vector_norm of a complex tensor by converting each element to
    # its real part first: a wrong value, no error; so it did the cast to bool and the logical
    # ops (1j was False). Any other such op, with a real or bool result, stays out of XLA until
    # a decomposition (fft_complex.py, reductions_scans.py) computes it from both parts.
    if node.target.namespace not in ("aten", "prims"):
        return None
    val = node.meta.get("val")
    outputs = val if isinstance(val, (tuple, list)) else (val,)
    real = [o for o in outputs if isinstance(o, torch.Tensor) and
            (o.is_floating_point() or o.dtype is torch.bool)]
    if not real or (node.target in _COMPLEX_TO_REAL_LOWERED_RIGHT and
                    all(o.dtype is not torch.bool for o in real)):
        return None
    inputs = [a.meta.get("val") for a in node.all_input_nodes]
    if any(isinstance(i, torch.Tensor) and i.is_complex() for i in inputs):
        return "torch-mlir would drop the imaginary part of its complex input"
    return None


@never_lower
def complex128(node):
    # Our decompositions compute complex64 (complex_arithmetic.py, fft_complex.py); torch-mlir
    # lowers some complex128 ops alone (conj, _neg_view, view_as_complex), each passing its
    # probe, but not inside a graph: the graph failed to compile ("failed to legalize ...
    # torch.aten._conj") where it should have run them on the host.
    if node.target.namespace not in ("aten", "prims"):
        return None
    values = [node.meta.get("val")] + [a.meta.get("val") for a in node.all_input_nodes]
    for value in values:
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, torch.Tensor) and v.dtype == torch.complex128:
                return "torch-mlir does not lower complex128 (complex64 it does)"
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


def _is_error_check(node: fx.Node) -> bool:
    return (node.op == "call_function" and node.target is torch.ops.higher_order.with_effects
            and len(node.args) > 1 and node.args[1] in _ERROR_CHECKS)


def is_fallback(reason: str) -> bool:
    """Whether a node with this reason is an op that falls back (not host work by design)."""
    return reason not in _BY_DESIGN


def analyze(gm: fx.GraphModule, *, collectives_lowered: bool, lower_one=None) -> dict:
    """``{node: why it cannot go through XLA}`` for the nodes of ``gm`` that cannot (module doc).

    ``collectives_lowered``: the graph's functional collectives go into its program (a plan
    exists, ``collective_graphs.plan_collectives``), else each is cut (``COLLECTIVE``).
    ``lower_one(single-op graph)``, when given, lowers each remaining op alone (``probe``): for
    a graph that failed to lower as a whole, it names the ops at fault.

    Example::

        analyze(gm, collectives_lowered=False)            # rules only: {} when all may lower
        analyze(gm, collectives_lowered=False, lower_one=lambda g: lower_graph(g, ...))
    """
    reasons = {}
    for node in gm.graph.nodes:
        if is_collective(node):
            if not collectives_lowered:
                reasons[node] = COLLECTIVE
            continue  # lowered through the plan's builders, never the importer: no probe
        if is_host_scalar(node):
            reason = HOST_SCALAR
        elif _is_error_check(node):
            reason = ERROR_CHECK
        else:
            reason = rule_violation(node)
            if reason is None and lower_one is not None:
                reason = probe(node, lower_one)
        if reason:
            reasons[node] = reason
    return reasons


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

    args = ", ".join([fmt(a) for a in node.args] +
                     [f"{k}={fmt(v)}" for k, v in node.kwargs.items()])
    return f"{op_name(node)}({args}) at {source_line(node)}"


def op_name(node: fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"aten.{target.__name__}" if target.namespace == "aten" else str(target)
    return getattr(target, "__name__", str(target))
