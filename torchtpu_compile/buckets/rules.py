"""How each ATen op runs on padded tensors so that the real elements come out exact.

One rule per op family, registered with ``@padding_rule(op, ...)``. A rule gets the tracing
context, the FX node (its ``meta["val"]`` holds the symbolic shapes) and the node's arguments
as ``Padded`` tensors, ``Size`` values or plain Python values, and returns ``Padded`` results.
Ops without a rule run unchanged when no padding reaches them, and pointwise ops combine their
inputs' layouts; any other op that meets padding raises ``NotPaddable``, and the graph is then
compiled for the exact shape instead.

The rules mask padding where an op reads across a padded dim (reductions, contractions,
softmax, cumulative ops, sorting, scatters), use the real sizes (runtime scalars of the
program) where a size is used as a value (``mean``'s divisor, ``x / n``), compute
positions counted from the real end (``x[:, -1]``, ``x[-k:]``) from the real size, and keep
writes exact: a block that follows padding goes to its real offset (``cat``, a KV cache
append), a padded entry of a write goes nowhere real (``index_put``, a static cache's prefill).

Example::

    @padding_rule(aten.neg.default)
    def neg(ctx, node, x):
        return Padded(aten.neg.default(x.tensor), x.layout)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import sympy
import torch.fx as fx
from torch.utils._sympy import functions as symfn

from ..index_errors import ASSERT_OP
from ..lower.index_checks import DIVISOR_OPS, INDEX_CHECK, INDEX_CHECK_REAL
from .layout import Dim, DimsDiffer, NotPaddable, dim_mask, evaluate, \
    is_symbolic, prefix, prefix_holds, same_size, simplified_size, sym_expr, \
    view_layout

aten = torch.ops.aten
RULES: dict = {}


@dataclass
class Padded:
    """A tensor traced at its padded shape and where its real elements are."""
    tensor: object
    layout: tuple

    @property
    def padded(self) -> bool:
        return any(d is not None for d in self.layout)


@dataclass
class Size:
    """A symbolic size: its value at the bucket (``pad``) and at run time (``real``, traced)."""
    expr: object
    pad: int
    real: object


def padding_rule(*ops):
    """Register ``fn(ctx, node, *args, **kwargs)`` as the padding rule of ``ops``."""
    def register(fn):
        for op in ops:
            RULES[op] = fn
        return fn
    return register


class Context:
    """Symbol values at the bucket (ints) and at run time (traced 0-d int64 tensors)."""

    def __init__(self, pad_env: dict, real_env: dict):
        self.pad_env = pad_env
        self.real_env = real_env
        self._masks: dict = {}
        self._holds: dict = {}

    def check_fits(self, result, node) -> None:
        """Raise NotPaddable where a dim of ``result`` (a rule's output) is padded to fewer
        elements than a smaller real size gives it: a size that does not grow with its symbols
        (adaptive pooling's longest window, ``ceil(n/4) - n//8``: 3 at 14, 2 at 16) would
        drop real elements at the bucket, silently."""
        for value in result if isinstance(result, (list, tuple)) else (result,):
            if not isinstance(value, Padded):
                continue
            for dim in value.layout:
                for factor in () if dim is None else dim.factors:
                    held = self._holds.get(factor)
                    if held is None:
                        held = self._holds[factor] = prefix_holds(factor, self.pad_env)
                    if not held:
                        raise NotPaddable(f"{node.target} makes a dim of size {factor}, which "
                                          f"a smaller size outgrows at this bucket",
                                          symbols=factor.free_symbols)

    def dim_mask(self, dim: Dim):
        key = dim.factors
        if key not in self._masks:
            self._masks[key] = dim_mask(dim, self.pad_env, self.real_env)
        return self._masks[key]

    def mask(self, x: Padded, dims=None):
        """bool tensor broadcastable to ``x``: True on real elements along ``dims``."""
        dims = range(len(x.layout)) if dims is None else dims
        rank = len(x.layout)
        mask = None
        for d in dims:
            dim = x.layout[d]
            if dim is None:
                continue
            shape = [1] * rank
            shape[d] = -1
            m = aten.view.default(self.dim_mask(dim), shape)
            mask = m if mask is None else aten.logical_and.default(mask, m)
        return mask

    def fill(self, x: Padded, value, dims=None):
        """``x``'s tensor with ``value`` on the padding along ``dims``."""
        mask = self.mask(x, dims)
        if mask is None:
            return x.tensor
        return aten.where.self(mask, x.tensor, _scalar(value, x.tensor.dtype))

    def real_size(self, x: Padded, d: int, shape_expr):
        """The real extent of dim ``d`` (an int, or a traced 0-d int64 tensor)."""
        if x.layout[d] is None:
            return int(shape_expr) if not is_symbolic(shape_expr) else evaluate(
                shape_expr, self.real_env)
        return math.prod([evaluate(f, self.real_env) for f in x.layout[d].factors]) \
            if len(x.layout[d].factors) > 1 else evaluate(x.layout[d].factors[0], self.real_env)


def _scalar(value, dtype):
    return aten.scalar_tensor.default(value, dtype=dtype)


def lowest(dtype):
    return -math.inf if dtype.is_floating_point else (
        False if dtype == torch.bool else torch.iinfo(dtype).min)


def highest(dtype):
    return math.inf if dtype.is_floating_point else (
        True if dtype == torch.bool else torch.iinfo(dtype).max)


# --- helpers -----------------------------------------------------------------------------------

def out_shape(node: fx.Node):
    val = node.meta["val"]
    return [sym_expr(s) for s in val.shape]


def meta_layout(node: fx.Node, uniform: bool, val=None) -> tuple:
    """A layout from the node's symbolic shape: every symbolic dim a prefix."""
    val = node.meta["val"] if val is None else val
    return tuple(Dim((sym_expr(s),), uniform) if is_symbolic(sym_expr(s)) else None
                 for s in val.shape)


def unwrap(value, ctx: Context, real: bool = False):
    """Arguments for a plain call: tensors for Padded, bucket (or real) values for Size."""
    if isinstance(value, Padded):
        return value.tensor
    if isinstance(value, Size):
        return value.real if real else value.pad
    if isinstance(value, (list, tuple)):
        return type(value)(unwrap(v, ctx, real) for v in value)
    return value


def merge_dims(dims: list):
    """The layout of one output dim from its inputs' (broadcast ones left out)."""
    padded = [d for d in dims if d is not None]
    if not padded:
        return None
    varying = [d for d in padded if not d.uniform]
    if not varying:
        return padded[0]
    first = varying[0]
    other = next((d for d in varying[1:] if not d.same_elements(first)), None)
    if other is not None:
        raise DimsDiffer(f"an op combines dims padded differently: {first} and {other}",
                         (first, other))
    return first


def broadcast_layout(inputs: list, rank: int) -> tuple:
    """Right-aligned broadcast of the inputs' layouts to ``rank`` dims."""
    out = []
    for d in range(rank):
        dims = []
        for x in inputs:
            k = d - (rank - len(x.layout))
            if k >= 0:
                dims.append(x.layout[k])
        out.append(merge_dims(dims))
    return tuple(out)


def _norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def _norm_dims(dims, rank: int) -> list:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(_norm_dim(d, rank) for d in dims)


def _prefix_dim(x: Padded, d: int, what: str) -> Dim | None:
    dim = x.layout[d]
    if dim is not None and len(dim.factors) != 1:
        raise NotPaddable(f"{what} along a dim that merges padded dims")
    return dim


def _positions_along(ctx, x: Padded, d: int, index, what: str):
    """``index``, positions along ``x``'s dim ``d`` counted in real elements, as positions in
    its padded layout. A dim that merges padded factors (``view(b * s, d)``) holds real row
    ``i * s + j`` at ``i * S + j`` for a bucket of ``S``: the real position is split in the
    mixed radix of the real sizes and joined in that of the padded ones. Positions out of the
    real range stay out of the padded range (the outermost digit is not reduced)."""
    dim = x.layout[d]
    if dim is None or len(dim.factors) == 1:
        return index
    if index.dtype not in (torch.int64, torch.int32):
        raise NotPaddable(f"{what} along a dim that merges padded dims")
    return reradix(index, [evaluate(f, ctx.real_env) for f in dim.factors],
                   [evaluate(f, ctx.pad_env) for f in dim.factors])


def as_prefix(ctx, x: Padded, d: int) -> Padded:
    """``x`` with the real elements of its dim ``d`` moved to the front. A dim that merges
    padded factors (a grid of patches flattened to a sequence) becomes a prefix of their
    product, for ops that need the real elements in one run (ViT's class token ``cat``
    before the patches).

    Example::

        as_prefix(ctx, Padded(t, (Dim((h, w)),)), 0).layout == (prefix(h * w),)
    """
    dim = x.layout[d]
    if dim is None or len(dim.factors) == 1:
        return x
    return relaid(ctx, x, d, Dim((math.prod(dim.factors),), dim.uniform))


def relaid(ctx, x: Padded, d: int, target: Dim) -> Padded:
    """``x`` with its dim ``d`` laid out as ``target``, a layout of as many real elements
    (``(h, w)`` against ``(h * w,)``): each position of ``target`` gathers the real element
    of the same rank, split in the mixed radix of its padded factors, joined in the real
    one, then split in the real sizes of ``x``'s factors and joined in their padded ones."""
    dim = x.layout[d]
    there = [evaluate(f, ctx.pad_env) for f in target.factors]
    rank = reradix(aten.arange.default(math.prod(there), dtype=torch.int64), there,
                   [evaluate(f, ctx.real_env) for f in target.factors])
    source = reradix(rank, [evaluate(f, ctx.real_env) for f in dim.factors],
                     [evaluate(f, ctx.pad_env) for f in dim.factors])
    layout = list(x.layout)
    layout[d] = Dim(target.factors, dim.uniform)
    return Padded(gather_along(x.tensor, d, source), tuple(layout))


def gather_along(tensor, d: int, source):
    """``tensor``'s elements at positions ``source`` (traced int64) along dim ``d``; a position
    out of range (where the result holds padding) reads an element clamped into range.

    Example::

        gather_along(t, 1, real_n - 1 - arange(16))   # flipped, the real elements a prefix
    """
    last = max(tensor.shape[d] - 1, 0)
    return aten.index_select.default(tensor, d, aten.clamp.default(source, 0, last))


def agreeing(ctx, dims: list) -> dict:
    """Where operands lay out one dim of as many real elements in different ways (ViT's
    patches as a ``(h, w)`` grid against a length ``h * w``; Swin's tokens against its
    windows' ``(2, h, w)``), the ways to bring them to the layout with the most factors:
    {index in ``dims``: that layout}. ``dims``: per operand, its Dim there or None."""
    varying = [(i, dim) for i, dim in enumerate(dims) if dim is not None and not dim.uniform]
    if len(varying) < 2:
        return {}
    target = max((dim for _, dim in varying), key=lambda dim: len(dim.factors))
    total = math.prod(target.factors)
    return {i: target for i, dim in varying
            if not dim.same_elements(target)
            and same_size(math.prod(dim.factors), total, ctx.pad_env)}


def reradix(index, source: list, target: list):
    """``index``, row-major positions over dims of sizes ``source``, as the positions of the
    same elements over dims of sizes ``target`` (ints or traced 0-d int64 tensors): split in
    one mixed radix, joined in the other. The outermost digit is kept whole, so a position
    past the end stays past it.

    Example::

        reradix(torch.tensor([4]), [3, 3], [3, 8])   # tensor([9]): row 1, column 1
    """
    rest, position, stride = index, None, 1
    for size, size_there in zip(reversed(source[1:]), reversed(target[1:])):
        digit = aten.remainder.Tensor(rest, _int64(size))
        rest = aten.div.Tensor_mode(rest, _int64(size), rounding_mode="floor")
        term = aten.mul.Tensor(digit, _int64(stride))
        position = term if position is None else aten.add.Tensor(position, term)
        stride = stride * size_there
    last = aten.mul.Tensor(rest, _int64(stride))
    return last if position is None else aten.add.Tensor(position, last)


def _tensor_overload(op):
    # A Size used as a value is a traced tensor: the Scalar overload becomes the Tensor one
    # (clamp, clamp_min and clamp_max take their Scalars in their default overload).
    name = op._overloadname
    if "Scalar" in name:
        candidate = name.replace("Scalar", "Tensor")
    elif name == "default" and any(str(a.type) in ("number", "Optional[number]")
                                   for a in op._schema.arguments):
        candidate = "Tensor"
    else:
        return op
    packet = getattr(aten, op._schema.name.split("::")[1])
    if candidate in packet.overloads():
        return getattr(packet, candidate)
    raise NotPaddable(f"{op} takes a size as a scalar value")


def _numbers_as_tensors(op, args, kwargs):
    """``op``'s Scalar arguments given as plain numbers, as 0-d tensors (for its Tensor
    overload, with the same type promotion: a 0-d tensor promotes as a number does)."""
    scalar = {i: a.name for i, a in enumerate(op._schema.arguments)
              if str(a.type) in ("number", "Optional[number]")}

    def wrap(value):
        if isinstance(value, (bool, int, float)):
            return aten.scalar_tensor.default(
                value, dtype=torch.float64 if isinstance(value, float) else torch.int64)
        return value

    args = tuple(wrap(a) if i in scalar else a for i, a in enumerate(args))
    kwargs = {k: wrap(v) if k in scalar.values() else v for k, v in kwargs.items()}
    return args, kwargs


# --- generic rules (used by the tracer for ops without their own) -------------------------------

def pointwise(ctx, node, *args, **kwargs):
    """Elementwise ops: padding stays padding; sizes used as values are the real ones."""
    op = node.target
    sized = any(isinstance(a, Size) for a in list(args) + list(kwargs.values()))
    if sized:
        if op._overloadname == "default":   # clamp's other bound, a number, as a tensor too
            args, kwargs = _numbers_as_tensors(op, args, kwargs)
        op = _tensor_overload(op)
    tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, Padded)]
    compacted = _relaid_to_agree(ctx, tensors)
    if compacted:
        args = tuple(compacted.get(id(a), a) for a in args)
        kwargs = {k: compacted.get(id(v), v) for k, v in kwargs.items()}
        tensors = [compacted.get(id(t), t) for t in tensors]
    try:
        torch.broadcast_shapes(*(t.tensor.shape for t in tensors))
    except RuntimeError as exc:
        # A padded operand meets one whose size Dynamo made a constant under a guard
        # (``x.reshape(-1) * linspace(0, 1, x.numel())``): the graph only runs exact.
        raise NotPaddable(f"{op} combines a padded tensor with one of a fixed size: "
                          f"{exc}") from exc
    call_args, call_kwargs = unwrap(args, ctx, real=True), unwrap(kwargs, ctx, real=True)
    if sized:
        call_args, call_kwargs = _numbers_in_result_dtype(node, args, call_args, kwargs,
                                                          call_kwargs)
    result = op(*call_args, **call_kwargs)
    return Padded(result, broadcast_layout(tensors, result.dim()))


