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

Ints are lifted the same way where an op has no floats, and only from its ``Scalar`` and
``Tensor`` slots (``x * i``, ``loss / n``, ``pos + i``; never a dim, size or index): an int64
input, each read cast to what eager computes the consumer in (``_operand_dtype``). An int's key
keeps its ``_bucket``: the integer and half ranges it fits and its sign, so values an overflow
check or a sign test tells apart never share a program, and the sentinels are drawn from the
value's own bucket. 0 is never lifted: ``int_tensor // 0`` raises in eager.

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

from torchtpu_compile.lower.node_values import set_value

aten = torch.ops.aten


def _leaves(value, out: list, kind=float):
    if type(value) is kind:
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _leaves(v, out, kind)


def dtype_for(tensors, values=(), requested: torch.dtype | None = None) -> torch.dtype:
    """The dtype an op's lifted ``values`` travel in, given the op's tensor inputs and the
    ``dtype=`` it was called with: int64 for ints (each read is cast where it is used:
    ``_operand_dtype``), else a float dtype.

    Eager computes a double op with its Python floats as doubles: rounded to float32 they were
    wrong in the 8th digit (LBFGS's ``p.add_(d, alpha=t)`` on a float64 model drifted by 1e-4
    in two steps; ``linspace(4.3, end, 50, dtype=torch.float64)`` of an int ``end`` started at
    4.300000190734863). Other ops keep float32, which is what eager's float kernels round the
    float to and what the device computes natively.

    Example::

        dtype_for([x_float32], [0.5], requested=torch.float64)   # torch.float64
    """
    if values and type(values[0]) is int:
        return torch.int64
    doubles = (torch.float64, torch.complex128)
    if torch.get_default_dtype() == torch.float64 or requested in doubles or any(
            t.dtype in doubles for t in tensors):
        return torch.float64
    return torch.float32


def collect(args, kwargs, func=None) -> list:
    """The op's scalars that may become an input, in signature order: its Python floats, or,
    where it has none and ``func`` is given, its ints in scalar slots (``int_slots``).

    Example::

        collect((x, 0.5), {})                    # [0.5]
        collect((x, 3), {}, aten.mul.Tensor)     # [3]
    """
    out: list = []
    for a in args:
        _leaves(a, out)
    for v in kwargs.values():
        _leaves(v, out)
    if out or func is None:
        return out
    return [args[where] if type(where) is int else kwargs[where]
            for where in int_slots(func, args, kwargs)]


_INT64 = (-2 ** 63, 2 ** 63 - 1)
_F32_MAX, _INF = torch.finfo(torch.float32).max, float("inf")
#: The ranges an eager check tells ints apart by: int8, uint8, int16, uint16, half's finite
#: values, int32, uint32 (``uint8.clamp(min=300)`` raises, ``half + 70000`` is inf).
_RANGES = ((-2 ** 7, 2 ** 7 - 1), (0, 2 ** 8 - 1), (-2 ** 15, 2 ** 15 - 1), (0, 2 ** 16 - 1),
           (-65504, 65504), (-2 ** 31, 2 ** 31 - 1), (0, 2 ** 32 - 1))
#: Where the buckets start: each range's ends and the sign split the int64 line into intervals.
_STARTS = sorted({lo for lo, _ in _RANGES} | {hi + 1 for _, hi in _RANGES} | {1, _INT64[0]})
_SCALAR_SLOTS = frozenset({"Tensor", "number", "Optional[number]"})  # Tensor, Scalar, Scalar?
_slots_of: dict = {}   # op -> (positional slot kinds, keyword slot kinds)


def _bucket(value: int) -> tuple:
    """(start, end) of the interval of ints that fit the same ``_RANGES`` as ``value`` and
    share its sign."""
    start = max(s for s in _STARTS if s <= value)
    end = min((s for s in _STARTS if s > value), default=_INT64[1] + 1) - 1
    return start, end


