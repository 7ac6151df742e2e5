"""Graphs with calls whose StableHLO comes from elsewhere: one module from several importers.

torch-mlir imports ATen only. Some ops have StableHLO of their own: a ``jax_op`` (JAX lowers it,
``jax_calls.py``) or a functional collective (``collectives.py`` builds it,
``collective_graphs.py``). Such a graph is cut at each of those calls: every run of ATen between
them becomes a function that torch-mlir lowers, every call becomes the function its ``Callee``
supplies, and ``main`` calls them in graph order. XLA inlines the calls, so the program is one
fusion region as if one importer had made it. The module is put together in jaxlib's MLIR
context, which registers CHLO (JAX's lowerings use it; torch-mlir's Python bindings lack it).

Example::

    callees = {node: Callee(text, inputs=[...], outputs=[...]) for node in calls}
    module = import_with_callees(gm, callees, import_aten)   # @main calls @seg0, @call1, ...
"""
from __future__ import annotations

import dataclasses

import torch
import torch.fx as fx

from ..errors import LoweringError
from .mlir_types import tensor_type


@dataclasses.dataclass
class Callee:
    """A call node's StableHLO: ``text`` is a module whose public ``main`` takes ``inputs``
    (graph values, in order) and returns ``len(outputs)`` results; ``outputs[i]`` is the graph
    node that carries result ``i`` (the call itself, or its getitem; None if unused), and
    ``result_types`` their MLIR types."""
    text: str
    inputs: list
    outputs: list
    result_types: list


class _Step:
    """One function ``main`` calls: a run of ATen nodes, or one call with what reads it."""

    def __init__(self, callee: Callee | None = None):
        self.callee = callee
        self.nodes: list[fx.Node] = []
        self.inputs: list[fx.Node] = []    # an ATen run's values from outside, in order
        self.outputs: list[fx.Node] = []   # an ATen run's values used after it, in order


def _steps(gm: fx.GraphModule, callees: dict) -> list[_Step]:
    steps: list[_Step] = []
    absorbed = {out: node for node, c in callees.items() for out in c.outputs
                if out is not None and out is not node}   # getitems of a call
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output") or node in absorbed:
            continue
        if node in callees:
            steps.append(_Step(callees[node]))
        elif not steps or steps[-1].callee is not None:
            steps.append(_Step())
        steps[-1].nodes.append(node)
    for step in steps:
        if step.callee is not None:
            continue
        inside = set(step.nodes)
        for node in step.nodes:
            for arg in node.all_input_nodes:
                if arg not in inside and arg not in step.inputs:
                    step.inputs.append(arg)
        step.outputs = [n for n in step.nodes if any(u not in inside for u in n.users)]
    return steps


def _segment_module(gm: fx.GraphModule, step: _Step) -> fx.GraphModule:
    graph = fx.Graph()
    env = {}
    for value in step.inputs:
        env[value] = graph.placeholder(value.name)
        env[value].meta = dict(value.meta)
    for node in step.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[n] for n in step.outputs))
    return fx.GraphModule(gm, graph)


def value_type(value: fx.Node) -> str:
    """The MLIR tensor type of a graph value, from its fake tensor."""
    val = value.meta.get("val")
    if not isinstance(val, torch.Tensor):
        raise LoweringError(f"value {value.name} of a spliced call is not a tensor ({val!r})")
    return tensor_type(val.shape, val.dtype)


def _functions_of(text: str, prefix: str, context, ir) -> list[str]:
    """The functions of a module's text, ``main`` renamed to ``prefix`` and made private, every
    other symbol prefixed so two importers' helpers never collide; in MLIR's generic form."""
    module = ir.Module.parse(text, context=context)
    functions = [op for op in module.body.operations if op.operation.name == "func.func"]
    for op in functions:
        old = ir.StringAttr(op.attributes["sym_name"]).value
        new = prefix if old == "main" else f"{prefix}__{old}"
        ir.SymbolTable.replace_all_symbol_uses(old, new, module.operation)
        op.attributes["sym_name"] = ir.StringAttr.get(new, context=context)
        op.attributes["sym_visibility"] = ir.StringAttr.get("private", context=context)
    return [op.operation.get_asm(print_generic_op_form=True, enable_debug_info=False)
            for op in functions]


def _jax_context():
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    return jax_mlir.make_ir_context(), ir


def import_with_callees(gm: fx.GraphModule, callees: dict, import_aten):
    """Lower ``gm`` to one StableHLO module (module doc), in jaxlib's MLIR context.

    ``callees`` maps each call node to its ``Callee``; ``import_aten(segment_gm)`` is
    torch-mlir's import (and our rewrites) of a pure-ATen graph.
    """
    context, ir = _jax_context()
    functions: list[str] = []
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    ssa: dict[fx.Node, str] = {node: f"%arg{i}" for i, node in enumerate(placeholders)}
    body: list[str] = []
    for index, step in enumerate(_steps(gm, callees)):
        if step.callee is not None:
            symbol, text = f"call{index}", step.callee.text
            args, outputs, result_types = (step.callee.inputs, step.callee.outputs,
                                           step.callee.result_types)
        else:
            symbol, args, outputs = f"seg{index}", step.inputs, step.outputs
            text = import_aten(_segment_module(gm, step)).operation.get_asm(
                print_generic_op_form=True, enable_debug_info=False)
            result_types = [value_type(n) for n in outputs]
        functions += _functions_of(text, symbol, context, ir)
        name, arity = f"%r{index}", len(result_types)
        lhs = f"{name}:{arity} = " if arity > 1 else (f"{name} = " if arity else "")
        body.append(f'{lhs}"func.call"({", ".join(ssa[a] for a in args)}) '
                    f'{{callee = @{symbol}}} : ({", ".join(value_type(a) for a in args)}) -> '
                    f'({", ".join(result_types)})')
        for k, node in enumerate(outputs):
            if node is not None:
                ssa[node] = f"{name}#{k}" if arity > 1 else name
    returned = gm.graph.output_node().args[0]
    returned = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    ret_types = [value_type(r) for r in returned]
    body.append(f'"func.return"({", ".join(ssa[r] for r in returned)}) : '
                f'({", ".join(ret_types)}) -> ()')
    signature = ", ".join(f"%arg{i}: {value_type(p)}" for i, p in enumerate(placeholders))
    main = (f"func.func @main({signature}) -> ({', '.join(ret_types)}) {{\n  "
            + "\n  ".join(body) + "\n}")
    text = "module {\n" + "\n".join(functions) + "\n" + main + "\n}"
    try:
        module = ir.Module.parse(text, context=context)
    except Exception as exc:  # the parts disagree on a type: a bug in a Callee
        raise LoweringError(f"splicing calls into one module failed: {exc}") from exc
    if not module.operation.verify():
        raise LoweringError("the module spliced from calls does not verify")
    return module
