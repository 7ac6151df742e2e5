"""Checks run before decompositions (``@checked_first``): eager's error where eager raises,
eager's value where it has one, for reductions over no elements (and an integer to a negative
power, a bool subtracted, an integer round with decimals, which eager refuses).

An XLA reduction of an empty window gives the reduction's initial value: max of nothing is
-inf, a variance divides 0 by ``N - correction`` < 0. Eager PyTorch instead raises for reductions
without an identity (max, min, argmax, amax, median over a dim, mode, ...) and gives NaN where
it divides by ``max(N - correction, 0) == 0``. Sizes are static where an op is traced (the
compile path's aot_autograd trace and the eager device's per-op trace share this table), so the
checks run on the host, at trace time, raising eager's exception type with eager's message.

Example::

    torch.empty(0, device="tpu").max()   # RuntimeError: max(): Expected reduction dim to be ...
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ...errors import invalid_input
from .registry import checked_first

aten = torch.ops.aten


def _empty(x) -> bool:
    return guard_or_false(x.numel() == 0)


def _reduces_everything(name: str, kind: type, hint: bool):
    """The check of a reduction over every element: eager raises ``kind`` for an empty input."""
    message = f"{name}: Expected reduction dim to be specified for input.numel() == 0."
    if hint:
        message += " Specify the reduction dim with the 'dim' argument."

    def check(x):
        if _empty(x):
            raise invalid_input(kind, message)
    return check


def _check_dims(name: str, x, dims) -> None:
    """Eager's IndexError if a reduced dim of an empty ``x`` has size 0 (named wrapped)."""
    if not _empty(x) or x.dim() == 0:
        return
    for dim in dims:
        dim = dim % x.dim()
        if guard_or_false(x.shape[dim] == 0):
            raise invalid_input(IndexError, f"{name}: Expected reduction dim {dim} to have "
                                            f"non-zero size.")


def _reduces_one_dim(op, name: str):
    """The check of a reduction along the op's ``dim`` argument (positional or keyword)."""
    schema = op._schema.arguments
    at = [a.name for a in schema].index("dim")
    default = schema[at].default_value

    def check(x, *args, **kwargs):
        dim = args[at - 1] if len(args) >= at else kwargs.get("dim", default)
        _check_dims(name, x, [dim])
    return check


for _op, _name in ((aten.max.default, "max()"), (aten.min.default, "min()")):
    checked_first(_op)(_reduces_everything(_name, RuntimeError, hint=True))

# nanmedian's message says "median()", as eager's does.
for _op, _name in ((aten.max.dim, "max()"), (aten.min.dim, "min()"),
                   (aten.median.dim, "median()"), (aten.nanmedian.dim, "median()"),
                   (aten.mode.default, "mode()"), (aten.kthvalue.default, "kthvalue()")):
    checked_first(_op)(_reduces_one_dim(_op, _name))


def _arg_extremum(name: str):
    everything = _reduces_everything(name, IndexError, hint=False)

    def check(x, dim=None, keepdim=False):
        if dim is None:
            everything(x)
        else:
            _check_dims(name, x, [dim])
    return check


def _extremum_over_dims(name: str):
    everything = _reduces_everything(name, RuntimeError, hint=True)

    def check(x, dim=(), keepdim=False):
        if len(dim) == 0:
            everything(x)
        else:
            _check_dims(name, x, dim)
    return check


checked_first(aten.argmax.default)(_arg_extremum("argmax()"))
checked_first(aten.argmin.default)(_arg_extremum("argmin()"))
checked_first(aten.amax.default)(_extremum_over_dims("amax()"))
checked_first(aten.amin.default)(_extremum_over_dims("amin()"))


@checked_first(aten.aminmax.default)
def _aminmax(x, *, dim=None, keepdim=False):
    if dim is not None:
        _check_dims("aminmax", x, [dim])
    elif _empty(x):
        raise invalid_input(RuntimeError, "aminmax(): cannot compute aminmax over an empty "
                                          "dimension as the operation has no identity.")


@checked_first(aten.median.default, aten.nanmedian.default)
def _median_of_nothing(x):
    # Eager's NaN, converted to the dtype as the host converts it (INT64_MIN for int64 on x86).
    if not _empty(x):
        return None
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():  # a real host computation, not part of the traced graph
        value = torch.tensor(float("nan")).to(x.dtype).item()
    return torch.full((), value, dtype=x.dtype, device=x.device)


