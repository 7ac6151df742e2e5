"""Turn an aot_autograd graph into a tensors-in, tensors-out program that torch-mlir can import.

XLA programs take and return only tensors, exactly once each. This module rewrites the graph
and records how to rebuild the caller's view around the executable:

- None outputs (common in backward graphs), outputs that are inputs, duplicate outputs,
  constant (int) outputs and tensors with no elements (batch norm's reserve) are dropped from
  the program and put back after it runs;
- outputs that are views of inputs, or views of a computed tensor that another output also
  shows (``y, y.view(-1)``), are rebuilt as views after the program runs, so that a write
  through one output shows in the others as in eager PyTorch (aot_autograd leaves this
  aliasing to the backend in inference graphs);
- tensors held by the graph (``get_attr``) become arguments, never inlined literals;
- random ops whose tensor argument only gives the result's shape (dropout masks, ``rand_like``,
  ``randn_like``, ``bernoulli``) are drawn inside the program from keys drawn from torch's
  generator (``device_random.py``), except with ``config.random_draws`` "host" (by default on
  the CPU client); those and the other random ops (``rand`` of a size, ``randint``) are drawn
  on the host from torch's generator and passed in, so results follow ``torch.manual_seed``
  exactly as eager does. So are the two RNG state operators aot_autograd puts around a random
  op that the backward recomputes (dropout in a checkpointed block): ``run_and_save_rng_state``
  reads the generator's state before drawing, ``run_with_rng_state`` draws again from it.
- index checks (``index_checks.py``) leave as one last output, its slot of kind "check".
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, field
from collections.abc import Callable

import torch
import torch.fx as fx

from ..output_slots import (OutputSlot, decode_view_steps, empty_spec, encode_view_steps,
                            memory_order, replay_view_steps)
from .node_values import set_value

aten = torch.ops.aten
prims = torch.ops.prims

# Random ops whose tensor arguments only give shape and dtype: they can be drawn on the host
# before the program runs.
_METADATA_ONLY_RNG = {
    aten.rand_like.default, aten.randn_like.default, aten.randint_like.default,
    aten.randint_like.low_dtype, aten.bernoulli.p,
}


@functools.cache
def _rng_state_ops() -> tuple:
    from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state
    return run_and_save_rng_state, run_with_rng_state


def is_rng_state_op(node: fx.Node) -> bool:
    """``run_and_save_rng_state`` or ``run_with_rng_state``: a random op with its state."""
    return node.op == "call_function" and node.target in _rng_state_ops()


def is_random(node: fx.Node) -> bool:
    target = node.target
    return (node.op == "call_function" and isinstance(target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in target.tags) or is_rng_state_op(node)


def _random_call(node: fx.Node) -> tuple:
    """(random op, its args, its kwargs, the node holding a saved generator state or None)."""
    save, replay = _rng_state_ops()
    if node.target is save:
        return node.args[0], node.args[1:], node.kwargs, None
    if node.target is replay:
        return node.args[1], node.args[2:], node.kwargs, node.args[0]
    return node.target, node.args, node.kwargs, None


def can_draw_on_host(node: fx.Node) -> bool:
    """A random node that needs no value computed by the graph (a saved generator state is a
    graph input, read at the call)."""
    op, args, kwargs, state = _random_call(node)
    if state is not None and state.op != "placeholder":
        return False
    if op in _METADATA_ONLY_RNG:
        return True
    return all(n is state for n in node.all_input_nodes)


def _host_draw(op, args, kwargs, device: str = "cpu") -> Callable[[], torch.Tensor]:
    """``op`` with its graph-value arguments replaced by empty tensors of their shape and dtype
    on ``device`` (metadata-only ops read nothing else): "meta" gives the result's shape; a
    device's own draws come from its generator, as eager's."""
    device = torch.device(device)

    def as_host(value):
        if isinstance(value, fx.Node):
            meta = value.meta["val"]
            return torch.empty(meta.shape, dtype=meta.dtype, device=device)
        if isinstance(value, torch.device):
            return device
        return value

    args = tuple(as_host(a) for a in args)
    kwargs = {k: as_host(v) for k, v in kwargs.items()}
    if "device" in kwargs:
        kwargs["device"] = device
    return functools.partial(op, *args, **kwargs)


def _state_example() -> torch.Tensor:
    """A generator state's shape and dtype (what ``torch.get_rng_state()`` returns)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return torch.empty(torch.get_rng_state().shape, dtype=torch.uint8)


