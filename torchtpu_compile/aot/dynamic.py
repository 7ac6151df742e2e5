"""Dynamic dims in AOT artifacts: one program per bucket, and the layouts to pad and unpad.

At export, every size symbol of the exported program (a ``torch.export.Dim``) gets the buckets
of ``torchtpu_compile.config.bucket_policy`` that cover its ``[min, max]`` range, and each
combination of buckets becomes one static program (``buckets/trace.py``, the same padding rules
as the compile path). The manifest records, per dynamic dim, its input, range and buckets; per
program, how its padded outputs map back to real ones. The loader (``BucketTable``) binds the
real sizes from the inputs, picks the smallest bucket covering each, and pads and unpads with
``buckets/layout.py``; it needs sympy, not Dynamo or torch-mlir.

Example::

    table = BucketTable(path, manifest["dynamic_dims"], manifest["inputs"])
    real_env = table.bind(flat_inputs)          # {s0: 3}; a clear error outside [min, max]
    key = table.key(real_env)                   # (8,): the program for bucket 8
"""
from __future__ import annotations

import itertools

import sympy

from ..errors import LoweringError

#: More programs than this in one artifact is a policy mistake, not a plan: each is a full XLA
#: compile at export and a load at start.
MAX_PROGRAMS = 16


def _symbol(name: str) -> sympy.Symbol:
    # The assumptions torch's ShapeEnv gives size symbols, so parsed expressions compare equal.
    return sympy.Symbol(name, integer=True, positive=True)


def _functions() -> dict:
    # torch's size functions (FloorDiv, Mod, ...), which ``sympy.srepr`` names but sympy lacks.
    from torch.utils._sympy import functions as symfn
    return {name: getattr(symfn, name) for name in symfn.__all__}


def parse_expr(text, symbols: dict):
    """An int, or a size expression over ``symbols`` (name -> Symbol) written by ``dump_expr``.

    Example::

        s0 = _symbol("s0")
        parse_expr("2*s0", {"s0": s0}) == 2 * s0
    """
    if isinstance(text, int):
        return text
    return sympy.sympify(text, locals={**_functions(), **symbols})


def dump_expr(expr, check_env: dict):
    """An int, or the text of a size expression: plain (``2*s0``) where that reads back, else
    ``sympy.srepr`` (torch's ``FloorDiv`` prints as ``//``, which sympy reads as ``floor``).
    LoweringError if neither reads back to the same value at ``check_env``.

    Example::

        dump_expr(2 * s0, {s0: 8}) == "2*s0"
    """
    from ..buckets.layout import evaluate
    if isinstance(expr, int) or (isinstance(expr, sympy.Expr) and expr.is_Integer):
        return int(expr)
    symbols = {str(s): _symbol(str(s)) for s in expr.free_symbols}
    env = {symbols[str(s)]: v for s, v in check_env.items() if str(s) in symbols}
    for text in (str(expr), sympy.srepr(expr)):
        try:
            if evaluate(parse_expr(text, symbols), env) == evaluate(expr, check_env):
                return text
        except Exception:
            continue
    raise LoweringError(f"the size expression {expr} of a dynamic output cannot be stored "
                        f"in an artifact; export with static shapes for it")


def dump_layout(layout, check_env: dict) -> list:
    """JSON for a layout: per dim None, or its factors and whether it is uniform.

    Example::

        dump_layout((prefix(s0), None), {s0: 8}) == [{"factors": ["s0"], "uniform": False}, None]
    """
    return [None if dim is None else
            {"factors": [dump_expr(f, check_env) for f in dim.factors], "uniform": dim.uniform}
            for dim in layout]


def load_layout(data: list, symbols: dict) -> tuple:
    """The layout ``dump_layout`` wrote, with its symbols from ``symbols`` (name -> Symbol).

    Example::

        load_layout([{"factors": ["s0"], "uniform": False}, None], {"s0": s0}) == \
            (Dim((s0,)), None)
    """
    from ..buckets.layout import Dim
    return tuple(None if dim is None else
                 Dim(tuple(parse_expr(f, symbols) for f in dim["factors"]), dim["uniform"])
                 for dim in data)