def _correction_at_most_count(op, name: str):
    # Eager divides by max(N - correction, 0): with correction > N that is 0 (NaN, or inf for a
    # nonzero sum of squares). Decompositions divide by N - correction, negative then: the
    # division eager makes is the one with correction = N.
    def check(x, dim=None, *, correction=None, keepdim=False):
        if not x.is_floating_point() and not x.is_complex():
            # Eager's error; a dynamic-shape graph computed them (2.5 for var(arange(5))),
            # where static graphs fell back to eager.
            raise invalid_input(RuntimeError, f"{name} only support floating point and complex "
                                              f"dtypes")
        dims = range(x.dim()) if dim is None or len(dim) == 0 else dim
        count = 1
        for d in dims if x.dim() else ():  # a 0-d tensor is one element, whatever dim says
            count *= x.shape[d % x.dim()]
        if not guard_or_false((1 if correction is None else correction) > count):
            return None
        return op(x, dim, correction=count, keepdim=keepdim)
    return check


for _op, _name in ((aten.var.correction, "std and var"), (aten.std.correction, "std and var"),
                   (aten.var_mean.correction, "var_mean"), (aten.std_mean.correction, "std_mean")):
    checked_first(_op)(_correction_at_most_count(_op, _name))


@checked_first(aten.index_copy.default)
def _index_copy(x, dim, index, source):
    # Eager's kernel refuses a source of another dtype; traced, it was converted (a bf16 key
    # written into a float32 KV cache).
    _same_dtype(x, source, "index_copy_(): self and source expected to have the same dtype, "
                           "but got (self) {expected} and (source) {given}")
    return _index_into_an_empty_dim(x, dim, index, source)


@checked_first(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_into_an_empty_dim(x, dim, index, *rest):
    # Eager's kernels write through ``x`` restrided to the index's length along ``dim``
    # (stride 0) over a fresh, empty storage: any index into an empty ``dim`` fails there,
    # whatever its value, with the storage's error (the index check would raise IndexError).
    if x.dim() == 0 or not guard_or_false(x.shape[dim % x.dim()] == 0):
        return None
    dim = dim % x.dim()
    sizes = [index.numel() if d == dim else s for d, s in enumerate(x.shape)]
    strides, step = [0] * x.dim(), 1
    for d in range(x.dim() - 1, -1, -1):
        strides[d] = 0 if d == dim else step
        step *= max(x.shape[d], 1)
    if not all(guard_or_false(s != 0) for s in sizes):
        return None  # nothing to write: the storage is large enough
    needed = (1 + sum((s - 1) * st for s, st in zip(sizes, strides))) * x.element_size()
    raise invalid_input(RuntimeError, f"setStorage: sizes {sizes}, strides {strides}, storage "
                                      f"offset 0, and itemsize {x.element_size()} requiring a "
                                      f"storage size of {needed} are out of bounds for "
                                      f"storage of size 0")


@checked_first(aten.pow.Tensor_Scalar)
def _integer_to_a_negative_power(base, exponent):
    # Eager's meta function raises (NumPy's rule); torch-mlir computed 2 ** -1 as 0.
    if not base.is_floating_point() and not base.is_complex() and \
            isinstance(exponent, (int, bool)) and exponent < 0:
        raise invalid_input(RuntimeError, "Integers to negative integer powers are not allowed.")
    return None


def _is_bool(value) -> bool:
    return value.dtype == torch.bool if isinstance(value, torch.Tensor) else \
        isinstance(value, bool)


@checked_first(aten.sub.Tensor, aten.sub.Scalar, aten.rsub.Tensor, aten.rsub.Scalar)
def _subtraction_of_bools(a, b, alpha=1):
    # Eager's sub_check; traced, the subtraction went through on 0 and 1.
    if _is_bool(a) and _is_bool(b):
        raise invalid_input(RuntimeError, "Subtraction, the `-` operator, with two bool tensors "
                                          "is not supported. Use the `^` or `logical_xor()` "
                                          "operator instead.")
    if _is_bool(a) or _is_bool(b):
        raise invalid_input(RuntimeError, "Subtraction, the `-` operator, with a bool tensor is "
                                          "not supported. If you are trying to invert a mask, "
                                          "use the `~` or `logical_not()` operator instead.")
    return None



#: c10's names of the types its overflow message names.
_C_NAMES = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t",
            torch.int32: "int", torch.int64: "int64_t", torch.float16: "c10::Half",
            torch.bfloat16: "c10::BFloat16", torch.float32: "float"}