def _relaid_to_agree(ctx, tensors: list) -> dict:
    """Operands of an elementwise op relaid (``agreeing``) where they lay out a dim of as many
    real elements differently (BEiT's relative position index: a ``(h, w)`` grid's offsets
    written into a slice of length ``h * w``): {id of the operand: the operand relaid}."""
    rank = max((len(t.layout) for t in tensors), default=0)
    relaid_ones: dict = {}
    for d in range(rank):
        at = [(t, d - (rank - len(t.layout))) for t in tensors]
        at = [(t, k) for t, k in at if k >= 0]
        for i, target in agreeing(ctx, [t.layout[k] for t, k in at]).items():
            t, k = at[i]
            relaid_ones[id(t)] = relaid(ctx, relaid_ones.get(id(t), t), k, target)
    return relaid_ones


def _numbers_in_result_dtype(node, args, call_args, kwargs, call_kwargs):
    # A size or number given as a 0-d int64/float64 tensor promotes like a tensor: next to a
    # 0-d float32 (a loss times ``0.1 / num_classes``) the op ran in float64 and returned
    # float64. Eager takes them as Python numbers, computed in the result's float dtype.
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point:
        return call_args, call_kwargs

    def cast(original, value):
        if isinstance(original, Padded) or not isinstance(value, torch.Tensor) or \
                value.dtype == val.dtype:
            return value
        return aten._to_copy.default(value, dtype=val.dtype)

    return (tuple(cast(a, v) for a, v in zip(args, call_args)),
            {k: cast(kwargs[k], v) for k, v in call_kwargs.items()})


def same_layout(ctx, node, x, *args, **kwargs):
    return Padded(node.target(x.tensor, *unwrap(args, ctx), **unwrap(kwargs, ctx)), x.layout)


for _op in (aten.clone.default, aten._to_copy.default, aten.alias.default, aten.detach.default,
            aten.lift_fresh_copy.default, torch.ops.prims.view_of.default):
    RULES[_op] = same_layout

# src's values broadcast into self's shape and dtype, element by element: the functional form
# of a slice assignment (T5's and BART's shift_tokens_right, ``shifted[:, 1:] = ids[:, :-1]``)
RULES[aten.copy.default] = pointwise


@padding_rule(aten.view.dtype)
def view_dtype(ctx, node, x, dtype):
    # The bits of each element as another type of the same width: no element moves.
    if torch.empty((), dtype=dtype).element_size() != x.tensor.element_size():
        raise NotPaddable("view(dtype) to a type of another width")
    return Padded(aten.view.dtype(x.tensor, dtype), x.layout)


# --- shapes ------------------------------------------------------------------------------------