def pin_rng_state_sizes(gm: fx.GraphModule) -> None:
    """Give the generator states of a graph's RNG state ops their one concrete size.

    aot_autograd makes them fake tensors of a fresh symbolic size, which would make the graph
    look dynamic (and pad a state like an activation); a state's size is the generator's.
    """
    save, replay = _rng_state_ops()
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is replay and node.args[0].op == "placeholder":
            state = node.args[0]
        elif node.target is operator.getitem and node.args[0].op == "call_function" and \
                node.args[0].target is save and node.args[1] == 0:
            state = node
        else:
            continue
        set_value(state, _state_example())


def _drawing_device(node: fx.Node) -> str:
    """The device whose generator a random node draws from, as eager's op would: its value's
    (for a state-saving node, the drawn value's); for aot_autograd's rng-state nodes, which
    carry no value (a checkpointed dropout), the op's ``device`` or its first tensor's; the
    CPU's where nothing says."""
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)):
        val = val[-1]
    if val is None:
        _, args, kwargs, _ = _random_call(node)
        if kwargs.get("device") is not None:
            return str(kwargs["device"])
        val = next((a.meta.get("val") for a in args if isinstance(a, fx.Node)), None)
    device = getattr(val, "device", None)
    return "cpu" if device is None or device.type == "meta" else str(device)


def _rng_state_of(device: str):
    """``(get_rng_state, set_rng_state)`` of ``device``'s default generator."""
    if torch.device(device).type == "cpu":
        return torch.get_rng_state, torch.set_rng_state
    module = torch.get_device_module(device)
    return module.get_rng_state, module.set_rng_state


def _drawn_from(draw: Callable[[], torch.Tensor], device: str,
                state: torch.Tensor) -> torch.Tensor:
    """``draw()`` from generator state ``state`` of ``device``'s generator, leaving the
    generator as it was."""
    get_state, set_state = _rng_state_of(device)
    current = get_state()
    set_state(state.cpu())  # a tpu graph's saved state comes back a tpu tensor
    try:
        return draw()
    finally:
        set_state(current)


@dataclass(frozen=True)
class HostDraw:
    """A program input made on the host at each call: ``fn`` of the caller's ``args[i]`` for
    ``i`` in ``reads`` (a saved generator state), in list order (a state is read before the
    draw that follows it)."""
    fn: Callable
    reads: tuple = ()

    def __call__(self, args=()) -> torch.Tensor:
        return self.fn(*(args[i] for i in self.reads))


@dataclass
class PreparedGraph:
    """A program-ready graph plus what the runtime must add around it."""
    gm: fx.GraphModule
    arg_indices: list                      # caller's args that become program inputs, in order
    constants: list = field(default_factory=list)        # lifted graph tensors, resident
    random_inputs: list = field(default_factory=list)    # HostDraw per drawn input
    # OutputSlot per original output, then the "check" slot of index checks, if any
    outputs: list = field(default_factory=list)
    single_output: bool = False

    @property
    def num_program_outputs(self) -> int:
        # Not the "program" slots: a root that only views show is a program output too.
        return len(self.gm.graph.output_node().args[0])


def _new_placeholder(graph: fx.Graph, after: fx.Node | None, name: str, val) -> fx.Node:
    if after is None:
        first = next(iter(graph.nodes), None)
        ctx = graph.inserting_before(first)
    else:
        ctx = graph.inserting_after(after)
    with ctx:
        node = graph.placeholder(name)
    set_value(node, val)
    return node


