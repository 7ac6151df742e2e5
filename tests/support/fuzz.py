"""Differential fuzzing: small seeded random programs run on eager CPU PyTorch (the reference)
and on torchtpu's paths, every result compared. ``program(seed)`` draws one; ``check(prog,
path)`` runs it on a path and returns None or the mismatch; ``minimize`` shrinks a failing
program to the lines that still fail.

Per-op sweeps (``tests/support/opinfo``) pass; wrong results hide in compositions: views and
in-place writes, dtype promotion across ops, float/int conversions, indices computed from data,
special values (NaN, inf, -0.0, integer extremes) flowing through several ops. A program here
is Python source: a few input tensors built from literals (some transposed, strided, offset or
expanded views), then ``ops`` statements drawn from ``TEMPLATES`` (one decorator per template),
each kept only if eager CPU accepts it (so shape and dtype rules are eager's own), or, at the
end and rarely, one eager rejects (then every path must raise its exception type). The function
returns every value it made; the inputs are compared after the call too (in-place writes).

Paths (``PATHS``): ``compile`` (``torch.compile(backend="torchtpu")`` on CPU tensors),
``dynamic`` (the same with ``dynamic=True``), ``eager`` (the tpu device, strict) and ``fuse``
(the tpu device in defer-and-fuse mode). Repro from the command line::

    python -m tests.support.fuzz --seeds 0:200 --paths compile,eager,fuse --jobs 1
    python -m tests.support.fuzz --seeds 17 --paths fuse --minimize --show
"""
from __future__ import annotations

import argparse
import dataclasses
import math
import random
import re
import sys
import time
import traceback

import torch

from .opinfo.errors import unwrap

FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
INTS = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
DTYPES = FLOATS + INTS + (torch.bool,)
#: Tolerances per dtype: tight (assert_close's defaults, a little more atol for f32 chains).
TOLERANCES = {torch.float32: dict(rtol=1.3e-6, atol=1e-5),
              torch.float64: dict(rtol=1e-7, atol=1e-7),
              torch.float16: dict(rtol=1e-3, atol=1e-3),
              torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}
#: ... and of a training program's gradients: each sums, over every output its input reached,
#: values weighted up to 3.5, and where the true gradient is 0 the cancellation leaves float32
#: rounding of 1e-5 on eager CPU as on ours (seed 6142: group_norm of one element per group,
#: whose weight's gradient is 0, ±5.7e-6).
GRAD_TOLERANCES = {**TOLERANCES, torch.float32: dict(rtol=1e-5, atol=5e-5)}
SPECIAL_FLOATS = (math.nan, math.inf, -math.inf, -0.0, 0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, -7.0,
                  1e-3, 1e30, -1e30, 100.25)
SHAPES = ((), (1,), (4,), (3, 1), (2, 3), (3, 3), (0,), (0, 3), (2, 1, 3), (1, 3))


# ----------------------------------------------------------------------------------- inputs

def _scalar_source(value, dtype) -> str:
    if dtype == torch.bool:
        return "True" if value else "False"
    if dtype.is_floating_point:
        return f"float('{value}')" if not math.isfinite(value) else repr(float(value))
    return str(int(value))


def _values(rng: random.Random, n: int, dtype) -> list:
    if dtype == torch.bool:
        return [rng.random() < 0.5 for _ in range(n)]
    if dtype.is_floating_point:
        special = rng.random() < 0.6
        return [rng.choice(SPECIAL_FLOATS) if special and rng.random() < 0.4
                else round(rng.uniform(-6, 6) * 4) / 4 for _ in range(n)]
    info = torch.iinfo(dtype)
    extremes = (info.min, info.max, info.min + 1, info.max - 1, 0, -1 if info.min < 0 else 1)
    extreme = rng.random() < 0.3
    return [rng.choice(extremes) if extreme and rng.random() < 0.3
            else rng.randint(max(info.min, -9), min(info.max, 9)) for _ in range(n)]


def _nested(flat, shape) -> str:
    """Source of a nested list of ``shape`` holding the literals ``flat``."""
    if not shape:
        return flat[0]
    step = len(flat) // shape[0] if shape[0] else 0
    return "[" + ", ".join(_nested(flat[i * step:(i + 1) * step], shape[1:])
                           for i in range(shape[0])) + "]"


def _input_source(rng: random.Random, shape, dtype) -> str:
    """Source that builds a tensor of ``shape`` and ``dtype`` on device ``dev``: contiguous or a
    transposed, strided, offset or expanded view of a bigger tensor."""
    base, suffix = _layout(rng, shape)
    n = math.prod(base)
    flat = [_scalar_source(v, dtype) for v in _values(rng, n, dtype)]
    if n == 0:  # a nested empty list loses the other dims
        return f"torch.empty({tuple(base)}, dtype={dtype}, device=dev){suffix}"
    return f"torch.tensor({_nested(flat, base)}, dtype={dtype}, device=dev){suffix}"


def _layout(rng: random.Random, shape, expand=True) -> tuple:
    """(the shape of a base tensor, the source of a view of it that has ``shape``): the base
    itself, or a transposed, strided, offset or (where ``expand``) expanded view."""
    layouts = ["contiguous"]
    if len(shape) >= 2:
        layouts += ["transposed", "strided"]
    if len(shape) >= 1:
        layouts += ["offset", "expanded"] if expand else ["offset"]
    layout = rng.choice(layouts)
    base, suffix = list(shape), ""
    if layout == "transposed":
        base[-1], base[-2] = base[-2], base[-1]
        suffix = ".transpose(-1, -2)"
    elif layout == "strided":
        base[-1] *= 2
        suffix = "[..., ::2]"
    elif layout == "offset":
        base[0] += 1
        suffix = "[1:]"
    elif layout == "expanded":
        base[0] = 1
        suffix = f".expand({', '.join(map(str, shape))})"
    return base, suffix


# -------------------------------------------------------------------------------- templates

#: name -> (weight, function(rng, env) -> a statement's right-hand side, or None to skip,
#: generation).
TEMPLATES: dict = {}
#: The generation ``program`` draws from by default. A template joins a later generation, so
#: that the programs of earlier seeds (and the slow sweep's known seeds) stay what they were.
GENERATION = 1


def template(weight: float = 1.0, generation: int = 1):
    """Register an op template: ``fn(rng, env)`` returns source over the names in ``env``
    (name -> eager value) or None when ``env`` has nothing it applies to; programs of
    ``generation`` or later draw it.

    Example::

        @template(2)
        def neg(rng, env):
            return f"torch.neg({pick(rng, env)})"
    """
    def register(fn):
        TEMPLATES[fn.__name__] = (weight, fn, generation)
        return fn
    return register


def pick(rng, env, want=lambda t: True):
    """A random name in ``env`` whose value satisfies ``want``, or None."""
    names = [n for n, v in env.items() if isinstance(v, torch.Tensor) and want(v)]
    return rng.choice(names) if names else None


def _is_float(t):
    return t.is_floating_point()


def _is_int(t):
    return not t.is_floating_point() and t.dtype != torch.bool


def _nonempty(t):
    return t.numel() > 0


def _dim(rng, t):
    return rng.randrange(-t.dim(), t.dim()) if t.dim() else 0


ROUNDING_MODES = ("None", "'floor'", "'trunc'")


def _scalar(rng):
    return rng.choice(("2", "-3", "0.5", "1.5", "-2.5", "7", "True", "1e-3", "-0.0"))


def _index(rng, env, size):
    """An int64 index expression in [0, size) built from some tensor's data, or None."""
    source = pick(rng, env, lambda t: t.dim() >= 1 and t.numel() > 0 and not t.is_complex())
    if source is None or size == 0:
        return None
    build = rng.choice((
        f"{source}.long().remainder({size})",
        f"{source}.argsort(dim=-1, stable=True).remainder({size})",
        f"({source}.float().nan_to_num(0.5).abs() * 3).long().remainder({size})",
        f"{source}.argmax(dim=-1, keepdim=True).remainder({size})",
    ))
    return build