def _overflows(dtype, value) -> bool:
    # c10::overflows: an unsigned type takes negatives down to -max (they wrap); a float type
    # takes infinities and NaN, and refuses a finite value beyond its largest (65504.5 for
    # half, though it would round to 65504).
    if dtype.is_floating_point:
        info = torch.finfo(dtype)
        return value == value and abs(value) != float("inf") and \
            not info.min <= value <= info.max
    info = torch.iinfo(dtype)
    low = -info.max if info.min == 0 else info.min
    return not low <= value <= info.max


def _refuse_overflowing(dtype, values) -> None:
    """Eager's error where a Python number among ``values`` converted to ``dtype`` would
    overflow; a float meets an integer dtype in float (the result's dtype), so only ints
    are checked there."""
    if dtype not in _C_NAMES:
        return
    kinds = (int, float) if dtype.is_floating_point else (int,)
    for value in values:
        if type(value) in kinds and _overflows(dtype, value):
            raise invalid_input(RuntimeError, f"value cannot be converted to type "
                                              f"{_C_NAMES[dtype]} without overflow")


@checked_first(aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default)
def _bound_that_overflows(x, *bounds, **named):
    # Eager converts a Python bound to the tensor's dtype and raises where it would overflow
    # (clamp of uint8 to 300, of half to 70000); traced, the bound wrapped or saturated
    # silently.
    _refuse_overflowing(x.dtype, (*bounds, *named.values()))
    return None


@checked_first(aten.full_like.default)
def _fill_like_that_overflows(x, fill_value, *, dtype=None, **options):
    # As clamp: full_like(int8, 300) wrapped to 44, of half to 1e5 saturated to inf.
    _refuse_overflowing(dtype or x.dtype, (fill_value,))
    return None


@checked_first(aten.scalar_tensor.default)
def _scalar_tensor_that_overflows(value, *, dtype=None, **options):
    # Where a traced where(cond, int8, 300) holds its number: eager makes it at run time and
    # raises; lowered, it was a constant wrapped to 44.
    _refuse_overflowing(dtype or torch.get_default_dtype(), (value,))
    return None


@checked_first(aten.masked_fill.Scalar)
def _masked_fill_that_overflows(x, mask, value):
    _refuse_overflowing(x.dtype, (value,))
    return None


@checked_first(aten.where.ScalarOther)
def _where_other_that_overflows(condition, x, other):
    # where(cond, int8, 300): the number meets the tensor in its dtype, and overflows there
    _refuse_overflowing(x.dtype, (other,))
    return None


@checked_first(aten.where.ScalarSelf)
def _where_self_that_overflows(condition, value, other):
    _refuse_overflowing(other.dtype, (value,))
    return None


#: c10's names of the non-float types in its "not implemented for" message.
_SCALAR_NAMES = {torch.bool: "Bool", torch.uint8: "Byte", torch.int8: "Char",
                 torch.int16: "Short", torch.int32: "Int", torch.int64: "Long"}


@checked_first(aten.round.default, aten.round.decimals)
def _round_without_an_eager_kernel(x, decimals=None):
    # Eager's round with decimals has float kernels only, and round without them is the
    # identity on integers but has no bool kernel; traced, both returned values.
    if x.dtype in _SCALAR_NAMES and (decimals is not None or x.dtype == torch.bool):
        raise invalid_input(NotImplementedError, f'"round" not implemented for '
                                                 f"'{_SCALAR_NAMES[x.dtype]}'")
    return None


#: c10's names of the floating types, as its "expected scalar type" message spells them.
_FLOAT_NAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half",
                torch.bfloat16: "BFloat16"}


def _type_name(dtype) -> str:
    """c10's name of ``dtype`` (``Long``, ``BFloat16``), as eager's messages spell it."""
    return _SCALAR_NAMES.get(dtype) or _FLOAT_NAMES.get(dtype) or str(dtype)


def _same_dtype(expected, given, message: str) -> None:
    """Eager's ``message`` where tensor ``given``'s dtype is not ``expected``'s: a kernel that
    refuses an operand of another dtype, which a trace promoted or converted instead.
    ``{expected}`` and ``{given}`` in it become c10's names of the two dtypes.

    Example::

        _same_dtype(x, source, "self ({expected}) and source ({given}) must match")
    """
    if given.dtype != expected.dtype:
        raise invalid_input(RuntimeError, message.format(expected=_type_name(expected.dtype),
                                                         given=_type_name(given.dtype)))


