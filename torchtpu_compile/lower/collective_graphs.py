"""Functional collectives inside a compiled graph, lowered into its StableHLO program.

torch-mlir does not import ``_c10d_functional`` ops. So the graph is lowered without them:
each collective becomes a new graph input (its result) and a new graph output (its operand),
and ``wait_tensor`` the value it waits on. In the imported module each such pair is joined
again by the collective's StableHLO (``collectives.py``'s builder for it, parsed and spliced
in), the extra inputs and outputs are removed, and the ops are put back in dependency order.
The program is then compiled for the group's devices, one replica each: every rank runs it
and the collectives cross processes inside it.

This happens only when every collective of the graph has a rule (``RULES``, one per op) and
names a group whose devices are known (a tpu_dist group on the PJRT transport: its resolver
is registered with ``set_group_resolver``); otherwise the graph is cut at its collectives
and they run through the process group.

Example::

    plan = plan_collectives(gm)          # None: no collectives, or cut the graph at them
    lowered = lower_with_collectives(gm, plan, platform="cpu", precision="medium")
    lowered.replicas                     # (0, 2048): compile for these devices
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import time

import torch
import torch.fx as fx

from .. import counters
from . import collectives

_c10d = torch.ops._c10d_functional
RULES: dict = {}
_group_resolver = None


def set_group_resolver(fn) -> None:
    """``fn(group_name) -> device ids of the group's ranks, or None`` (tpu_dist registers it)."""
    global _group_resolver
    _group_resolver = fn


def rule(op):
    """Register ``fn(node, n) -> (builder name, params) or None`` for functional collective
    ``op``; None: this call cannot be lowered (the graph is cut there)."""
    def register(fn):
        RULES[op] = fn
        return fn
    return register


def _shape(value) -> tuple:
    return tuple(int(s) for s in value.shape)


def _reduction(name: str):
    name = name.lower()
    if name == "avg":
        return {"reduce": "add", "average": True}
    body = collectives.REDUCTIONS.get(name)
    return None if body is None else {"reduce": body, "average": False}


@rule(_c10d.all_reduce.default)
def _all_reduce(node, n):
    params = _reduction(node.args[1])
    return None if params is None else ("all_reduce", params)


@rule(_c10d.all_gather_into_tensor.default)
def _all_gather_into_tensor(node, n):
    return "all_gather", {"outputs": (_shape(node.meta["val"]),)}


@rule(_c10d.reduce_scatter_tensor.default)
def _reduce_scatter_tensor(node, n):
    params = _reduction(node.args[1])
    if params is None:
        return None
    return "reduce_scatter", {"output": _shape(node.meta["val"]), **params}


@rule(_c10d.all_to_all_single.default)
def _all_to_all_single(node, n):
    out_splits, in_splits = node.args[1], node.args[2]
    if len(set(out_splits)) > 1 or len(set(in_splits)) > 1:
        return None  # uneven: cut the graph, the process group handles it
    return "all_to_all", {"outputs": (_shape(node.meta["val"]),)}


@rule(_c10d.broadcast.default)
def _broadcast(node, n):
    return "broadcast", {"root": int(node.args[1])}


@dataclasses.dataclass
class Planned:
    node: fx.Node
    builder: str
    params: dict


@dataclasses.dataclass
class CollectivePlan:
    devices: tuple
    collectives: list   # Planned, in graph order
    waits: list         # wait_tensor nodes (identities once lowered)


def _group_name(node):
    for argument, value in zip(node.target._schema.arguments, node.args):
        if argument.name == "group_name":
            return value
    return node.kwargs.get("group_name")


def plan_collectives(gm: fx.GraphModule) -> CollectivePlan | None:
    """How to lower ``gm``'s functional collectives into its program, or None (module doc)."""
    found, waits, devices = [], [], set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or getattr(node.target, "namespace", None) not in \
                ("_c10d_functional", "_c10d_functional_autograd"):
            continue
        if node.target is _c10d.wait_tensor.default:
            waits.append(node)
            continue
        fn = RULES.get(node.target)
        value = node.args[0] if node.args else None
        group = _group_resolver(_group_name(node)) if _group_resolver else None
        if fn is None or group is None or not isinstance(value, fx.Node) or \
                value.meta.get("val") is None or \
                value.meta["val"].dtype not in collectives.ELEMENT_TYPES:
            return None
        planned = fn(node, len(group))
        if planned is None:
            return None
        devices.add(tuple(group))
        found.append(Planned(node, planned[0], planned[1]))
    if not found or len(devices) != 1:
        return None  # no collectives, or groups on different devices: one program cannot
    return CollectivePlan(devices.pop(), found, waits)


