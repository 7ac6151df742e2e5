"""Re-trace a graph with symbolic sizes as a static graph at a bucket's padded sizes.

The traced graph takes the padded tensors, then one 0-d int64 tensor per size symbol holding
its real value, and runs each node through its padding rule (rules.py). What comes out is an
ordinary static graph for the program builder (``program/build.py``), plus the plan to turn its
padded outputs back into real ones.

Example::

    spec = analyze(gm, known_layouts={})
    plan = trace_bucket(gm, spec, {s0: 128})
    plan.gm   # static: inputs padded to 128, then s0's real value
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

import sympy
import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

from .layout import (Dim, NotPaddable, assuming_equal, constant_size, evaluate, is_symbolic,
                     never_shrinks, of_one_symbol_each, prefix, prefix_holds, same_size,
                     sym_expr, under_guards)
from . import spatial_rules  # noqa: F401  (registers its rules in RULES)
from .rules import RULES, Context, Padded, Size, pointwise, unwrap

_ASSERT = torch.ops.aten._assert_async.msg   # read by nothing, run all the same (rules.py)
_SKIPPED = {torch.ops.aten._assert_scalar.default, torch.ops.aten.sym_constrain_range.default,
            torch.ops.aten.sym_constrain_range_for_size.default}


@dataclass
class InputSpec:
    """How each placeholder of a symbolic graph is fed: its layout, or the size it is."""
    kinds: list                     # per placeholder: "tensor", "size" or "unused"
    layouts: list                   # per placeholder: layout (tensor) / expr (size) / None
    symbols: list                   # the size symbols, in program-argument order
    binding: dict                   # symbol -> (placeholder index, dim or None)
    # symbol -> the symbol it is assumed to equal (layout.assuming_equal): bound, so that each
    # call checks the two real sizes; it picks no bucket of its own
    aliases: dict = field(default_factory=dict)


@dataclass
class BucketPlan:
    """A bucket's static graph and how its outputs map back to the symbolic graph's."""
    gm: fx.GraphModule
    # ("tensor", program index, layout) | ("size", expr) | ("value", v)
    outputs: list
    named_layouts: dict = field(default_factory=dict)   # output node name -> layout


def analyze(gm: fx.GraphModule, known_layouts: dict, aliases: dict | None = None) -> InputSpec:
    """Layouts of the placeholders; ``known_layouts`` (by node name) come from the forward
    graph for tensors it saved for the backward. Under ``aliases`` (symbol -> the symbol it
    is taken to equal), layouts name only the symbols aliased to; an alias holds only where
    inputs bind both symbols, for the check of each call (the forward's, taken by its backward,
    may name symbols the backward does not have)."""
    bound = {_own_symbol(size) for node in gm.graph.nodes if node.op == "placeholder"
             for size in _sizes_of(node.meta.get("val"))}
    aliases = {a: b for a, b in (aliases or {}).items() if a in bound and b in bound}
    for a in aliases:  # each maps to the end of its chain
        seen = {a}
        while aliases[a] in aliases and aliases[a] not in seen:
            seen.add(aliases[a])
            aliases[a] = aliases[aliases[a]]
    if any(a == b for a, b in aliases.items()):
        raise NotPaddable(f"size symbols assumed equal in a cycle: {aliases}")
    with assuming_equal(aliases):
        spec = _analyze(gm, {name: tuple(None if dim is None else Dim(
            tuple(sym_expr(f) for f in dim.factors), dim.uniform) for dim in layout)
            for name, layout in known_layouts.items()}, aliases)
    spec.aliases = aliases
    return spec


def _sizes_of(val) -> tuple:
    if isinstance(val, torch.Tensor):
        return tuple(val.shape)
    return (val,) if isinstance(val, torch.SymInt) else ()


def size_binding(gm: fx.GraphModule) -> dict:
    """Symbol -> (placeholder index, dim) of the first input whose size it is, or
    (placeholder index, None) for a size input; a call's real value of each symbol is there.

    Example::

        size_binding(gm)   # {s0: (0, 0), s1: (0, 1)} for one input of shape (s0, s1)
    """
    binding = {}
    for i, node in enumerate(n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                symbol = _own_symbol(size)
                if symbol is not None:
                    binding.setdefault(symbol, (i, d))
        elif isinstance(val, torch.SymInt) and _own_symbol(val) is not None:
            binding.setdefault(_own_symbol(val), (i, None))  # it may be the only one
    return binding


def _analyze(gm: fx.GraphModule, known_layouts: dict, aliases: dict) -> InputSpec:
    kinds, layouts, binding = [], [], size_binding(gm)
    for node in (n for n in gm.graph.nodes if n.op == "placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            if free_unbacked_symbols(val):
                raise NotPaddable("an input with a data-dependent size")
            shape = [sym_expr(s) for s in val.shape]
            layout = known_layouts.get(node.name)
            if layout is not None and not _fits(layout, shape):
                layout = None  # another graph's tensor of the same name
            if layout is None:
                layout = []
                for expr in shape:
                    if _has_own_layout(expr):
                        layout.append(prefix(expr))
                    elif is_symbolic(expr):
                        raise NotPaddable(f"input {node.name} has a dim {expr} whose padded "
                                          f"layout is unknown")
                    else:
                        layout.append(None)
            kinds.append("tensor")
            layouts.append(tuple(layout))
        elif isinstance(val, torch.SymInt):
            expr = sym_expr(val)
            kinds.append("size" if node.users else "unused")
            layouts.append(expr if node.users else None)
        elif node.users:
            raise NotPaddable(f"input {node.name} is a {type(val).__name__}, not a tensor or size")
        else:
            kinds.append("unused")
            layouts.append(None)
    needed = set()
    for kind, layout in zip(kinds, layouts):
        if kind == "tensor":
            for dim in layout:
                for f in (dim.factors if dim is not None else ()):
                    needed |= getattr(f, "free_symbols", set())
        elif kind == "size" and is_symbolic(layout):
            needed |= layout.free_symbols
    unbound = needed - set(binding)
    if unbound:
        raise NotPaddable(f"size symbols {sorted(map(str, unbound))} are bound by no input")
    # Only sizes the program depends on pick buckets: a size input that no node reads and no
    # tensor's shape holds (Falcon's decode step has one) would compile one program per
    # bucket of its own. An aliased symbol stays bound, for the check of its size.
    symbols = sorted((s for s in binding if s in needed), key=str)
    binding = {s: where for s, where in binding.items() if s in needed or s in aliases}
    return InputSpec(kinds, layouts, symbols, binding)


def _own_symbol(size):
    """The symbol a size is, as Dynamo named it (an alias not applied), or None."""
    expr = size.node.expr if isinstance(size, torch.SymInt) else None
    return expr if isinstance(expr, sympy.Symbol) else None


def _grows_with_its_symbols(expr) -> bool:
    """Whether an input's dim ``expr`` never shrinks as its symbols grow: sums, products with
    positive ints and floor divisions by them, of symbols and ints (a mask one longer than its
    cache, ``s + 1``; a strided convolution's output, ``(s - 1) // 2 + 1``, whose gradient a
    backward takes). Padded to its value at the bucket, its real elements are a prefix
    (``expr(n) <= expr(P)`` for ``n <= P``), as a symbol's are.

    Example::

        _grows_with_its_symbols(s0 + 1)      # True
        _grows_with_its_symbols(8 - s0)      # False: it shrinks as s0 grows
    """
    return is_symbolic(expr) and never_shrinks(expr)


def _of_one_symbol(expr) -> bool:
    # A size that grows in steps (``s + (-s) % 7``, a window partition's padded length), or a
    # product of such sizes of one symbol each (a grid of them, ``h * w``): a prefix where the
    # bucket's size is at least every smaller one's, which trace_bucket checks for the bucket
    # at hand (layout.prefix_holds).
    return is_symbolic(expr) and of_one_symbol_each(expr)


def _has_own_layout(expr) -> bool:
    """Whether an input dim of size ``expr`` is padded as a prefix of its own: a symbol, a
    size that never shrinks as its symbols grow, or one of sizes of one symbol each.

    Example::

        _has_own_layout(s0 + 1)            # True
        _has_own_layout(8 - s0)            # False: it shrinks as s0 grows
    """
    return isinstance(expr, sympy.Symbol) or _grows_with_its_symbols(expr) or \
        _of_one_symbol(expr)


def _fits(layout, shape) -> bool:
    """Whether a layout the forward found fits this input's shape. Sizes that sympy cannot
    prove equal to the layout's (Swin's window counts, ``X // (X // 2)``) fit where they
    name the same symbols: ``trace_bucket`` checks them at each bucket
    (``_check_input_dims``). A dim without padding fits a size spelled with symbols where
    the size has no layout of its own to derive (it may be one value: checked there too)."""
    if len(layout) != len(shape):
        return False
    for dim, expr in zip(layout, shape):
        if dim is None:
            if _has_own_layout(expr):
                return False
            continue  # a size spelled with symbols that may be one value
        product = sympy.Mul(*dim.factors)
        if sympy.simplify(product - expr) != 0 and (
                not is_symbolic(expr) or product.free_symbols != expr.free_symbols):
            return False
    return True


def padded_shape(layout, val, pad_env: dict) -> list:
    return [dim.padded(pad_env) if dim is not None else int(evaluate(sym_expr(s), pad_env))
            for dim, s in zip(layout, val.shape)]


def trace_bucket(gm: fx.GraphModule, spec: InputSpec, pad_env: dict) -> BucketPlan:
    """The static graph of one bucket (raises NotPaddable for an op no rule makes exact)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    guards = _size_guards(placeholders)
    examples = []
    for node, kind, layout in zip(placeholders, spec.kinds, spec.layouts):
        if kind == "tensor":
            val = node.meta["val"]
            with assuming_equal(spec.aliases), under_guards(guards, pad_env):
                _check_input_dims(node.name, layout, val, pad_env)
            examples.append(torch.zeros(padded_shape(layout, val, pad_env), dtype=val.dtype))
    examples += [torch.zeros((), dtype=torch.int64) for _ in spec.symbols]
    plan = BucketPlan(gm=None, outputs=[])

    def run(*flat):
        real_env = dict(zip(spec.symbols, flat[len(flat) - len(spec.symbols):]))
        return _interpret(gm, spec, flat, Context(pad_env, real_env), plan)

    # The rules emit ATen ops that the backend's table may decompose (cumsum, left whole at a
    # symbolic length): decompose them the same way, now that sizes are static.
    # The graph's own index checks are marked already (their rule pads them); the indexing the
    # rules add is in range by construction.
    from ..lower.decompositions import decomposition_table
    from ..lower.index_checks import unchecked
    # Nodes keep their source node's meta (its stack trace: errors name the user's line).
    with torch.no_grad(), unchecked(), fx_traceback.preserve_node_meta(), \
            assuming_equal(spec.aliases), under_guards(guards, pad_env):
        plan.gm = make_fx(run, decomposition_table=decomposition_table(),
                          tracing_mode="fake")(*examples)
    return plan