def int_slots(func, args, kwargs) -> list:
    """Where the ints that may become an input sit: argument indices and keyword names of
    ``Tensor`` and ``Scalar`` slots holding a nonzero int64 (never a bool), in signature
    order; none where the op takes a float."""
    slots = _slots_of.get(func)
    if slots is None:
        arguments = func._schema.arguments
        slots = _slots_of[func] = (
            [str(a.type) in _SCALAR_SLOTS for a in arguments],
            {a.name for a in arguments if str(a.type) in _SCALAR_SLOTS})
    positional, named = slots
    where: list = [i for i, a in enumerate(args) if type(a) is int and a != 0 and
                   i < len(positional) and positional[i] and _INT64[0] <= a <= _INT64[1]]
    where += [k for k, v in kwargs.items() if type(v) is int and v != 0 and k in named and
              _INT64[0] <= v <= _INT64[1]]
    if where and (any(type(a) is float for a in args) or any(
            type(v) is float for v in kwargs.values())):
        return []
    return where


def _replace(value, it):
    if type(value) is float:
        return next(it)
    if isinstance(value, (list, tuple)):
        return type(value)(_replace(v, it) for v in value)
    return value


def replace(args, kwargs, values: list, func=None):
    """``args`` and ``kwargs`` with the scalars ``collect`` finds replaced, in order, by
    ``values``."""
    if values and type(values[0]) is int:
        args, kwargs = list(args), dict(kwargs)
        for where, value in zip(int_slots(func, args, kwargs), values):
            if type(where) is int:
                args[where] = value
            else:
                kwargs[where] = value
        return tuple(args), kwargs
    it = iter(values)
    return (tuple(_replace(a, it) for a in args),
            {k: _replace(v, it) for k, v in kwargs.items()})


def structure(key: tuple, func=None, args=(), kwargs=None) -> tuple:
    """A signature with its float values blanked (floats appear as ``(float, value)``); where
    it has none and ``func`` is given, with the values of its ``int_slots`` replaced by their
    ``_bucket``. ``args`` and ``kwargs``: the call ``key`` is the signature of."""
    beyond = []

    def blank(part):
        if type(part) is tuple:
            if len(part) == 2 and part[0] is float:
                if type(part[1]) is float and _F32_MAX < abs(part[1]) < _INF:
                    beyond.append(part[1])
                return (float, None)
            return tuple(blank(p) for p in part)
        return part
    blanked = tuple(blank(p) for p in key)
    if beyond:
        # A finite float beyond float32's range is never an input: clamp's bound check (eager
        # raises) runs when a program is traced, not when it runs.
        return key
    if blanked != key or func is None:
        return blanked
    kwargs = kwargs or {}
    where = int_slots(func, args, kwargs)
    if not where:
        return key
    blanked = list(key)
    names = list(kwargs)
    for w in where:  # the key: the op, each argument, then each keyword's name and value
        at = 1 + w if type(w) is int else 2 + len(args) + 2 * names.index(w)
        blanked[at] = (int, _bucket(key[at][1]))
    return tuple(blanked)