def prepare(gm: fx.GraphModule, rebuild_views: bool = True,
            platform: str | None = None, eager_layouts: tuple = ()) -> PreparedGraph:
    """Rewrite a copy of ``gm`` to the program calling convention (``gm`` is not changed).

    ``rebuild_views``: outputs that alias inputs or other outputs become "view" slots (for
    callers that hold tensors; the eager device's graphs return buffers, which cannot view).
    ``platform``: the PJRT platform the program is for, which decides where random ops draw
    (``device_random.enabled``); None: the CPU client's choice. ``eager_layouts``: positions
    of the outputs the user sees, which come back with the strides eager gives them
    (``_eager_layout``) where those are a permutation of a contiguous layout.
    """
    gm = fx.GraphModule(gm, _copy_graph(gm.graph))
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    # A region of a partitioned graph (CapabilityBasedPartitioner) declares an input where its
    # first user is, maybe after other nodes; the inputs added below go after the last
    # placeholder, which then came after a node using them (a host-drawn random value: "used
    # before it has been defined"). Every placeholder first, in order.
    first_op = next((n for n in graph.nodes if n.op != "placeholder"), None)
    if first_op is not None:
        for node in placeholders:
            first_op.prepend(node)

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
    from . import device_random
    on_device = [n for n in graph.nodes if device_random.draws_on_device(n)] \
        if device_random.enabled(platform) else []
    if on_device:  # one key per draw, all in one input (device_random.py)
        keys = device_random.KeyDraw(len(on_device), _drawing_device(on_device[0]))
        last = _new_placeholder(graph, last, "random_keys", keys.example())
        random_inputs.append(HostDraw(keys))
        device_random.rewrite(graph, on_device, last)
    position = {n: i for i, n in enumerate(placeholders)}
    save, _ = _rng_state_ops()
    for node in list(graph.nodes):
        if not (is_random(node) and can_draw_on_host(node)):
            continue
        op, args, kwargs, state = _random_call(node)
        # From the generator eager's op would draw from: a graph on tpu tensors follows
        # torch.tpu.manual_seed and moves the tpu generator (it drew from the CPU's: the
        # tpu's seed was ignored, and eager draws after the call repeated the graph's).
        device = _drawing_device(node)
        draw = _host_draw(op, args, kwargs, device)
        if node.target is save:  # (state, value): the state as it was before the draw
            for index, fn in ((0, _rng_state_of(device)[0]), (1, draw)):
                part = next((u for u in node.users if u.args[1] == index), None)
                if part is None:
                    continue
                last = _new_placeholder(graph, last, f"random_{len(random_inputs)}",
                                        part.meta["val"])
                random_inputs.append(HostDraw(fn))
                part.replace_all_uses_with(last)
                graph.erase_node(part)
        else:
            val = node.meta.get("val")
            if val is None:  # aot_autograd's run_with_rng_state nodes carry no value
                val = _host_draw(op, args, kwargs, device="meta")()
            last = _new_placeholder(graph, last, f"random_{len(random_inputs)}", val)
            if state is None:
                random_inputs.append(HostDraw(draw))
            else:
                random_inputs.append(HostDraw(functools.partial(_drawn_from, draw, device),
                                              (position[state],)))
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
    views = _rebuilt_views(values, input_pos) if rebuild_views else {}
    slots, program_values, seen = [], [], {}
    layouts: dict = {}  # graph output node -> its "program" slots' value (eager strides)
    roots = {root for root, _ in views.values() if root not in input_pos}
    for at, value in enumerate(values):
        if value in views:
            root, steps = views[value]
            if root in input_pos:
                slots.append(OutputSlot("view", index=input_pos[root],
                                        value={"of": "input", "ops": steps}))
                continue
            if root not in seen:
                order = _eager_layout(root)
                seen[root] = len(program_values)
                layouts[root] = None if order is None else {"memory_order": order}
                program_values.append(root if order is None else
                                      _permuted(graph, root, order, output_node))
            view = {"of": "program", "ops": steps}
            if layouts.get(root):  # the steps replay on the base laid out as eager's
                view["memory_order"] = layouts[root]["memory_order"]
            slots.append(OutputSlot("view", index=seen[root], value=view))
        elif value is None:
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
            slots.append(OutputSlot("program", index=seen[value], value=layouts.get(value)))
        else:
            # A base of rebuilt views comes in eager's layout whether or not the user sees
            # it: aot_autograd rebuilds a view of a written input from the input's memory
            # with the base's strides (fuzz seed 1614: a contiguous base of a transposed
            # input read other elements).
            order = _eager_layout(value) if at in eager_layouts or value in roots else None
            layout = None if order is None else {"memory_order": order}
            seen[value], layouts[value] = len(program_values), layout
            slots.append(OutputSlot("program", index=len(program_values), value=layout))
            # Computed in its memory order; the slot restrides it.
            program_values.append(value if order is None else
                                  _permuted(graph, value, order, output_node))
    if check is not None:  # last, after the graph's own outputs (index_checks.py)
        slots.append(OutputSlot("check", index=len(program_values), value=check_specs))
        program_values.append(check)
    output_node.args = (tuple(program_values),)
    graph.eliminate_dead_code()
    gm.recompile()
    return PreparedGraph(gm=gm, arg_indices=arg_indices, constants=constants,
                         random_inputs=random_inputs, outputs=slots, single_output=single)