@checked_first(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _class_weight_of_another_dtype(x, target, weight, reduction, ignore_index):
    # Eager's kernel reads the weight as the input's scalar type and refuses another; traced,
    # the weight was promoted and the loss computed (fp16 weights of an fp32 loss).
    if weight is not None:
        _same_dtype(x, weight, "expected scalar type {expected} but found {given}")
    return None


@checked_first(aten.index_add.default)
def _index_add_source_of_another_shape(x, dim, index, source, alpha=1):
    # Eager's index_add checks the source against self outside its meta function (fake
    # tensors accept [3, 2] += [2] along dim 0); traced, the source was broadcast, and one of
    # another dtype converted (fuzz seed 4582: bool += int64 gave a value, no error).
    _same_dtype(x, source, "index_add_(): self ({expected}) and source ({given}) must have "
                           "the same scalar type")
    if x.dim() and source.dim():
        kept = [s for d, s in enumerate(x.shape) if d != dim % x.dim()]
        given = [s for d, s in enumerate(source.shape) if d != dim % source.dim()]
    else:
        kept, given = list(x.shape), list(source.shape)
    if not guard_or_false(len(kept) == len(given)) or \
            not all(guard_or_false(a == b) for a, b in zip(kept, given)):
        raise invalid_input(RuntimeError, f"source tensor shape must match self tensor shape, "
                                          f"excluding the specified dimension. Got self.shape "
                                          f"= {list(x.shape)} source.shape = "
                                          f"{list(source.shape)}")
    return None


@checked_first(aten.as_strided_scatter.default)
def _as_strided_scatter_beyond_the_input(x, src, size, stride, storage_offset=None):
    # Eager scatters into a clone of the input, whose storage holds its numel elements; a view
    # reaching past them is refused (setStorage). Traced, the scatter dropped those elements.
    offset = storage_offset or 0
    needed = 0 if any(guard_or_false(s == 0) for s in size) else \
        offset + 1 + sum((s - 1) * st for s, st in zip(size, stride))
    if guard_or_false(needed > x.numel()):
        item = x.element_size()
        raise invalid_input(RuntimeError, f"setStorage: sizes {list(size)}, strides "
                                          f"{list(stride)}, storage offset {offset}, and "
                                          f"itemsize {item} requiring a storage size of "
                                          f"{needed * item} are out of bounds for storage of "
                                          f"size {x.numel() * item}")
    return None


@checked_first(aten.index_put.default, aten._unsafe_index_put.default)
def _index_put_of_another_dtype(x, indices, values, accumulate=False):
    # As index_copy: eager's index_put refuses values of another dtype; traced, converted.
    _same_dtype(x, values, "Index put requires the source and destination dtypes match, got "
                           "{expected} for the destination and {given} for the source.")
    return None


@checked_first(aten.addmm.default)
def _addmm_of_mixed_dtypes(bias, mat1, mat2, *, beta=1, alpha=1):
    # Eager's CPU kernel (F.linear with a bias) refuses operands of other dtypes; traced, they
    # were promoted. mm and F.linear without a bias raise already, from their meta functions.
    for name, t in (("self", bias), ("mat1", mat1)):
        _same_dtype(t, mat2, name + " and mat2 must have the same dtype, but got {expected} and "
                                    "{given}")
    return None


def _norm_parameters_of_another_dtype(x, weight, bias) -> None:
    """Eager's CPU rule for a norm's weight and bias: of the input's dtype, or float32 ones
    for a bf16 or half input ("mixed dtype"); traced, any were promoted."""
    parameters = [p for p in (weight, bias) if p is not None]
    if not parameters:
        return
    if parameters[0].dtype != x.dtype:
        for p in parameters:
            if p.dtype != torch.float32:
                raise invalid_input(RuntimeError, "mixed dtype (CPU): expect parameter to have "
                                                  "scalar type of Float")
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise invalid_input(RuntimeError, "mixed dtype (CPU): all inputs must share same "
                                              "datatype.")
        return
    for p in parameters:
        _same_dtype(x, p, "expected scalar type {expected} but found {given}")


@checked_first(aten.native_layer_norm.default)
def _layer_norm_parameters(x, normalized_shape, weight, bias, eps):
    _norm_parameters_of_another_dtype(x, weight, bias)
    return None


@checked_first(aten.native_group_norm.default)
def _group_norm_parameters(x, weight, bias, n, c, hxw, group, eps):
    _norm_parameters_of_another_dtype(x, weight, bias)
    return None


@checked_first(aten.histogram.bin_ct)
def _histogram_bins(x, bins=100, *, range=None, weight=None, density=False):
    # Eager's error; traced, the edges were empty and the counts too. (A range eager refuses
    # is checked at run time, lower/index_checks.py: its ends are program inputs.)
    if bins <= 0:
        raise invalid_input(RuntimeError, f"torch.histogram(): bins must be > 0, but got {bins} "
                                          f"for dimension 0")
    return None