@template(3)
def unary(rng, env):
    x = pick(rng, env)
    if x is None:
        return None
    t = env[x]
    if _is_float(t):
        op = rng.choice(("abs", "neg", "floor", "ceil", "round", "trunc", "sign", "sqrt", "exp",
                         "log", "sigmoid", "relu", "reciprocal", "frac", "square", "sin",
                         "signbit", "isnan", "isinf", "isfinite", "nan_to_num", "rsqrt"))
    elif _is_int(t):
        op = rng.choice(("abs", "neg", "sign", "bitwise_not", "square", "logical_not"))
    else:
        op = rng.choice(("logical_not", "bitwise_not"))
    return f"torch.{op}({x})"


@template(2)
def rounding(rng, env):
    x = pick(rng, env, _is_float)
    if x is None:
        return None
    return rng.choice((f"torch.round({x}, decimals={rng.choice((1, -1, 2))})",
                       f"{x}.clamp({rng.choice(('-1.5', 'None', '0'))}, "
                       f"{rng.choice(('2.5', '0.0'))})",
                       f"{x}.clamp(min={rng.choice(('-0.0', '1'))})",
                       f"torch.nan_to_num({x}, nan={rng.choice(('0.0', '-1.5'))}, posinf=3.0)"))


@template(3)
def convert(rng, env):
    x = pick(rng, env)
    if x is None:
        return None
    dtype = rng.choice(DTYPES)
    return rng.choice((f"{x}.to({dtype})", f"{x}.long()", f"{x}.float()", f"{x}.int()",
                       f"{x}.to({dtype})"))


@template(5)
def binary(rng, env):
    a, b = pick(rng, env), pick(rng, env)
    if a is None:
        return None
    op = rng.choice(("+", "-", "*", "/", "//", "%", "<", "<=", "==", "!=", ">", "&", "|", "^",
                     "<<", ">>", "**"))
    if op == "**":
        return f"torch.pow({a}, {b})"
    return f"({a} {op} {b})"


@template(3)
def binary_fn(rng, env):
    a, b = pick(rng, env), pick(rng, env)
    if a is None:
        return None
    op = rng.choice(("maximum", "minimum", "fmax", "fmin", "fmod", "remainder", "floor_divide",
                     "atan2", "copysign", "bitwise_and", "logical_and", "logical_xor", "hypot",
                     "true_divide", "eq", "ne"))
    return f"torch.{op}({a}, {b})"


@template(3)
def with_scalar(rng, env):
    a = pick(rng, env)
    if a is None:
        return None
    s = _scalar(rng)
    return rng.choice((f"({a} + {s})", f"({a} * {s})", f"({a} - {s})", f"({a} / {s})",
                       f"({a} // {s})", f"({a} % {s})", f"torch.fmod({a}, {s})",
                       f"{a}.div({s}, rounding_mode={rng.choice(ROUNDING_MODES)})",
                       f"({s} - {a})", f"torch.pow({a}, {rng.choice(('2', '0.5', '-1', '3'))})",
                       f"({a} << {rng.choice(('1', '3', '63'))})",
                       f"({a} >> {rng.choice(('1', '7'))})"))


@template(3)
def where(rng, env):
    c, a, b = pick(rng, env), pick(rng, env), pick(rng, env)
    if c is None:
        return None
    cond = c if env[c].dtype == torch.bool else f"({c} > 0)"
    return rng.choice((f"torch.where({cond}, {a}, {b})", f"{a}.masked_fill({cond}, {_scalar(rng)})",
                       f"torch.where({cond}, {a}, {_scalar(rng)})"))


@template(4)
def reduce(rng, env):
    x = pick(rng, env)
    if x is None:
        return None
    t = env[x]
    d = _dim(rng, t)
    keep = rng.choice(("True", "False"))
    op = rng.choice(("sum", "prod", "amax", "amin", "argmax", "argmin", "any", "all", "mean",
                     "count_nonzero", "nansum", "logsumexp", "std", "var"))
    if op == "count_nonzero":
        return f"torch.count_nonzero({x}, dim={d})"
    form = rng.choice(("all", "dim", "dim"))
    if form == "all":
        return f"{x}.{op}()"
    return f"{x}.{op}(dim={d}, keepdim={keep})" if op not in ("any", "all") or True else None


def _ties(t, d) -> bool:
    """Whether ``t`` holds equal values (NaNs count as equal) along dim ``d``."""
    if t.dim() == 0 or t.shape[d] < 2:
        return False
    ordered = t.sort(dim=d).values
    n = t.shape[d]
    a, b = ordered.narrow(d, 1, n - 1), ordered.narrow(d, 0, n - 1)
    same = a == b
    if t.is_floating_point():
        same = same | (a.isnan() & b.isnan())
    return bool(same.any())