def _check_input_dims(name: str, layout, val, pad_env: dict) -> None:
    """Each input dim's layout holds at this bucket: its factors' real sizes fit in the
    bucket's, and a layout ``_fits`` took on trust matches the dim's size at every real size
    (a dim the forward found to be one value, a window's area ``X // (X // 2)``)."""
    for dim, size in zip(layout, val.shape):
        expr = sym_expr(size)
        if dim is None:
            if is_symbolic(expr) and constant_size(expr, pad_env) is None:
                raise NotPaddable(f"input {name} has a dim {expr} whose padded layout is "
                                  f"unknown")
            continue
        if not all(prefix_holds(f, pad_env) for f in dim.factors):
            raise NotPaddable(f"input {name} has a dim {dim.factors} that a smaller size "
                              f"outgrows at this bucket")
        if not same_size(sympy.Mul(*dim.factors), expr, pad_env):
            raise NotPaddable(f"input {name} has a dim {expr} that its layout {dim.factors} "
                              f"does not match")


def _size_guards(placeholders) -> list:
    """The relations Dynamo guarded the graph's sizes on (from its inputs' shape env)."""
    for node in placeholders:
        val = node.meta.get("val")
        sizes = val.shape if isinstance(val, torch.Tensor) else [val]
        for size in sizes:
            if isinstance(size, torch.SymInt):
                return [guard.expr for guard in size.node.shape_env.guards]
    return []


