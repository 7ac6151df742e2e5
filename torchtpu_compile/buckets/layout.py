"""Where the real elements of a padded tensor are: one ``Dim`` per padded dim.

A padded dim is a row-major product of factors, each either static (an ``int``) or padded (a
sympy expression of the dynamic symbols, with its real elements in the prefix of the factor).
``(2, s0)`` is ``x.view(2 * s0, d)`` of a ``(2, s0, d)`` tensor padded to ``(2, P, d)``: rows
``[0, n)`` and ``[P, P + n)`` are real. ``None`` stands for a dim without padding.

Example::

    dim = Dim((2, s0))
    dim.padded({s0: 128}) == 256
    mask = dim_mask(dim, {s0: 128}, {s0: n_tensor})   # bool[256], traced into the program
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import math
import operator
from fractions import Fraction
from dataclasses import dataclass

import sympy
import torch
from torch.utils._sympy import functions as symfn

aten = torch.ops.aten


class NotPaddable(Exception):
    """This graph cannot run exactly at a padded size; compile it for the exact shape.
    ``symbols``: where only some sizes are at fault (a size expression no rule evaluates on
    padded sizes, ``1 / sqrt(head_dim)``), those, which can be held at their real values
    (``holding``) while the others pick buckets."""

    def __init__(self, message: str, symbols: frozenset = frozenset()):
        super().__init__(message)
        self.symbols = frozenset(symbols)


class DimsDiffer(NotPaddable):
    """An op combines two padded dims whose sizes are spelled by different symbols (``dims``):
    exact only where those symbols are equal (``BucketedGraph`` may assume so)."""

    def __init__(self, message: str, dims: tuple):
        super().__init__(message)
        self.dims = dims


# Symbol -> the symbol it is taken to equal, while a graph is analyzed or a bucket traced
# (``assuming_equal``): Dynamo gives two tensors of one batch sizes of their own when they
# meet after a graph break (logits and labels), and only a product of them is guarded equal.
_EQUAL: contextvars.ContextVar = contextvars.ContextVar("torchtpu_equal_sizes", default=None)


@contextlib.contextmanager
def assuming_equal(aliases: dict):
    """Within the block, ``sym_expr`` and ``evaluate`` read each symbol of ``aliases`` as the
    one it maps to; the caller checks at run time that the real sizes are equal.

    Example::

        with assuming_equal({s97: s88}):
            sym_expr(labels_val.shape[0])   # s88
    """
    token = _EQUAL.set(aliases or None)
    try:
        yield
    finally:
        _EQUAL.reset(token)


# The graph's guards on one size symbol each (``Eq(Mod(s0, 4), 0)``, Swin's "no window
# padding needed" branch), while a bucket is traced (``under_guards``): every real size that
# reaches the bucket's program passed them, so sizes compared over "every size up to the
# bucket" need only hold at the sizes that pass.
_GUARDS: contextvars.ContextVar = contextvars.ContextVar("torchtpu_size_guards", default=None)


# Symbol -> its real value (a sympy Integer), for sizes held exact (``holding``): the graph is
# analyzed and traced as if Dynamo had made them static.
_HELD: contextvars.ContextVar = contextvars.ContextVar("torchtpu_held_sizes", default=None)


@contextlib.contextmanager
def holding(values: dict):
    """Within the block, ``sym_expr`` reads each symbol of ``values`` as its int value: those
    sizes are exact in every bucket, and the caller builds buckets per value.

    Example::

        with holding({s77: 64}):
            sym_expr(scale)   # 0.125, where the scale is 1 / sqrt(s77)
    """
    token = _HELD.set({s: sympy.Integer(v) for s, v in values.items()} or None)
    try:
        yield
    finally:
        _HELD.reset(token)


@contextlib.contextmanager
def under_guards(guards, pad_env: dict):
    """Within the block (a bucket of sizes ``pad_env`` traced), sizes compared at every value
    up to the bucket (``prefix_holds``, the equalities of ``view_layout`` and
    ``Dim.same_elements``) skip the values that fail one of ``guards`` (sympy relations of
    one symbol each; others are ignored).

    Example::

        with under_guards([sympy.Eq(Mod(s0, 2), 0)], {s0: 8}):
            constant_size(2 * ((s0 + Mod(s0, 2)) // 2) - s0, {s0: 8})   # 0
    """
    by_symbol: dict = {}
    for guard in guards:
        guard = _canonical(guard)
        if len(guard.free_symbols) == 1:
            by_symbol.setdefault(next(iter(guard.free_symbols)), []).append(guard)
    token = _GUARDS.set((by_symbol, {}, pad_env))
    try:
        yield
    finally:
        _GUARDS.reset(token)


def _passes_guards(symbol, n: int) -> bool:
    state = _GUARDS.get()
    if state is None:
        return True
    by_symbol, seen, _ = state
    if (symbol, n) not in seen:
        seen[(symbol, n)] = not any(_fails(g, symbol, n) for g in by_symbol.get(symbol, ()))
    return seen[(symbol, n)]


def _fails(guard, symbol, n: int) -> bool:
    try:
        return guard.xreplace({symbol: sympy.Integer(n)}) is sympy.false
    except (AssertionError, ZeroDivisionError, TypeError, ValueError):
        return False  # undecided at n (torch's size functions refuse negative operands)


@dataclass(frozen=True)
class Dim:
    """A padded dim: row-major ``factors``; ``uniform`` if values do not vary along it."""
    factors: tuple
    uniform: bool = False

    def padded(self, pad_env: dict) -> int:
        return math.prod(evaluate(f, pad_env) for f in self.factors)

    def same_elements(self, other: Dim) -> bool:
        mine, theirs = canonical_factors(self.factors), canonical_factors(other.factors)
        if mine == theirs:
            return True
        # While a bucket is traced: factors spelled apart but equal at every real size that
        # passes the guards, and at the bucket's (Swin's ``2 * (h // 2)`` against ``h``
        # under its guard that ``h`` is even).
        state = _GUARDS.get()
        if state is None or len(mine) != len(theirs):
            return False
        pad_env = state[2]
        return all(a == b or (is_symbolic(a) and is_symbolic(b)
                              and evaluate(a, pad_env) == evaluate(b, pad_env)
                              and _equal_up_to_bucket(a, b, pad_env))
                   for a, b in zip(mine, theirs))


def canonical_factors(factors) -> tuple:
    """``factors`` with each static factor that follows a padded one folded into it:
    ``(s, 2)`` holds rows ``2 * i + c`` for ``i < s``, the first ``2 * s`` of ``2 * S``, as
    ``(2 * s,)`` does (a view of ``(b, 2, s)`` as ``(b * 2, s)``, against ``(2 * b, s)``
    from its gradient). ``(2, s)`` differs from both: rows ``c * S + i``."""
    folded: list = []
    for f in factors:
        if isinstance(f, int) and folded and is_symbolic(folded[-1]):
            folded[-1] = folded[-1] * f
        else:
            folded.append(f)
    return tuple(folded)


def prefix(expr) -> Dim:
    """A dim whose real elements are its first ``expr`` positions."""
    return Dim((expr,))


def is_symbolic(expr) -> bool:
    return isinstance(expr, sympy.Expr) and not expr.is_number


def sym_expr(value):
    """A size as a sympy expression (or int): from a SymInt, an int or an expression."""
    if isinstance(value, torch.SymFloat):
        expr = _canonical(value.node.expr)
        return float(expr) if expr.is_number else expr
    if isinstance(value, torch.SymInt):
        value = value.node.expr
    if isinstance(value, sympy.Expr):
        expr = _canonical(value)
        return int(expr) if expr.is_number else expr
    return value


def _canonical(expr):
    aliases, held = _EQUAL.get(), _HELD.get()
    if aliases:
        expr = expr.xreplace(aliases)
    return expr.xreplace(held) if held else expr


_BINARY = {
    symfn.FloorDiv: operator.floordiv,
    symfn.Mod: operator.mod,
    symfn.PythonMod: operator.mod,
    symfn.CleanDiv: operator.floordiv,
}


def evaluate(expr, env: dict):
    """Value of a size expression with symbols from ``env`` (ints, or 0-d int64 tensors).

    Example::

        evaluate(2 * s0 - 1, {s0: 8}) == 15
    """
    if isinstance(expr, (int, float)):
        return expr
    if isinstance(expr, (torch.SymInt, torch.SymFloat)):
        expr = expr.node.expr
    held = _HELD.get()
    if held:
        expr = expr.xreplace(held)
    if expr.is_Integer:
        return int(expr)
    if expr.is_number:
        return float(expr)
    if expr.is_Symbol:
        expr = (_EQUAL.get() or {}).get(expr, expr)
        if expr not in env:
            raise NotPaddable(f"size symbol {expr} is not bound by any input")
        return env[expr]
    args = [evaluate(a, env) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return _fold(operator.add, args)
    if isinstance(expr, sympy.Mul):
        return _fold(operator.mul, args)
    if type(expr) in _BINARY:
        return _BINARY[type(expr)](*args)
    if isinstance(expr, (symfn.Max, sympy.Max)):
        return _fold(_maximum, args)
    if isinstance(expr, (symfn.Min, sympy.Min)):
        return _fold(_minimum, args)
    if isinstance(expr, (sympy.Pow, symfn.PowByNatural)) and isinstance(args[1], int):
        power = _fold(operator.mul, [args[0]] * abs(args[1])) if args[1] else 1
        return power if args[1] >= 0 else _true_divide(1, power)
    if isinstance(expr, symfn.ToFloat):  # sizes used as float values (BatchNorm's n / (n-1))
        return float(args[0]) if isinstance(args[0], int) else args[0].to(torch.float64)
    if isinstance(expr, (symfn.FloatTrueDiv, symfn.IntTrueDiv)):
        return _true_divide(*args)
    if isinstance(expr, (symfn.CeilToInt, symfn.FloorToInt)):  # math.ceil of a size ratio
        rounded = math.ceil if isinstance(expr, symfn.CeilToInt) else math.floor
        if isinstance(args[0], (int, float)):
            return rounded(args[0])
        return (torch.ceil if rounded is math.ceil else torch.floor)(args[0]).to(torch.int64)
    raise NotPaddable(f"size expression {expr} ({type(expr).__name__}) is not supported",
                      symbols=expr.free_symbols)


def _true_divide(a, b):
    """``a / b`` as Python divides sizes, in double precision: int64 tensors divide in the
    default dtype, float32, which rounded every float64 result built on the quotient (the 1/N
    of a batch norm's backward, a resize's scale)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.as_tensor(a, dtype=torch.float64) / torch.as_tensor(b, dtype=torch.float64)
    return a / b


def _fold(fn, values):
    result = values[0]
    for v in values[1:]:
        result = fn(result, v)
    return result


def _maximum(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return torch.maximum(torch.as_tensor(a), torch.as_tensor(b))


def _minimum(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return torch.minimum(torch.as_tensor(a), torch.as_tensor(b))


def never_shrinks(expr) -> bool:
    """Whether a size expression is built so that it never shrinks as its symbols grow: sums,
    products with positive ints, floor and ceiling divisions by them, max and min, of
    symbols and ints.

    Example::

        never_shrinks((s0 - 1) // 2 + 1)     # True
        never_shrinks(8 - s0)                # False
    """
    if isinstance(expr, sympy.Symbol) or expr.is_Integer:
        return True
    if isinstance(expr, sympy.Add):
        return all(never_shrinks(a) for a in expr.args)
    if isinstance(expr, sympy.Mul):
        ceiling = _ceiling_of(expr)  # -c * ((-x) // k): ceil mode's sizes
        if ceiling is not None:
            return never_shrinks(ceiling)
        return all(a > 0 if a.is_number else never_shrinks(a) for a in expr.args)
    if isinstance(expr, (sympy.Max, sympy.Min, symfn.Max, symfn.Min)):
        return all(never_shrinks(a) for a in expr.args)
    if isinstance(expr, symfn.FloorDiv):
        divisor = expr.args[1]
        return divisor.is_Integer and divisor > 0 and never_shrinks(expr.args[0])
    return False


def _ceiling_of(expr):
    """``x`` where ``expr`` is ``-c * ((-x) // k)``, sympy's spelling of ``c * ceil(x / k)``
    for positive ints c and k (an average pool's input padded to whole windows in ceil mode:
    ``-2 * ((-s0) // 2)``)."""
    if len(expr.args) != 2 or not (expr.args[0].is_Integer and expr.args[0] < 0) or \
            not isinstance(expr.args[1], symfn.FloorDiv):
        return None
    numerator, divisor = expr.args[1].args
    if not (divisor.is_Integer and divisor > 0):
        return None
    return -numerator


def prefix_holds(expr, pad_env: dict) -> bool:
    """Whether a dim of size ``expr``, at the bucket's sizes ``pad_env``, is at least as large as
    at every smaller real size, so that the real elements fit as a prefix: checked at each real
    value for an expression of one symbol (a remainder's complement, ``s + (-s) % 7``, grows
    in steps), else by its form (``never_shrinks``).

    Example::

        prefix_holds(s0 + Mod(-s0, 7), {s0: 16})    # True: 21 at 16, at most 21 below
    """
    if not is_symbolic(expr) or never_shrinks(expr):
        return True
    split = _by_symbol(expr)
    if split is None:  # symbols that do not separate: at each combination of their sizes
        top = evaluate(expr, pad_env)
        return _holds_on_grid(lambda env: evaluate(expr, env) <= top, expr.free_symbols,
                              pad_env)
    constant, terms = split
    if constant <= 0:
        return False
    # a product of several terms holds where each term is at most its bucket's value and
    # none is negative; a lone term only needs the first
    lowest = -math.inf if len(terms) == 1 else 0
    for symbol, term in terms.items():
        values = _values_up_to_bucket(term, symbol, pad_env)
        if values is None:
            return False
        top = evaluate(term, {symbol: pad_env[symbol]})
        if any(v is not None and not lowest <= v <= top for v in values):
            return False
    return True


def constant_size(expr, pad_env: dict):
    """The one value a symbolic size takes at every size up to the bucket's, or None: a
    window of a grid, ``X // (X // 2)``, is 2 wherever it is defined, which sympy does not
    see.

    Example::

        constant_size(X // (X // 2), {s0: 16})   # 2, X = s0 rounded up to even
    """
    if not is_symbolic(expr):
        return int(expr)
    split = _by_symbol(expr)
    if split is None or not split[0].is_Integer:
        return None
    value = int(split[0])
    for symbol, term in split[1].items():
        values = _values_up_to_bucket(term, symbol, pad_env)
        seen = {v for v in values or [None] if v is not None}
        if values is None or len(seen) != 1 or not isinstance(next(iter(seen)), int):
            return None
        value *= seen.pop()
    return value


def simplified_size(expr, pad_env: dict, known=()):
    """``expr`` with each part of one symbol that is one value (``constant_size``) replaced by
    that value, and each that equals one of the ``known`` sizes at every real size up to the
    bucket (under the graph's guards) replaced by it, so that sympy simplifies what is left:
    Dynamo's ``(h * w) // (2 * (X // 2))`` for a view's ``-1`` (``X``: ``h`` rounded up to
    even, under a guard that ``h`` is even) becomes ``w``.

    Example::

        simplified_size(s1 * (X // (X // 2)), {s0: 16, s1: 8})   # 2 * s1
    """
    known = [k for k in known if is_symbolic(k) and len(k.free_symbols) == 1]

    def walk(e):
        if not is_symbolic(e) or e.is_Symbol:
            return e
        if len(e.free_symbols) == 1:
            value = constant_size(e, pad_env)
            if value is not None:
                return sympy.Integer(value)
            for k in known:
                if k.free_symbols == e.free_symbols and same_size(e, k, pad_env):
                    return k
        return e.func(*(walk(a) for a in e.args))
    return walk(expr)


def of_one_symbol_each(expr) -> bool:
    """Whether ``expr`` is a product of factors of one symbol each (``h * (w // 2)``).

    Example::

        of_one_symbol_each(s0 * (s1 // 2))    # True
        of_one_symbol_each((s0 * s1) // 2)    # False
    """
    return _by_symbol(expr) is not None


def _by_symbol(expr):
    """``expr`` as (a number, {symbol: the product of its factors of that symbol alone}), or
    None where a factor holds two symbols: a grid's ``2 * h * (X // h) * w * (Y // w)``."""
    constant, terms = sympy.Integer(1), {}
    for factor in sympy.Mul.make_args(expr):
        symbols = factor.free_symbols
        if not symbols:
            constant *= factor
            continue
        if len(symbols) != 1:
            return None
        [symbol] = symbols
        symbol = (_EQUAL.get() or {}).get(symbol, symbol)
        terms[symbol] = terms.get(symbol, sympy.Integer(1)) * factor
    return constant, terms


def _values_up_to_bucket(expr, symbol, pad_env: dict):
    """``expr`` (of ``symbol`` alone) at each size from 1 to the symbol's bucket, None where it
    divides by zero or fails the graph's guards (no program runs at that size; the bucket's
    own size may fail them: its program runs at real sizes); None for a symbol without a
    bucket."""
    bucket = pad_env.get(symbol)
    if not isinstance(bucket, int):
        return None
    values = []
    for n in range(1, bucket + 1):
        try:
            values.append(evaluate(expr, {symbol: n}) if _passes_guards(symbol, n) else None)
        except ZeroDivisionError:
            values.append(None)
    return values


def factor_sizes(dim: Dim, env: dict) -> list:
    return [evaluate(f, env) for f in dim.factors]


def dim_mask(dim: Dim, pad_env: dict, real_env: dict):
    """bool[padded size]: True where the dim holds a real element (traced ops)."""
    sizes = factor_sizes(dim, pad_env)
    total = math.prod(sizes)
    index = aten.arange.default(total, dtype=torch.int64)
    valid = None
    stride = total
    for factor, size in zip(dim.factors, sizes):
        stride //= size
        if not is_symbolic(factor):
            continue
        component = index if stride == 1 else aten.div.Tensor_mode(index, stride,
                                                                    rounding_mode="floor")
        if stride * size != total:
            component = aten.remainder.Scalar(component, size)
        inside = aten.lt.Tensor(component, evaluate(factor, real_env))
        valid = inside if valid is None else aten.logical_and.default(valid, inside)
    if valid is None:  # only static factors: every position is real
        valid = aten.ones.default([total], dtype=torch.bool)
    return valid


# --- host side: real tensors <-> padded tensors ------------------------------------------------

def _factored(layout, shape_env: dict, real_shape) -> list:
    shape = []
    for d, dim in enumerate(layout):
        if dim is None:
            shape.append(real_shape[d])
        else:
            shape.extend(factor_sizes(dim, shape_env))
    return shape


def has_padding(layout) -> bool:
    return any(dim is not None for dim in layout)


def pad(tensor: torch.Tensor, layout, real_env: dict, pad_env: dict) -> torch.Tensor:
    """The real ``tensor`` laid out at the padded size (padding holds zeros).

    Example::

        pad(torch.ones(2, 3), (None, prefix(s0)), {s0: 3}, {s0: 8}).shape == (2, 8)
    """
    return pad_with(tensor, pad_plan(layout, real_env, pad_env, tensor.shape))


def pad_plan(layout, real_env: dict, pad_env: dict, shape) -> tuple | None:
    """What ``pad`` does to a tensor of ``shape`` at these sizes, worked out once (a decode
    loop pads at the same sizes call after call): None where nothing is padded, else (real
    factored shape, padded factored shape, the real region, padded shape)."""
    if not has_padding(layout):
        return None
    real = _factored(layout, real_env, shape)
    padded = _factored(layout, pad_env, shape)
    if real == padded:
        return None
    return real, padded, tuple(slice(0, r) for r in real), [
        math.prod(factor_sizes(dim, pad_env)) if dim is not None else s
        for dim, s in zip(layout, shape)]


def pad_with(tensor: torch.Tensor, plan) -> torch.Tensor:
    """``pad`` by a ``pad_plan``."""
    if plan is None:
        return tensor
    real, padded, region, shape = plan
    out = tensor.new_zeros(padded)
    out[region] = tensor.reshape(real)
    return out.reshape(shape)


def unpad(tensor: torch.Tensor, layout, real_env: dict, pad_env: dict) -> torch.Tensor:
    """The real elements of a padded ``tensor``, at their real shape, contiguous as eager's
    result would be: a strided view of the padded buffer would make Dynamo guard on its
    strides, and a KV cache fed back in would be traced again with a stride symbol."""
    return unpad_with(tensor, unpad_plan(layout, real_env, pad_env, tensor.shape))


def unpad_plan(layout, real_env: dict, pad_env: dict, shape) -> tuple | None:
    """What ``unpad`` does to a padded tensor of ``shape`` at these sizes: None where it is
    the real tensor, else (padded factored shape, the real region, real shape, the narrows
    that cut it back as (dim, length) pairs, whether the factored shapes differ from the
    tensor's: a reshape in and out that a decode step's KV cache does not need)."""
    if not has_padding(layout):
        return None
    real = _factored(layout, real_env, shape)
    padded = _factored(layout, pad_env, shape)
    if real == padded:
        return None
    real_shape = [math.prod(factor_sizes(dim, real_env)) if dim is not None else s
                  for dim, s in zip(layout, shape)]
    narrows = tuple((dim, r) for dim, (r, p) in enumerate(zip(real, padded)) if r != p)
    return (padded, tuple(slice(0, r) for r in real), real_shape, narrows,
            list(shape) != padded or real != real_shape)


def unpad_with(tensor: torch.Tensor, plan) -> torch.Tensor:
    """``unpad`` by an ``unpad_plan``."""
    if plan is None:
        return tensor
    padded, _, real_shape, narrows, factored = plan
    if factored:
        tensor = tensor.reshape(padded)
    for dim, length in narrows:  # narrow, not indexing by slices: a third of the host time
        tensor = tensor.narrow(dim, 0, length)
    tensor = tensor.contiguous()
    return tensor.reshape(real_shape) if factored else tensor


def unpad_outputs(results: list, plan_outputs: list, real_env: dict, pad_env: dict) -> list:
    """A bucket program's outputs at the real sizes, from its ``results`` and the plan's
    ``outputs`` (``BucketPlan.outputs``): padded tensors cut back, sizes evaluated, values as
    they are. The compile path's runner and the AOT loader both read plans through this.

    Example::

        unpad_outputs([y], [("tensor", 0, (prefix(s0),)), ("size", s0)], {s0: 3}, {s0: 8})
        # [y[:3], 3]
    """
    return outputs_by(results, outputs_plan(results, plan_outputs, real_env, pad_env))


def outputs_plan(results: list, plan_outputs: list, real_env: dict, pad_env: dict) -> list:
    """What ``unpad_outputs`` does at these sizes, worked out once: per output, ("tensor",
    program index, ``unpad_plan``) or ("value", v)."""
    plans = []
    for kind, *rest in plan_outputs:
        if kind == "tensor":
            index, layout = rest
            plans.append(("tensor", index,
                          unpad_plan(layout, real_env, pad_env, results[index].shape)))
        elif kind == "size":
            plans.append(("value", int(evaluate(rest[0], real_env))))
        else:
            plans.append(("value", rest[0]))
    return plans


def outputs_by(results: list, plans: list, skip=()) -> list:
    """``unpad_outputs`` by an ``outputs_plan``; None for the outputs in ``skip`` (indices
    whose value the caller makes otherwise: ``write_back.py``)."""
    return [None if k in skip else (unpad_with(results[rest[0]], rest[1])
                                    if kind == "tensor" else rest[0])
            for k, (kind, *rest) in enumerate(plans)]


# --- views -------------------------------------------------------------------------------------

def view_layout(layout, in_shape, out_exprs, pad_env: dict):
    """The layout of ``x.view(out)``: factors regrouped into the output dims, or NotPaddable.

    A padded factor cannot be split by a view (its real elements would scatter), static ones
    can. ``out_exprs`` are the symbolic output sizes, which check the regrouping.
    """
    atoms = []  # (padded size, factor)
    for dim, size in zip(layout, in_shape):
        if dim is None:
            atoms.append((size, size))
        else:
            atoms.extend(zip(factor_sizes(dim, pad_env), dim.factors))
    atoms = [a for a in atoms if a[0] != 1 or is_symbolic(a[1])]
    out = []
    for expr in out_exprs:
        target = evaluate(expr, pad_env)
        taken, product = [], 1
        while product < target or (product == target and atoms and atoms[0][0] == 1):
            if not atoms:
                raise NotPaddable("a view does not line up with the padded layout")
            size, factor = atoms.pop(0)
            if product * size <= target:
                taken.append(factor)
                product *= size
                continue
            if product == 1 and _splits_as(factor, expr, size, target, pad_env):
                # a padded size that is always a multiple of its inner size (a window
                # partition's ``s + (-s) % 7``, viewed as ``(... // 7, 7)``): real rows first
                atoms[:0] = [(target, expr), (size // target,) * 2]
                continue
            coefficient, rest = sympy.sympify(factor).as_coeff_Mul()
            if is_symbolic(factor) and coefficient > 1 and coefficient.is_Integer:
                # ``(k * s,)`` holds what ``(s, k)`` does (canonical_factors): split that way
                atoms[:0] = [(size // int(coefficient), rest), (int(coefficient),) * 2]
                continue
            need = target // product
            if is_symbolic(factor) or target % product or size % need:
                raise NotPaddable("a view splits a padded dim")
            taken.append(need)
            atoms.insert(0, (size // need, size // need))
            product *= need
        if product != target:
            raise NotPaddable("a view does not line up with the padded layout")
        symbolic = [f for f in taken if is_symbolic(f)]
        if not symbolic:
            out.append(None)
            continue
        merged = canonical_factors(_merge_static(taken))
        if len(merged) == 1 and _equal_up_to_bucket(merged[0], expr, pad_env):
            out.append(prefix(expr))  # (s // 7, 7) back into s + (-s) % 7: its first rows
            continue
        if not same_size(sympy.Mul(*taken), expr, pad_env):
            raise NotPaddable(f"a view regroups padded dims into {expr} ambiguously")
        out.append(Dim(tuple(_merge_static(taken))))
    if any(is_symbolic(a[1]) for a in atoms):
        raise NotPaddable("a view drops a padded dim")
    return tuple(out)


def _splits_as(factor, outer, size: int, target: int, pad_env: dict) -> bool:
    """Whether ``factor`` (padded size ``size``) is ``outer * k`` for a static ``k`` at every
    real size up to the bucket's, ``outer`` one symbol's size of padded size ``target``."""
    if not (is_symbolic(factor) and is_symbolic(outer)) or size % target or size == target:
        return False
    return _equal_up_to_bucket(factor, (size // target) * outer, pad_env)


def same_size(a, b, pad_env: dict) -> bool:
    """Whether sizes ``a`` and ``b`` are equal at every real size up to the bucket's: by
    sympy's algebra, else value by value (``_equal_up_to_bucket``).

    Example::

        same_size(7 * ((s0 + 6) // 7), s0 + Mod(-s0, 7), {s0: 16})   # True
    """
    return a == b or sympy.simplify(a - b) == 0 or _equal_up_to_bucket(a, b, pad_env)


def _equal_up_to_bucket(a, b, pad_env: dict) -> bool:
    """Whether sizes ``a`` and ``b`` are equal at every size up to the bucket's, where each is a
    product of factors of one symbol each, compared symbol by symbol: the ratio of their
    factors of one symbol must be one number at every size of that symbol (sympy does not
    simplify ``7 * ((s + 6) // 7) - (s + (-s) % 7)`` to 0, nor a window grid's
    ``h * (X // h)`` to ``2 * h``)."""
    if a == b:
        return True
    if not (is_symbolic(a) and is_symbolic(b)):
        return False
    split_a, split_b = _by_symbol(a), _by_symbol(b)
    if split_a is None or split_b is None:
        return _equal_on_grid(a, b, pad_env)
    if split_a[1].keys() != split_b[1].keys():
        return False
    ratio = Fraction(int(split_a[0])) / Fraction(int(split_b[0])) \
        if split_a[0].is_Integer and split_b[0].is_Integer and split_b[0] != 0 else None
    if ratio is None:
        return False
    for symbol in split_a[1]:
        values_a = _values_up_to_bucket(split_a[1][symbol], symbol, pad_env)
        values_b = _values_up_to_bucket(split_b[1][symbol], symbol, pad_env)
        if values_a is None or values_b is None:
            return False
        ratios = set()
        for va, vb in zip(values_a, values_b):
            if va is None or vb is None:
                continue
            if not (isinstance(va, int) and isinstance(vb, int)):
                return False
            if vb == 0 or va == 0:
                if va != vb:
                    return False
                continue
            ratios.add(Fraction(va, vb))
        if len(ratios) > 1:
            return False
        ratio *= ratios.pop() if ratios else 1
    return ratio == 1


_GRID_POINTS = 4096


def _equal_on_grid(a, b, pad_env: dict) -> bool:
    """Whether ``a`` and ``b`` are equal at every combination of their symbols' sizes up to
    the buckets that passes the graph's guards, for sizes whose symbols do not separate
    (Dynamo's ``(h * w) // (2 * (X // 2))`` for a view's ``-1``), where the combinations
    are few."""
    return _holds_on_grid(lambda env: evaluate(a, env) == evaluate(b, env),
                          a.free_symbols | b.free_symbols, pad_env)


def _holds_on_grid(check, symbols, pad_env: dict) -> bool:
    """Whether ``check(env)`` holds at every combination of ``symbols``' sizes from 1 to
    their buckets that passes the graph's guards (skipping those that divide by zero); False
    outside a bucket's trace or where the combinations are too many to try."""
    symbols = sorted(symbols, key=str)
    if _GUARDS.get() is None or not symbols:
        return False  # outside a bucket's trace: no guards to narrow the grid
    axes = []
    for symbol in symbols:
        bucket = pad_env.get(symbol)
        if not isinstance(bucket, int) or bucket < 1:  # a negative int argument: no grid
            return False
        axes.append([n for n in range(1, bucket + 1) if _passes_guards(symbol, n)])
    if math.prod(len(axis) for axis in axes) > _GRID_POINTS:
        return False
    for values in itertools.product(*axes):
        try:
            if not check(dict(zip(symbols, values))):
                return False
        except ZeroDivisionError:
            continue
    return True


def _merge_static(factors):
    merged = []
    for f in factors:
        if isinstance(f, int) and merged and isinstance(merged[-1], int):
            merged[-1] *= f
        elif f != 1:
            merged.append(f)
    return merged or [1]