def _without_collectives(gm: fx.GraphModule, plan: CollectivePlan) -> fx.GraphModule:
    """``gm`` with each collective's result as an extra input and its operand as an extra
    output (in plan order, after the originals)."""
    graph = fx.Graph()
    env: dict = {}
    originals = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node in originals:
        env[node] = graph.node_copy(node, lambda n: env[n])
    planned = {p.node: p for p in plan.collectives}
    for i, p in enumerate(plan.collectives):
        stand_in = graph.placeholder(f"_collective_{i}")
        stand_in.meta["val"] = p.node.meta["val"]
        env[p.node] = stand_in
    waits = set(plan.waits)
    output = None
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node in planned:
            continue
        if node in waits:
            env[node] = env[node.args[0]]
        elif node.op == "output":
            output = node
        else:
            env[node] = graph.node_copy(node, lambda n: env[n])
    results = output.args[0]
    results = list(results) if isinstance(results, (tuple, list)) else [results]
    results = [fx.node.map_arg(r, lambda n: env[n]) for r in results]
    operands = [env[p.node.args[0]] for p in plan.collectives]
    graph.output(tuple(results) + tuple(operands))
    return fx.GraphModule(gm, graph)


def _splice(module, plan: CollectivePlan, original_args: int, original_results: int) -> None:
    """Join each extra output to its extra input through the collective (module doc)."""
    from torch_mlir import ir
    n = len(plan.devices)
    with module.context, ir.Location.unknown():
        func = next(op for op in module.body.operations
                    if op.operation.name == "func.func")
        block = func.regions[0].blocks[0]
        terminator = list(block.operations)[-1]
        for i, p in enumerate(plan.collectives):
            # Read now: an earlier collective's result may have replaced this operand.
            value = terminator.operands[original_results + i]
            value_type = value.type.maybe_downcast()
            shape = tuple(value_type.shape)
            dtype = p.node.args[0].meta["val"].dtype
            text = collectives.module_text(p.builder, n, ((shape, dtype),), **p.params)
            result = _inline(ir, ir.Module.parse(text), terminator, [value])
            block.arguments[original_args + i].replace_all_uses_with(result)
        # The return without the extra outputs; the function without the extra inputs.
        with ir.InsertionPoint(terminator):
            ir.Operation.create("func.return",
                                operands=list(terminator.operands)[:original_results])
        terminator.erase()
        for index in range(len(block.arguments) - 1, original_args - 1, -1):
            block.erase_argument(index)
        function_type = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        func.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
            list(function_type.inputs)[:original_args],
            list(function_type.results)[:original_results]))
        _sort_block(block)


def _inline(ir, snippet, before, arguments):
    """Copy the body of ``snippet``'s function before op ``before``, its arguments bound to
    ``arguments``; its returned value."""
    func = next(op for op in snippet.body.operations if op.operation.name == "func.func")
    body = func.regions[0].blocks[0]
    mapping = dict(zip(body.arguments, arguments))
    for op in body.operations:
        if op.operation.name == "func.return":
            return mapping[op.operands[0]]
        copy = op.operation.clone(ir.InsertionPoint(before))
        for index, operand in enumerate(op.operands):
            if operand in mapping:
                copy.operands[index] = mapping[operand]
        mapping.update(zip(op.results, copy.results))
    raise RuntimeError("collective lowering: a builder's function has no return")


def _sort_block(block) -> None:
    """Put the block's ops in an order where each comes after what it uses (stable: the
    original order wherever dependencies allow)."""
    from torch_mlir import ir
    ops = [op.operation for op in block.operations]
    terminator, ops = ops[-1], ops[:-1]
    top = set(ops)

    def producers(op) -> set:
        found = set()

        def visit(inner):
            for value in inner.operands:
                if isinstance(value, ir.BlockArgument):
                    continue  # of the function or of a region inside an op: no producer
                owner = value.owner.operation
                if owner in top and owner != op:
                    found.add(owner)
            return ir.WalkResult.ADVANCE
        op.walk(visit)
        return found

    needs = {op: producers(op) for op in ops}
    placed: set = set()
    order: list = []
    pending = ops
    while pending:
        rest = []
        for op in pending:
            if needs[op] <= placed:
                order.append(op)
                placed.add(op)
            else:
                rest.append(op)
        if len(rest) == len(pending):
            raise RuntimeError("collective lowering: the program has a dependency cycle")
        pending = rest
    for op in order:
        op.move_before(terminator)


def lower_with_collectives(gm: fx.GraphModule, plan: CollectivePlan, platform: str,
                           precision: str):
    """Lower ``gm`` with its collectives in the program; a ``LoweredModule`` whose
    ``replicas`` are the devices to compile it for."""
    from .importer import LoweredModule, import_stablehlo
    from .stablehlo_passes import PassContext, run_passes
    start = time.perf_counter()
    try:
        stripped = _without_collectives(gm, plan)
        original_args = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
        output = gm.graph.output_node().args[0]
        original_results = len(output) if isinstance(output, (tuple, list)) else 1
        module = import_stablehlo(stripped)
        _splice(module, plan, original_args, original_results)
        run_passes(module, PassContext(platform=platform, precision=precision))
        text = module.operation.get_asm(enable_debug_info=False)
        buf = io.BytesIO()
        module.operation.write_bytecode(buf)
    finally:
        counters.add("lowering_seconds", time.perf_counter() - start)
    counters.add_dist("lowered_collectives", len(plan.collectives))
    return LoweredModule(bytecode=buf.getvalue(), fingerprint=hashlib.sha256(
        text.encode()).hexdigest(), text=text, replicas=plan.devices)