def _eager_layout(node) -> list | None:
    """The dims of ``node``'s value from outermost to innermost in eager's memory layout,
    where that layout is dense and not contiguous (``x.t() * 2``, a channels-last conv's
    output: eager's TensorIterator keeps its inputs' layout); None otherwise (contiguous,
    overlapping, with gaps, symbolic). A compiled call's results were always contiguous, so
    code after it that views them as eager laid them out (``y.t().view(-1)``) raised, and
    ``stride()``/``is_contiguous()`` told another story than eager's and Inductor's."""
    return memory_order(node.meta.get("val") if isinstance(node, fx.Node) else None)


def _permuted(graph: fx.Graph, node: fx.Node, order: list, before: fx.Node) -> fx.Node:
    """``node``'s value permuted to ``order``: its elements in eager's memory order."""
    with graph.inserting_before(before):
        permuted = graph.call_function(aten.permute.default, (node, order))
    set_value(permuted, node.meta["val"].permute(order))
    return permuted


# Views whose result depends on the base's strides, not only its values: replayed on a base
# laid out otherwise than in the trace (program results are contiguous), they would read other
# elements.
_LAYOUT_DEPENDENT_VIEWS = {aten.as_strided.default, aten._reshape_alias.default}


def _as_reshape(node: fx.Node):
    return aten.view.default, (list(node.meta["val"].shape),)


# The view prims that decompositions leave (unbind: slice + prims.squeeze) as the ATen views
# they are: prims carry no autograd view metadata, so their results would share storage with
# no ``_base``, unlike eager's.
_PRIMS_AS_ATEN = {
    prims.squeeze.default: _as_reshape,
    prims.split_dim.default: _as_reshape,
    prims.collapse_view.default: _as_reshape,
    prims.transpose.default: lambda node: (aten.permute.default, (node.args[1],)),
    prims.view_of.default: lambda node: (aten.alias.default, ()),
    prims.view_of_dtype.default: lambda node: (aten.view.dtype, (node.args[1],)),
}