def _interpret(gm, spec, flat, ctx: Context, plan: BucketPlan) -> list:
    env: dict = {}
    tensors = iter(flat)
    for node, kind, layout in zip((n for n in gm.graph.nodes if n.op == "placeholder"),
                                  spec.kinds, spec.layouts):
        if kind == "tensor":
            env[node] = Padded(next(tensors), layout)
        elif kind == "size":
            env[node] = _size(layout, ctx)
        else:
            env[node] = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "output":
            return _outputs(node, env, plan)
        if node.op == "get_attr":
            env[node] = _constant(gm, node)
            continue
        if node.op != "call_function":
            raise NotPaddable(f"{node.op} nodes are not supported")
        if not node.users and node.target is not _ASSERT:
            continue
        args, kwargs = _on_the_host(fx.node.map_arg(node.args, lambda n: env[n]),
                                    fx.node.map_arg(node.kwargs, lambda n: env[n]))
        with fx_traceback.set_current_meta(node):
            try:
                env[node] = _run_node(node, args, kwargs, ctx)
                ctx.check_fits(env[node], node)
            except NotPaddable:
                raise
            except RuntimeError as exc:
                # A size Dynamo made a constant under a guard (``linspace(0, 1, x.numel())``
                # holds the real numel) meets a padded tensor: the graph only runs exact.
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
                raise NotPaddable(f"{node.target} fails at the bucket's sizes: "
                                  f"{first}") from exc
    raise NotPaddable("graph without output")