@template(2)
def reduce_pair(rng, env):
    x = pick(rng, env, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = _dim(rng, env[x])
    op = rng.choice(("max", "min", "sort", "median", "mode", "cummax", "cummin"))
    part = rng.choice(("[0]", "[1]"))
    if op in ("median", "mode") and _ties(env[x], d):
        part = "[0]"  # which of equal values gives the index is not defined (seed 1193)
    if op == "median" and 0 in env[x].stride():
        # eager CPU's median(dim) reads past an expanded (stride 0) tensor's memory and returns
        # garbage (torch 2.13; seed 1193): the reference must not be the wrong one
        x = f"{x}.contiguous()"
    if op == "sort":
        return f"{x}.sort(dim={d}, descending={rng.choice(('True', 'False'))}, stable=True){part}"
    if op in ("cummax", "cummin"):
        return f"{x}.{op}(dim={d}){part}"
    return f"{x}.{op}(dim={d}){part}"


@template(3)
def scan(rng, env):
    x = pick(rng, env, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = _dim(rng, env[x])
    op = rng.choice(("cumsum", "cumprod", "cumsum", "logcumsumexp"))
    dtype = rng.choice(("", ", dtype=torch.int64", ", dtype=torch.float64", ""))
    if op == "logcumsumexp":
        dtype = ""
    return f"torch.{op}({x}, dim={d}{dtype})"


@template(4)
def view(rng, env):
    x = pick(rng, env)
    if x is None:
        return None
    t = env[x]
    forms = [f"{x}.view(-1)", f"{x}.reshape(-1)", f"{x}.unsqueeze(0)", f"{x}[None]"]
    if t.dim() >= 1:
        forms += [f"{x}[1:]", f"{x}[::2]", f"{x}.flip(0)", f"{x}[-1]", f"{x}.narrow(0, 0, 1)",
                  f"{x}.expand(2, *{x}.shape)", f"{x}.roll(1, 0)", f"{x}[{x}.shape[0] // 2:]"]
    if t.dim() >= 2:
        forms += [f"{x}.t()", f"{x}.transpose(0, 1)", f"{x}.diagonal()", f"{x}[:, 1:]",
                  f"{x}.permute(1, 0, *range(2, {x}.dim()))", f"{x}.tril()", f"{x}.mT"]
    return rng.choice(forms)


@template(2)
def combine(rng, env):
    a = pick(rng, env)
    if a is None:
        return None
    b = pick(rng, env, lambda t: t.shape == env[a].shape)
    return rng.choice((f"torch.cat([{a}, {b}])", f"torch.stack([{a}, {b}])",
                       f"torch.cat([{a}, {b}], dim=-1)"))


@template(3)
def gather_index(rng, env):
    x = pick(rng, env, lambda t: t.dim() >= 1 and t.shape[0] > 0)
    if x is None:
        return None
    t = env[x]
    idx = _index(rng, env, t.shape[0])
    if idx is None:
        return None
    if rng.random() < 0.05:  # occasionally out of range: every path must raise eager's error
        idx = f"({idx} + {t.shape[0]})"
    return rng.choice((f"{x}[{idx}]", f"{x}.index_select(0, {idx}.reshape(-1))",
                       f"torch.take({x}, {idx})", f"{x}.gather(0, {idx}.expand_as({x}))"
                       if t.dim() == 1 else f"{x}[{idx}.reshape(-1)]"))


@template(4)
def in_place(rng, env):
    x = pick(rng, env)
    if x is None:
        return None
    t = env[x]
    v = pick(rng, env)
    forms = [f"{x}.add_({v})", f"{x}.mul_({_scalar(rng)})", f"{x}.copy_({v})",
             f"{x}.clamp_(max={rng.choice(('0', '1.5'))})", f"{x}.zero_()",
             f"{x}.masked_fill_({v} > 0, {_scalar(rng)})", f"{x}.fill_({_scalar(rng)})",
             f"{x}.sub_({v}, alpha={rng.choice(('2', '0.5'))})", f"{x}.floor_divide_({v})",
             f"{x}.abs_()", f"{x}.neg_()"]
    if t.dim() >= 1 and t.shape[0] > 0:
        n = t.shape[0]
        forms += [f"{x}[0].add_({v})", f"{x}[{rng.randrange(n)}] = {_scalar(rng)}",
                  f"{x}[1:].copy_({x}[:-1])", f"{x}[::2].mul_({_scalar(rng)})",
                  f"{x}[{x} > 0] = {_scalar(rng)}"]
        idx = _index(rng, env, n)
        if idx is not None:
            accumulate = rng.choice(('True', 'False'))
            forms += [f"{x}.index_put_(({idx}.reshape(-1),), {v}, accumulate={accumulate})",
                      f"{x}.index_add_(0, {idx}.reshape(-1), {v})",
                      f"{x}.index_fill_(0, {idx}.reshape(-1), {_scalar(rng)})",
                      f"{x}[{idx}.reshape(-1)] = {v}"]
            if t.dim() == 1:
                forms += [f"{x}.scatter_add_(0, {idx}.reshape(-1), {v}.reshape(-1))",
                          f"{x}.scatter_(0, {idx}.reshape(-1), {v}.reshape(-1))",
                          f"{x}.scatter_reduce_(0, {idx}.reshape(-1), {v}.reshape(-1), "
                          f"reduce={rng.choice(('sum', 'prod', 'amax', 'amin', 'mean'))!r}, "
                          f"include_self={rng.choice(('True', 'False'))})"]
    stmt = rng.choice(forms)
    return "STMT " + stmt  # a statement, not an expression: it binds nothing new


@template(2)
def matmul(rng, env):
    a = pick(rng, env, lambda t: _is_float(t) and t.dim() >= 1)
    if a is None:
        return None
    b = pick(rng, env, lambda t: _is_float(t) and t.dim() >= 1)
    return rng.choice((f"({a} @ {b})", f"torch.matmul({a}, {b}.mT if {b}.dim() > 1 else {b})",
                       f"({a} @ {a}.mT)" if env[a].dim() >= 2 else f"torch.dot({a}, {a})"))


@template(2)
def index_math(rng, env):
    """Float arithmetic turned into an index: the class of the FMA bug (a ratio times a
    position, minus a constant, truncated)."""
    x = pick(rng, env, lambda t: t.dim() >= 1 and t.shape[0] > 1)
    if x is None:
        return None
    n = env[x].shape[0]
    r = rng.choice(("(15 / 7)", "(1 / 3)", "0.1", "(7 / 15)"))
    pos = rng.choice((f"(torch.arange({n}, device={x}.device).float() + 0.5)",
                      f"(torch.arange({n}, device={x}.device) * {r})"))
    return f"{x}[(({pos} * {r} - {r} + 0.5).long()).clamp(0, {n - 1})]"


@template(3, generation=2)
def in_place_view(rng, env):
    """An in-place op through a view: the write must reach the base and every other view."""
    x = pick(rng, env, lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    t, v = env[x], pick(rng, env)
    views = [f"{x}[::2]", f"{x}[1:]", f"{x}.view(-1)[-1:]", f"{x}.unsqueeze(0)",
             f"{x}.narrow(0, {t.shape[0] - 1}, 1)"]
    if t.dim() >= 2:
        views += [f"{x}.t()", f"{x}.diagonal()", f"{x}[:, ::2]", f"{x}.mT[0]", f"{x}.select(1, 0)"]
    op = rng.choice((f"add_({v})", f"mul_({v})", f"copy_({v})", f"fill_({_scalar(rng)})",
                     f"clamp_(min={rng.choice(('0', '-1.5'))})", f"div_({_scalar(rng)})",
                     f"masked_fill_({v} > 0, {_scalar(rng)})", f"pow_({rng.choice(('2', '0.5'))})",
                     f"index_fill_(0, torch.tensor([0, 0], device={x}.device), {_scalar(rng)})",
                     f"index_put_((torch.tensor([0, 0, -1], device={x}.device),), {v}, "
                     f"accumulate={rng.choice(('True', 'False'))})"))
    return f"STMT {rng.choice(views)}.{op}"


@template(3, generation=2)
def reduce_dims(rng, env):
    """Reductions over dim lists, keepdim, corrections, and the pairs that return two tensors."""
    x = pick(rng, env, lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = env[x]
    dims = sorted(rng.sample(range(t.dim()), rng.randint(1, t.dim())))
    dims = tuple(d - t.dim() if rng.random() < 0.5 else d for d in dims)
    keep = rng.choice(("True", "False"))
    op = rng.choice(("sum", "mean", "amax", "amin", "nansum", "prod", "std", "var", "logsumexp",
                     "norm", "var_mean", "std_mean", "aminmax", "any", "all", "count_nonzero"))
    if op in ("std", "var", "var_mean", "std_mean"):
        return f"torch.{op}({x}, dim={dims}, correction={rng.choice((0, 1, 2))}, keepdim={keep})" \
            + ("[" + rng.choice("01") + "]" if op.endswith("_mean") else "")
    if op == "aminmax":
        return f"torch.aminmax({x}, dim={dims[0]}, keepdim={keep}){rng.choice(('.min', '.max'))}"
    if op == "prod":  # prod takes one dim
        return f"{x}.prod(dim={dims[0]}, keepdim={keep}, dtype={rng.choice(DTYPES[:2] + INTS[:1])})"
    if op == "count_nonzero":
        return f"torch.count_nonzero({x}, dim={dims})"
    if op == "norm":
        order = rng.choice(("2", "1", "float('inf')", "0"))
        return f"torch.linalg.vector_norm({x}, ord={order}, dim={dims}, keepdim={keep})"
    return f"{x}.{op}(dim={dims}, keepdim={keep})"


@template(3, generation=2)
def division(rng, env):
    """Division modes on tensors of any dtypes (zero divisors, negative operands, -0.0)."""
    a, b = pick(rng, env), pick(rng, env)
    if a is None:
        return None
    mode = rng.choice(ROUNDING_MODES)
    return rng.choice((f"torch.div({a}, {b}, rounding_mode={mode})",
                       f"torch.div({a}, {_scalar(rng)}, rounding_mode={mode})",
                       f"torch.remainder({_scalar(rng)}, {b})", f"torch.fmod({a}, {b})",
                       f"torch.floor_divide({a}, {b})"))


@template(3, generation=2)
def promote(rng, env):
    """Type promotion with Python scalars: an int scalar keeps an integer tensor's dtype (and
    wraps), a float one makes it the default float, a bool one keeps a bool tensor bool."""
    a = pick(rng, env)
    if a is None:
        return None
    s = rng.choice(("2", "-1", "300", "2.5", "True", "-0.0", "1e5", "65504.0", "-129"))
    return rng.choice((f"({a} + {s})", f"({a} * {s})", f"({s} - {a})",
                       f"torch.add({a}, {s}, alpha=2)", f"torch.mul({a}, {s})",
                       f"torch.where({a} > 0, {s}, {a})",
                       f"torch.maximum({a}, torch.tensor({s}))", f"({a} == {s})",
                       f"torch.clamp({a}, min={s})", f"({a}.sub({s}, alpha=3))"))


@template(2, generation=2)
def select_broadcast(rng, env):
    """where/masked_fill whose condition, values and target broadcast against each other."""
    c, a, b = pick(rng, env), pick(rng, env), pick(rng, env)
    if c is None:
        return None
    cond = f"({c} != 0)" if env[c].dtype != torch.bool else c
    return rng.choice((f"torch.where({cond}[..., None], {a}, {b})",
                       f"torch.where({cond}, {a}.unsqueeze(-1), {b})",
                       f"{a}.masked_fill({cond}[:1], {_scalar(rng)})",
                       f"{a}.masked_fill({cond}.any(), {_scalar(rng)})",
                       f"torch.where({cond}, {a}.sum(), {b}[..., :1])"))


def _literal_index(rng, n, count, unique=False):
    """Source of an int64 tensor of ``count`` indices in [0, n) (duplicates unless ``unique``;
    some negative, which index from the end), on the device of the tensor it indexes."""
    if unique:
        values = rng.sample(range(n), min(count, n))
    else:
        values = [rng.randrange(n) for _ in range(count)]
    return [v - n if rng.random() < 0.3 else v for v in values]


@template(3, generation=3)
def scatter_dim(rng, env):
    """scatter/gather along any dim of an n-d tensor: scatter_add and scatter_reduce with
    duplicate indices, scatter (whose pick among duplicates is not defined) with a permutation."""
    x = pick(rng, env, lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    t = env[x]
    d = _dim(rng, t)
    v = pick(rng, env, lambda s: s.dtype == t.dtype and s.dim() == t.dim()) or f"{x}.flip(0)"
    perm = f"{x}.argsort(dim={d}, stable=True)"
    dup = f"({x}.long().remainder({t.shape[d]}) if {x}.dtype != torch.bool else {x}.long())"
    form = rng.choice(("scatter", "scatter_add", "scatter_reduce", "gather", "take_along_dim",
                       "scatter_value", "gather_dup"))
    if form == "scatter":
        return f"{x}.scatter({d}, {perm}, {v})"
    if form == "scatter_value":
        return f"{x}.scatter({d}, {perm}[..., :1], {_scalar(rng)})"
    if form == "scatter_add":
        return f"{x}.scatter_add({d}, {dup}, {v})"
    if form == "scatter_reduce":
        return (f"{x}.scatter_reduce({d}, {dup}, {v}, "
                f"reduce={rng.choice(('sum', 'prod', 'amax', 'amin', 'mean'))!r}, "
                f"include_self={rng.choice(('True', 'False'))})")
    if form == "gather":
        return f"{x}.gather({d}, {dup})"
    if form == "gather_dup":
        return f"torch.gather({x}, {d}, {perm}.flip({d}))"
    return f"torch.take_along_dim({x}, {perm}, dim={d})"


@template(3, generation=3)
def index_dup(rng, env):
    """index_put/index_add/index_copy with literal indices: duplicates where the op
    accumulates, unique where it does not (eager's pick among duplicates is not defined)."""
    x = pick(rng, env, lambda t: t.dim() >= 1 and t.shape[0] > 0)
    if x is None:
        return None
    t = env[x]
    n = t.shape[0]
    k = rng.randint(1, 4)
    dup = _literal_index(rng, n, k)
    uniq = _literal_index(rng, n, k, unique=True)
    src = f"{x}[:1].expand({len(dup)}, *{x}.shape[1:]) * 2"
    usrc = f"{x}.flip(0)[:{len(uniq)}]"
    idx = f"torch.tensor({dup}, device={x}.device)"
    uidx = f"torch.tensor({uniq}, device={x}.device)"
    alpha = ", alpha=2" if not t.is_floating_point() and t.dtype != torch.bool else ""
    return rng.choice((f"{x}.index_put(({idx},), {src}, accumulate=True)",
                       f"{x}.index_put(({uidx},), {usrc})",
                       f"{x}.index_add(0, {idx}, {src}{alpha})",
                       f"{x}.index_copy(0, {uidx}, {usrc})",
                       f"STMT {x}.index_put_(({idx},), {src}, accumulate=True)",
                       f"STMT {x}[{uidx}] = {usrc}",
                       f"STMT {x}.index_add_(0, {idx}, {src})"))


@template(3, generation=3)
def order(rng, env):
    """sort/argsort/topk/kthvalue/msort: indices only where the values have no ties (or the
    sort is stable), NaN last as eager orders it."""
    x = pick(rng, env, lambda t: t.dim() >= 1 and t.dtype != torch.bool)
    if x is None:
        return None
    t = env[x]
    d = _dim(rng, t)
    n = t.shape[d]
    desc = rng.choice(("True", "False"))
    ties = _ties(t, d)
    forms = [f"torch.argsort({x}, dim={d}, descending={desc}, stable=True)",
             f"{x}.sort(dim={d}, descending={desc}, stable=True)[{rng.choice('01')}]",
             f"torch.msort({x})"]
    if n > 0:
        k = rng.randint(1, n)
        part = "[0]" if ties else rng.choice(("[0]", "[1]"))
        forms += [f"{x}.topk({k}, dim={d}, largest={desc}){part}",
                  f"torch.kthvalue({x}, {k}, dim={d}){part}"]
    return rng.choice(forms)


@template(3, generation=3)
def scan_pair(rng, env):
    """Scans over any dim, the index pairs included (cummax/cummin pick the last of equal
    values), with their dtype arguments."""
    x = pick(rng, env, lambda t: t.dim() >= 1)
    if x is None:
        return None
    d = _dim(rng, env[x])
    return rng.choice((f"torch.cummax({x}, {d})[{rng.choice('01')}]",
                       f"torch.cummin({x}, {d})[{rng.choice('01')}]",
                       f"torch.cumprod({x}, {d}, dtype={rng.choice(DTYPES[:2] + INTS[:2])})",
                       f"torch.cumsum({x}.flip({d}), {d}).flip({d})",
                       f"torch.logcumsumexp({x}.double(), {d})"))


@template(3, generation=3)
def clamp_tensor(rng, env):
    """clamp with tensor bounds (broadcast, NaN in a bound, min above max) and min/max with NaN
    and infinities."""
    x, lo, hi = pick(rng, env), pick(rng, env), pick(rng, env)
    if x is None:
        return None
    return rng.choice((f"torch.clamp({x}, min={lo}, max={hi})", f"torch.clamp({x}, min={lo})",
                       f"torch.clamp({x}, max={hi})", f"{x}.clamp_min({lo})",
                       f"{x}.clamp_max({hi})", f"torch.clip({x}, {lo}, {hi})",
                       f"torch.max({x}, {lo})", f"torch.min({x}, {hi})",
                       f"{x}.max()", f"{x}.min()", f"torch.max({x}, dim=-1)[0]"
                       if env[x].dim() else f"{x}.max()",
                       f"torch.maximum({x}, torch.tensor(float('nan'), device={x}.device))"))


@template(3, generation=3)
def integer(rng, env):
    """Integer and bool ops: bitwise with tensors, shifts by tensors (wide and negative
    amounts), remainder/fmod/floor_divide of ints of mixed signs, gcd/lcm."""
    a = pick(rng, env, lambda t: not t.is_floating_point())
    if a is None:
        return None
    b = pick(rng, env, lambda t: not t.is_floating_point())
    shift = rng.choice(("1", "7", "8", "15", "31", "63", "64", "-1"))
    return rng.choice((f"torch.bitwise_left_shift({a}, {b})",
                       f"torch.bitwise_right_shift({a}, {b})",
                       f"({a} << {shift})", f"({a} >> {shift})",
                       f"torch.bitwise_xor({a}, {b})", f"torch.bitwise_or({a}, {b})",
                       f"torch.bitwise_and({a}, ~{b})",
                       f"torch.remainder({a}, {b})", f"torch.fmod({a}, {b})",
                       f"torch.floor_divide({a}, {b})", f"torch.gcd({a}, {b})",
                       f"torch.lcm({a}, {b})", f"({a} % {rng.choice(('-3', '5', '-1'))})",
                       f"torch.fmod({a}, {rng.choice(('-3', '5', '-1'))})",
                       f"({a} // {rng.choice(('-3', '5', '-1', '2'))})",
                       f"{a}.logical_xor({b})", f"({a}.bool() ^ {b}.bool())"))


@template(2, generation=3)
def compare_special(rng, env):
    """Comparisons and selections where NaN and infinities meet: eq/lt with NaN, isclose,
    isin, equal, nan-aware reductions."""
    a, b = pick(rng, env), pick(rng, env)
    if a is None:
        return None
    s = rng.choice(("float('nan')", "float('inf')", "-float('inf')", "0.0", "-0.0"))
    return rng.choice((f"({a} < {s})", f"({a} >= {s})", f"({a} == {s})", f"({a} != {s})",
                       f"torch.isclose({a}.double(), {b}.double(), equal_nan=True)",
                       f"torch.isclose({a}.double(), {b}.double())",
                       f"torch.isin({a}, {b})", f"torch.fmax({a}, {s})",
                       f"torch.fmin({a}, {s})", f"torch.minimum({a}, {s} + 0 * {b})",
                       f"torch.nanmean({a}.double())", f"torch.nanmean({a}.double(), dim=-1)"
                       if env[a].dim() else f"torch.nanmean({a}.double())"))


@template(2, generation=3)
def empty_reduce(rng, env):
    """Reductions over no elements (sum 0, prod 1, mean NaN, amax raises, argmax raises)."""
    x = pick(rng, env, lambda t: t.dim() >= 1)
    if x is None:
        return None
    t = env[x]
    d = _dim(rng, t)
    empty = f"{x}.narrow({d}, 0, 0)"
    op = rng.choice(("sum", "prod", "mean", "amax", "amin", "argmax", "any", "all", "nansum",
                     "logsumexp", "std", "count_nonzero"))
    if op == "count_nonzero":
        return f"torch.count_nonzero({empty}, dim={d})"
    if rng.random() < 0.4:
        return f"{empty}.{op}()"
    return f"{empty}.{op}(dim={d}, keepdim={rng.choice(('True', 'False'))})"


@template(2, generation=3)
def to_int(rng, env):
    """Float to integer conversions (truncation toward zero) of values in range (out of range
    is not defined), and int to float of large values."""
    x = pick(rng, env, _is_float)
    if x is None:
        return None
    dtype = rng.choice(INTS + (torch.bool,))
    bound = {torch.uint8: "0, 255", torch.int8: "-128, 127"}.get(dtype, "-1000, 1000")
    safe = f"{x}.nan_to_num(0.0).clamp({bound})"
    return rng.choice((f"{safe}.to({dtype})", f"{safe}.trunc().to({dtype})",
                       f"{x}.to(torch.bool)", f"({safe} * 0.5).to({dtype})",
                       f"{safe}.to(torch.int64).to({x}.dtype)"))


@template(3, generation=3)
def where_scalars(rng, env):
    """torch.where with scalar branches (promotion from the scalars alone), nonzero,
    masked_select and argwhere (shapes computed from data)."""
    c = pick(rng, env)
    if c is None:
        return None
    cond = c if env[c].dtype == torch.bool else f"({c} > 0)"
    a = pick(rng, env)
    s, r = _scalar(rng), _scalar(rng)
    return rng.choice((f"torch.where({cond}, {s}, {r})", f"torch.where({cond}, {s}, {a})",
                       f"torch.where({cond}, {a}, {r})", f"torch.nonzero({c})",
                       f"{c}.nonzero(as_tuple=True)[0]", f"torch.masked_select({a}, {cond})",
                       f"torch.argwhere({cond})", f"{a}[{cond}]" if env[a].shape == env[c].shape
                       else f"torch.masked_select({a}, {cond})", f"torch.where({cond})[0]"))


@template(3, generation=3)
def shape_ops(rng, env):
    """repeat_interleave, roll over several dims, flip, tril/triu with offsets, diagonal with
    offsets and dims, diag_embed, unfold, as_strided reads, tile/repeat, einsum."""
    x = pick(rng, env)
    if x is None:
        return None
    t = env[x]
    k = rng.choice((-2, -1, 0, 1, 2))
    forms = [f"{x}.repeat_interleave({rng.randint(0, 3)})", f"{x}.repeat(2, *([1] * {x}.dim()))",
             f"torch.tile({x}, (2,))"]
    if t.dim() >= 1:
        d = _dim(rng, t)
        n = t.shape[d]
        forms += [f"{x}.roll({k}, {d})", f"{x}.flip({d})", f"{x}.unfold({d}, {min(n, 2)}, 1)",
                  f"{x}.repeat_interleave(torch.tensor({[rng.randint(0, 2) for _ in range(n)]}, "
                  f"device={x}.device), dim={d})",
                  f"torch.diag_embed({x}, offset={k})",
                  f"{x}.contiguous().as_strided(({max(t.numel() - 1, 0)},), (1,), 1)"
                  if t.numel() else f"{x}.flip({d})",
                  f"{x}.contiguous().as_strided((2, 2), (1, 1))" if t.numel() >= 3 else
                  f"{x}.roll(1)"]
    if t.dim() >= 2:
        forms += [f"{x}.roll(({k}, 1), (0, -1))", f"{x}.flip((0, -1))", f"{x}.tril({k})",
                  f"{x}.triu({k})", f"{x}.diagonal({k})", f"{x}.diagonal({k}, -1, 0)",
                  f"torch.einsum('ij,ij->i', {x}, {x})" if _is_float(t) else f"{x}.triu({k})",
                  f"torch.einsum('ij->ji', {x})", f"torch.einsum('ii', {x})"
                  if t.shape[0] == t.shape[1] and _is_float(t) else f"{x}.tril({k})",
                  f"torch.einsum('...j,kj->...k', {x}, {x})" if _is_float(t) else f"{x}.mT"]
    return rng.choice(forms)


@template(3, generation=3)
def expand_write(rng, env):
    """An expanded tensor cloned (the clone owns its elements) then written in place, and
    in-place ops that read the tensor they write (x.add_(x.flip(0)))."""
    x = pick(rng, env, lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    v = pick(rng, env)
    return rng.choice((f"{x}.expand(2, *{x}.shape).clone().add_({v})",
                       f"{x}.expand(2, *{x}.shape).clone().index_fill_(0, "
                       f"torch.tensor([1], device={x}.device), {_scalar(rng)})",
                       f"{x}[:1].expand_as({x}).clone().mul_({v})",
                       f"{x}.clone().add_({x}.flip(0))", f"{x}.clone().copy_({x}.roll(1, 0))",
                       f"STMT {x}.add_({x}.flip(0))", f"STMT {x}.copy_({x}.flip(0).clone())",
                       f"STMT {x}[1:].add_({x}[:-1])"))


# --------------------------------------------------------------------------------- programs

@dataclasses.dataclass
class Program:
    """A program's source: its inputs' builders and its statements; ``source()`` is the
    function, runnable alone."""
    seed: int
    inputs: list          # source per input, over ``dev``
    lines: list           # statements of the body
    returns: list         # names returned
    raises: bool = False  # eager CPU rejects the last line
    generation: int = GENERATION  # of the templates it was drawn from (``--generation``)
    #: training programs (``TRAINING``): the values summed, each weighted, into the scalar
    #: ``loss`` the function returns last; the harness compares every input's gradient of it
    loss: list = dataclasses.field(default_factory=list)

    def source(self) -> str:
        names = ", ".join(f"x{i}" for i in range(len(self.inputs)))
        lines = self.lines + ([_loss_line(self.loss)] if self.loss else [])
        body = "\n".join(f"    {line}" for line in lines)
        returns = self.returns + (["loss"] if self.loss else [])
        ret = ", ".join(returns) + ("," if len(returns) == 1 else "")
        return f"def f({names}):\n{body}\n    return ({ret})\n"

    def repro(self) -> str:
        made = "\n".join(f"x{i} = {s}" for i, s in enumerate(self.inputs))
        grads = ("# then the gradients of loss: torch.autograd.grad(f(...)[-1], [the inputs "
                 "that require grad])\n") if self.loss else ""
        return f"dev = 'cpu'\n{made}\n{self.source()}{grads}"

    def make_inputs(self, dev="cpu") -> list:
        return [eval(s, {"torch": torch, "dev": dev}) for s in self.inputs]

    def function(self):
        scope = {"torch": torch}
        exec(compile(self.source(), f"<fuzz {self.seed}>", "exec"), scope)
        return scope["f"]


def _loss_line(names) -> str:
    """``loss = ...``: each value times fixed weights (small integers and halves, exact in every
    dtype, none zero), summed: a plain sum would give softmax and the norms no gradient. The
    loss is float32 (held to float32's tolerance whatever the values' dtypes; the gradients
    keep each input's dtype)."""
    def term(v):
        weights = f"(torch.arange({v}.numel(), device={v}.device) % 7 - 2.5)"
        return f"({v} * {weights}.to({v}.dtype).reshape({v}.shape)).sum().float()"
    return "loss = " + " + ".join(term(v) for v in names)


def _run_eager_cpu(prog: Program):
    """(inputs after, env of every name, exception or None) of ``prog`` on eager CPU."""
    inputs = prog.make_inputs()
    env = {f"x{i}": t for i, t in enumerate(inputs)}
    scope = {"torch": torch, **env}
    try:
        exec(compile("\n".join(prog.lines) or "pass", "<fuzz>", "exec"), scope)
    except Exception as exc:  # the program's last line is one eager rejects
        return inputs, None, exc
    return inputs, {k: v for k, v in scope.items() if k in env or k.startswith("v")}, None


def program(seed: int, ops: int = 6, generation: int = GENERATION) -> Program:
    """Draw the program of ``seed``: inputs, then ``ops`` statements eager CPU accepts (and,
    rarely, a last one it rejects).

    Example::

        print(program(3).repro())
    """
    if generation >= TRAINING:
        return _training_program(seed, ops, generation)
    rng = random.Random(seed)
    dtype_mix = rng.sample(DTYPES, 3)
    shape = rng.choice(SHAPES)
    inputs = []
    for _ in range(rng.randint(1, 3)):
        s = shape if rng.random() < 0.7 else rng.choice(SHAPES)
        inputs.append(_input_source(rng, s, rng.choice(dtype_mix)))
    prog = Program(seed, inputs, [], [], generation=generation)
    drawn = [(w, fn) for w, fn, g in TEMPLATES.values() if g <= generation]
    weights = [w for w, _ in drawn]
    fns = [fn for _, fn in drawn]
    _, env, _ = _run_eager_cpu(prog)
    made = 0
    for _attempt in range(ops * 12):
        if made >= ops:
            break
        rhs = rng.choices(fns, weights)[0](rng, env)
        if rhs is None:
            continue
        line = rhs[5:] if rhs.startswith("STMT ") else f"v{made} = {rhs}"
        trial = dataclasses.replace(prog, lines=prog.lines + [line])
        _, trial_env, error = _run_eager_cpu(trial)
        verdict = _settle(error, trial_env, made, ops, rng)
        if verdict == "raises":
            prog = dataclasses.replace(trial, raises=True)
            break
        if verdict == "skip":
            continue
        prog, env = trial, trial_env
        if not rhs.startswith("STMT "):
            made += 1
    prog.returns = [f"v{i}" for i in range(made)] or ["x0"]
    return prog


def _settle(error, trial_env, made: int, ops: int, rng: random.Random) -> str:
    """What becomes of a drawn line, from eager CPU's run of the program with it: "keep" it,
    "skip" it (eager refused it, or a value grew past 4096 elements), or end the program with
    it as the line that "raises" (rarely, and only as the last line: every path must then raise
    eager's exception type). ``rng`` is drawn from only for a refused last line, so that the
    programs of earlier seeds stay as they were."""
    if error is not None:
        rejected = not isinstance(error, (NameError, TypeError))  # not a generator slip
        return "raises" if made == ops - 1 and rng.random() < 0.15 and rejected else "skip"
    if any(isinstance(v, torch.Tensor) and v.numel() > 4096 for v in trial_env.values()):
        return "skip"
    return "keep"


# ---------------------------------------------------------------------- training programs

#: The first generation whose programs are training steps: float inputs that require grad
#: (activations and the layers' parameters, in odd layouts), ``nn.functional`` layers drawn
#: from ``fuzz_layers.LAYERS``, a scalar loss; every input's gradient is
#: compared too.
TRAINING = 4


def _param_source(rng: random.Random, shape, dtype, grad=True, positive=False,
                  distinct=False) -> str:
    """Source of an input of ``shape`` (a leaf that requires grad when ``grad``, in one of
    ``_layout``'s layouts) holding distinct values in (-2, 2), or (0, 2) when ``positive``:
    no ties (where ``distinct``, not expanded either), so max and its kin have one
    gradient."""
    base, suffix = _layout(rng, shape, expand=not distinct)
    n = math.prod(base)
    if n == 0:
        source = f"torch.empty({tuple(base)}, dtype={dtype}, device=dev){suffix}"
    else:
        values = rng.sample(range(1, 20000) if positive else range(-19999, 20000), n)
        flat = [repr(v / 10000) for v in values]
        source = f"torch.tensor({_nested(flat, base)}, dtype={dtype}, device=dev){suffix}"
    return source + (".detach().requires_grad_()" if grad else "")


def _loss_names(env) -> list:
    return [n for n, v in env.items() if n.startswith("v") and isinstance(v, torch.Tensor)
            and v.is_floating_point() and v.requires_grad]


def _adder(rng, dtype, first: int, added: list):
    """A template's ``param``: appends a new input's source to ``added``, returns its name."""
    def param(shape, grad=True, positive=False, distinct=False):
        added.append(_param_source(rng, shape, dtype, grad, positive, distinct))
        return f"x{first + len(added) - 1}"
    param.dtype = dtype
    return param


def _training_program(seed: int, ops: int, generation: int) -> Program:
    """A training program: ``ops`` layers (each keeping only what eager CPU runs forward and
    backward), their parameters added as inputs as they are drawn, and the loss."""
    from .fuzz_layers import LAYERS
    rng = random.Random(seed)
    dtype = rng.choice((torch.float32, torch.float32, torch.float64))
    prog = Program(seed, [], [], [], generation=generation)
    drawn = [(w, fn) for w, fn, g in LAYERS.values() if g <= generation]
    weights, fns = [w for w, _ in drawn], [fn for _, fn in drawn]
    env, made = {}, 0
    for _attempt in range(ops * 12):
        if made >= ops:
            break
        added = []
        rhs = rng.choices(fns, weights)[0](rng, env, _adder(rng, dtype, len(prog.inputs), added))
        if rhs is None:
            continue
        line = rhs[5:] if rhs.startswith("STMT ") else f"v{made} = {rhs}"
        trial = dataclasses.replace(prog, inputs=prog.inputs + added, lines=prog.lines + [line])
        _, trial_env, error = _run_eager_cpu(trial)
        if error is None and any(bug(line, trial_env.get(f"v{made}"))
                                 for bug in _EAGER_CPU_BUGS):
            continue
        if error is None:
            trial.loss = _loss_names(trial_env)
            try:  # and its backward
                _run_reference(trial)
            except Exception as exc:
                error = exc
        verdict = _settle(error, trial_env, made, ops, rng)
        if verdict == "raises":
            prog = dataclasses.replace(trial, raises=True, loss=prog.loss)
            break
        if verdict == "skip":
            continue
        prog, env = trial, trial_env
        if not rhs.startswith("STMT "):
            made += 1
    prog.returns = [f"v{i}" for i in range(made)] or ["x0"]
    return prog


def _pools_only_padding(line: str, value) -> bool:
    """Whether a max pooling layer has a window that covers only padding (its -inf): eager
    CPU's backward then writes the gradient at index -1, outside its buffer, and the process
    aborts ("double free or corruption", torch 2.13, seed 7295: a (1, 3, 1, 2) input pooled
    by 2 with padding 1 and dilation 2)."""
    if "max_pool" not in line or not isinstance(value, tuple | list | torch.Tensor):
        return False
    values = value if isinstance(value, tuple | list) else (value,)
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() and
               bool(torch.isneginf(v).any()) for v in values)


def _antialiased_to_one_column(line: str, value) -> bool:
    """Whether an antialiased resize of an image has an output width of 1: eager CPU's kernel
    then repeats the first output row in every row (torch 2.13, seeds 7056, 7639); its own
    two-call resize, one dim at a time, and the separable definition give the values every
    path of ours gives."""
    return "antialias=True" in line and isinstance(value, torch.Tensor) and \
        value.dim() == 4 and value.shape[-1] == 1


#: Layers eager CPU computes wrongly, the reference itself at fault: not drawn.
_EAGER_CPU_BUGS = (_pools_only_padding, _antialiased_to_one_column)


def _with_grads(prog: Program, out, inputs) -> tuple:
    """(outputs, inputs after) of a run, and for a training program the gradient of its loss
    (its last output) for each input (None where the input does not require grad or the loss
    does not reach it)."""
    if not prog.loss:
        return out, inputs
    wanted = [t for t in inputs if t.requires_grad]
    found = iter(torch.autograd.grad(out[-1], wanted, allow_unused=True) if wanted else ())
    grads = [next(found) if t.requires_grad else None for t in inputs]
    return out, inputs, grads


# ------------------------------------------------------------------------------------ paths

def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.cpu()
    if isinstance(value, (tuple, list)):
        return type(value)(_to_cpu(v) for v in value)
    return value


def _run_compile(prog: Program, dynamic: bool, backend: str = "torchtpu"):
    import torch._dynamo
    torch._dynamo.reset()
    inputs = prog.make_inputs()
    fn = torch.compile(prog.function(), backend=backend, dynamic=dynamic)
    return _with_grads(prog, fn(*inputs), inputs)  # the backward is the compiled one


def _run_device(prog: Program, mode: str):
    import torchtpu_eager  # noqa: F401  (registers the device)
    from .helpers import eager_mode
    with eager_mode(mode):
        inputs = prog.make_inputs("tpu")
        return _to_cpu(_with_grads(prog, prog.function()(*inputs), inputs))


def _run_reference(prog: Program):
    inputs = prog.make_inputs()
    return _with_grads(prog, prog.function()(*inputs), inputs)


PATHS = {
    "compile": lambda prog: _run_compile(prog, dynamic=False),
    "dynamic": lambda prog: _run_compile(prog, dynamic=True),
    "eager": lambda prog: _run_device(prog, "strict"),
    "fuse": lambda prog: _run_device(prog, "defer_and_fuse"),
}
COMPILE_PATHS = ("compile", "dynamic")


def _reference_backend(backend: str, **inductor_config):
    """A path that compiles the program with ``backend`` (dynamic as the path it referees)."""
    def run(prog, path):
        if not inductor_config:
            return _run_compile(prog, dynamic=path == "dynamic", backend=backend)
        import torch._inductor.config
        with torch._inductor.config.patch(**inductor_config):
            return _run_compile(prog, dynamic=path == "dynamic", backend=backend)
    return run


# ---------------------------------------------------------------------- accepted differences

#: name -> Accepted: classes of difference from eager CPU that are PyTorch's own, not
#: torchtpu's. A mismatch is accepted only where its class's reference backend, run on the same
#: program, gives the same outcome as our path (the same values, or the same exception), so a
#: bug of ours that merely looks like a known class is still reported.
ACCEPTED: dict = {}


@dataclasses.dataclass
class Accepted:
    name: str
    paths: tuple
    applies: object    # (prog, what) -> bool: the mismatch has this class's shape
    referee: object    # (prog, path) -> (outputs, inputs): the reference backend's run
    why: str
    agrees: object = None  # optional (prog, path) -> bool: a second check of the cause


def accepted_class(paths, referee, why, agrees=None):
    """Register a class of difference from eager CPU that a reference backend shares.

    Example::

        @accepted_class(COMPILE_PATHS, _reference_backend("aot_eager"), "why ...")
        def dead_op(prog, what):
            return what.startswith("returned a value")
    """
    def register(fn):
        ACCEPTED[fn.__name__] = Accepted(fn.__name__, paths, fn, referee, why, agrees)
        return fn
    return register


@accepted_class(COMPILE_PATHS, _reference_backend("eager"),
                "Dynamo's fake tensors reject the program with another exception type than "
                "eager's kernel (a meta check stricter than the kernel): Dynamo alone "
                "(backend='eager') raises the same")
def dynamo_meta_check(prog, what):
    return what.startswith("raised")


@accepted_class(COMPILE_PATHS, _reference_backend("aot_eager"),
                "Dynamo drops an op whose result is never used before any backend sees it, so "
                "the error eager raises at it is lost (seed 1108: an unused x.var() of an "
                "integer tensor); aot_eager and Inductor the same")
def dead_op(prog, what):
    return what.startswith("returned a value where eager raises")


@accepted_class(COMPILE_PATHS, _reference_backend("aot_eager"),
                "aot_autograd refuses an in-place write into a view whose elements overlap (an "
                "expanded input, seeds 1014, 1101; an unfolded one, which functionalization "
                "names, seed 5273) where eager writes; aot_eager and Inductor the same")
def overlapping_write(prog, what):
    return what.startswith("raised") and any(words in what for words in (
        "more than one element of the written-to", "being mutated that has internal overlap"))


def _values_differ(what: str) -> bool:
    """Whether a mismatch is in values (or a value's type), not an exception."""
    return "differ" in what or "instead of" in what


def _zero_dim_float64_input(prog):
    return any(t.dim() == 0 and t.dtype == torch.float64 for t in prog.make_inputs())


@accepted_class(COMPILE_PATHS, _reference_backend("aot_eager"),
                "Dynamo restarts its trace on a 0-d float64 input (aot_autograd's "
                "TensorifyScalarRestartAnalysis) and the restarted graph lost an in-place write "
                "(seeds 1110, 1126); aot_eager and Inductor the same")
def restart_lost_write(prog, what):
    return _values_differ(what) and _zero_dim_float64_input(prog)


#: An in-place op from one view of a tensor into another that shares elements with it.
_SHIFTED_WRITE = re.compile(r"(\w+)\[1:\]\.(copy_|add_)\(\1\[:-1\]\)")


@accepted_class(COMPILE_PATHS, _reference_backend("aot_eager"),
                "an in-place op between overlapping views of one tensor (x[1:].copy_(x[:-1]) "
                "of a strided x, where eager lets it through): eager's kernel reads elements "
                "it has written and carries x[0] forward, aot_autograd's functional graph reads "
                "the old values (seeds 1884, 1893, 3687); aot_eager the same")
def overlapping_views(prog, what):
    return _values_differ(what) and any(_SHIFTED_WRITE.search(line) for line in prog.lines)


#: A dropout that keeps every value, then an in-place op on its result.
_KEEPING_DROPOUT = re.compile(r"^(v\d+) = torch\.nn\.functional\.\w*dropout\w*\(")


@accepted_class(COMPILE_PATHS, _reference_backend("aot_eager"),
                "a dropout that keeps every value (p=0, or not training) returns its input "
                "itself in eager, so an in-place op on its result writes that input too; "
                "traced, its result is a new tensor and the input keeps its values (seed 7302: "
                "dropout(v1, 0.0).div_(3)); aot_eager and Inductor the same")
def dropout_alias(prog, what):
    if not _values_differ(what):
        return False
    kept = {m.group(1) for m in map(_KEEPING_DROPOUT.match, prog.lines) if m}
    return any(re.match(rf"{name}\.\w+_\(", line) for name in kept for line in prog.lines)


def _outcome(run, prog):
    try:
        return run(prog)
    except Exception as exc:
        return unwrap(exc)


def _same_outcome(ours, theirs) -> bool:
    if isinstance(ours, BaseException) or isinstance(theirs, BaseException):
        return type(ours) is type(theirs)
    return compare(ours[0], theirs[0], "output") is None and \
        compare(ours[1], theirs[1], "input") is None and \
        compare(_grads(ours), _grads(theirs), "grad", GRAD_TOLERANCES) is None


def _compared_outputs(prog: Program, out):
    """The outputs compared: a training program's all but its loss, a weighted sum of the
    others whose cancellations magnify their float rounding past any tolerance of its own
    (seed 6115: 1.57917 against 1.57919 in float32, its terms equal within theirs); its
    gradients are compared."""
    return out[:-1] if prog.loss and isinstance(out, (tuple, list)) else out


def _grads(result) -> list:
    """The gradients of a training program's run (``_with_grads``), one per input, or []."""
    return result[2] if len(result) > 2 else []


def accepted_as(prog, path, what, ours) -> str:
    """The accepted class (``"name: why"``) of our path's outcome ``ours`` (an exception, or
    its outputs and inputs) differing from eager by ``what``, or "" when none accounts for it."""
    for cls in ACCEPTED.values():
        if path not in cls.paths or not cls.applies(prog, what):
            continue
        if _same_outcome(ours, _outcome(lambda p, cls=cls: cls.referee(p, path), prog)) and \
                (cls.agrees is None or cls.agrees(prog, path)):
            return f"{cls.name}: {cls.why}"
    return ""


# ------------------------------------------------------------------------------- comparison

def compare(actual, expected, what: str, tolerances=None) -> str | None:
    """The first difference between two results (tensors exact for ints and bools, within
    ``tolerances`` (``TOLERANCES``) for floats, NaN where NaN; dtype and shape equal), or
    None.

    Example::

        compare(torch.tensor([1, 2]), torch.tensor([1, 3]), "output")   # "output: values ..."
    """
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"{what}: {type(actual).__name__} instead of {len(expected)} values"
        for i, (a, e) in enumerate(zip(actual, expected)):
            found = compare(a, e, f"{what}[{i}]", tolerances)
            if found:
                return found
        return None
    if not isinstance(expected, torch.Tensor):
        return None if actual == expected else f"{what}: {actual!r} instead of {expected!r}"
    if not isinstance(actual, torch.Tensor):
        return f"{what}: {type(actual).__name__} instead of a tensor"
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return (f"{what}: {actual.dtype}{list(actual.shape)} instead of "
                f"{expected.dtype}{list(expected.shape)}")
    a, e = actual.detach().cpu(), expected.detach()
    if e.is_floating_point():
        close = torch.isclose(a.double(), e.double(), equal_nan=True,
                              **(tolerances or TOLERANCES)[e.dtype])
        # isclose calls inf == inf close; -0.0 and 0.0 are equal (docs/reliability.md).
    else:
        close = a == e
    if bool(close.all()):
        return None
    bad = (~close).nonzero()[0].tolist()
    at = tuple(bad)
    return (f"{what}: {(~close).sum().item()} of {e.numel()} differ, first at {at}: "
            f"{a[at].item()!r} instead of {e[at].item()!r}")


@dataclasses.dataclass
class Mismatch:
    """One path's difference from eager CPU on one program; ``accepted`` names the class of
    ``ACCEPTED`` it falls in (PyTorch's own, a reference backend the same), or is empty."""
    seed: int
    path: str
    what: str
    prog: Program
    accepted: str = ""

    def __str__(self):
        gen = f" (--generation {self.prog.generation})" if self.prog.generation != 1 else ""
        head = f"seed {self.seed}{gen} [{self.path}] {self.what}"
        if self.accepted:
            return f"{head}\n  accepted, {self.accepted}"
        return f"{head}\n{self.prog.repro()}"


def check(prog: Program, path: str, run=None) -> Mismatch | None:
    """Run ``prog`` on eager CPU and on ``path`` (``run`` overrides ``PATHS[path]``); the
    mismatch, or None where the path matches: same values, same inputs after, or the same
    exception type where eager raises. A mismatch a reference backend shares comes back with
    ``accepted`` set (``ACCEPTED``).

    Example::

        check(program(0), "compile")   # None
    """
    run = run or PATHS[path]
    try:
        expected = _run_reference(prog)
        reference_error = None
    except Exception as exc:
        reference_error = exc
    try:
        ours = run(prog)
        error = None
    except Exception as exc:
        error = ours = unwrap(exc)
    if reference_error is not None:
        if error is None:
            what = f"returned a value where eager raises {type(reference_error).__name__}: " \
                   f"{str(reference_error).splitlines()[0][:160]}"
        elif not isinstance(error, type(reference_error)):
            what = (f"raised {type(error).__name__}: {str(error).splitlines()[0][:160]} where "
                    f"eager raises {type(reference_error).__name__}: "
                    f"{str(reference_error).splitlines()[0][:160]}")
        else:
            return None
    elif error is not None:
        lines = "".join(traceback.format_exception_only(type(error), error)).strip().splitlines()
        what = f"raised {lines[0][:300]}"
    else:
        what = compare(_compared_outputs(prog, ours[0]), _compared_outputs(prog, expected[0]),
                       "output") or \
            compare(ours[1], expected[1], "input") or \
            compare(_grads(ours), _grads(expected), "grad", GRAD_TOLERANCES)
        if not what:
            return None
    return Mismatch(prog.seed, path, what, prog, accepted_as(prog, path, what, ours))


def minimize(mismatch: Mismatch, run=None) -> Mismatch:
    """Drop statements (last first), returned values and inputs while the path still differs
    from eager CPU in the same way (same first words of the difference).

    Example::

        small = minimize(check(program(17), "fuse"))
    """
    kind = mismatch.what.split(":")[0].split("[")[0]
    best = mismatch

    def still(prog):
        found = check(prog, mismatch.path, run)
        same = found and not found.accepted and found.what.split(":")[0].split("[")[0] == kind
        return found if same else None

    changed = True
    while changed:
        changed = False
        prog = best.prog
        for i in reversed(range(len(prog.lines))):
            lines = prog.lines[:i] + prog.lines[i + 1:]
            defined = {line.split(" = ")[0] for line in lines if " = " in line}
            returns = [r for r in prog.returns if r in defined] or ["x0"]
            loss = [r for r in prog.loss if r in defined]
            found = still(dataclasses.replace(prog, lines=lines, returns=returns, loss=loss))
            if found:
                best, changed = found, True
                break
        prog = best.prog
        for r in list(prog.returns):
            if len(prog.returns) > 1:
                fewer = [x for x in prog.returns if x != r]
                found = still(dataclasses.replace(prog, returns=fewer))
                if found:
                    best, changed = found, True
                    break
    return best


# ------------------------------------------------------------------------------------- main

def sweep(seeds, paths, ops=6, minimize_found=False, out=sys.stdout, minutes=None,
          generation=GENERATION) -> list:
    """Run the programs of ``seeds`` on ``paths`` (stopping after ``minutes``, if given); print
    and return the mismatches, the accepted ones (``Mismatch.accepted``) among them."""
    import torchtpu_compile
    # our setting, not torch's global one: a test run in the same process after a sweep must
    # see torch's precision as nobody set it
    with torchtpu_compile.config.patch(matmul_precision="highest"):
        return _sweep(seeds, paths, ops, minimize_found, out, minutes, generation)


def _sweep(seeds, paths, ops, minimize_found, out, minutes, generation) -> list:
    found, start, ran = [], time.time(), 0
    for seed in seeds:
        if minutes is not None and time.time() - start > minutes * 60:
            break
        ran += 1
        prog = program(seed, ops, generation)
        for path in paths:
            try:
                mismatch = check(prog, path)
            except Exception as exc:  # the harness itself broke: a finding too
                mismatch = Mismatch(seed, path, f"harness: {exc!r}", prog)
            if mismatch and minimize_found and not mismatch.accepted:
                mismatch = minimize(mismatch)
            if mismatch:
                found.append(mismatch)
                print(mismatch, file=out, flush=True)
    print(f"{ran} programs (seeds {seeds[0]}..{list(seeds)[ran - 1]}) x {len(paths)} paths, "
          f"{sum(not m.accepted for m in found)} mismatches "
          f"(and {sum(bool(m.accepted) for m in found)} accepted), "
          f"{time.time() - start:.0f}s", file=out, flush=True)
    return found


def _seeds(text: str) -> range | list:
    if ":" in text:
        lo, hi = text.split(":")
        return range(int(lo), int(hi))
    return [int(s) for s in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0:50", help="a:b or a,b,c")
    parser.add_argument("--paths", default="compile,eager,fuse")
    parser.add_argument("--ops", type=int, default=6)
    parser.add_argument("--generation", type=int, default=GENERATION,
                        help="the generation of templates drawn (later ones add families)")
    parser.add_argument("--jobs", type=int, default=1, help="only 1 (the machine is shared)")
    parser.add_argument("--minimize", action="store_true")
    parser.add_argument("--minutes", type=float, help="stop after this long")
    parser.add_argument("--show", action="store_true", help="print the programs and stop")
    args = parser.parse_args(argv)
    import logging
    logging.getLogger("torchtpu").setLevel(logging.ERROR)
    if args.show:
        for seed in _seeds(args.seeds):
            print(f"# seed {seed}\n{program(seed, args.ops, args.generation).repro()}")
        return 0
    found = sweep(_seeds(args.seeds), args.paths.split(","), args.ops, args.minimize,
                  minutes=args.minutes, generation=args.generation)
    return 1 if any(not m.accepted for m in found) else 0


if __name__ == "__main__":
    sys.exit(main())