def _view_step(node: fx.Node):
    """(the viewed node, (op, args, kwargs, item)) if ``node`` is an ATen view of another."""
    item = None
    if node.op == "call_function" and node.target is operator.getitem and \
            isinstance(node.args[0], fx.Node):  # one output of split, unbind, chunk
        node, item = node.args[0], node.args[1]
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or \
            not target.is_view or target in _LAYOUT_DEPENDENT_VIEWS or not node.args or \
            not isinstance(node.args[0], fx.Node):
        return None
    args, kwargs = node.args[1:], node.kwargs
    if target in _PRIMS_AS_ATEN:
        target, args = _PRIMS_AS_ATEN[target](node)
    elif target.namespace != "aten":
        return None
    graph_values = []  # a view whose size comes from the graph cannot be replayed later
    fx.node.map_arg((args, kwargs), graph_values.append)
    if graph_values:
        return None
    return node.args[0], (target, args, kwargs, item)


def _view_chain(node: fx.Node):
    """(root, JSON steps from root to ``node``): the first node up the chain of views that is
    not itself a view; no steps if ``node`` is not a view (or one we cannot replay)."""
    steps = []
    root = node
    while True:
        step = _view_step(root)
        if step is None:
            break
        root, one = step
        steps.append(one)
    steps.reverse()
    # aot_autograd marks some outputs with an alias() of a view; replayed, it would make the
    # view its _base. Alone it stays: then it is the output's only link to its root.
    if len(steps) > 1:
        steps = [s for s in steps if s[0] is not aten.alias.default] or steps[:1]
    encoded = encode_view_steps(steps)
    return (root, encoded) if steps and encoded is not None else (node, [])


def _replays(steps: list, base_meta, want) -> bool:
    """The steps run on ``base_meta`` (a meta tensor) and give ``want``'s shape and dtype."""
    try:
        out = replay_view_steps(base_meta, decode_view_steps(steps))
    except Exception:  # an invalid view on this layout (view of a transposed base)
        return False
    return tuple(out.shape) == tuple(want.shape) and out.dtype == want.dtype


def _rebuilt_views(values: list, input_pos: dict) -> dict:
    """{output node: (root, steps)} for the outputs to rebuild as views after the program.

    A view of an input always (a view costs nothing and aliases it, as in eager); a view of a
    computed tensor when another output shares its root (else its aliasing cannot be seen), or
    when the root has no more elements than the view: an ``expand`` of a row then comes back
    with eager's stride-0 dims from the row alone, where the program returned every copy.
    A narrowing view (``y[:, -1]``) stays the program's own result, contiguous: returning its
    whole root would move all of it off the device for a part (docs/reliability.md). The steps
    must replay on the base as it will come: an input as traced or contiguous (a region of a
    partitioned graph gets earlier programs' results), a program result in eager's layout
    where that is a permutation (``_eager_layout``), else contiguous.
    """
    chains = {v: _view_chain(v) for v in values if isinstance(v, fx.Node)}
    sharing: dict = {}
    for node, (root, _) in chains.items():
        sharing.setdefault(root, set()).add(node)
    rebuilt = {}
    for node, (root, steps) in chains.items():
        if not steps or _has_no_elements(node) or _has_no_elements(root):
            continue
        want, base = node.meta.get("val"), root.meta.get("val")
        if not isinstance(want, torch.Tensor) or not isinstance(base, torch.Tensor):
            continue
        contiguous = torch.empty(base.shape, dtype=base.dtype, device="meta")
        if root not in input_pos and _eager_layout(root) is not None:
            contiguous = torch.empty_strided(base.shape, base.stride(), dtype=base.dtype,
                                             device="meta")
        if root in input_pos:
            traced = torch.empty_strided(base.shape, base.stride(), dtype=base.dtype,
                                         device="meta")
            ok = _replays(steps, traced, want) and _replays(steps, contiguous, want)
        else:
            ok = (len(sharing[root]) > 1 or _no_larger(base, want)) and \
                _replays(steps, contiguous, want)
        if ok:
            rebuilt[node] = (root, steps)
    return rebuilt


def _no_larger(base: torch.Tensor, view: torch.Tensor) -> bool:
    """Whether ``base`` has at most as many elements as ``view`` (False where a size is
    symbolic)."""
    sizes = (*base.shape, *view.shape)
    return all(isinstance(s, int) for s in sizes) and base.numel() <= view.numel()


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
