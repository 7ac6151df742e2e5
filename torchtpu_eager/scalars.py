"""Python floats and int positions as program inputs, so that an op called with new values
compiles once.

An op's cache key holds its float arguments, so ``p.addcdiv_(m, v, value=-step_size)`` with a new
step size would compile again: Adam's bias corrections change every step. When an op is seen a
second time with other floats, it is traced twice, with two sets of sentinel values, and each
sentinel in the traced graph is replaced by an element of one extra 1-D input (``dtype_for``).
The result is kept only if both traces give the same graph and no sentinel is left: a float
that a decomposition transformed (``1 - x``) or that sits where only a Python scalar fits keeps
the op on exact keys. Lifted floats meet tensors as 0-dim tensors do, which promote like Python
floats.

Example::

    floats = collect(args, kwargs)                 # [0.9, 1e-3]
    args2, kwargs2 = replace(args, kwargs, sentinels(len(floats), 0))
    values.append(as_input(floats, dtype_for(tensors)))

Positions are the other kind: the storage offset of a view read or written with a gather or
scatter (``x[t]``, ``x[i:i + n]``, ``narrow``, ``split``'s pieces, ``y[i] = v``: ``views.py``)
is a 1-D int64 input of its program, read with ``read_input`` as the floats are, so a loop over
time steps or batches compiles one program per view shape, not one per position. The position
is checked on the host before (the view's geometry comes from eager's own view op: ``x[10]``
on a size-4 dim raises its IndexError), so the program does no index check.
"""
from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten


def _leaves(value, out: list):
    if type(value) is float:
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _leaves(v, out)


def dtype_for(tensors) -> torch.dtype:
    """The dtype an op's lifted floats travel in, given the op's tensor inputs.

    Eager computes a double op with its Python floats as doubles: rounded to float32 they were
    wrong in the 8th digit (LBFGS's ``p.add_(d, alpha=t)`` on a float64 model drifted by 1e-4
    in two steps). Other ops keep float32, which is what eager's float kernels round the float
    to and what the device computes natively.
    """
    if torch.get_default_dtype() == torch.float64 or any(
            t.dtype in (torch.float64, torch.complex128) for t in tensors):
        return torch.float64
    return torch.float32


def collect(args, kwargs) -> list:
    """The Python floats among the op's arguments, in signature order."""
    out: list = []
    for a in args:
        _leaves(a, out)
    for v in kwargs.values():
        _leaves(v, out)
    return out


def _replace(value, it):
    if type(value) is float:
        return next(it)
    if isinstance(value, (list, tuple)):
        return type(value)(_replace(v, it) for v in value)
    return value


def replace(args, kwargs, floats: list):
    """``args`` and ``kwargs`` with their floats replaced, in order, by ``floats``."""
    it = iter(floats)
    return (tuple(_replace(a, it) for a in args),
            {k: _replace(v, it) for k, v in kwargs.items()})


def structure(key: tuple) -> tuple:
    """A signature with its float values blanked (floats appear as ``(float, value)``)."""
    def blank(part):
        if type(part) is tuple:
            if len(part) == 2 and part[0] is float:
                return (float, None)
            return tuple(blank(p) for p in part)
        return part
    return tuple(blank(p) for p in key)


def sentinels(count: int, variant: int) -> list:
    """Values no program would hold by chance, distinct per position and per variant."""
    return [-(7.0 + variant) * 1.000000119 ** (i + 1) * 1e-13 for i in range(count)]


_kept: dict = {}   # (dtype, shape, values as keyed) -> their buffer, in modes that run each op now
#: Values kept uploaded: a loop revisits the same few positions and fill values, and an upload
#: per read of a strided view cost 8 us of a 40 us op on the CPU client.
MAX_KEPT = 4096
_KEPT_LENGTH = 8   # positions and fill values are one element: longer inputs are not kept