def dump_plan_outputs(outputs: list, check_env: dict) -> list:
    """JSON for ``BucketPlan.outputs``: padded tensors with their layouts, sizes, values.

    Example::

        dump_plan_outputs([("tensor", 0, (prefix(s0),)), ("value", None)], {s0: 8}) == \
            [["tensor", 0, [{"factors": ["s0"], "uniform": False}]], ["value", None]]
    """
    dumped = []
    for kind, *rest in outputs:
        if kind == "tensor":
            dumped.append(["tensor", rest[0], dump_layout(rest[1], check_env)])
        elif kind == "size":
            dumped.append(["size", dump_expr(rest[0], check_env)])
        else:
            dumped.append(["value", rest[0]])
    return dumped


def bucket_ladder(low: int, high: int) -> list:
    """The buckets of the configured policy that serve every size in ``[low, high]``; the
    last is ``high`` itself, since no larger size can come (padding past it is waste).

    Example::

        bucket_ladder(2, 20) == [8, 16, 20]     # policy "pow2-128", bucket_min 8
    """
    from ..buckets.policy import bucket_size
    return sorted({min(bucket_size(size), high) for size in range(max(1, low), high + 1)})


def plan_buckets(exported, spec, binding_names: dict) -> tuple[list, list]:
    """(dynamic dim records for the manifest, bucket keys) for an exported program.

    ``binding_names`` maps each symbol to (input name, user input index, dim).

    Example::

        records, keys = plan_buckets(exported, analyze(gm, {}), {s0: ("x", 0, 0)})
        keys == [(8,), (16,)]     # a Dim with min=2, max=16
    """
    records, ladders = [], []
    for symbol in spec.symbols:
        name, index, dim = binding_names[symbol]
        bounds = exported.range_constraints.get(symbol)
        # Unbounded ends are torch's int_oo, which is not a sympy Integer.
        low = int(bounds.lower) if bounds is not None and bounds.lower.is_Integer else 1
        high = bounds.upper if bounds is not None else None
        if high is None or not high.is_Integer:
            raise LoweringError(
                f"input {name!r} dim {dim} is dynamic without an upper bound; give its "
                f"torch.export.Dim a max= so that the artifact can hold a bucket for every size")
        ladder = bucket_ladder(low, int(high))
        ladders.append(ladder)
        records.append({"input": name, "input_index": index, "dim": dim,
                        "symbol": str(symbol), "min": low, "max": int(high), "buckets": ladder})
    keys = list(itertools.product(*ladders))
    if len(keys) > MAX_PROGRAMS:
        raise LoweringError(
            f"dynamic dims {[(r['input'], r['dim']) for r in records]} need {len(keys)} bucket "
            f"programs (more than {MAX_PROGRAMS}); narrow their Dim ranges or choose a coarser "
            f"torchtpu_compile.config.bucket_policy")
    return records, keys


class BucketTable:
    """The loader's view of an artifact's dynamic dims: bind real sizes, pick the bucket.

    ``records`` are the manifest's ``dynamic_dims`` (one per symbol); ``inputs`` its input
    specs, whose ``dynamic`` maps a dim to its symbol.
    """

    def __init__(self, path: str, records: list, inputs: list):
        self.path = path
        self.records = {r["symbol"]: r for r in records}
        self.order = [r["symbol"] for r in records]
        self.inputs = inputs
        self.symbols = {name: _symbol(name) for name in self.order}

    def bind(self, flat: list) -> dict:
        """{symbol: real size} from the inputs; ValueError naming the input and dim if a size
        is outside the range the artifact was exported for."""
        env = {}
        for value, spec in zip(flat, self.inputs):
            for dim, name in spec.get("dynamic", {}).items():
                dim, record = int(dim), self.records[name]
                size = int(value.shape[dim]) if value.dim() > dim else None
                if size is None or not record["min"] <= size <= record["max"]:
                    raise ValueError(
                        f"{self.path}: input {spec['name']!r} has size {size} in dim {dim}; "
                        f"the artifact was compiled for sizes {record['min']} to "
                        f"{record['max']} there (buckets {record['buckets']})")
                symbol = self.symbols[name]
                if env.setdefault(symbol, size) != size:
                    raise ValueError(
                        f"{self.path}: input {spec['name']!r} has size {size} in dim {dim}, "
                        f"which the exported program ties to a size of {env[symbol]} elsewhere")
        return env

    def key(self, real_env: dict) -> tuple:
        """The smallest bucket covering each real size, in the records' order."""
        return tuple(next(b for b in self.records[name]["buckets"]
                          if b >= real_env[self.symbols[name]]) for name in self.order)

    def pad_env(self, key: tuple) -> dict:
        return {self.symbols[name]: b for name, b in zip(self.order, key)}
