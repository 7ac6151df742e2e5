"""Functional collectives inside a compiled graph, lowered into its StableHLO program.

torch-mlir does not import ``_c10d_functional`` ops. So each collective is a call whose
StableHLO is ``collectives.py``'s builder for it, put together with the ATen around it by
``splice.py`` (as ``jax_op`` calls are), and ``wait_tensor`` is the value it waits on. The
program is then compiled for the group's devices, one replica each: every rank runs it and the
collectives cross processes inside it.

This happens only when every collective of the graph has a rule (``RULES``, one per op) and
names a group whose devices are known (a tpu_dist group on the PJRT transport: its resolver
is registered with ``set_group_resolver``); otherwise the graph is cut at its collectives
and they run through the process group.

The plan is made once per graph, by the program builder (``program/build.py``), which decides
with it whether to cut the graph and hands it to the lowering (``lower_graph(...,
collectives=plan)``); the lowering only rebinds it to the copy of the graph it lowers.

Example::

    plan = plan_collectives(gm)          # None: no collectives, or cut the graph at them
    gm, plan = without_waits(gm, plan)   # the waits gone, the plan on the new graph's nodes
    callees = collective_callees(plan)
    plan.devices                         # (0, 2048): compile for these devices
"""
from __future__ import annotations

import copy as copy_module
import dataclasses

import torch
import torch.fx as fx

from .. import counters
from . import collectives
from .splice import Callee, value_type

_c10d = torch.ops._c10d_functional
_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd")
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


def is_collective(node: fx.Node) -> bool:
    """A functional collective (or its ``wait_tensor``): a ``_c10d_functional`` op."""
    return node.op == "call_function" and getattr(node.target, "namespace", None) in _NAMESPACES


def _group_name(node):
    for argument, value in zip(node.target._schema.arguments, node.args):
        if argument.name == "group_name":
            return value
    return node.kwargs.get("group_name")


def plan_collectives(gm: fx.GraphModule) -> CollectivePlan | None:
    """How to lower ``gm``'s functional collectives into its program, or None (module doc)."""
    found, waits, devices = [], [], set()
    for node in gm.graph.nodes:
        if not is_collective(node):
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


def without_waits(gm: fx.GraphModule, plan: CollectivePlan) -> tuple:
    """(a copy of ``gm`` in which each ``wait_tensor`` is replaced by the value it waits on,
    ``plan`` on that copy's nodes): in one program a collective's result is ready when the next
    op reads it. ``plan`` was made for ``gm`` or a copy of it (nodes are matched by name)."""
    copy = fx.GraphModule(gm, copy_module.deepcopy(gm.graph))
    for node in list(copy.graph.nodes):
        if node.op == "call_function" and node.target is _c10d.wait_tensor.default:
            node.replace_all_uses_with(node.args[0])
            copy.graph.erase_node(node)
    copy.recompile()
    by_name = {node.name: node for node in copy.graph.nodes}
    try:
        planned = [dataclasses.replace(p, node=by_name[p.node.name]) for p in plan.collectives]
    except KeyError as missing:
        raise ValueError(f"the collective plan names node {missing}, which the graph being "
                         f"lowered lacks: plan the graph that is lowered") from None
    return copy, CollectivePlan(plan.devices, planned, [])


def collective_callees(plan: CollectivePlan) -> dict:
    """``{collective node: Callee}``: each collective's StableHLO from its builder, for the
    plan's group size (``splice.py`` puts the module together)."""
    n = len(plan.devices)
    callees = {}
    for p in plan.collectives:
        operand = p.node.args[0]
        val = operand.meta["val"]
        text = collectives.module_text(p.builder, n, ((_shape(val), val.dtype),), **p.params)
        callees[p.node] = Callee(text=text, inputs=[operand], outputs=[p.node],
                                 result_types=[value_type(p.node)])
    counters.COLLECTIVES.add("lowered_collectives", len(plan.collectives))
    return callees
