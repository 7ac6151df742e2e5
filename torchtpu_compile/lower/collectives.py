"""Collectives as StableHLO, one builder per collective (the one lowering of collectives).

Each builder returns the body of a function that one replica runs: it takes this process's
tensors and returns its results, and its collective ops span the group's replicas (replica
``i`` is group rank ``i``). tpu_dist's PJRT transport compiles them as whole programs
(``torchtpu_eager.distributed.pjrt_transport``); a compiled graph with functional collectives
gets the same ops spliced in where the collectives were (``collective_graphs.py``).

What the CPU client's gloo collectives can do decides the forms: sum, product, max and min
reductions (no bitwise ones), no collective_broadcast (a broadcast is a sum of the root's
bits and everyone else's zeros, exact for every dtype) and no working collective_permute
(send and recv stay host-staged).

Example::

    text = module_text("all_reduce", 2, (((4, 3), torch.float32),), reduce="add",
                       average=False)
"""
from __future__ import annotations

import torch

from . import mlir_types
from .mlir_types import tensor_type as tensor

#: What PJRT collectives carry: every element type but complex ones (host-staged).
ELEMENT_TYPES = {dtype: element for dtype, element in mlir_types.ELEMENT_TYPES.items()
                 if not dtype.is_complex}
#: The StableHLO body of each reduction tpu_dist runs through PJRT.
REDUCTIONS = {"sum": "add", "product": "multiply", "max": "maximum", "min": "minimum"}
_BITS = {1: "ui8", 2: "ui16", 4: "ui32", 8: "ui64"}  # same-width unsigned, for exact moves

_BUILDERS: dict = {}


def collective(name: str):
    """Register ``fn(n, signature, **params) -> list of body lines`` as collective ``name``.

    ``signature``: ((shape, dtype), ...) of the inputs; the lines use ``%arg{i}`` for the
    inputs and end with a ``return``; ``n`` is the group size.

    Example::

        @collective("identity")
        def identity(n, signature):
            return [f"return %arg0 : {tensor(*signature[0])}"]
    """
    def register(fn):
        _BUILDERS[name] = fn
        return fn
    return register


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


class _Body:
    """Lines of a function body with fresh SSA names."""

    def __init__(self, n: int):
        self.n = n
        self.lines: list = []
        self._count = 0
        self.groups = f"dense<[[{', '.join(map(str, range(n)))}]]> : tensor<1x{n}xi64>"

    def op(self, text: str) -> str:
        name = f"%v{self._count}"
        self._count += 1
        self.lines.append(f"{name} = {text}")
        return name

    def reshape(self, value: str, src: str, dst: str) -> str:
        return value if src == dst else self.op(f'"stablehlo.reshape"({value}) : ({src}) -> {dst}')

    def constant(self, literal: str, type_: str) -> str:
        return self.op(f'"stablehlo.constant"() {{value = dense<{literal}> : {type_}}} : '
                       f"() -> {type_}")

    def all_reduce(self, value: str, type_: str, element: str, body: str) -> str:
        x, y = f"%x{self._count}", f"%y{self._count}"
        scalar = f"tensor<{element}>"
        return self.op(
            f'"stablehlo.all_reduce"({value}) ({{\n'
            f"  ^bb0({x}: {scalar}, {y}: {scalar}):\n"
            f'    %r = "stablehlo.{body}"({x}, {y}) : ({scalar}, {scalar}) -> {scalar}\n'
            f'    "stablehlo.return"(%r) : ({scalar}) -> ()\n'
            f"  }}) {{replica_groups = {self.groups}}} : ({type_}) -> {type_}")

    def divide(self, value: str, type_: str, dtype) -> str:
        literal = f"{float(self.n):e}" if dtype.is_floating_point else str(self.n)
        divisor = self.constant(literal, type_)
        # Integer division in StableHLO truncates toward zero, as reduce_ops.average does.
        return self.op(f'"stablehlo.divide"({value}, {divisor}) : ({type_}, {type_}) -> {type_}')

    def slice(self, value: str, src: str, start: list, limit: list, dst: str) -> str:
        ints = lambda xs: f"array<i64: {', '.join(map(str, xs))}>"  # noqa: E731
        return self.op(f'"stablehlo.slice"({value}) {{start_indices = {ints(start)}, '
                       f'limit_indices = {ints(limit)}, strides = {ints([1] * len(start))}}} '
                       f": ({src}) -> {dst}")

    def rows(self, signature) -> tuple:
        """The inputs as one [n, m] value (one tensor of n*m elements, or n of m each)."""
        m = _numel(signature[0][0]) // (self.n if len(signature) == 1 else 1)
        dtype = signature[0][1]
        if len(signature) == 1:
            return self.reshape("%arg0", tensor(*signature[0]), tensor((self.n, m), dtype)), m
        parts = [self.reshape(f"%arg{i}", tensor(*sig), tensor((1, m), dtype))
                 for i, sig in enumerate(signature)]
        row = tensor((1, m), dtype)
        joined = self.op(f'"stablehlo.concatenate"({", ".join(parts)}) {{dimension = 0 : i64}} '
                         f": ({', '.join([row] * len(parts))}) -> {tensor((self.n, m), dtype)}")
        return joined, m

    def split_rows(self, value: str, m: int, dtype, outputs) -> list:
        """Row ``i`` of an [n, m] value as output ``i`` (each of shape ``outputs[i]``)."""
        whole = tensor((self.n, m), dtype)
        return [self.reshape(self.slice(value, whole, [i, 0], [i + 1, m], tensor((1, m), dtype)),
                             tensor((1, m), dtype), tensor(shape, dtype))
                for i, shape in enumerate(outputs)]