def as_input(values: list, dtype: torch.dtype, keep: bool | None = None, shape=None):
    """``values`` as the input of ``dtype`` (1-D, or ``shape``) a lifted program takes last.

    Kept uploaded per value (``keep``; by default ints, which are positions) in strict and
    debug mode (eager programs do not donate their inputs). Lifted floats (Adam's step sizes
    never repeat) and, in defer-and-fuse mode, everything are uploaded each call: a recording
    then passed one buffer given twice as one input, so a buffer shared by chance (an offset
    of 3 and a fill of 3) changed its wiring and compiled it again. Recordings now take each
    read as an input of its own (``fuse.py``), so keeping them there too may be safe; not
    measured yet.
    """
    from . import modes
    from .transfer import upload
    if keep is None:
        keep = not (dtype.is_floating_point or dtype.is_complex)
    if not keep or len(values) > _KEPT_LENGTH or \
            not isinstance(modes._current or modes.current(), modes.Strict):
        return upload(torch.tensor(values, dtype=dtype).reshape(shape or (len(values),)))
    # repr: 0.0 and -0.0 are equal and hash alike, and are different fills
    key = (dtype, shape, tuple(v if type(v) is int else repr(v) for v in values))
    buffer = _kept.get(key)
    if buffer is None:
        if len(_kept) >= MAX_KEPT:
            _kept.clear()
        buffer = _kept[key] = upload(
            torch.tensor(values, dtype=dtype).reshape(shape or (len(values),)))
    return buffer


def read_input(lifted, i: int):
    """Element ``i`` of a lifted input, as a 0-dim tensor (in a graph being traced)."""
    return lifted.select(0, i)


def _tensor_slot(node: fx.Node, position, name=None) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    if name is not None:
        arg = next((a for a in schema.arguments if a.name == name), None)
    else:
        arg = schema.arguments[position] if position < len(schema.arguments) else None
    return arg is not None and str(arg.type) == "Tensor"


def _alpha_as_product(graph: fx.Graph, node: fx.Node, index: dict, read) -> None:
    # add/sub(x, y, alpha=a): alpha is a Python scalar slot; x + y * a is the same value with
    # a in a tensor slot.
    if node.target not in (aten.add.Tensor, aten.sub.Tensor):
        return
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else None)
    other = node.args[1] if len(node.args) > 1 else None
    if type(alpha) is not float or alpha not in index or not isinstance(other, fx.Node):
        return
    with graph.inserting_before(node):
        scaled = graph.call_function(aten.mul.Tensor, (other, read(index[alpha])))
    scaled.meta["val"] = other.meta.get("val")
    if "tensor_meta" in other.meta:
        scaled.meta["tensor_meta"] = other.meta["tensor_meta"]
    node.args = (node.args[0], scaled)
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}


def lift(gm: fx.GraphModule, values: list, dtype: torch.dtype) -> fx.GraphModule | None:
    """``gm`` with each float in ``values`` read from a new last input of ``dtype``, or None if
    it cannot."""
    graph = gm.graph
    index = {v: i for i, v in enumerate(values)}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    ctx = graph.inserting_after(anchor) if anchor is not None else \
        graph.inserting_before(next(iter(graph.nodes)))
    with ctx:
        lifted = graph.placeholder("lifted_floats")
    lifted.meta["val"] = torch.empty(len(values), dtype=dtype)
    from torch.fx.passes.shape_prop import _extract_tensor_metadata
    lifted.meta["tensor_meta"] = _extract_tensor_metadata(lifted.meta["val"])
    reads: dict = {}

    def read(i):
        node = reads.get(i)
        if node is None:
            with graph.inserting_after(lifted):
                node = reads[i] = graph.call_function(aten.select.int, (lifted, 0, i))
            node.meta["val"] = torch.empty((), dtype=dtype)
            node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])
        return node

    for node in list(graph.nodes):
        if node.op != "call_function" or node in reads.values():
            continue
        _alpha_as_product(graph, node, index, read)
        args = list(node.args)
        for pos, a in enumerate(args):
            if type(a) is float and a in index:
                if not _tensor_slot(node, pos):
                    return None
                args[pos] = read(index[a])
        kwargs = dict(node.kwargs)
        for name, a in kwargs.items():
            if type(a) is float and a in index:
                if not _tensor_slot(node, None, name):
                    return None
                kwargs[name] = read(index[a])
        node.args, node.kwargs = tuple(args), kwargs
    for node in graph.nodes:  # a sentinel left inside a list, or anywhere else
        left: list = []
        _leaves(node.args, left)
        _leaves(list(node.kwargs.values()), left)
        if any(v in index for v in left):
            return None
    if len(reads) != len(values):
        # A float the graph does not read was consumed at trace time: fill_ of an int tensor
        # truncated both sentinels to the same 0, and later values (-2.7) gave 0, not -2.
        return None
    graph.lint()
    gm.recompile()
    return gm