def sentinels(values: list, variant: int) -> list | None:
    """Values no program would hold by chance, distinct per position and per variant, for
    ``values`` (floats, or ints each drawn from its own ``_bucket``); None where a bucket is
    too narrow to hold them all."""
    if not values or type(values[0]) is not int:
        return [-(7.0 + variant) * 1.000000119 ** (i + 1) * 1e-13 for i in range(len(values))]
    out = []
    for i, value in enumerate(values):
        start, end = _bucket(value)
        # near the bucket's far end from zero's side, in odd steps: not 1, 2, 10 or 2**k
        sentinel = end - 2 - (2 * i + variant) * max(1, (end - start) // 41)
        if sentinel < start or sentinel in out:
            return None
        out.append(sentinel)
    return out


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
        return upload(_host_values(values, dtype, shape))
    # repr: 0.0 and -0.0 are equal and hash alike, and are different fills
    key = (dtype, shape, tuple(v if type(v) is int else repr(v) for v in values))
    buffer = _kept.get(key)
    if buffer is None:
        if len(_kept) >= MAX_KEPT:
            _kept.clear()
        from torchtpu_compile.runtime import memory
        buffer = _kept[key] = upload(_host_values(values, dtype, shape))
        memory.untrack(buffer)  # the cache's, not a tensor's: memory_allocated() leaves it out
    return buffer


def _host_values(values: list, dtype: torch.dtype, shape) -> torch.Tensor:
    # shape () is a 0-d input (a fill value): not "no shape given".
    return torch.tensor(values, dtype=dtype).reshape((len(values),) if shape is None else shape)


def read_input(lifted, i: int):
    """Element ``i`` of a lifted input, as a 0-dim tensor (in a graph being traced)."""
    return lifted.select(0, i)


#: Pointwise ops whose Scalar slots a lifted scalar moves to their Tensor twin's: the same
#: value, an int cast to the op's dtype first, as eager casts it; a float as a 0-dim tensor,
#: which promotes as a Python float does (``bf16 < 0.1`` compares in bf16). A comparison or a
#: clamp with a new float each call (LBFGS's line search, a threshold that moves) compiled a
#: program per value. Not pow: eager's kernel squares and cubes for exponents 2 and 3, and
#: takes a square root for 0.5, which a general power does not round alike.
_TENSOR_TWINS = {
    aten.clamp.default: aten.clamp.Tensor, aten.clamp_min.default: aten.clamp_min.Tensor,
    aten.clamp_max.default: aten.clamp_max.Tensor,
    **{getattr(aten, name).Scalar: getattr(aten, name).Tensor for name in (
        "eq", "ne", "lt", "le", "gt", "ge", "bitwise_and", "bitwise_or", "bitwise_xor",
        "remainder", "fmod")}}


def _tensor_slot(node: fx.Node, position, name=None) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    if name is not None:
        arg = next((a for a in schema.arguments if a.name == name), None)
    else:
        arg = schema.arguments[position] if position < len(schema.arguments) else None
    return arg is not None and str(arg.type) in ("Tensor", "Optional[Tensor]")


def _alpha_as_product(graph: fx.Graph, node: fx.Node, index: dict) -> None:
    # add/sub(x, y, alpha=a): alpha is a Python scalar slot; x + y * a is the same value with
    # a in a tensor slot, where the lifting loop finds it.
    if node.target not in (aten.add.Tensor, aten.sub.Tensor):
        return
    alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else None)
    other = node.args[1] if len(node.args) > 1 else None
    if type(alpha) not in (float, int) or alpha not in index or not isinstance(other, fx.Node):
        return
    out, val = node.meta.get("val"), other.meta.get("val")
    if type(alpha) is int and not (isinstance(out, torch.Tensor) and
                                   isinstance(val, torch.Tensor) and out.dtype == val.dtype):
        return  # y * a in y's dtype would wrap where eager computes in the sum's
    with graph.inserting_before(node):
        scaled = graph.call_function(aten.mul.Tensor, (other, alpha))
    scaled.meta["val"] = other.meta.get("val")
    if "tensor_meta" in other.meta:
        scaled.meta["tensor_meta"] = other.meta["tensor_meta"]
    node.args = (node.args[0], scaled)
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}


