"""Rewrites of the StableHLO module that torch-mlir produces, one registered function each.

Each pass takes (module, context) and edits the module in place; they run in registration order.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from torch_mlir import ir

_PASSES: list = []


@dataclass
class PassContext:
    platform: str
    precision: str


def stablehlo_pass(fn):
    """Register ``fn(module, ctx)`` as a StableHLO rewrite.

    Example::

        @stablehlo_pass
        def drop_nothing(module, ctx):
            pass
    """
    _PASSES.append(fn)
    return fn


def run_passes(module, ctx: PassContext) -> None:
    """Apply every registered rewrite to ``module``."""
    with module.context:
        for fn in _PASSES:
            fn(module, ctx)


def _ops_named(module, names) -> list:
    found = []

    def visit(op):
        if op.name in names:
            found.append(op)
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found


@stablehlo_pass
def arith_constants_to_stablehlo(module, ctx):
    # torch-mlir leaves tensor-typed arith.constant ops; portable StableHLO artifacts cannot
    # carry the arith dialect, and one spelling keeps fingerprints stable.
    for op in _ops_named(module, ("arith.constant",)):
        if not isinstance(op.result.type.maybe_downcast(), ir.RankedTensorType):
            continue
        new = ir.Operation.create("stablehlo.constant", results=[op.result.type],
                                  attributes={"value": op.attributes["value"]},
                                  loc=op.location, ip=ir.InsertionPoint(op))
        op.result.replace_all_uses_with(new.result)
        op.erase()


_TPU_PRECISION = {"medium": "DEFAULT", "high": "HIGH", "highest": "HIGHEST"}


def _is_f32(value) -> bool:
    value_type = value.type.maybe_downcast()
    return (isinstance(value_type, ir.RankedTensorType)
            and isinstance(value_type.element_type.maybe_downcast(), ir.F32Type))


@stablehlo_pass
def matmul_precision(module, ctx):
    # XLA CPU ignores precision_config, so off TPU "medium" is emulated by rounding f32
    # operands to bf16 (e8m7): their products are exact in f32, and sums stay f32, which is
    # exactly TPU's DEFAULT. On TPU the precision_config says it directly.
    if ctx.platform == "tpu":
        level = _TPU_PRECISION[ctx.precision]
    else:
        level = "HIGHEST"  # keep GPUs from using TF32 behind our back
    precision_attr = ir.Attribute.parse(
        f"[#stablehlo<precision {level}>, #stablehlo<precision {level}>]")
    i32 = ir.IntegerType.get_signless(32)
    emulate_bf16 = ctx.platform != "tpu" and ctx.precision == "medium"
    for op in _ops_named(module, ("stablehlo.dot_general", "stablehlo.convolution")):
        if not all(_is_f32(v) for v in op.operands):
            continue
        op.attributes["precision_config"] = precision_attr
        if not emulate_bf16:
            continue
        for i, value in enumerate(list(op.operands)):
            rounded = ir.Operation.create(
                "stablehlo.reduce_precision", results=[value.type], operands=[value],
                attributes={"exponent_bits": ir.IntegerAttr.get(i32, 8),
                            "mantissa_bits": ir.IntegerAttr.get(i32, 7)},
                loc=op.location, ip=ir.InsertionPoint(op))
            op.operands[i] = rounded.result


def _is_unsigned_or_bool(value) -> bool:
    element = value.type.maybe_downcast().element_type.maybe_downcast()
    return isinstance(element, ir.IntegerType) and (element.width == 1 or element.is_unsigned)


@stablehlo_pass
def unsigned_comparisons(module, ctx):
    # torch-mlir marks every integer comparison SIGNED, bool and uint8 included; XLA's verifier
    # rejects SIGNED on booleans (`bool_a != bool_b`) and would order uint8 128..255 below 0.
    unsigned = ir.Attribute.parse("#stablehlo<comparison_type UNSIGNED>")
    for op in _ops_named(module, ("stablehlo.compare",)):
        if _is_unsigned_or_bool(op.operands[0]):
            op.attributes["compare_type"] = unsigned


def _is_float_compare(op) -> bool:
    return str(op.attributes["compare_type"]) == "#stablehlo<comparison_type FLOAT>" \
        if "compare_type" in op.attributes else False


def _create(name: str, operands: list, result_type, ip, loc, **attributes):
    return ir.Operation.create(name, results=[result_type], operands=operands,
                               attributes=attributes, loc=loc, ip=ip).result


@stablehlo_pass
def sorts_put_nan_last(module, ctx):
    # Eager puts NaN after every number (before them, descending); torch-mlir's comparator is a
    # plain LT/GT, for which NaN is unordered. The comparator becomes eager's. (The sort stays
    # unstable as eager's default sort is: stable=True is a decomposition, _stable_sort.)
    ne = ir.Attribute.parse("#stablehlo<comparison_direction NE>")
    for sort in _ops_named(module, ("stablehlo.sort",)):
        block = sort.regions[0].blocks[0]
        ops = list(block.operations)
        # torch-mlir's comparator: one compare of the first operand's pair, returned.
        if len(ops) != 2 or ops[0].name != "stablehlo.compare" or \
                ops[1].name != "stablehlo.return" or not _is_float_compare(ops[0]):
            continue
        compare, terminator = ops
        a, b = block.arguments[0], block.arguments[1]
        direction = str(compare.attributes["comparison_direction"])
        if list(compare.operands) != [a, b] or not direction.endswith(("LT>", "GT>")):
            continue
        ip, loc, i1 = ir.InsertionPoint(terminator), compare.location, compare.result.type
        kind = compare.attributes["compare_type"]
        a_nan = _create("stablehlo.compare", [a, a], i1, ip, loc, comparison_direction=ne,
                        compare_type=kind)
        b_nan = _create("stablehlo.compare", [b, b], i1, ip, loc, comparison_direction=ne,
                        compare_type=kind)
        # Ascending: a < b, or b is NaN and a is not; descending: a > b, or a is NaN and b is
        # not. Two NaNs (and -0, +0) are equal: the stable sort keeps their order.
        first, second = (b_nan, a_nan) if direction.endswith("LT>") else (a_nan, b_nan)
        not_second = _create("stablehlo.not", [second], i1, ip, loc)
        nan_order = _create("stablehlo.and", [first, not_second], i1, ip, loc)
        terminator.operands[0] = _create("stablehlo.or", [compare.result, nan_order], i1, ip,
                                         loc)


@stablehlo_pass
def arg_reductions_pick_nan(module, ctx):
    # argmax/argmin, max.dim/min.dim: torch-mlir reduces (value, index) pairs with `a >= b`
    # (`a <= b`) and, on `a == b`, the smaller index. NaN compares false with everything, so
    # which NaN (or number) won depended on XLA's reduction order. Eager's rule: the first
    # NaN wins, both directions. NaN becomes the best value and equal to itself; the pair
    # order is then total and the reduction has one answer whatever its order.
    ne = ir.Attribute.parse("#stablehlo<comparison_direction NE>")
    for reduce in _ops_named(module, ("stablehlo.reduce",)):
        ops = list(reduce.regions[0].blocks[0].operations)
        matched = _arg_reduction_compares(ops)
        if matched is None:
            continue
        better, same = matched
        a, b = better.operands
        loc, i1, kind = better.location, better.result.type, better.attributes["compare_type"]
        after_better = ir.InsertionPoint(ops[ops.index(better) + 1])
        a_nan = _create("stablehlo.compare", [a, a], i1, after_better, loc,
                        comparison_direction=ne, compare_type=kind)
        b_nan = _create("stablehlo.compare", [b, b], i1, after_better, loc,
                        comparison_direction=ne, compare_type=kind)
        nan_better = _create("stablehlo.or", [better.result, a_nan], i1, after_better, loc)
        after_same = ir.InsertionPoint(ops[ops.index(same) + 1])
        both_nan = _create("stablehlo.and", [a_nan, b_nan], i1, after_same, loc)
        nan_same = _create("stablehlo.or", [same.result, both_nan], i1, after_same, loc)
        for op in ops:
            if op in (better, same):
                continue
            for i, operand in enumerate(list(op.operands)):
                if operand == better.result:
                    op.operands[i] = nan_better
                elif operand == same.result:
                    op.operands[i] = nan_same


def _arg_reduction_compares(ops: list):
    """(the GE/LE compare, the EQ compare) of torch-mlir's (value, index) reducer, else None.

    Its body: compare GE|LE (a, b); select; compare EQ (a, b); minimum; select; select; return.
    """
    names = [op.name for op in ops]
    if names != ["stablehlo.compare", "stablehlo.select", "stablehlo.compare",
                 "stablehlo.minimum", "stablehlo.select", "stablehlo.select",
                 "stablehlo.return"]:
        return None
    better, same = ops[0], ops[2]
    if not (_is_float_compare(better) and _is_float_compare(same)):
        return None
    direction = str(better.attributes["comparison_direction"])
    if not direction.endswith(("GE>", "LE>")) or \
            not str(same.attributes["comparison_direction"]).endswith("EQ>"):
        return None
    if list(better.operands) != list(same.operands):
        return None
    return better, same


@functools.cache
def _host_converts_out_of_range_to_int_min() -> bool:
    """Whether eager's CPU kernels give INT_MIN for NaN and out-of-range floats (x86's
    cvttss2si), rather than saturating as XLA (and ARM) do."""
    import torch
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():  # a real host computation, whatever traces around us
        probe = torch.tensor([float("nan"), 3e9])
        return probe.to(torch.int32).tolist() == [-2 ** 31] * 2


def _ranked_convert(op):
    """(source type, target type) of a convert between ranked tensors, else (None, None)."""
    source = op.operands[0].type.maybe_downcast()
    target = op.result.type.maybe_downcast()
    if not isinstance(source, ir.RankedTensorType) or not isinstance(target,
                                                                     ir.RankedTensorType):
        return None, None
    return source, target


def _float_to_int(op):
    """(source float type, target integer type) of a float-to-integer convert, else None."""
    source, target = _ranked_convert(op)
    if source is None:
        return None
    element = target.element_type.maybe_downcast()
    if not isinstance(source.element_type.maybe_downcast(), ir.FloatType) or \
            not isinstance(element, ir.IntegerType) or element.width == 1:
        return None
    if not source.has_static_shape:
        return None
    return source, target


@stablehlo_pass
def float_to_int_as_the_host(module, ctx):
    # XLA's float-to-integer convert saturates (3e9 -> 2**31 - 1, -1.7 -> uint8 0, NaN -> 0);
    # eager's CPU kernels on x86 convert through int32 (int8, int16, int32) or int64 (int64,
    # uint8), where NaN and values out of that range become its minimum, and wrap to the
    # narrower type: -1.7 -> uint8 255, 300.7 -> int8 44, 3e9 -> int32 -2**31, NaN -> 0 in
    # int8 and INT_MIN in int32. Each such convert becomes that, so .to(dtype), copy_ and
    # every cast give eager's integers on the host that runs eager (left alone where the host
    # saturates as XLA does).
    if not _host_converts_out_of_range_to_int_min():
        return
    for op in _ops_named(module, ("stablehlo.convert",)):
        types = _float_to_int(op)
        if types is not None:
            with op.location:
                _convert_as_the_host(op, *types)


def _convert_as_the_host(op, source, target):
    element = target.element_type.maybe_downcast()
    if element.is_unsigned and element.width > 8:
        return
    wide_width = 64 if element.width == 64 or element.is_unsigned else 32
    shape, ip, loc = source.shape, ir.InsertionPoint(op), op.location
    float_element = source.element_type.maybe_downcast()
    if isinstance(float_element, (ir.F16Type, ir.BF16Type)):
        float_element = ir.F32Type.get()  # exact, and holds 2**31 and 2**63
    float_type = ir.RankedTensorType.get(shape, float_element)
    x = op.operands[0]
    if float_type != source:
        x = _create("stablehlo.convert", [x], float_type, ip, loc)
    bool_type = ir.RankedTensorType.get(shape, ir.IntegerType.get_signless(1))
    wide_element = ir.IntegerType.get_signless(wide_width)
    wide_type = ir.RankedTensorType.get(shape, wide_element)

    def splat(tensor_type, attribute):
        return _create("stablehlo.constant", [], tensor_type, ip, loc,
                       value=ir.DenseElementsAttr.get_splat(tensor_type, attribute))

    def compare(a, b, direction):
        return _create("stablehlo.compare", [a, b], bool_type, ip, loc,
                       comparison_direction=ir.Attribute.parse(
                           f"#stablehlo<comparison_direction {direction}>"),
                       compare_type=ir.Attribute.parse("#stablehlo<comparison_type FLOAT>"))

    limit = float(2 ** (wide_width - 1))
    low = splat(float_type, ir.FloatAttr.get(float_element, -limit))
    high = splat(float_type, ir.FloatAttr.get(float_element, limit))
    inside = _create("stablehlo.and", [compare(x, low, "GE"), compare(x, high, "LT")],
                     bool_type, ip, loc)  # false for NaN
    wide = _create("stablehlo.convert", [x], wide_type, ip, loc)
    int_min = splat(wide_type, ir.IntegerAttr.get(wide_element, -2 ** (wide_width - 1)))
    result = _create("stablehlo.select", [inside, wide, int_min], wide_type, ip, loc)
    if wide_type != target:
        result = _create("stablehlo.convert", [result], target, ip, loc)
    op.result.replace_all_uses_with(result)
    op.erase()


def _bool_to_float(op) -> ir.RankedTensorType | None:
    """The int8 type of a bool-to-float convert's shape, else None."""
    source, target = _ranked_convert(op)
    if source is None:
        return None
    element = source.element_type.maybe_downcast()
    if not isinstance(element, ir.IntegerType) or element.width != 1 or \
            not isinstance(target.element_type.maybe_downcast(), ir.FloatType):
        return None
    return ir.RankedTensorType.get(source.shape, ir.IntegerType.get_signless(8))


@stablehlo_pass
def bool_to_float_through_int8(module, ctx):
    # XLA's algebraic simplifier rewrites a product with a converted bool, convert(p) * y, as
    # select(p, y, 0), and a division by a constant as a product with its reciprocal: where y
    # is inf or NaN, eager's 0 * y is NaN and the select gives 0 (`mask.float() * scores`
    # holding -inf, `bools.float() / 0.0`: fuzz seed 3588; plain jax.jit the same). A bool
    # converted through int8 is the same value and no longer matches the rewrite; XLA fuses the
    # second convert into the same loop.
    for op in _ops_named(module, ("stablehlo.convert",)):
        with op.location:
            int8 = _bool_to_float(op)
            if int8 is None:
                continue
            ip, loc = ir.InsertionPoint(op), op.location
            wide = _create("stablehlo.convert", [op.operands[0]], int8, ip, loc)
            result = _create("stablehlo.convert", [wide], op.result.type, ip, loc)
        op.result.replace_all_uses_with(result)
        op.erase()