def _returning(body: _Body, values: list, types: list) -> list:
    body.lines.append(f"return {', '.join(values)} : {', '.join(types)}")
    return body.lines


@collective("all_reduce")
def all_reduce(n, signature, reduce: str, average: bool):
    """Each input reduced over the group (and divided by n for an average)."""
    body = _Body(n)
    results, types = [], []
    for i, (shape, dtype) in enumerate(signature):
        type_ = tensor(shape, dtype)
        value = body.all_reduce(f"%arg{i}", type_, ELEMENT_TYPES[dtype], reduce)
        if average:
            value = body.divide(value, type_, dtype)
        results.append(value)
        types.append(type_)
    return _returning(body, results, types)


@collective("broadcast")
def broadcast(n, signature, root: int):
    """Every input as the root has it: the sum of the root's bits and everyone else's zeros."""
    body = _Body(n)
    replica = body.op('"stablehlo.replica_id"() : () -> tensor<ui32>')
    root_id = body.constant(str(root), "tensor<ui32>")
    is_root = body.op(f'"stablehlo.compare"({replica}, {root_id}) {{comparison_direction = '
                      f"#stablehlo<comparison_direction EQ>}} : (tensor<ui32>, tensor<ui32>) "
                      f"-> tensor<i1>")
    results, types = [], []
    for i, (shape, dtype) in enumerate(signature):
        type_ = tensor(shape, dtype)
        bits_element = _BITS[dtype.itemsize]
        bits = tensor(shape, bits_element)
        move = "convert" if dtype is torch.bool else "bitcast_convert"
        value = body.op(f'"stablehlo.{move}"(%arg{i}) : ({type_}) -> {bits}')
        zeros = body.constant("0", bits)
        mine = body.op(f'"stablehlo.select"({is_root}, {value}, {zeros}) : '
                       f"(tensor<i1>, {bits}, {bits}) -> {bits}")
        summed = body.all_reduce(mine, bits, bits_element, "add")
        results.append(body.op(f'"stablehlo.{move}"({summed}) : ({bits}) -> {type_}'))
        types.append(type_)
    return _returning(body, results, types)