def _on_the_host(args: tuple, kwargs: dict) -> tuple:
    # The bucket is retraced with CPU examples, and the rules make their masks and indices on
    # the CPU; a graph compiled on tpu tensors names tpu in its factories and copies
    # (arange(..., device=tpu), prims.device_put(x, tpu) from a Hugging Face static cache's
    # .to(device)), which would meet those CPU tensors. The program built from the trace holds
    # no device: the CPU stands for whichever device runs it.
    def host(value):
        if isinstance(value, torch.device) and value.type != "cpu":
            return torch.device("cpu")
        return value
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        kwargs = {**kwargs, "device": torch.device("cpu")}
    return tuple(host(a) for a in args), kwargs


def _constant(gm: fx.GraphModule, node: fx.Node) -> Padded:
    # A tensor the graph holds (torch.tensor([...]) in the model's code, a cache's empty
    # start): the same at every size, so never padded; the trace captures it as a constant.
    value = getattr(gm, node.target)
    if not isinstance(value, torch.Tensor):
        raise NotPaddable(f"get_attr {node.target} holds a {type(value).__name__}, "
                          f"not a tensor")
    return Padded(value, (None,) * value.dim())


def _size(expr, ctx: Context):
    if not is_symbolic(expr):
        return expr if isinstance(expr, (int, float)) else (
            int(expr) if expr.is_Integer else float(expr))
    return Size(expr, evaluate(expr, ctx.pad_env), evaluate(expr, ctx.real_env))


def _has_padding(value) -> bool:
    if isinstance(value, Padded):
        return value.padded
    if isinstance(value, Size):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_padding(v) for v in value)
    if isinstance(value, dict):
        return any(_has_padding(v) for v in value.values())
    return False


def _run_node(node: fx.Node, args, kwargs, ctx: Context):
    target = node.target
    val = node.meta.get("val")
    if target is operator.getitem:
        return args[0][args[1]]
    if target in _SKIPPED or (node.users and all(u.target in _SKIPPED for u in node.users)):
        return None  # a runtime assert, and the SymBool only it reads
    if isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)) or (
            not isinstance(target, torch._ops.OpOverload)):
        if isinstance(val, (torch.SymInt, torch.SymFloat)):
            return _size(sym_expr(val), ctx)
        if isinstance(val, (int, bool)) and not isinstance(val, torch.SymInt):
            return val
        raise NotPaddable(f"{target} computes a {type(val).__name__}")
    rule = RULES.get(target)
    if rule is not None:
        return rule(ctx, node, *args, **kwargs)
    if not _has_padding(args) and not _has_padding(kwargs):
        result = target(*unwrap(args, ctx), **unwrap(kwargs, ctx))
        if isinstance(result, torch.Tensor):
            return Padded(result, (None,) * result.dim())
        if isinstance(result, (tuple, list)):
            return [Padded(r, (None,) * r.dim()) if isinstance(r, torch.Tensor) else r
                    for r in result]
        return result
    if torch.Tag.pointwise in target.tags:
        return pointwise(ctx, node, *args, **kwargs)
    raise NotPaddable(f"{target} has no padding rule")


def _outputs(node: fx.Node, env: dict, plan: BucketPlan) -> list:
    raw = node.args[0]
    values = list(raw) if isinstance(raw, (tuple, list)) else [raw]
    program_outputs = []
    for value in values:
        if isinstance(value, fx.Node):
            result = env[value]
            if isinstance(result, Padded):
                plan.outputs.append(("tensor", len(program_outputs), result.layout))
                plan.named_layouts[value.name] = result.layout
                program_outputs.append(result.tensor)
            elif isinstance(result, Size):
                plan.outputs.append(("size", result.expr))
            else:
                plan.outputs.append(("value", result))
        else:
            plan.outputs.append(("value", value))
    return program_outputs


__all__ = ["InputSpec", "BucketPlan", "analyze", "size_binding", "trace_bucket", "Dim"]
