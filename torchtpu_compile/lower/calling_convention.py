"""Turn an aot_autograd graph into a tensors-in, tensors-out program that torch-mlir can import.

XLA programs take and return only tensors, exactly once each. This module rewrites the graph
and records how to rebuild the caller's view around the executable:

- None outputs (common in backward graphs), outputs that are inputs, duplicate outputs,
  constant (int) outputs and tensors with no elements (batch norm's reserve) are dropped from
  the program and put back after it runs;
- tensors held by the graph (``get_attr``) become arguments, never inlined literals;
- random ops (dropout masks, ``rand``) are drawn on the host from torch's generator and passed
  in, so results follow ``torch.manual_seed`` exactly as eager does;
- index checks (``index_checks.py``) leave as one last output, its slot of kind "check".
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.fx as fx
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ..output_slots import OutputSlot, empty_spec

aten = torch.ops.aten

# Random ops whose tensor arguments only give shape and dtype: they can be drawn on the host
# before the program runs.
_METADATA_ONLY_RNG = {
    aten.rand_like.default, aten.randn_like.default, aten.randint_like.default,
    aten.randint_like.low_dtype, aten.bernoulli.p,
}


def is_random(node: fx.Node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in target.tags)


def can_draw_on_host(node: fx.Node) -> bool:
    """A random node that needs no value computed by the graph."""
    if node.target in _METADATA_ONLY_RNG:
        return True
    return not any(isinstance(a, fx.Node) for a in node.all_input_nodes)


def _host_draw(node: fx.Node) -> Callable[[], torch.Tensor]:
    target = node.target

    def as_host(value):
        if isinstance(value, fx.Node):
            meta = value.meta["val"]
            return torch.empty(meta.shape, dtype=meta.dtype)
        if isinstance(value, torch.device):
            return torch.device("cpu")
        return value

    args = tuple(as_host(a) for a in node.args)
    kwargs = {k: as_host(v) for k, v in node.kwargs.items()}
    if "device" in kwargs:
        kwargs["device"] = torch.device("cpu")
    return functools.partial(target, *args, **kwargs)


@dataclass
class PreparedGraph:
    """A program-ready graph plus what the runtime must add around it."""
    gm: fx.GraphModule
    arg_indices: list                      # caller's args that become program inputs, in order
    constants: list = field(default_factory=list)        # lifted graph tensors, resident
    random_inputs: list = field(default_factory=list)    # callables drawing host tensors
    # OutputSlot per original output, then the "check" slot of index checks, if any
    outputs: list = field(default_factory=list)
    single_output: bool = False

    @property
    def num_program_outputs(self) -> int:
        return sum(1 for o in self.outputs if o.kind in ("program", "check"))


def _new_placeholder(graph: fx.Graph, after: fx.Node | None, name: str, val) -> fx.Node:
    if after is None:
        first = next(iter(graph.nodes), None)
        ctx = graph.inserting_before(first)
    else:
        ctx = graph.inserting_after(after)
    with ctx:
        node = graph.placeholder(name)
    node.meta["val"] = val
    # The FX importer types a placeholder from FakeTensor vals or from tensor_meta.
    node.meta["tensor_meta"] = _extract_tensor_metadata(val)
    return node


def prepare(gm: fx.GraphModule) -> PreparedGraph:
    """Rewrite a copy of ``gm`` to the program calling convention (``gm`` is not changed)."""
    gm = fx.GraphModule(gm, _copy_graph(gm.graph))
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]

    arg_indices = []
    for index, node in enumerate(placeholders):
        if isinstance(node.meta.get("val"), torch.Tensor):
            arg_indices.append(index)
        elif node.users:
            raise ValueError(f"placeholder {node.name} is not a tensor; specialize the graph first")
        else:
            graph.erase_node(node)
    last = [n for n in graph.nodes if n.op == "placeholder"]
    last = last[-1] if last else None

    constants = []
    for node in list(graph.nodes):
        if node.op != "get_attr":
            continue
        value = operator.attrgetter(node.target)(gm)
        if not isinstance(value, torch.Tensor):
            continue
        last = _new_placeholder(graph, last, f"const_{len(constants)}", value)
        node.replace_all_uses_with(last)
        graph.erase_node(node)
        constants.append(value.detach())

    random_inputs = []
    for node in list(graph.nodes):
        if is_random(node) and can_draw_on_host(node):
            last = _new_placeholder(graph, last, f"random_{len(random_inputs)}", node.meta["val"])
            random_inputs.append(_host_draw(node))
            node.replace_all_uses_with(last)
            graph.erase_node(node)

    from .. import config
    from .index_checks import lower_marks
    check, check_specs = lower_marks(gm, config.check_indices)

    output_node = graph.output_node()
    raw = output_node.args[0]
    single = not isinstance(raw, (tuple, list))
    values = [raw] if single else list(raw)
    input_pos = {n: i for i, n in enumerate(placeholders)}
    slots, program_values, seen = [], [], {}
    for value in values:
        if value is None:
            slots.append(OutputSlot("none"))
        elif not isinstance(value, fx.Node):
            slots.append(OutputSlot("constant", value=value))
        elif value in input_pos:
            slots.append(OutputSlot("input", index=input_pos[value]))
        elif _has_no_elements(value):
            # Made outside the program: torch-mlir cannot express a 0-element literal (the
            # uint8 reserve of _batch_norm_with_update), and XLA would return nothing anyway.
            slots.append(OutputSlot("empty", value=empty_spec(value.meta["val"])))
        elif value in seen:
            slots.append(OutputSlot("program", index=seen[value]))
        else:
            seen[value] = len(program_values)
            slots.append(OutputSlot("program", index=len(program_values)))
            program_values.append(value)
    if check is not None:  # last, after the graph's own outputs (index_checks.py)
        slots.append(OutputSlot("check", index=len(program_values), value=check_specs))
        program_values.append(check)
    output_node.args = (tuple(program_values),)
    graph.eliminate_dead_code()
    gm.recompile()
    return PreparedGraph(gm=gm, arg_indices=arg_indices, constants=constants,
                         random_inputs=random_inputs, outputs=slots, single_output=single)


def _has_no_elements(node: fx.Node) -> bool:
    val = node.meta.get("val")
    return (isinstance(val, torch.Tensor) and all(isinstance(s, int) for s in val.shape)
            and 0 in val.shape)


def _copy_graph(graph: fx.Graph) -> fx.Graph:
    new = fx.Graph()
    env: dict = {}
    out = new.graph_copy(graph, env)
    new.output(out)
    return new
