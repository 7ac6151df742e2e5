"""Graphs that call JAX functions (``jax_op``): one StableHLO module from two importers.

torch-mlir imports ATen only, so a graph that calls ``torchtpu_jax::*`` ops is cut at each
call. Every run of ATen between calls becomes a function that torch-mlir lowers; every call
becomes the function JAX lowers for it; ``main`` calls them in graph order. XLA inlines the
calls, so the program is one fusion region as if one importer had made it.

Example::

    gm = make_fx(lambda x: rms_norm(x.sin(), w) * 2, tracing_mode="fake")(x)
    module = import_with_jax_calls(gm, "cpu", "medium", import_stablehlo)
    # @main calls @seg0 (x.sin()), @jax1 (rms_norm), @seg2 (* 2)
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..errors import LoweringError
from ..kernels.jax_op import kernel_of

_ELEMENT = {
    torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "ui8", torch.bool: "i1", torch.complex64: "complex<f32>",
}


def has_jax_calls(gm: fx.GraphModule) -> bool:
    return any(kernel_of(n.target) is not None for n in gm.graph.nodes if n.op == "call_function")


class _Step:
    """One function ``main`` calls: a run of ATen nodes, or one JAX call with its getitems."""

    def __init__(self, index: int, kernel=None):
        self.index = index
        self.kernel = kernel
        self.nodes: list[fx.Node] = []
        self.inputs: list[fx.Node] = []    # values from outside the step, in argument order
        self.outputs: list[fx.Node] = []   # values used after the step, in result order

    @property
    def symbol(self) -> str:
        return f"jax{self.index}" if self.kernel else f"seg{self.index}"


def _steps(gm: fx.GraphModule) -> list[_Step]:
    steps: list[_Step] = []
    owner: dict[fx.Node, _Step] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        kernel = kernel_of(node.target) if node.op == "call_function" else None
        if kernel is not None:
            steps.append(_Step(len(steps), kernel))
            steps[-1].nodes.append(node)
            owner[node] = steps[-1]
        elif node.op == "call_function" and node.target is operator.getitem and \
                node.args[0] in owner and owner[node.args[0]].kernel is not None:
            owner[node.args[0]].nodes.append(node)   # a result of an earlier JAX call
        else:
            if not steps or steps[-1].kernel is not None:
                steps.append(_Step(len(steps)))
            steps[-1].nodes.append(node)
            owner[node] = steps[-1]
    for step in steps:
        inside = set(step.nodes)
        for node in step.nodes:
            for arg in node.all_input_nodes:
                if arg not in inside and arg not in step.inputs and \
                        not (step.kernel and arg is step.nodes[0]):
                    step.inputs.append(arg)
        for node in step.nodes:
            if step.kernel and node is step.nodes[0]:
                continue  # the call's list result is only read through its getitems
            if any(u not in inside for u in node.users):
                step.outputs.append(node)
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


def _kernel_inputs(step: _Step) -> list[fx.Node]:
    call = step.nodes[0]
    return list(call.args[0])


def _type(shape, dtype: torch.dtype) -> str:
    return f"tensor<{''.join(f'{int(d)}x' for d in shape)}{_ELEMENT[dtype]}>"


def _tensor_type(value: fx.Node) -> str:
    val = value.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype not in _ELEMENT:
        raise LoweringError(f"jax_op call: value {value.name} is not a tensor of a supported "
                            f"dtype ({val!r})")
    return _type(val.shape, val.dtype)


def _functions_of(text: str, prefix: str, context, ir) -> list[str]:
    """The functions of a module's text, ``main`` renamed to ``prefix`` and made private, every
    other symbol prefixed so two importers' helpers never collide."""
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
    # Stitched in jaxlib's MLIR: it registers CHLO, which JAX's lowerings use and torch-mlir's
    # Python bindings lack. torch-mlir's output is plain StableHLO, which both parse.
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib.mlir import ir
    return jax_mlir.make_ir_context(), ir


def import_with_jax_calls(gm: fx.GraphModule, platform: str, precision: str, import_aten):
    """Lower ``gm`` (which calls ``jax_op`` ops) to one StableHLO module (module doc), in
    jaxlib's MLIR context.

    ``import_aten(segment_gm)`` is torch-mlir's import (and our rewrites) of a pure-ATen graph.
    """
    steps = _steps(gm)
    context, ir = _jax_context()
    functions: list[str] = []
    results: dict[fx.Node, str] = {}   # fx value -> SSA name in main
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        results[node] = f"%arg{i}"
    body: list[str] = []
    for step in steps:
        if step.kernel is not None:
            args = _kernel_inputs(step)
            avals = step.kernel.avals([a.meta["val"] for a in args])
            text = step.kernel.stablehlo(avals, precision, platform)
            arity = len(step.kernel.output_specs(avals))
            result_types = [_type(*spec) for spec in step.kernel.output_specs(avals)]
        else:
            args = step.inputs
            segment = _segment_module(gm, step)
            text = import_aten(segment).operation.get_asm(print_generic_op_form=True,
                                                          enable_debug_info=False)
            arity = len(step.outputs)
            result_types = [_tensor_type(n) for n in step.outputs]
        functions += _functions_of(text, step.symbol, context, ir)
        arg_types = [_tensor_type(a) for a in args]
        name = f"%r{step.index}"
        lhs = f"{name}:{arity} = " if arity > 1 else (f"{name} = " if arity else "")
        body.append(f'{lhs}"func.call"({", ".join(results[a] for a in args)}) '
                    f'{{callee = @{step.symbol}}} : ({", ".join(arg_types)}) -> '
                    f'({", ".join(result_types)})')
        if step.kernel is not None:
            for item in step.nodes[1:]:   # the call's getitems
                index = item.args[1]
                results[item] = f"{name}#{index}" if arity > 1 else name
        else:
            for k, node in enumerate(step.outputs):
                results[node] = f"{name}#{k}" if arity > 1 else name
    (output,) = [n for n in gm.graph.nodes if n.op == "output"]
    returned = output.args[0]
    returned = list(returned) if isinstance(returned, (tuple, list)) else [returned]
    arg_types = [_tensor_type(p) for p in placeholders]
    ret_types = [_tensor_type(r) for r in returned]
    body.append(f'"func.return"({", ".join(results[r] for r in returned)}) : '
                f'({", ".join(ret_types)}) -> ()')
    signature = ", ".join(f"%arg{i}: {t}" for i, t in enumerate(arg_types))
    main = (f"func.func @main({signature}) -> ({', '.join(ret_types)}) {{\n  "
            + "\n  ".join(body) + "\n}")
    text = "module {\n" + "\n".join(functions) + "\n" + main + "\n}"
    try:
        module = ir.Module.parse(text, context=context)
    except Exception as exc:  # a type mismatch between the two importers' conventions
        raise LoweringError(f"stitching jax_op calls into one module failed: {exc}") from exc
    if not module.operation.verify():
        raise LoweringError("the module stitched from jax_op calls does not verify")
    return module