@collective("all_gather")
def all_gather(n, signature, outputs: tuple):
    """One input gathered from every rank in rank order: into one output of n times its
    elements, or into n outputs (one per rank)."""
    body = _Body(n)
    (shape, dtype), = signature
    m = _numel(shape)
    row = body.reshape("%arg0", tensor(shape, dtype), tensor((1, m), dtype))
    gathered = body.op(f'"stablehlo.all_gather"({row}) {{all_gather_dim = 0 : i64, '
                       f"replica_groups = {body.groups}}} : ({tensor((1, m), dtype)}) -> "
                       f"{tensor((n, m), dtype)}")
    if len(outputs) == 1:
        out = body.reshape(gathered, tensor((n, m), dtype), tensor(outputs[0], dtype))
        return _returning(body, [out], [tensor(outputs[0], dtype)])
    parts = body.split_rows(gathered, m, dtype, outputs)
    return _returning(body, parts, [tensor(s, dtype) for s in outputs])


@collective("reduce_scatter")
def reduce_scatter(n, signature, output: tuple, reduce: str, average: bool):
    """Rank r gets chunk r of the reduction (one input of n chunks, or n chunk inputs)."""
    body = _Body(n)
    dtype = signature[0][1]
    rows, m = body.rows(signature)
    scattered = body.op(
        f'"stablehlo.reduce_scatter"({rows}) ({{\n'
        f"  ^bb0(%x: tensor<{ELEMENT_TYPES[dtype]}>, %y: tensor<{ELEMENT_TYPES[dtype]}>):\n"
        f'    %r = "stablehlo.{reduce}"(%x, %y) : (tensor<{ELEMENT_TYPES[dtype]}>, '
        f"tensor<{ELEMENT_TYPES[dtype]}>) -> tensor<{ELEMENT_TYPES[dtype]}>\n"
        f'    "stablehlo.return"(%r) : (tensor<{ELEMENT_TYPES[dtype]}>) -> ()\n'
        f"  }}) {{scatter_dimension = 0 : i64, replica_groups = {body.groups}}} : "
        f"({tensor((n, m), dtype)}) -> {tensor((1, m), dtype)}")
    if average:
        scattered = body.divide(scattered, tensor((1, m), dtype), dtype)
    out = body.reshape(scattered, tensor((1, m), dtype), tensor(output, dtype))
    return _returning(body, [out], [tensor(output, dtype)])


@collective("all_to_all")
def all_to_all(n, signature, outputs: tuple):
    """Chunk j of rank r's input becomes chunk r of rank j's output (equal chunks)."""
    body = _Body(n)
    dtype = signature[0][1]
    rows, m = body.rows(signature)
    whole = tensor((n, m), dtype)
    moved = body.op(f'"stablehlo.all_to_all"({rows}) {{split_dimension = 0 : i64, '
                    f"concat_dimension = 0 : i64, split_count = {n} : i64, "
                    f"replica_groups = {body.groups}}} : ({whole}) -> {whole}")
    if len(outputs) == 1:
        out = body.reshape(moved, whole, tensor(outputs[0], dtype))
        return _returning(body, [out], [tensor(outputs[0], dtype)])
    return _returning(body, body.split_rows(moved, m, dtype, outputs),
                      [tensor(s, dtype) for s in outputs])


def module_text(name: str, n: int, signature, donate: tuple = (), **params) -> str:
    """The whole module of collective ``name`` for ``n`` replicas; the inputs at positions
    ``donate`` give their memory to the result at the same position (same shape and dtype)."""
    lines = _BUILDERS[name](n, signature, **params)
    args = ", ".join(f"%arg{i}: {tensor(*sig)}"
                     + (f" {{tf.aliasing_output = {i} : i32}}" if i in donate else "")
                     for i, sig in enumerate(signature))
    results = lines[-1].split(" : ", 1)[1]
    body = "\n    ".join("\n    ".join(line.splitlines()) for line in lines)
    return (f"module @tpu_dist_{name} attributes {{mhlo.num_replicas = {n} : i32, "
            f"mhlo.num_partitions = 1 : i32}} {{\n"
            f"  func.func public @main({args}) -> ({results}) {{\n    {body}\n  }}\n}}\n")


def transportable(dtype) -> bool:
    """Whether PJRT collectives carry tensors of ``dtype`` (complex ones are host-staged)."""
    return dtype in ELEMENT_TYPES