@padding_rule(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view(ctx, node, x, size):
    out = out_shape(node)
    try:
        layout = view_layout(x.layout, list(x.tensor.shape), out, ctx.pad_env)
    except NotPaddable as exc:
        known = [f for dim in x.layout if dim is not None for f in dim.factors]
        out = [simplified_size(e, ctx.pad_env, known) for e in out]
        try:
            layout = view_layout(x.layout, list(x.tensor.shape), out, ctx.pad_env)
        except NotPaddable:
            return _view_by_gather(ctx, out, x, exc)
    # A reshape: the padded program's strides are its own (a convolution over filled images
    # comes out contiguous where eager's was channels-last), and a functional graph's views
    # and copies hold the same values.
    return Padded(aten.reshape.default(x.tensor, unwrap(size, ctx)), layout)


def _view_by_gather(ctx, out: list, x: Padded, refused: NotPaddable) -> Padded:
    """``x.view(out)`` where the padded elements cannot keep their places (a padded dim split
    by a view, ``cat([a, b]).view(2, n)`` in an interpolation's indices; padded dims merged
    and regrouped): each real element of the output, at its place in a padding of each
    symbolic output dim at its end, is gathered from its place in ``x``. Row-major order of
    the real elements is what a view keeps: output position ``(i, j)`` is real element
    ``i * n + j``, found in ``x`` by splitting that number in the real sizes of ``x``'s
    factors and joining it in their padded ones."""
    if any(is_symbolic(e) and not prefix_holds(e, ctx.pad_env) for e in out):
        raise refused
    padded = [int(evaluate(e, ctx.pad_env)) for e in out]
    flat = None
    for d, (e, length) in enumerate(zip(out, padded)):
        shape = [1] * len(out)
        shape[d] = length
        position = aten.view.default(aten.arange.default(length, dtype=torch.int64), shape)
        flat = position if flat is None else aten.add.Tensor(
            aten.mul.Tensor(flat, _int64(evaluate(e, ctx.real_env))), position)
    factors = [f for dim, size in zip(x.layout, x.tensor.shape)
               for f in ((size,) if dim is None else dim.factors)]
    numel = x.tensor.numel()
    if flat is None or numel == 0:
        raise refused
    source = reradix(aten.reshape.default(flat, [-1]),
                     [evaluate(f, ctx.real_env) for f in factors],
                     [evaluate(f, ctx.pad_env) for f in factors])
    picked = gather_along(aten.reshape.default(x.tensor, [-1]), 0, source)
    return Padded(aten.reshape.default(picked, padded),
                  tuple(prefix(e) if is_symbolic(e) else None for e in out))


@padding_rule(aten.permute.default)
def permute(ctx, node, x, dims):
    rank = len(x.layout)
    dims = [_norm_dim(d, rank) for d in dims]
    return Padded(aten.permute.default(x.tensor, dims), tuple(x.layout[d] for d in dims))


@padding_rule(aten.transpose.int)
def transpose(ctx, node, x, a, b):
    rank = len(x.layout)
    a, b = _norm_dim(a, rank), _norm_dim(b, rank)
    layout = list(x.layout)
    layout[a], layout[b] = layout[b], layout[a]
    return Padded(aten.transpose.int(x.tensor, a, b), tuple(layout))


@padding_rule(aten.t.default)
def t(ctx, node, x):
    return Padded(aten.t.default(x.tensor), tuple(reversed(x.layout)))


@padding_rule(aten.unsqueeze.default)
def unsqueeze(ctx, node, x, dim):
    dim = _norm_dim(dim, len(x.layout) + 1)
    layout = list(x.layout)
    layout.insert(dim, None)
    return Padded(aten.unsqueeze.default(x.tensor, dim), tuple(layout))


@padding_rule(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
              torch.ops.prims.squeeze.default)
def squeeze(ctx, node, x, dims=None):
    in_shape = [sym_expr(s) for s in node.args[0].meta["val"].shape]
    rank = len(in_shape)
    dims = list(range(rank)) if dims is None else _norm_dims(dims, rank)
    gone = {d for d in dims if in_shape[d] == 1}
    result = node.target(x.tensor, *([] if node.target is aten.squeeze.default else
                                     [node.args[1]]))
    return Padded(result, tuple(l for d, l in enumerate(x.layout) if d not in gone))


@padding_rule(aten.expand.default)
def expand(ctx, node, x, size, implicit=False):
    shape = out_shape(node)
    offset = len(shape) - len(x.layout)
    layout = []
    for d, expr in enumerate(shape):
        k = d - offset
        source = x.layout[k] if k >= 0 else None
        if source is not None or (k >= 0 and x.tensor.shape[k] != 1):
            # not broadcast: a static dim whose size sympy spells with symbols stays static
            layout.append(source)
        elif is_symbolic(expr):  # broadcast along a padded dim: the same value everywhere
            layout.append(Dim((expr,), uniform=True))
        else:
            layout.append(None)
    return Padded(aten.expand.default(x.tensor, unwrap(size, ctx)), tuple(layout))


@padding_rule(aten.repeat.default)
def repeat(ctx, node, x, repeats):
    # A padded dim tiled k times is k blocks, each padded at its end: factors (k, *dim's).
    # A static dim tiled a dynamic number of times s is padded in its outer factor: (s, n).
    lead = len(repeats) - len(x.layout)
    layout = []
    for d, count in enumerate(repeats):
        inner = x.layout[d - lead] if d >= lead else None
        if isinstance(count, Size):
            if inner is not None:
                raise NotPaddable("repeat of a padded dim a dynamic number of times")
            n = x.tensor.shape[d - lead] if d >= lead else 1
            layout.append(Dim((count.expr,) if n == 1 else (count.expr, n), uniform=n == 1))
        elif inner is None or count == 1:
            layout.append(inner)
        else:
            layout.append(Dim((count, *inner.factors), uniform=inner.uniform))
    return Padded(aten.repeat.default(x.tensor, unwrap(repeats, ctx)), tuple(layout))


@padding_rule(aten.split_with_sizes.default, aten.split.Tensor)
def split(ctx, node, x, sizes, dim=0):
    dim = _norm_dim(dim, len(x.layout))
    if x.layout[dim] is not None:
        raise NotPaddable("split along a padded dim")
    if any(isinstance(s, Size) for s in (sizes if isinstance(sizes, (list, tuple)) else
                                         [sizes])):
        return _split_static_dim(ctx, node, x, dim)
    parts = node.target(x.tensor, unwrap(sizes, ctx), dim)
    return [Padded(p, x.layout) for p in parts]


def _split_static_dim(ctx, node, x: Padded, dim: int) -> list:
    """A static dim split by dynamic sizes (``x.split([k, 10 - k])``, ``k`` dynamic): each
    part its bucket's length from its real start, the real elements a prefix. Split at the
    bucket sizes instead, every part but the first started at the wrong element."""
    parts, start = [], 0
    for val in node.meta["val"]:
        out_expr = sym_expr(val.shape[dim])
        length = evaluate(out_expr, ctx.pad_env)
        index = aten.add.Tensor(aten.arange.default(length, dtype=torch.int64),
                                _as_tensor(start))
        layout = list(x.layout)
        layout[dim] = prefix(out_expr) if is_symbolic(out_expr) else None
        parts.append(Padded(gather_along(x.tensor, dim, index), tuple(layout)))
        start = aten.add.Tensor(_as_tensor(start), _as_tensor(evaluate(out_expr, ctx.real_env)))
    return parts


@padding_rule(aten.slice.Tensor)
def slice_(ctx, node, x, dim=0, start=None, end=None, step=1):
    rank = len(x.layout)
    dim = _norm_dim(dim, rank)
    layout = list(x.layout)
    in_expr = sym_expr(node.args[0].meta["val"].shape[dim])
    out_expr = out_shape(node)[dim]
    if x.layout[dim] is None:
        if isinstance(start, Size) or isinstance(end, Size):
            return _slice_static_dim(ctx, x, dim, start, out_expr, step)
        return Padded(aten.slice.Tensor(x.tensor, dim, start, end, step), x.layout)
    start = 0 if start is None else start
    if step != 1:
        return _strided_slice_to_the_end(ctx, x, dim, start, end, step, in_expr, out_expr)
    if isinstance(start, int) and start >= 0 and out_expr == in_expr:
        return x  # the whole dim (``x[:, 0]`` slices dim 0 whole first)
    _prefix_dim(x, dim, "a slice")
    if _unbounded_at_padding(out_expr):
        raise NotPaddable(f"a slice of length {out_expr}")
    length = evaluate(out_expr, ctx.pad_env)
    layout[dim] = prefix(out_expr) if is_symbolic(out_expr) else None
    if isinstance(start, int) and start >= 0:
        if start + length > x.tensor.shape[dim]:
            raise NotPaddable("a slice reaches past the padded size")
        return Padded(aten.slice.Tensor(x.tensor, dim, start, start + length), tuple(layout))
    # The start counts from the real end (x[-k:]) or is dynamic: gather from real positions.
    real_in = evaluate(in_expr, ctx.real_env)
    real_start = _real_start(start, real_in)
    real_start = aten.clamp.default(_as_tensor(real_start), 0)
    index = aten.add.Tensor(aten.arange.default(length, dtype=torch.int64), real_start)
    return Padded(gather_along(x.tensor, dim, index), tuple(layout))


def _strided_slice_to_the_end(ctx, x: Padded, dim: int, start, end, step, in_expr, out_expr):
    # x[:, k::2] (Swin's patch merging): element i is x[k + 2 * i], at the same place in a
    # prefix-padded dim, so the real ones are a prefix of the padded slice.
    if not (isinstance(start, int) and start >= 0 and _to_the_end(end, in_expr)):
        raise NotPaddable("a strided slice of a padded dim that stops before its end")
    _prefix_dim(x, dim, "a strided slice")
    result = aten.slice.Tensor(x.tensor, dim, start, None, step)
    if not prefix_holds(out_expr, ctx.pad_env) or \
            evaluate(out_expr, ctx.pad_env) != result.shape[dim]:
        raise NotPaddable(f"a strided slice of length {out_expr}")
    layout = list(x.layout)
    layout[dim] = prefix(out_expr)
    return Padded(result, tuple(layout))


def _to_the_end(end, in_expr) -> bool:
    """Whether a slice's ``end`` is its dim's end at every size (Python's ``x[k::2]``)."""
    return end is None or (isinstance(end, int) and end >= 2 ** 62) or (
        isinstance(end, Size) and end.expr == in_expr)


def _real_start(start, real_in):
    """Where a slice starting at ``start`` (or a select at that index) begins in a dim of
    ``real_in`` real elements: a negative start counts from the real end, as Python's does.
    A dynamic start (``x[-k:]`` with ``k`` dynamic: Hugging Face's ``logits_to_keep``) is
    negative at run time exactly when it is at the bucket, since Dynamo guards its sign (and
    a negative one is its own bucket, ``policy.bucket_of``); it was taken as an offset from
    the front (position -k, clamped to 0), which kept the first rows instead of the last."""
    if not isinstance(start, Size):
        return real_in + start
    if start.pad < 0:
        return aten.add.Tensor(_as_tensor(real_in), start.real)
    return start.real


def _unbounded_at_padding(expr) -> bool:
    # A length holding a remainder of a dynamic size is no bound of the real length at the
    # padded size (``s - 7 % s`` is 1 at a bucket of 8, 3 at a real 5): slicing that many
    # dropped real elements without an error.
    return is_symbolic(expr) and any(
        isinstance(e, (symfn.Mod, symfn.PythonMod, sympy.Mod)) and is_symbolic(e.args[1])
        for e in sympy.preorder_traversal(expr))


def _extended(tensor, dim: int, extra: int):
    """``tensor`` with ``extra`` zeros appended along ``dim`` (itself when ``extra`` <= 0)."""
    if extra <= 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = extra
    return aten.cat.default([tensor, aten.zeros.default(shape, dtype=tensor.dtype)], dim)

def _slice_static_dim(ctx, x: Padded, dim: int, start, out_expr, step):
    # x[:, :n] of a static cache (its first n positions, n dynamic): the bucket's length from
    # the same start, the dim first extended with zeros where the bucket reaches past it.
    # The real elements are the first n of those.
    start = 0 if start is None else start
    if step != 1 or not isinstance(start, int) or start < 0 or not is_symbolic(out_expr):
        raise NotPaddable("a static dim sliced by a dynamic size")
    length = evaluate(out_expr, ctx.pad_env)
    tensor = _extended(x.tensor, dim, start + length - x.tensor.shape[dim])
    layout = list(x.layout)
    layout[dim] = prefix(out_expr)
    return Padded(aten.slice.Tensor(tensor, dim, start, start + length), tuple(layout))


def _as_tensor(value):
    if isinstance(value, int):
        return aten.scalar_tensor.default(value, dtype=torch.int64)
    return value


@padding_rule(aten.select.int)
def select(ctx, node, x, dim, index):
    rank = len(x.layout)
    dim = _norm_dim(dim, rank)
    layout = tuple(l for d, l in enumerate(x.layout) if d != dim)
    if x.layout[dim] is None or (isinstance(index, int) and index >= 0):
        if isinstance(index, Size):
            raise NotPaddable("a static dim indexed by a dynamic size")
        return Padded(aten.select.int(x.tensor, dim, index), layout)
    _prefix_dim(x, dim, "select")
    in_expr = sym_expr(node.args[0].meta["val"].shape[dim])
    # A negative index counts from the real end, a dynamic one too (its bucket is its value:
    # policy.bucket_of); a gather at -2 picked row 0.
    real = _real_start(index, evaluate(in_expr, ctx.real_env))
    picked = gather_along(x.tensor, dim, aten.view.default(_as_tensor(real), [1]))
    return Padded(aten.squeeze.dim(picked, dim), layout)


@padding_rule(aten.cat.default)
def cat(ctx, node, tensors, dim=0):
    # cat skips 1-d empty tensors (a cache before its first write) whatever their rank
    # ... but not their dtype: cat(int64, empty float32) is float32
    dtype = node.meta["val"].dtype
    kept = [(t if t.tensor.dtype == dtype else
             Padded(aten._to_copy.default(t.tensor, dtype=dtype), t.layout),
             [sym_expr(s) for s in n.meta["val"].shape])
            for t, n in zip(tensors, node.args[0])
            if not (t.tensor.dim() == 1 and t.tensor.shape[0] == 0)]
    parts = [t for t, _ in kept]
    if not parts:
        # every part was a 1-d empty tensor: so is the result (a stack of empties is one)
        return Padded(aten.cat.default([t.tensor for t in tensors], dim), tensors[0].layout)
    rank = len(parts[0].layout)
    dim = _norm_dim(dim, rank)
    layout = [merge_dims([p.layout[d] for p in parts]) if d != dim else None
              for d in range(rank)]
    if len(parts) == 1:
        return Padded(aten.cat.default([parts[0].tensor], dim), parts[0].layout)
    if all(p.layout[dim] is None for p in parts):
        return Padded(aten.cat.default([p.tensor for p in parts], dim), tuple(layout))
    # The real elements must end up a prefix: each part after a padded one (a KV cache's new
    # block after the cached ones) is written again at its real offset, over the padding
    # before it. A part's padding lands past every real element written so far, and the
    # parts after it overwrite it in turn; the writes stay inside the padded size. A part
    # whose dim merges padded factors (ViT's patches after its class token) is made a prefix
    # first.
    layout[dim] = prefix(out_shape(node)[dim])
    kept = [(as_prefix(ctx, part, dim), shape) for part, shape in kept]
    result = aten.cat.default([part.tensor for part, _ in kept], dim)
    offset, shifted = 0, False
    for part, shape in kept:
        if shifted:
            result = _write_at(result, part.tensor, dim, offset)
        if part.layout[dim] is not None:
            shifted = True
        size = ctx.real_size(part, dim, shape[dim])
        offset = aten.add.Tensor(_as_tensor(offset), size) if shifted else offset + size
    return Padded(result, tuple(layout))


def _write_at(x, block, dim: int, offset):
    """``x`` with ``block`` written along ``dim`` from the traced position ``offset`` on (a
    dynamic-update-slice, as a scatter of the block's rows)."""
    length = block.shape[dim]
    shape = [1] * block.dim()
    shape[dim] = length
    positions = aten.add.Tensor(aten.arange.default(length, dtype=torch.int64),
                                _as_tensor(offset))
    index = aten.expand.default(aten.view.default(positions, shape), list(block.shape))
    return aten.scatter.src(x, dim, index, block)


@padding_rule(aten.constant_pad_nd.default)
def constant_pad(ctx, node, x, pad, value=0):
    # A padded dim padded by k after its end (a causal LM loss's ``pad(labels, (0, 1),
    # value=-100)``) holds the k values right after its real elements, where the bucket put
    # padding: that padding is set to the value first. Padding before the start keeps the real
    # elements a prefix as it is.
    rank = len(x.layout)
    pairs = [(rank - 1 - i, pad[2 * i], pad[2 * i + 1]) for i in range(len(pad) // 2)]
    moved = [(d, before, after) for d, before, after in pairs if _moves_elements(before, after)]
    if moved:  # by a size or a negative amount: each such dim on its own, then the rest
        for d, before, after in moved:
            x = _pad_by_real_amounts(ctx, node, x, d, before, after, value)
        pad = [0 if (d, b, a) in moved else v
               for (d, b, a) in pairs for v in (b, a)]
        if not any(pad):
            return x
    layout = list(x.layout)
    shape = out_shape(node)
    filled = []
    for d, before, after in ((rank - 1 - i, pad[2 * i], pad[2 * i + 1])
                             for i in range(len(pad) // 2)):
        if x.layout[d] is None or not (before or after):
            continue
        _prefix_dim(x, d, "constant_pad_nd")
        layout[d] = prefix(shape[d])
        if after:
            filled.append(d)
    tensor = ctx.fill(x, value, filled) if filled else x.tensor
    return Padded(aten.constant_pad_nd.default(tensor, unwrap(pad, ctx), value), tuple(layout))


def _moves_elements(before, after) -> bool:
    return any(isinstance(v, Size) or (isinstance(v, int) and v < 0) for v in (before, after))


def _pad_by_real_amounts(ctx, node, x: Padded, d: int, before, after, value) -> Padded:
    """``x`` padded along ``d`` by amounts known at run time, or cut by negative ones
    (TensorFlow-style "same" padding of a convolution's input, ``W % stride``'s complement; a
    window partition's ``-W % window``): output element i is real element ``i - before`` where
    that is one, else ``value``, its real elements a prefix of the bucket's output."""
    _prefix_dim(x, d, "constant_pad_nd")
    in_expr = sym_expr(node.args[0].meta["val"].shape[d])
    out_expr = sym_expr(node.meta["val"].shape[d])
    if not prefix_holds(out_expr, ctx.pad_env):
        raise NotPaddable(f"constant_pad_nd to a size {out_expr} that a smaller size outgrows")
    length = int(evaluate(out_expr, ctx.pad_env))
    real_in = _as_tensor(ctx.real_size(x, d, in_expr))
    start = _as_tensor(before.real if isinstance(before, Size) else before)
    source = aten.sub.Tensor(aten.arange.default(length, dtype=torch.int64), start)
    inside = aten.logical_and.default(aten.ge.Scalar(source, 0),
                                      aten.lt.Tensor(source, real_in))
    shape = [1] * len(x.layout)
    shape[d] = length
    picked = gather_along(x.tensor, d, source)
    result = aten.where.self(aten.view.default(inside, shape), picked,
                             _scalar(value, x.tensor.dtype))
    layout = list(x.layout)
    layout[d] = prefix(out_expr) if is_symbolic(out_expr) else None
    return Padded(result, tuple(layout))


# --- factories ---------------------------------------------------------------------------------

@padding_rule(aten.arange.default, aten.arange.start, aten.arange.start_step)
def arange(ctx, node, *args, **kwargs):
    if node.target is not aten.arange.default and isinstance(args[0], Size):
        raise NotPaddable("arange with a dynamic start")
    # arange(P) holds arange(n) in its prefix.
    result = node.target(*unwrap(args, ctx), **unwrap(kwargs, ctx))
    return Padded(result, meta_layout(node, uniform=False))


@padding_rule(aten.zeros.default, aten.ones.default, aten.empty.memory_format,
              aten.empty_strided.default, aten.full.default, aten.new_zeros.default,
              aten.new_ones.default, aten.new_empty.default, aten.new_full.default,
              aten.new_empty_strided.default, aten.scalar_tensor.default)
def factory(ctx, node, *args, **kwargs):
    values = list(args) + list(kwargs.values())
    if node.target in (aten.full.default, aten.new_full.default, aten.scalar_tensor.default) \
            and any(isinstance(v, Size) for v in values[1 if node.target is aten.full.default
                                                         else 0:]):
        # the fill value is a size: the real one, traced
        return _full_of_size(ctx, node, args, kwargs)
    result = node.target(*unwrap(args, ctx), **unwrap(kwargs, ctx))
    return Padded(result, meta_layout(node, uniform=True))


def _full_of_size(ctx, node, args, kwargs):
    val = node.meta["val"]
    fill = [v for v in list(args[1:] if node.target is not aten.scalar_tensor.default
                            else args) + list(kwargs.values()) if isinstance(v, Size)][0]
    shape = [evaluate(sym_expr(s), ctx.pad_env) for s in val.shape]
    real = aten._to_copy.default(fill.real, dtype=val.dtype)
    result = aten.expand.default(real, shape) if shape else real
    return Padded(aten.clone.default(result), meta_layout(node, uniform=True))


@padding_rule(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
              aten.empty_like.default, aten.rand_like.default, aten.randn_like.default)
def factory_like(ctx, node, x, *args, **kwargs):
    if any(isinstance(v, Size) for v in list(args) + list(kwargs.values())):
        raise NotPaddable(f"{node.target} filled with a size")
    uniform = node.target not in (aten.rand_like.default, aten.randn_like.default)
    layout = tuple(None if d is None else Dim(d.factors, uniform or d.uniform)
                   for d in x.layout)
    return Padded(node.target(x.tensor, *unwrap(args, ctx), **unwrap(kwargs, ctx)), layout)


# --- reductions --------------------------------------------------------------------------------

_IDENTITY = {
    "sum": lambda dtype: 0, "mean": lambda dtype: 0, "prod": lambda dtype: 1,
    "amax": lowest, "max": lowest, "argmax": lowest,
    "amin": highest, "min": highest, "argmin": highest,
    "any": lambda dtype: False, "all": lambda dtype: True, "logsumexp": lowest,
}


def _reduce_layout(x: Padded, dims, keepdim) -> tuple:
    if keepdim:
        return tuple(None if d in dims else l for d, l in enumerate(x.layout))
    return tuple(l for d, l in enumerate(x.layout) if d not in dims)


def _reduction(kind: str, dims_at: int | None, keepdim_at: int | None, positions=False):
    def rule(ctx, node, x, *args, **kwargs):
        rank = len(x.layout)
        call_args = list(args)
        dims_arg = None
        if dims_at is not None:
            dims_arg = call_args[dims_at - 1] if len(call_args) >= dims_at else kwargs.get("dim")
        dims = _norm_dims(dims_arg, rank)
        keepdim = False
        if keepdim_at is not None:
            keepdim = (call_args[keepdim_at - 1] if len(call_args) >= keepdim_at
                       else kwargs.get("keepdim", False))
        padded = [d for d in dims if x.layout[d] is not None]
        layout = _reduce_layout(x, dims, keepdim)
        if not padded:
            return _wrap(node.target(x.tensor, *unwrap(args, ctx), **unwrap(kwargs, ctx)),
                         layout)
        if positions:
            for d in padded:
                _prefix_dim(x, d, f"{kind} (it returns positions)")
        if kind == "mean":
            total = aten.sum.dim_IntList(ctx.fill(x, 0, padded), dims, keepdim,
                                         dtype=kwargs.get("dtype"))
            return Padded(aten.div.Tensor(total, real_count(ctx, x, node.args[0], dims)), layout)
        filled = ctx.fill(x, _IDENTITY[kind](x.tensor.dtype), padded)
        result = node.target(filled, *unwrap(args, ctx), **unwrap(kwargs, ctx))
        if positions and dims_arg is None and rank > 1:
            result = _real_flat_position(ctx, x, node, result)
        return _wrap(result, layout)
    return rule


def _real_flat_position(ctx, x: Padded, node, flat):
    """A position in the flattened padded tensor (argmax/argmin without a dim) as the
    position in the flattened real one: padding of any dim but the first lies between real
    elements, so the padded position (row * padded width + column) is not eager's."""
    shape = [sym_expr(s) for s in node.args[0].meta["val"].shape]
    padded_shape = list(x.tensor.shape)
    real, padded_stride, real_stride = None, 1, _as_tensor(1)
    for d in reversed(range(len(padded_shape))):
        coordinate = aten.floor_divide.Scalar(flat, padded_stride)
        if d:
            coordinate = aten.remainder.Scalar(coordinate, padded_shape[d])
        term = aten.mul.Tensor(coordinate, real_stride)
        real = term if real is None else aten.add.Tensor(real, term)
        real_stride = aten.mul.Tensor(real_stride, _as_tensor(ctx.real_size(x, d, shape[d])))
        padded_stride *= padded_shape[d]
    return real


def _wrap(result, layout):
    if isinstance(result, (tuple, list)):
        return [Padded(r, layout) for r in result]
    return Padded(result, layout)


def real_count(ctx, x, node_x, dims):
    """How many real elements ``x`` (the value of graph node ``node_x``) holds along ``dims``:
    a mean's or a pool's divisor, a tensor while the sizes are the call's.

    Example::

        real_count(ctx, x, node.args[0], [1])     # the real length of dim 1
    """
    shape = [sym_expr(s) for s in node_x.meta["val"].shape]
    count = 1
    for d in dims:
        count = count * ctx.real_size(x, d, shape[d])
    return count


for _op, _spec in {
    aten.sum.dim_IntList: ("sum", 1, 2), aten.sum.default: ("sum", None, None),
    aten.mean.dim: ("mean", 1, 2), aten.mean.default: ("mean", None, None),
    aten.prod.dim_int: ("prod", 1, 2), aten.prod.default: ("prod", None, None),
    aten.amax.default: ("amax", 1, 2), aten.amin.default: ("amin", 1, 2),
    aten.any.dim: ("any", 1, 2), aten.any.dims: ("any", 1, 2),
    aten.any.default: ("any", None, None),
    aten.all.dim: ("all", 1, 2), aten.all.dims: ("all", 1, 2),
    aten.all.default: ("all", None, None),
    aten.logsumexp.default: ("logsumexp", 1, 2),
}.items():
    RULES[_op] = _reduction(*_spec)
for _op, _spec in {
    aten.argmax.default: ("argmax", 1, 2), aten.argmin.default: ("argmin", 1, 2),
    aten.max.dim: ("max", 1, 2), aten.min.dim: ("min", 1, 2),
}.items():
    RULES[_op] = _reduction(*_spec, positions=True)
RULES[aten.max.default] = _reduction("max", None, None)
RULES[aten.min.default] = _reduction("min", None, None)
_norm_of_filled = _reduction("sum", 2, 3)


@padding_rule(aten.linalg_vector_norm.default)
def vector_norm(ctx, node, x, *args, **kwargs):
    # Zeros add nothing to a norm of order p >= 0 (ConvNeXt V2's global response
    # normalization) and are not counted by order 0; a negative order's zeros would win.
    order = args[0] if args else kwargs.get("ord", 2)
    if order < 0:
        raise NotPaddable(f"a vector norm of order {order} over a padded dim")
    return _norm_of_filled(ctx, node, x, *args, **kwargs)


@padding_rule(aten.var_mean.correction, aten.var.correction, aten.std.correction)
def variance(ctx, node, x, dims=None, correction=None, keepdim=False, **kwargs):
    rank = len(x.layout)
    dims = _norm_dims(dims, rank)
    padded = [d for d in dims if x.layout[d] is not None]
    layout = _reduce_layout(x, dims, keepdim)
    if not padded:
        result = node.target(x.tensor, dims, correction=correction, keepdim=keepdim, **kwargs)
        return _wrap(result, layout)
    correction = 1 if correction is None else correction
    count = real_count(ctx, x, node.args[0], dims)
    # Half widths in float32, rounded once at the end, as eager's kernel and the unpadded
    # decomposition: a float16 sum of squares past 65504 was inf (fuzz seed 6061).
    dtype = x.tensor.dtype
    if dtype in (torch.float16, torch.bfloat16):
        x = Padded(aten._to_copy.default(x.tensor, dtype=torch.float32), x.layout)
    scale = None
    if x.tensor.dtype == torch.float32 and node.target is not aten.var_mean.correction:
        # divided by a power of two near its largest magnitude first, as the unpadded
        # decomposition (reductions_scans.overflow_scale): var of 1e17-sized values was inf
        from ..lower.decompositions.reductions_scans import overflow_scale
        scale = overflow_scale(aten.amax.default(
            aten.abs.default(ctx.fill(x, 0, padded)), dims, True))
        x = Padded(aten.div.Tensor(x.tensor, scale), x.layout)
    mean = aten.div.Tensor(aten.sum.dim_IntList(ctx.fill(x, 0, padded), dims, True), count)
    centered = Padded(aten.sub.Tensor(x.tensor, mean), x.layout)
    squares = aten.mul.Tensor(ctx.fill(centered, 0, padded), ctx.fill(centered, 0, padded))
    var = aten.div.Tensor(aten.sum.dim_IntList(squares, dims, keepdim),
                          aten.clamp.default(aten.sub.Tensor(_as_tensor(count), correction), 0))
    if not keepdim:
        mean = aten.squeeze.dims(mean, dims)
    if scale is not None:
        scale = scale if keepdim else aten.squeeze.dims(scale, dims)
        var = aten.mul.Tensor(aten.mul.Tensor(var, scale), scale)
    if dtype != var.dtype and dtype.is_floating_point:
        if node.target is aten.std.correction:
            var = aten.sqrt.default(var)
        var, mean = (aten._to_copy.default(v, dtype=dtype) for v in (var, mean))
        if node.target is aten.std.correction:
            return Padded(var, layout)
    if node.target is aten.var_mean.correction:
        return [Padded(var, layout), Padded(mean, layout)]
    if node.target is aten.std.correction:
        return Padded(aten.sqrt.default(var), layout)
    return Padded(var, layout)


# --- contractions ------------------------------------------------------------------------------

def _contract(ctx, a: Padded, ka: int, b: Padded, kb: int):
    """a and b with the padding of their contracted dims zeroed (garbage could be inf/nan)."""
    if a.layout[ka] is None and b.layout[kb] is None:
        return a.tensor, b.tensor
    a, b = _laid_alike(ctx, a, ka, b, kb)
    merge_dims([a.layout[ka], b.layout[kb]])
    return ctx.fill(a, 0, [ka]), ctx.fill(b, 0, [kb])


def _laid_alike(ctx, a: Padded, ka: int, b: Padded, kb: int):
    """``a`` and ``b`` with their dims ``ka`` and ``kb`` in one layout (``agreeing``)."""
    relayout = agreeing(ctx, [a.layout[ka], b.layout[kb]])
    if 0 in relayout:
        a = relaid(ctx, a, ka, relayout[0])
    if 1 in relayout:
        b = relaid(ctx, b, kb, relayout[1])
    return a, b


@padding_rule(aten.mm.default)
def mm(ctx, node, a, b):
    ta, tb = _contract(ctx, a, 1, b, 0)
    return Padded(aten.mm.default(ta, tb), (a.layout[0], b.layout[1]))


@padding_rule(aten.bmm.default)
def bmm(ctx, node, a, b):
    a, b = _laid_alike(ctx, a, 0, b, 0)
    ta, tb = _contract(ctx, a, 2, b, 1)
    return Padded(aten.bmm.default(ta, tb),
                  (merge_dims([a.layout[0], b.layout[0]]), a.layout[1], b.layout[2]))


@padding_rule(aten.addmm.default)
def addmm(ctx, node, bias, a, b, beta=1, alpha=1):
    ta, tb = _contract(ctx, a, 1, b, 0)
    product = Padded(None, (a.layout[0], b.layout[1]))
    layout = broadcast_layout([bias, product], 2)
    return Padded(aten.addmm.default(bias.tensor, ta, tb, beta=beta, alpha=alpha), layout)


# --- softmax, cumulative ops, sorting ----------------------------------------------------------

@padding_rule(aten._softmax.default, aten._log_softmax.default)
def softmax(ctx, node, x, dim, half_to_float):
    dim = _norm_dim(dim, len(x.layout))
    return Padded(node.target(ctx.fill(x, -math.inf, [dim]), dim, half_to_float), x.layout)


@padding_rule(aten._softmax_backward_data.default)
def softmax_backward(ctx, node, grad, out, dim, dtype):
    dim = _norm_dim(dim, len(grad.layout))
    return Padded(node.target(ctx.fill(grad, 0, [dim]), ctx.fill(out, 0, [dim]), dim, dtype),
                  grad.layout)


@padding_rule(aten._log_softmax_backward_data.default)
def log_softmax_backward(ctx, node, grad, out, dim, dtype):
    dim = _norm_dim(dim, len(grad.layout))
    return Padded(node.target(ctx.fill(grad, 0, [dim]), ctx.fill(out, -math.inf, [dim]), dim,
                              dtype), grad.layout)


_SCAN_NEUTRAL = {aten.cumsum.default: 0, aten.cumprod.default: 1,
                 aten.logcumsumexp.default: -math.inf}


@padding_rule(*_SCAN_NEUTRAL)
def cumulative(ctx, node, x, dim, **kwargs):
    # A prefix sum at a real position reads only earlier positions: the padding that a merged
    # dim puts between real elements is made the scan's neutral element.
    dim = _norm_dim(dim, len(x.layout))
    return Padded(node.target(ctx.fill(x, _SCAN_NEUTRAL[node.target], [dim]), dim, **kwargs),
                  x.layout)


@padding_rule(aten.cummax.default, aten.cummin.default)
def cumulative_extreme(ctx, node, x, dim):
    # A running maximum at a real position reads only earlier positions, and its index counts
    # them: along a prefix the padding comes after every real element.
    dim = _norm_dim(dim, len(x.layout))
    _prefix_dim(x, dim, str(node.target))
    values, indices = node.target(x.tensor, dim)
    return [Padded(values, x.layout), Padded(indices, x.layout)]


def _diagonal_layout(ctx, node, x: Padded, offset, dim1: int, dim2: int) -> tuple:
    """The layout of ``x``'s diagonal over ``dim1`` and ``dim2`` (the other dims' own, then
    the diagonal's): element i of a padded diagonal is ``x[i + a, i + b]`` (a, b: the offset's
    parts), real for every i below the real length ``min(n1 - a, n2 - b)``, so the real
    elements are its first ones."""
    if not isinstance(offset, int):
        raise NotPaddable("a diagonal at a dynamic offset")
    for d in (dim1, dim2):
        _prefix_dim(x, d, "a diagonal")
    rest = [x.layout[d] for d in range(len(x.layout)) if d not in (dim1, dim2)]
    if x.layout[dim1] is None and x.layout[dim2] is None:
        return tuple(rest + [None])
    expr = sym_expr(node.meta["val"].shape[-1])
    return tuple(rest + [prefix(expr) if is_symbolic(expr) else None])


@padding_rule(aten.diagonal.default)
def diagonal(ctx, node, x, offset=0, dim1=0, dim2=1):
    # A contrastive loss's logits.diag() over a dynamic batch: the padded logits' diagonal
    # holds the real one first (its decomposition, a strided slice of the flattened dims, is
    # left whole at symbolic sizes).
    rank = len(x.layout)
    dim1, dim2 = _norm_dim(dim1, rank), _norm_dim(dim2, rank)
    layout = _diagonal_layout(ctx, node, x, offset, dim1, dim2)
    return Padded(aten.diagonal.default(x.tensor, offset, dim1, dim2), layout)


@padding_rule(aten.diagonal_scatter.default)
def diagonal_scatter(ctx, node, x, src, offset=0, dim1=0, dim2=1):
    # diagonal's backward: the padded diagonal's positions past the real length are padding
    # of x, so writing src's padding there leaves x's real elements as eager's.
    rank = len(x.layout)
    dim1, dim2 = _norm_dim(dim1, rank), _norm_dim(dim2, rank)
    expected = _diagonal_layout(ctx, node.args[1], x, offset, dim1, dim2)
    if [None if d is None else d.factors for d in src.layout] != \
            [None if d is None else d.factors for d in expected]:
        raise NotPaddable("a diagonal_scatter of a source laid out unlike the diagonal")
    return Padded(aten.diagonal_scatter.default(x.tensor, src.tensor, offset, dim1, dim2),
                  x.layout)


@padding_rule(aten.flip.default)
def flip(ctx, node, x, dims):
    # Reversed along a padded dim, the real elements would end the dim: element i of the
    # result is real element n - 1 - i instead, a prefix again (cumsum's backward flips its
    # gradient along the summed dim).
    rank = len(x.layout)
    dims = _norm_dims(dims, rank)
    static = [d for d in dims if x.layout[d] is None]
    tensor = aten.flip.default(x.tensor, static) if static else x.tensor
    shape = [sym_expr(s) for s in node.args[0].meta["val"].shape]
    for d in dims:
        if x.layout[d] is None:
            continue
        _prefix_dim(x, d, "flip")
        source = aten.sub.Tensor(aten.sub.Tensor(_as_tensor(ctx.real_size(x, d, shape[d])), 1),
                                 aten.arange.default(tensor.shape[d], dtype=torch.int64))
        tensor = gather_along(tensor, d, source)
    return Padded(tensor, x.layout)


@padding_rule(aten.sort.default, aten.sort.stable)
def sort(ctx, node, x, *args, **kwargs):
    if node.target is aten.sort.stable:
        _, dim, descending = (list(args) + [None, -1, False][len(args):])[:3]
        dim = kwargs.get("dim", dim)
        descending = kwargs.get("descending", descending)
    else:
        dim, descending = (list(args) + [-1, False][len(args):])[:2]
        dim = kwargs.get("dim", dim)
        descending = kwargs.get("descending", descending)
    dim = _norm_dim(dim, len(x.layout))
    if x.layout[dim] is None:
        return _wrap(node.target(x.tensor, *args, **kwargs), x.layout)
    _prefix_dim(x, dim, "sort")
    # Padding sorts behind every real element (stable, so real infinities, and NaN, the
    # largest, stay first); the positions returned are real positions, since the real
    # elements are a prefix.
    fill = lowest(x.tensor.dtype) if descending else _last_ascending(x.tensor.dtype)
    values, indices = aten.sort.stable(ctx.fill(x, fill, [dim]), stable=True, dim=dim,
                                       descending=descending)
    return [Padded(values, x.layout), Padded(indices, x.layout)]


@padding_rule(aten.topk.default)
def topk(ctx, node, x, k, dim=-1, largest=True, sorted=True):
    dim = _norm_dim(dim, len(x.layout))
    layout = tuple(None if d == dim else l for d, l in enumerate(x.layout))
    if x.layout[dim] is None:
        return _wrap(aten.topk.default(x.tensor, unwrap(k, ctx), dim, largest, sorted), layout)
    _prefix_dim(x, dim, "topk")
    if isinstance(k, Size):
        raise NotPaddable("topk with a dynamic k")
    # Padding never beats a real element: topk takes the lowest index among equal values,
    # and the real elements are a prefix (real infinities and NaN stay first).
    fill = lowest(x.tensor.dtype) if largest else _last_ascending(x.tensor.dtype)
    return _wrap(aten.topk.default(ctx.fill(x, fill, [dim]), k, dim, largest, sorted), layout)


def _last_ascending(dtype):
    # Eager orders NaN above +inf: a padding of +inf sorted before a real NaN (ascending sort
    # and topk(largest=False) of [1, nan] gave [1, inf]).
    return math.nan if dtype.is_floating_point else highest(dtype)


# --- indexing ----------------------------------------------------------------------------------

@padding_rule(INDEX_CHECK)
def index_check(ctx, node, index, size, dim, wraps, op, ignore=None):
    # lower/index_checks.py's mark. Only real indices are checked: the padding holds whatever
    # the padded computation left there, replaced by an index in range. Indexing along a
    # dynamic dim is checked against its real size (an input of the program), as eager
    # checks it: an index between the real size and the bucket's raises too.
    # A divisor's padding is 1, which its check passes (index_errors.DIVISOR_OPS).
    # An ignored index that is a size (BERT QA's ``ignore_index=start_logits.size(1)``) is
    # known only at run time: its elements are checked as an in-range 0 and put back after.
    ignored, given = None, index.tensor
    if isinstance(ignore, Size):
        ignored = aten.eq.Tensor(given, _int64(ignore.real))
        index = Padded(aten.where.self(ignored, _scalar(0, index.tensor.dtype), index.tensor),
                       index.layout)
        ignore = None
    fill = ignore if ignore is not None else 1 if op in DIVISOR_OPS else 0
    index_tensor = ctx.fill(index, fill)
    if isinstance(size, Size):
        checked = INDEX_CHECK_REAL(index_tensor, _int64(size.real), dim, wraps, op, ignore)
    else:
        checked = INDEX_CHECK(index_tensor, size, dim, wraps, op, ignore)
    if ignored is not None:
        checked = aten.where.self(ignored, given, checked)
    return Padded(checked, index.layout)


def _int64(value):
    return value if isinstance(value, torch.Tensor) else torch.tensor(int(value),
                                                                      dtype=torch.int64)


@padding_rule(aten._assert_async.msg)
def assert_async(ctx, node, condition, message):
    # A check PyTorch's decompositions leave in the graph (one_hot's class values): static
    # graphs run it on the host, padded ones dropped it (a class value out of range gave a row
    # of zeros where eager raises). A value check of the program now, raising ``message``.
    # (The condition reduces the real elements only: ``all``'s rule fills the padding.)
    failed = aten.where.self(condition.tensor, _scalar(0, torch.int64), _scalar(1, torch.int64))
    INDEX_CHECK(aten.reshape.default(failed, [1]), 1, 0, False, f"{ASSERT_OP}:{message}")
    return None


@padding_rule(aten.embedding.default)
def embedding(ctx, node, weight, indices, *args):
    if weight.padded:
        raise NotPaddable("an embedding table with a padded dim")
    return Padded(aten.embedding.default(weight.tensor, indices.tensor, *unwrap(args, ctx)),
                  indices.layout + (None,))


@padding_rule(aten.index_select.default)
def index_select(ctx, node, x, dim, index):
    dim = _norm_dim(dim, len(x.layout))
    layout = list(x.layout)
    layout[dim] = index.layout[0]
    positions = _positions_along(ctx, x, dim, index.tensor, "index_select")
    return Padded(aten.index_select.default(x.tensor, dim, positions), tuple(layout))


def _rows_meet(x: Padded, index: Padded, skip, what: str) -> None:
    """Raise unless ``index``'s element i meets ``x``'s element i, along every dim but
    ``skip``, at the same padded position: a gather reads, and a scatter writes, row i of
    ``x`` for row i of ``index``. Dims padded differently would pair real rows with other
    rows, or with padding (cross_entropy of logits and labels whose batch and length Dynamo
    named apart: their flattened dims are padded differently)."""
    for d in range(len(index.layout)):
        if d == skip:
            continue
        a, b = x.layout[d], index.layout[d]
        if a is not None and b is not None:
            merge_dims([a, b])
            continue
        one = a if b is None else b
        if one is not None and not one.uniform and len(one.factors) > 1:
            raise NotPaddable(f"{what} pairs a dim that merges padded dims with an unpadded one")


@padding_rule(aten.gather.default)
def gather(ctx, node, x, dim, index, sparse_grad=False):
    dim = _norm_dim(dim, len(x.layout))
    _rows_meet(x, index, dim, "gather")
    positions = _positions_along(ctx, x, dim, index.tensor, "gather")
    return Padded(aten.gather.default(x.tensor, dim, positions, sparse_grad=sparse_grad),
                  index.layout)


@padding_rule(aten.index.Tensor)
def index(ctx, node, x, indices):
    positions = [i for i, ix in enumerate(indices) if ix is not None]
    for d in positions:
        _prefix_dim(x, d, "indexing")
    if positions != list(range(positions[0], positions[-1] + 1)):
        raise NotPaddable("advanced indexing with separated index tensors")
    index_layout = broadcast_layout([indices[i] for i in positions],
                                    max(indices[i].tensor.dim() for i in positions))
    layout = x.layout[:positions[0]] + index_layout + x.layout[positions[-1] + 1:]
    result = aten.index.Tensor(x.tensor, [None if ix is None else ix.tensor for ix in indices])
    return Padded(result, layout)


@padding_rule(aten.index_put.default)
def index_put(ctx, node, x, indices, values, accumulate=False):
    given = [(d, ix) for d, ix in enumerate(indices) if ix is not None]
    for d, _ in given:
        _prefix_dim(x, d, "index_put")
    if not values.padded and not any(ix.padded for _, ix in given):
        return Padded(aten.index_put.default(x.tensor, unwrap(indices, ctx), values.tensor,
                                             accumulate), x.layout)
    if any(ix.tensor.dtype in (torch.bool, torch.uint8) for _, ix in given):
        raise NotPaddable("index_put with a padded boolean mask")
    index_layout = broadcast_layout([ix for _, ix in given],
                                    max(ix.tensor.dim() for _, ix in given))
    layout, covered = _values_layout(x, [d for d, _ in given], index_layout, values)
    values = Padded(values.tensor, layout)
    if accumulate:
        if not covered:  # padded entries would add the broadcast values somewhere real
            raise NotPaddable("index_put adding values broadcast along a padded dim")
        return _index_put_adding_zeros(ctx, x, indices, index_layout, values)
    return _index_put_dropping_padding(ctx, node, x, indices, index_layout, values)


def _values_layout(x: Padded, given: list, index_layout: tuple, values: Padded) -> tuple:
    """(``values``' layout, each dim merged with the dim of ``x[indices]`` it is written to;
    whether ``values`` has a dim for each padded dim of ``x[indices]``). A value lands at the
    padded position of its own row, which must be the same row of ``x``; one broadcast along
    a padded dim takes that dim's layout, so that its padding can be masked. ``x[indices]``
    has the broadcast indices' dims where the indexed dims were (first, if they are not next
    to each other), then ``x``'s other dims; values broadcast to it from the right."""
    if given == list(range(given[0], given[-1] + 1)):
        target = x.layout[:given[0]] + index_layout + x.layout[given[-1] + 1:]
    else:
        target = index_layout + tuple(l for d, l in enumerate(x.layout) if d not in given)
    rank = values.tensor.dim()
    if rank > len(target):
        raise NotPaddable("index_put with values of more dims than the indexed result")
    layout = []
    for written, own in zip(target[len(target) - rank:], values.layout):
        if own is not None and written is None:
            raise NotPaddable("index_put of values padded along a dim that is not")
        layout.append(merge_dims([written, own]))
    return tuple(layout), all(d is None for d in target[:len(target) - rank])


def _index_put_adding_zeros(ctx, x, indices, index_layout, values):
    # Padded positions add zero wherever their (garbage) index points.
    filled = ctx.fill(values, 0)
    return Padded(aten.index_put.default(x.tensor, unwrap(indices, ctx), filled, True),
                  x.layout)


def _index_put_dropping_padding(ctx, node, x, indices, index_layout, values):
    # A write replaces what is there, so a padded entry must not land on a real position
    # (nor race a real write to the same one): padded entries go to one extra slot past the
    # end of the first indexed dim, cut off afterwards (a static cache's prefill writing
    # cache_position = arange(prompt length)). values padded along x's own padded dims write
    # into x's padding.
    mask = ctx.mask(Padded(None, index_layout))
    if mask is None:  # only values padded, along x's own padded dims
        return Padded(aten.index_put.default(x.tensor, unwrap(indices, ctx), values.tensor,
                                             False), x.layout)
    shape = [sym_expr(s) for s in node.args[0].meta["val"].shape]
    first = next(d for d, ix in enumerate(indices) if ix is not None)
    size = x.tensor.shape[first]
    routed = []
    for d, ix in enumerate(indices):
        if ix is None:
            routed.append(None)
            continue
        # negative indices count from the real end, not from the extended one
        t = aten.where.self(aten.lt.Scalar(ix.tensor, 0),
                            aten.add.Tensor(ix.tensor, ctx.real_size(x, d, shape[d])), ix.tensor)
        routed.append(aten.where.self(mask, t, _scalar(size if d == first else 0, t.dtype)))
    written = aten.index_put.default(_extended(x.tensor, first, 1), routed, values.tensor, False)
    return Padded(aten.slice.Tensor(written, first, 0, size), x.layout)


@padding_rule(aten.scatter_add.default)
def scatter_add(ctx, node, x, dim, index, src):
    dim = _norm_dim(dim, len(x.layout))
    layout = broadcast_layout([index, src], src.tensor.dim())
    _rows_meet(x, Padded(None, layout), dim, "scatter_add")
    src_tensor = ctx.fill(Padded(src.tensor, layout), 0)
    # the backward of ``logits[arange(b), last]`` (sequence classification's pooling) adds
    # into ``view(b * s, c)`` at the real rows ``i * s + last[i]``
    positions = _positions_along(ctx, x, dim, index.tensor, "scatter_add")
    return Padded(aten.scatter_add.default(x.tensor, dim, positions, src_tensor), x.layout)


# --- normalization -----------------------------------------------------------------------------

@padding_rule(aten.native_layer_norm.default)
def layer_norm(ctx, node, x, shape, weight, bias, eps):
    k = len(shape)
    if any(d is not None for d in x.layout[-k:]):
        raise NotPaddable("layer_norm over a padded dim")
    out, mean, rstd = aten.native_layer_norm.default(x.tensor, unwrap(shape, ctx),
                                                     unwrap(weight, ctx), unwrap(bias, ctx), eps)
    stats_layout = x.layout[:-k] + (None,) * k
    return [Padded(out, x.layout), Padded(mean, stats_layout), Padded(rstd, stats_layout)]


@padding_rule(aten._native_batch_norm_legit_functional.default)
def batch_norm_training(ctx, node, x, weight, bias, running_mean, running_var, training,
                        momentum, eps):
    if any(d is not None for d in x.layout[1:]):
        raise NotPaddable("batch_norm with a padded channel or spatial dim")
    if x.layout[0] is None or not training:
        outs = node.target(x.tensor, *unwrap([weight, bias, running_mean, running_var], ctx),
                           training, momentum, eps)
        return [Padded(outs[0], x.layout)] + [Padded(o, (None,)) for o in outs[1:]]
    # Statistics over the real samples only; running_var takes the unbiased variance.
    dims = [0] + list(range(2, len(x.layout)))
    count = real_count(ctx, x, node.args[0], dims)
    total = aten.sum.dim_IntList(ctx.fill(x, 0, [0]), dims, True)
    mean = aten.div.Tensor(total, count)
    centered = Padded(aten.sub.Tensor(x.tensor, mean), x.layout)
    squares = ctx.fill(centered, 0, [0])
    var = aten.div.Tensor(aten.sum.dim_IntList(aten.mul.Tensor(squares, squares), dims, True),
                          count)
    rstd = aten.rsqrt.default(aten.add.Tensor(var, eps))
    out = aten.mul.Tensor(centered.tensor, rstd)
    shape = [1, -1] + [1] * (len(x.layout) - 2)
    if weight is not None:
        out = aten.mul.Tensor(out, aten.view.default(weight.tensor, shape))
    if bias is not None:
        out = aten.add.Tensor(out, aten.view.default(bias.tensor, shape))
    mean_c, var_c, rstd_c = (aten.view.default(v, [-1]) for v in (mean, var, rstd))
    unbiased = aten.div.Tensor(aten.mul.Tensor(var_c, count),
                               aten.clamp.default(aten.sub.Tensor(_as_tensor(count), 1), 1))
    new_mean = aten.add.Tensor(aten.mul.Tensor(running_mean.tensor, 1 - momentum),
                               aten.mul.Tensor(mean_c, momentum))
    new_var = aten.add.Tensor(aten.mul.Tensor(running_var.tensor, 1 - momentum),
                              aten.mul.Tensor(unbiased, momentum))
    return [Padded(out, x.layout), Padded(mean_c, (None,)), Padded(rstd_c, (None,)),
            Padded(new_mean, (None,)), Padded(new_var, (None,))]


@padding_rule(aten.scatter.value, aten.scatter.src)
def scatter(ctx, node, x, dim, index, src_or_value):
    # A write into position index[i][j] lands in row i of x: rows of padding only write into
    # rows of padding, as long as the scattered dim itself holds no padding of the index.
    dim = _norm_dim(dim, len(x.layout))
    _prefix_dim(x, dim, "scatter")
    if index.layout[dim] is not None:
        raise NotPaddable("scatter with an index padded along the scattered dim")
    if isinstance(src_or_value, Padded):
        _rows_meet(src_or_value, index, None, "scatter")
    layout = tuple(l if d == dim else merge_dims([l, index.layout[d]])
                   for d, l in enumerate(x.layout))
    source = src_or_value.tensor if isinstance(src_or_value, Padded) else unwrap(src_or_value,
                                                                                 ctx, real=True)
    return Padded(node.target(x.tensor, dim, index.tensor, source), layout)


@padding_rule(aten.slice_scatter.default)
def slice_scatter(ctx, node, x, src, dim=0, start=None, end=None, step=1):
    rank = len(x.layout)
    dim = _norm_dim(dim, rank)
    whole = step == 1 and sym_expr(node.args[1].meta["val"].shape[dim]) == \
        sym_expr(node.args[0].meta["val"].shape[dim])
    for d in range(rank):  # rows laid out differently (BEiT's ``index[1:, 1:] = grid``)
        if (d != dim or whole) and x.layout[d] is not None and src.layout[d] is not None:
            x, src = _laid_alike(ctx, x, d, src, d)
    # along dim, x's layout holding src's values too (a zeros tensor's is uniform: no more)
    written = x.layout[dim] if x.layout[dim] is None or src.layout[dim] is None or \
        src.layout[dim].uniform else Dim(x.layout[dim].factors)
    layout = tuple(merge_dims([x.layout[d], src.layout[d]]) if d != dim else written
                   for d in range(rank))
    if x.layout[dim] is None:
        if isinstance(start, Size) or isinstance(end, Size):
            raise NotPaddable("a static dim slice-scattered by a dynamic size")
        return Padded(aten.slice_scatter.default(x.tensor, src.tensor, dim, start, end, step),
                      layout)
    if whole:
        # src as long as x: the whole dim, whatever the bounds said (a sliding-window cache's
        # ``states[:, :, -4095:]`` of fewer states, in its backward): every element is src's.
        # Bounds spelled out: the lowering takes constant ones, not None.
        return Padded(aten.slice_scatter.default(x.tensor, src.tensor, dim, 0,
                                                 x.tensor.shape[dim]),
                      broadcast_layout([x, src], rank))
    start = 0 if start is None else start
    if step != 1:
        return _strided_slice_scatter_to_the_end(x, src, dim, start, end, step, layout,
                                                 sym_expr(node.args[0].meta["val"].shape[dim]))
    if not isinstance(start, int) or start < 0:
        raise NotPaddable("slice_scatter into a padded dim from its real end")
    _prefix_dim(x, dim, "slice_scatter")
    length = src.tensor.shape[dim]
    if start + length > x.tensor.shape[dim]:
        raise NotPaddable("slice_scatter reaches past the padded size")
    # Past the real end of src, keep x's elements: src's padding must not land on them.
    kept = aten.slice.Tensor(x.tensor, dim, start, start + length)
    mask = ctx.mask(src, [dim])
    source = src.tensor if mask is None else aten.where.self(mask, src.tensor, kept)
    return Padded(aten.slice_scatter.default(x.tensor, source, dim, start, start + length),
                  layout)


def _strided_slice_scatter_to_the_end(x: Padded, src: Padded, dim: int, start, end, step,
                                      layout, in_expr) -> Padded:
    # The backward of x[:, k::2] (Swin's patch merging): src's element i goes to k + 2 * i,
    # the same place in a prefix-padded dim; its padding (i past its real length) lands past
    # x's real end.
    if not (isinstance(start, int) and start >= 0 and _to_the_end(end, in_expr)):
        raise NotPaddable("a strided slice_scatter into a padded dim that stops before its end")
    _prefix_dim(x, dim, "a strided slice_scatter")
    size = x.tensor.shape[dim]
    if src.tensor.shape[dim] != len(range(start, size, step)):
        raise NotPaddable("a strided slice_scatter whose source is not the padded slice")
    return Padded(aten.slice_scatter.default(x.tensor, src.tensor, dim, start, size, step),
                  layout)