def _operand_dtype(node: fx.Node, value: int):
    """The dtype eager computes pointwise ``node`` in, given int ``value`` in one of its slots:
    its result's, or for a comparison (a bool result) its operands' common one; None for any
    other node."""
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) or torch.Tag.pointwise not in getattr(
            node.target, "tags", ()):
        return None
    if out.dtype is not torch.bool:
        return out.dtype
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes
    operands = [a.meta.get("val") for a in node.args if isinstance(a, fx.Node)]
    if not all(isinstance(t, torch.Tensor) for t in operands):
        return None
    return elementwise_dtypes(*operands, value,
                              type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def lift(gm: fx.GraphModule, values: list, dtype: torch.dtype) -> fx.GraphModule | None:
    """``gm`` with each scalar in ``values`` (all floats or all ints) read from a new last
    input of ``dtype``, or None if it cannot.

    An int read is cast to the dtype its pointwise consumer computes in, as eager casts a
    Python int there: ``int32 + 2**40`` wraps, a 0-dim int32 plus an int stays int32 (a 0-dim
    int64 input would promote it)."""
    kind = type(values[0])
    graph = gm.graph
    index = {v: i for i, v in enumerate(values)}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    anchor = placeholders[-1] if placeholders else None
    ctx = graph.inserting_after(anchor) if anchor is not None else \
        graph.inserting_before(next(iter(graph.nodes)))
    with ctx:
        lifted = graph.placeholder("lifted_floats" if kind is float else "lifted_ints")
    set_value(lifted, torch.empty(len(values), dtype=dtype))
    reads: dict = {}
    added: set = set()
    twinned: set = set()   # nodes moved to their _TENSOR_TWINS op

    def new_node(before, op, args, kwargs, like):
        with graph.inserting_before(before) if before is not None else \
                graph.inserting_after(lifted):
            node = graph.call_function(op, args, kwargs)
        set_value(node, like)
        added.add(node)
        return node

    def read(i, consumer, value, cast=None):
        node = reads.get(i)
        if node is None:
            node = reads[i] = new_node(None, aten.select.int, (lifted, 0, i), {},
                                       torch.empty((), dtype=dtype))
        if cast is None:
            if kind is float and consumer not in twinned:
                return node
            cast = _operand_dtype(consumer, value)
            if cast is None or kind is float and cast != dtype:
                # A float that eager rounds to a half dtype once would be rounded twice,
                # through the lifted input's float32: left on exact keys.
                return None
        if cast == dtype:
            return node
        return new_node(consumer, torch.ops.prims.convert_element_type.default, (node, cast),
                        {}, torch.empty((), dtype=cast))

    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        _alpha_as_product(graph, node, index)
        value = node.args[0] if node.args else None
        if kind is int and node.target is aten.scalar_tensor.default and \
                type(value) is int and value in index and \
                isinstance(node.meta.get("val"), torch.Tensor):
            # a decomposition's own 0-dim tensor of the int (floor division, fmod): the read,
            # cast as scalar_tensor casts. Not floats: float floor division's decomposition
            # tells 0.0 from -0.0 in Python, which both sentinels pass alike.
            node.replace_all_uses_with(read(index[value], node, value, node.meta["val"].dtype))
            graph.erase_node(node)
    for node in list(graph.nodes):
        if node.op != "call_function" or node in added:
            continue
        if node.target in _TENSOR_TWINS and any(
                type(a) is kind and a in index for a in (*node.args, *node.kwargs.values())):
            node.target = _TENSOR_TWINS[node.target]
            twinned.add(node)
        args = list(node.args)
        for pos, a in enumerate(args):
            if type(a) is kind and a in index:
                args[pos] = read(index[a], node, a) if _tensor_slot(node, pos) else None
                if args[pos] is None:
                    return None
        kwargs = dict(node.kwargs)
        for name, a in kwargs.items():
            if type(a) is kind and a in index:
                kwargs[name] = read(index[a], node, a) if _tensor_slot(node, None, name) \
                    else None
                if kwargs[name] is None:
                    return None
        node.args, node.kwargs = tuple(args), kwargs
    for node in graph.nodes:  # a sentinel left inside a list, or anywhere else
        left: list = []
        _leaves(node.args, left, kind)
        _leaves(list(node.kwargs.values()), left, kind)
        if any(v in index for v in left):
            return None
    if len(reads) != len(values):
        # A float the graph does not read was consumed at trace time: fill_ of an int tensor
        # truncated both sentinels to the same 0, and later values (-2.7) gave 0, not -2.
        return None
    graph.lint()
    gm.recompile()
    return gm
