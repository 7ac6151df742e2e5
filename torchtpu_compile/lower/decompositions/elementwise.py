"""Elementwise decompositions: arithmetic torch-mlir lowers wrongly (remainder's sign, integer
floor division in float64, fmax/fmin and clamp's bounds without broadcasting, uint8 right
shifts) or not at all (the shift operators, gcd, lcm, bitwise or/xor with a number), floats
read bit by bit (nextafter, frexp), short formulas (hypot, angle, inductor's fma, the shrinks'
backward) and dropout's random mask.

Example::

    table = decomposition_table()
    table[torch.ops.aten.remainder.Tensor](torch.tensor([-3.0]), torch.tensor([2.0]))  # [1.]
"""
from __future__ import annotations

import math

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from ..fx_passes import C_FMOD
from .common import (as_before, computing_dtype, float_dtypes, in_common_dtype,
                     rounded_once)
from .jax_functions import builds, jax_function
from .registry import decomposition

aten = torch.ops.aten


# --- arithmetic ------------------------------------------------------------------------------

def _as_tensor(value, like):
    """A Python scalar as a 0-d tensor of the promoted dtype: torch-mlir cannot legalize the
    ``torch.constant.float`` that scalar overloads such as ``fmod.Scalar`` leave behind."""
    if isinstance(value, torch.Tensor):
        return value
    dtype = torch.result_type(like, value)
    if dtype == torch.uint8:  # nor a uint8 literal: an int64 one, converted
        return torch.scalar_tensor(value, dtype=torch.int64).to(dtype)
    return torch.scalar_tensor(value, dtype=dtype)


@decomposition(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(a, b):
    # torch-mlir's lowering gives the C remainder (sign of the dividend) for floats; Python's
    # takes the divisor's sign. From fmod, as the CPU kernel does, to keep its rounding. The
    # sign test reads the divisor in the promoted dtype: an int64 0-d -130 beside int8 is 126
    # there, and int8 1 % it was 127 (eager: 1).
    a, b = _promoted(_as_tensor(a, b), _as_tensor(b, a))
    mod = _c_fmod(a, b)
    # logical_xor, not !=: torch-mlir compares booleans as signed, which XLA rejects.
    wrong_sign = (mod != 0) & torch.logical_xor(mod < 0, b < 0)
    return torch.where(wrong_sign, mod + b, mod)


def _c_fmod(a, b):
    """C's fmod, exact (``fx_passes.c_fmod``: torch-mlir's own fmod is not)."""
    a, b = _promoted(a, b)
    return C_FMOD(a, b)


@decomposition(aten.fmod.Tensor, aten.fmod.Scalar)
def fmod(a, b):
    return _c_fmod(a, _as_tensor(b, a))


def _with_an_unrounded_scalar(op):
    """``op(x, scalar)`` of a bf16/f16 tensor and a Python number computed in float32 with the
    number as a float32, as the CPU mul and div kernels do (TensorIterator's original scalar):
    converting the number to the tensor's dtype first rounded it (bf16 0.1 is 0.1001), and
    x * 0.1 came out 1 ulp from eager's in about a quarter of the elements. A number in the
    first place is ``_with_the_number_second``'s."""
    def decompose(x, other, **kwargs):
        if _is_number(x) and isinstance(other, torch.Tensor):
            return _with_the_number_second(op, x, other)
        if not isinstance(x, torch.Tensor) or computing_dtype(x.dtype) == x.dtype or \
                type(other) not in (int, float):
            return NotImplemented
        return op(x.to(computing_dtype(x.dtype)), other, **kwargs).to(x.dtype)
    decompose.__name__ = f"{op._schema.name.split('::')[1]}_with_an_unrounded_scalar"
    return decompose


# (add and sub round the number to the tensor's dtype in eager too)
for _op in (aten.mul.Tensor, aten.div.Tensor):
    decomposition(_op)(_with_an_unrounded_scalar(_op))


def _is_number(value) -> bool:
    return type(value) in (int, float, bool)


def _with_the_number_second(op, number, x, alpha=1):
    """``op(number, x)`` (``torch.add(0.1, x)``; Python's operators put the number second)
    rewritten with the number where the lowering gives it x's dtype: in the first place it
    became a float32 literal, so a float64 ``torch.mul(s, x)`` was off by 8e-7. The number is
    a 0-d tensor of the promoted dtype, as eager's kernels read a number in the first place
    (rounded to bf16 for a bf16 ``x``: only a second one stays unrounded); sums and products
    commute exactly, and ``number - x`` is rsub's."""
    if op is aten.sub.Tensor:
        return aten.rsub.Scalar(x, number, alpha)
    number = _as_tensor(number, x)
    if op is aten.div.Tensor:
        return aten.div.Tensor(number, x)
    if op is aten.add.Tensor and alpha != 1:
        x = aten.mul.Tensor(x, alpha)
    return op(x, number)


@decomposition(aten.sub.Tensor)
def sub_from_a_number(a, b, *, alpha=1):
    if not (_is_number(a) and isinstance(b, torch.Tensor)):
        return NotImplemented
    return _with_the_number_second(aten.sub.Tensor, a, b, alpha)


@decomposition(aten.rsub.Scalar)
def rsub_of_a_number(x, other, alpha=1):
    # torch's reference subtracts with the number as sub's first argument, which the lowering
    # made a float32 literal whatever x's dtype: 1/3 - x of a float64 x was off by float32's
    # rounding, and 1e39 - x was inf. -(alpha * x) + other, in the result's dtype, is eager's
    # other - alpha * x (negation is exact), with the number where add keeps it right.
    x = x.to(torch.result_type(x, other))
    scaled = aten.neg.default(x) if alpha == 1 else aten.mul.Tensor(x, -alpha)
    return aten.add.Tensor(scaled, other)


@decomposition(aten.add.Tensor)
def add(a, b, *, alpha=1):
    if _is_number(a) and isinstance(b, torch.Tensor):
        return _with_the_number_second(aten.add.Tensor, a, b, alpha)
    return _add_of_bools(a, b, alpha)


def _add_of_bools(a, b, alpha):
    # Eager's bool add is a logical or. torch-mlir folds an add of i1 literals as integers mod
    # 2, true + true = false: (x >= x) + (x >= x), both compares folded to true first, came
    # out all false with no error (fuzz seed 4280).
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and
            a.dtype == torch.bool and b.dtype == torch.bool and alpha in (1, True)):
        return NotImplemented
    return torch.logical_or(a, b)


def _is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


@decomposition(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, *, rounding_mode=None):
    # torch-mlir floors integer quotients in float64: int64 beyond 2**53 loses its low digits
    # (and TPUs have no float64). Integers are floored exactly here; floats stay torch-mlir's.
    if rounding_mode not in ("floor", "trunc"):
        return NotImplemented
    # A 0-d tensor operand is read in the promoted dtype first, as eager's kernel reads it (an
    # int64 -130 beside int8 is 126: int8 1 // it is 0; it was -1, computed in int64).
    dtype = torch.result_type(a, b)
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        # Two numbers (torch.div(-8, 6, rounding_mode="trunc")): the lowering divided the two
        # int64 literals as unsigned (-8 by 6 gave 3074457345618258432).
        if _is_integer(dtype) and guard_or_false(a >= 0) and guard_or_false(b > 0):
            # Signed and unsigned quotients agree: the op stays whole, a constant that a trace
            # can read back. Longformer's chunking views x as torch.div(x.size(1), w,
            # rounding_mode="trunc") rows; a tensor made by scalar_tensor has no value while
            # traced ("_local_scalar_dense": the graph ran in eager PyTorch).
            return NotImplemented
        return aten.div.Tensor_mode(torch.scalar_tensor(a, dtype=dtype), b,
                                    rounding_mode=rounding_mode)
    if rounding_mode == "trunc":
        return _trunc_divide_floats(a, b, dtype)
    a, b = (v.to(dtype) if isinstance(v, torch.Tensor) else v for v in (a, b))
    if not _is_integer(dtype):
        return _floor_divide_floats(a, b, dtype)
    return _floor_divide_integers(_as_tensor(a, b), _as_tensor(b, a))


@decomposition(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(a, b):
    return torch.div(a, b, rounding_mode="floor")


def _floor_divide_integers(a, b):
    """a // b in integer arithmetic, as the CPU kernel computes it: the truncated quotient,
    one less where the remainder is nonzero and its sign differs from the divisor's
    (tests/decompositions/test_elementwise.py).

    Division by zero is not caught: XLA has no way to raise from inside a program.
    """
    quotient = torch.div(a, b, rounding_mode="trunc")
    rest = a - quotient * b
    # logical_xor, not !=: see remainder.
    rounds_down = (rest != 0) & torch.logical_xor(rest < 0, b < 0)
    return quotient - rounds_down.to(quotient.dtype)


def _trunc_divide_floats(a, b, dtype):
    """trunc(a / b) of floats with a Python number, as the CPU kernel computes it: the number
    read in float64/float32, and for half widths the quotient of a float32 division truncated
    before it is rounded (x / 1e-3 of bf16 2.0 is 2000, not 2000 rounded first). torch's own
    decomposition took the number as a float32, so float64 2.0 / 1e-3 truncated to 1999
    (eager 2000; fuzz seed 3136). Other operands (integers, two tensors, a number divided by
    a half-width tensor, whose quotient eager rounds first) are torch's decomposition's."""
    if _is_integer(dtype) or not isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return NotImplemented
    wide = computing_dtype(dtype)
    quotient = a.to(wide) / torch.scalar_tensor(b, dtype=wide)
    return torch.trunc(quotient).to(dtype)


def _floor_divide_floats(a, b, dtype):
    """a // b as the CPU kernel computes it (div_floor_floating, in float32 for half widths):
    from the exact remainder, not floor(a / b), whose rounded quotient can reach the next
    integer (1.0 // 0.1 is 9, floor(1.0 / 0.1) is 10; inf // 2 is NaN)."""
    wide = computing_dtype(dtype)
    # A Python scalar enters at the computing dtype, as the kernel's unrounded scalar does.
    a, b = (v.to(wide) if isinstance(v, torch.Tensor) else torch.scalar_tensor(v, dtype=wide)
            for v in (a, b))
    mod = _c_fmod(a, b)
    div = (a - mod) / b
    div = torch.where((mod != 0) & torch.logical_xor(b < 0, mod < 0), div - 1, div)
    floor = torch.floor(div)
    floor = torch.where(div - floor > 0.5, floor + 1, floor)
    zero = torch.copysign(torch.zeros_like(div), a / b)
    result = torch.where(b == 0, a / b, torch.where(div != 0, floor, zero))
    return result.to(dtype)


def _promoted(a, b):
    return in_common_dtype(a, b) or (a, b)


def _ignoring_nan(pick, a, b):
    """``pick(a, b)`` where a NaN loses to a number (fmax/fmin)."""
    a, b = _promoted(a, b)
    if not a.is_floating_point():
        return pick(a, b)
    return torch.where(b.isnan(), a, torch.where(a.isnan(), b, pick(a, b)))


@decomposition(aten.__lshift__.Tensor, aten.__lshift__.Scalar,
               aten.bitwise_left_shift.Tensor_Scalar, aten.bitwise_left_shift.Scalar_Tensor)
def lshift(x, other):
    # The operator spellings (x << n) and the scalar overloads (a number on either side) do
    # not lower; the tensor one does, with eager's answer for a shift past the width (0).
    return aten.bitwise_left_shift.Tensor(_as_tensor(x, other), _as_tensor(other, x))


@decomposition(aten.__rshift__.Tensor, aten.__rshift__.Scalar,
               aten.bitwise_right_shift.Tensor_Scalar, aten.bitwise_right_shift.Scalar_Tensor)
def rshift(x, other):
    # As lshift: past the width, 0, or -1 for a negative x (arithmetic shift).
    return aten.bitwise_right_shift.Tensor(_as_tensor(x, other), _as_tensor(other, x))


#: Overloads with a Python number on one side -> the tensor overload, which lowers.
_WITH_A_NUMBER = {aten.bitwise_and.Scalar_Tensor: aten.bitwise_and.Tensor,
                  aten.bitwise_or.Scalar: aten.bitwise_or.Tensor,
                  aten.bitwise_or.Scalar_Tensor: aten.bitwise_or.Tensor,
                  aten.bitwise_xor.Scalar: aten.bitwise_xor.Tensor,
                  aten.bitwise_xor.Scalar_Tensor: aten.bitwise_xor.Tensor,
                  aten.copysign.Scalar: aten.copysign.Tensor,
                  aten.xlogy.Scalar_Self: aten.xlogy.Tensor,
                  aten.xlogy.Scalar_Other: aten.xlogy.Tensor,
                  aten.special_xlog1py.self_scalar: aten.special_xlog1py.default,
                  aten.special_xlog1py.other_scalar: aten.special_xlog1py.default}


def _number_as_a_tensor(op):
    """``op`` (with a Python number on one side) as its tensor overload. torch-mlir lowers
    only ``bitwise_and.Scalar`` of the bitwise ones, so ``mask | True`` (generate()'s assisted
    decoding) and ``6 ^ x`` ran on the host; PyTorch's references for copysign, xlogy and
    xlog1py build the number with prims.scalar_tensor, which does not lower either. Both sides
    go to the promoted dtype first (a bool tensor with an int is int64, as in eager); floats
    reach the bitwise tensor overloads, which refuse them."""
    tensor_op = _WITH_A_NUMBER[op]

    def with_a_tensor(a, b):
        x = b if isinstance(b, torch.Tensor) else a
        dtype = torch.result_type(a, b)
        a, b = (v.to(dtype) if isinstance(v, torch.Tensor) else _as_tensor(v, x) for v in (a, b))
        return tensor_op(a, b)
    with_a_tensor.__name__ = f"{op.__name__.replace('.', '_')}_as_tensor"
    return with_a_tensor


for _op in _WITH_A_NUMBER:
    decomposition(_op)(_number_as_a_tensor(_op))


@decomposition(aten.copysign.Tensor)
def copysign(a, b):
    # Integers are floats first, as in eager: copysign(int8 -128, 2) was -128.0, the
    # magnitude taken in int8, where -128 has none.
    if a.is_floating_point() and b.is_floating_point():
        return as_before(aten.copysign.Tensor, None, a, b)
    result = float_dtypes(a, b)[1]
    return torch.copysign(a.to(result), b.to(result))


def _broadcast_shift(op, x, other):
    """``op`` on ``x`` and ``other`` promoted to one dtype and broadcast to one shape first, or
    None where they have both: torch-mlir's shifts do neither, and the mismatched StableHLO
    they built aborted the whole process (an int64[5, 1] >> int64[5])."""
    if x.dtype == other.dtype and (x.shape == other.shape or other.dim() == 0):
        return None
    dtype = torch.result_type(x, other)
    x, other = torch.broadcast_tensors(x.to(dtype), other.to(dtype))
    return op(x.contiguous(), other.contiguous())


@decomposition(aten.bitwise_left_shift.Tensor)
def bitwise_left_shift(x, other):
    result = _broadcast_shift(aten.bitwise_left_shift.Tensor, x, other)
    return NotImplemented if result is None else result


@decomposition(aten.bitwise_right_shift.Tensor)
def bitwise_right_shift(x, other):
    result = _broadcast_shift(aten.bitwise_right_shift.Tensor, x, other)
    if result is not None:
        return result
    # torch-mlir shifts uint8 arithmetically, as if signed: 200 >> 3 gave 249 (eager: 25).
    # In int32 a uint8 value is non-negative, where the arithmetic shift is the logical one.
    if x.dtype != torch.uint8:
        return NotImplemented
    return aten.bitwise_right_shift.Tensor(x.to(torch.int32), other.to(torch.int32)) \
        .to(torch.uint8)


@decomposition(aten.gcd.default)
def gcd(a, b):
    # Unlowered; eager's Euclid loop (a while loop in the program).
    return jax_function("gcd")(a, b)


@decomposition(aten.lcm.default)
def lcm(a, b):
    # Unlowered; eager's formula: |a / gcd * b|, 0 where the gcd is 0. C++ computes the
    # product and its absolute value of int8, int16 and uint8 in int, then narrows: int8 lcm
    # of -85 and -53 is -103 there (the product wrapped in int8 first gave 103).
    g = gcd(a, b)
    quotient = torch.div(a, torch.where(g == 0, torch.ones_like(g), g), rounding_mode="trunc")
    wide = torch.int32 if g.dtype.itemsize < 4 else g.dtype
    product = (quotient.to(wide) * b.to(wide)).abs().to(g.dtype)
    return torch.where(g == 0, torch.zeros_like(g), product)


@builds("gcd")
def _gcd_fn():
    # Eager's calc_gcd: a, b = |a|, |b|, then (a, b) = (b % a, a) until a is 0. Not jnp.gcd:
    # it swaps to keep x1 >= x2, which for the integer minimum (its own absolute value,
    # negative) swaps back every step and never ends (fuzz seed 6173: lcm of
    # int64 -2**63 hung the process). Here the minimum stays eager's result (gcd(m, m) = m).
    import jax.numpy as jnp
    from jax import lax

    def gcd(a, b):
        dtype = jnp.result_type(a, b)
        a, b = jnp.broadcast_arrays(jnp.abs(a.astype(dtype)), jnp.abs(b.astype(dtype)))

        def step(pair):
            a, b = pair
            going = a != 0
            return (jnp.where(going, lax.rem(b, jnp.where(going, a, 1)), a),
                    jnp.where(going, a, b))
        return lax.while_loop(lambda pair: jnp.any(pair[0] != 0), step, (a, b))[1]
    return gcd


@decomposition("prims::fma")
def fma(a, b, c):
    # Dynamo writes an optimizer's addcmul_(..., value=v) and add_(..., alpha=a) as inductor's
    # prims.fma (defined when torch._inductor.inductor_prims is imported: by name, then), which
    # torch-mlir does not legalize; as its own definition says, a * b + c. Without it every
    # Adam/AdamW step graph was cut around an eager fma per parameter.
    return a * b + c


def _integral(x) -> bool:
    return not (x.is_floating_point() or x.is_complex())


@decomposition(aten.reciprocal.default)
def reciprocal(x):
    # torch-mlir lowers it for floats only; eager computes an integer or bool input in the
    # default float dtype (AveragedModel's SWA step divides 1 by its int64 count).
    if not _integral(x):
        return NotImplemented
    return torch.reciprocal(x.to(torch.get_default_dtype()))


@decomposition(aten.relu.default)
def relu(x):
    # Eager (and Inductor) keep -0.0: relu returns x unless x < 0. torch-mlir's maximum(x, 0)
    # gave +0.0, which 1 / x or copysign downstream tells apart. NaN stays NaN.
    if x.dtype == torch.bool:
        return NotImplemented  # eager's own error
    return torch.where(x < 0, 0, x)


@decomposition(aten.rrelu_with_noise_functional.default)
def rrelu_with_noise_functional(x, noise, lower=0.125, upper=1 / 3, training=False,
                                generator=None):
    # Eval mode draws nothing: leaky_relu at the mean slope, the noise untouched (it ran on
    # the host as a random op, and refused under TORCHTPU_STRICT=1).
    if training:
        return NotImplemented
    return aten.leaky_relu.default(x, (lower + upper) / 2), noise.clone()


@decomposition(aten.rrelu_with_noise_backward.default)
def rrelu_with_noise_backward(grad, x, noise, lower, upper, training, self_is_result):
    # Eager's kernel. torch-mlir's own lowering of eval mode gave grad + x * slope for
    # negative inputs (F.rrelu(training=False)'s gradient: 0.6 where eager gives 0.2).
    if training:
        return grad * noise
    return aten.leaky_relu_backward(grad, x, (lower + upper) / 2, self_is_result)


@decomposition(aten.trunc.default)
def trunc(x):
    # Toward zero by the side x is on, which keeps eager's sign of zero: torch-mlir's lowering
    # gave +0.0 for trunc(-0.0), and frac(-0.0) = x - trunc(x) came out -0.0 (eager: +0.0).
    if not x.is_floating_point():
        return NotImplemented
    return torch.where(x < 0, torch.ceil(x), torch.floor(x))


@decomposition(aten.erf.default)
def erf(x):
    # As reciprocal: floats only in torch-mlir (erfc is 1 - erf).
    if not _integral(x):
        return NotImplemented
    return torch.erf(x.to(torch.get_default_dtype()))


@decomposition(aten.lerp.Scalar)
def lerp_scalar(start, end, weight):
    # The weight as a 0-d tensor, so that the eager device lifts a new weight into a program
    # input (an EMA, or SWA's 1 / (n + 1), changes it every step; PyTorch's reference picks
    # its formula in Python and compiled one program per weight). Eager's kernel: a weight
    # under 0.5 in magnitude steps from start, the others back from end.
    if start.is_complex():
        return NotImplemented
    compute = computing_dtype(start.dtype)
    start_, end_ = start.to(compute), end.to(compute)
    diff = end_ - start_
    # The weight in a tensor slot (liftable) of a product with data, which the tracer cannot
    # fold into a constant (it folds ones_like(x) * w, and the comparison below with it).
    # Where diff is NaN eager's result is NaN; XLA turns the product of a converted predicate
    # into a select of 0, so NaN is put back explicitly (lerp(0, nan, 1.0) gave 0).
    nan = diff.isnan()
    w = nan.logical_not().to(compute) * weight
    out = torch.where(w.abs() < 0.5, start_ + w * diff, end_ - diff * (1 - w))
    return torch.where(nan, diff, out).to(start.dtype)


@decomposition(aten.fmax.default)
def fmax(a, b):
    # torch-mlir's lowering builds a comparison of the unbroadcast shapes and fails to verify.
    return _ignoring_nan(torch.maximum, a, b)


@decomposition(aten.fmin.default)
def fmin(a, b):
    return _ignoring_nan(torch.minimum, a, b)


@decomposition(aten.clamp.default)
def clamp_scalar(x, min=None, max=None):
    # An integer tensor with a float bound is clamped in the promoted float dtype, as eager;
    # torch-mlir's clamp requires one dtype, so the op ran in eager PyTorch (a fallback).
    dtype = x.dtype
    for bound in (min, max):
        if bound is not None:
            dtype = torch.promote_types(dtype, torch.result_type(x, bound))
    if dtype == x.dtype:
        return NotImplemented
    return torch.clamp(x.to(dtype), min, max)


@decomposition(aten.clamp.Tensor)
def clamp_tensor(x, min=None, max=None):
    # torch-mlir's clamp.Tensor does not broadcast its bounds (a [5, 1] bound on [5, 5] fails).
    dtype = torch.result_type(x, min if min is not None else max)
    if min is not None and max is not None:
        dtype = torch.promote_types(dtype, torch.result_type(x, max))
    out = x.to(dtype)
    if min is not None:
        out = torch.maximum(out, min.to(dtype))
    if max is not None:
        out = torch.minimum(out, max.to(dtype))
    return out


#: Activations whose lowering computes step by step in a half-width input's dtype, where
#: eager's CPU kernels compute in float32 and round once: bf16 gelu(-3) was 45% off, and
#: elu(-1e-3) 0 (exp(x) - 1 in bf16).
_HALF_IN_FLOAT32 = (aten.gelu.default, aten.gelu_backward.default, aten.elu.default,
                    aten.elu_backward.default)

for _op in _HALF_IN_FLOAT32:
    decomposition(_op)(rounded_once(_op))


@decomposition(aten.hypot.default)
def hypot(a, b):
    # C's hypot, scaled by the larger magnitude: sqrt(a*a + b*b) overflowed to inf from
    # |a| ~ 1.8e19 in float32 and underflowed to 0 below ~1e-19. An infinity wins over NaN.
    a, b = _promoted(a, b)
    a, b = a.abs(), b.abs()
    larger, smaller = torch.maximum(a, b), torch.minimum(a, b)
    ratio = torch.where(larger == 0, 0, smaller / larger)
    out = larger * torch.sqrt(1 + ratio * ratio)
    return torch.where(torch.isinf(a) | torch.isinf(b), torch.inf, out)


@decomposition(aten.angle.default)
def angle(x):
    # Real inputs only (complex ones do not reach XLA from us): pi below zero, else 0 (infinities
    # too); NaN stays. pi in x's own dtype: a where of two Python numbers is float32.
    if x.is_complex():
        return NotImplemented
    x = x if x.is_floating_point() else x.to(torch.get_default_dtype())
    return torch.where(x.isnan(), x, torch.where(x < 0, torch.full_like(x, math.pi), 0))


@decomposition(aten.round.decimals)
def round_decimals(x, *, decimals=0):
    # The CPU kernel: nearbyint(x * 10^d) / 10^d (for d < 0: nearbyint(x / 10^-d) * 10^-d),
    # in float32 for half widths. torch-mlir's computes in the half width: round(bf16 0.35, 1)
    # gave 0.4, eager 0.3. (In float32, XLA divides by a scalar as a product with its
    # reciprocal, as for any x / c: 1 ulp from eager's quotient at times.)
    if not x.is_floating_point() or decimals == 0:
        return NotImplemented
    wide = computing_dtype(x.dtype)
    scale = torch.scalar_tensor(float(10 ** abs(decimals)), dtype=wide)
    value = x.to(wide)
    if decimals > 0:
        return (torch.round(value * scale) / scale).to(x.dtype)
    return (torch.round(value / scale) * scale).to(x.dtype)


@decomposition(aten.pow.Tensor_Scalar)
def pow_scalar(x, exponent):
    # The CPU kernel takes x ** 0.5 as sqrt and x ** -0.5 as rsqrt (float32, float64, bf16:
    # not float16) and x ** -2 as 1 / (x * x); std::pow differs at the edges: (-inf) ** 0.5
    # is inf there, NaN in eager; (-0) ** 0.5 is 0, eager -0; (-0) ** -0.5 inf, eager -inf.
    if x.dtype in (torch.float32, torch.float64, torch.bfloat16) and exponent in (0.5, -0.5):
        return torch.sqrt(x) if exponent == 0.5 else torch.rsqrt(x)
    if x.is_floating_point() and exponent == -2:
        return torch.reciprocal(x * x)
    if _is_integer(x.dtype) and isinstance(exponent, int) and exponent >= 0:
        return _integer_power_of(x, exponent)
    return NotImplemented


def _integer_power_of(x, exponent: int):
    """x ** exponent for a Python int exponent >= 0: by squaring, one multiply per bit of the
    exponent (``x ** 2`` is one), wrapping in x's dtype as eager's kernel does (products
    modulo 2**bits agree however they are grouped)."""
    result, base = None, x
    while exponent:
        if exponent & 1:
            result = base if result is None else result * base
        exponent >>= 1
        if exponent:
            base = base * base
    return torch.ones_like(x) if result is None else result


def _integer_power(x, exponent):
    """x ** exponent for integers of one dtype, as eager's kernel computes it: by squaring,
    wrapping in the dtype (a negative exponent: 1 for 1, +-1 for -1, else 0). torch-mlir's
    integer power was wrong past small exponents: int16 (-7) ** 4464 gave 14465 (eager and
    exact arithmetic: 1665)."""
    result = torch.ones_like(x)
    base, rest = x, exponent
    for _ in range(torch.iinfo(x.dtype).bits):
        result = torch.where((rest & 1) != 0, result * base, result)
        base, rest = base * base, rest >> 1
    if x.dtype == torch.uint8:
        return result
    odd = (exponent & 1) != 0
    negative = torch.where(x == 1, torch.ones_like(x),
                           torch.where(x == -1, torch.where(odd, -torch.ones_like(x),
                                                            torch.ones_like(x)),
                                       torch.zeros_like(x)))
    return torch.where(exponent < 0, negative, result)


@decomposition(aten.pow.Tensor_Tensor)
def pow_integers(x, exponent):
    # Both operands read in the result's dtype, as eager's kernel does (an int64 0-d exponent
    # 70000 beside int16 is 4464 there).
    dtype = torch.result_type(x, exponent)
    if not _is_integer(dtype):
        return NotImplemented
    x, exponent = torch.broadcast_tensors(x.to(dtype), exponent.to(dtype))
    return _integer_power(x, exponent)


# --- comparisons and logical ops -------------------------------------------------------------

def _compared_in_common_dtype(op):
    """``op(a, b)`` with both tensors cast to their promoted dtype first, as eager's kernels
    compare; NotImplemented (the usual lowering) where they share one already.

    torch-mlir converts the right operand to the left one's dtype, so where a 0-d tensor takes
    part (its dtype does not promote a dimensioned tensor of its kind) the comparison ran in the
    wrong dtype: ``torch.tensor(256) == uint8_zeros`` was False (eager casts 256 to uint8, 0:
    True), ``float64(1e-50) == float32_zeros`` False (eager: True). A Python number beside
    a bool tensor was made a bool: ``bools == 300`` was True where the bool was (eager
    compares in int64: False; fuzz seed 3830).
    """
    def compare(a, b):
        if not isinstance(b, torch.Tensor):  # a number: only the tensor may need a cast
            dtype = torch.result_type(a, b)
            return NotImplemented if a.dtype == dtype else op(a.to(dtype), b)
        cast = in_common_dtype(a, b)
        return NotImplemented if cast is None else op(*cast)
    compare.__name__ = f"{op.__name__.split('.')[0]}_in_common_dtype"
    return compare


for _op in (aten.eq.Tensor, aten.ne.Tensor, aten.lt.Tensor, aten.le.Tensor, aten.gt.Tensor,
            aten.ge.Tensor, aten.eq.Scalar, aten.ne.Scalar, aten.lt.Scalar, aten.le.Scalar,
            aten.gt.Scalar, aten.ge.Scalar):
    decomposition(_op)(_compared_in_common_dtype(_op))


# --- floats bit by bit -----------------------------------------------------------------------

_SAME_WIDTH_INT = {torch.float32: torch.int32, torch.float64: torch.int64,
                   torch.bfloat16: torch.int16, torch.float16: torch.int16}


@decomposition(aten.nextafter.default)
def nextafter(x, y):
    # Unlowered. One step of the bit pattern read as a signed integer: +1 moves away from zero
    # for either sign, so up when y lies beyond x on x's side of zero; from zero, the smallest
    # subnormal toward y (made by a bitcast: XLA flushes subnormal arithmetic).
    x, y = _promoted(x, y)
    int_dtype = _SAME_WIDTH_INT.get(x.dtype)
    if int_dtype is None:
        return NotImplemented
    bits = x.view(int_dtype)
    step = torch.where((y > x) == (x > 0), 1, -1).to(int_dtype)
    stepped = (bits + step).view(x.dtype)
    smallest = torch.iinfo(int_dtype).min + 1
    tiny = torch.where(y > 0, torch.ones_like(bits), torch.full_like(bits, smallest))
    out = torch.where(x == 0, tiny.view(x.dtype), stepped)
    out = torch.where(x == y, y, out)
    return torch.where(x.isnan() | y.isnan(), float("nan"), out)


#: (mantissa bits, exponent bias) of the float dtypes frexp reads bit by bit.
_FLOAT_LAYOUT = {torch.float32: (23, 127), torch.float64: (52, 1023),
                 torch.bfloat16: (7, 127), torch.float16: (10, 15)}


@decomposition(aten.frexp.Tensor)
def frexp(x):
    # Unlowered. From the bit pattern: the exponent field, and the mantissa given the exponent
    # of 1/2. A subnormal is its integer mantissa times 2^(1 - bias - mantissa bits): that
    # integer converted to float (exact, no subnormal arithmetic, which XLA flushes) is normal.
    layout = _FLOAT_LAYOUT.get(x.dtype)
    if layout is None:
        return NotImplemented
    mantissa_bits, bias = layout
    int_dtype = _SAME_WIDTH_INT[x.dtype]
    exponent_mask = (2 * bias + 1) << mantissa_bits

    def exponent_field(bits):  # no shifts in torch-mlir: the masked field divided exactly
        return torch.div(torch.bitwise_and(bits, exponent_mask), 1 << mantissa_bits,
                         rounding_mode="floor")
    bits = x.view(int_dtype)
    field = exponent_field(bits)
    fraction = torch.bitwise_and(bits, (1 << mantissa_bits) - 1)
    subnormal = (field == 0) & (fraction != 0)
    scaled_bits = torch.where(subnormal, fraction, torch.ones_like(fraction)).to(x.dtype) \
        .view(int_dtype)
    exponent = torch.where(subnormal, exponent_field(scaled_bits) - 2 * bias - mantissa_bits + 2,
                           field - bias + 1)
    source = torch.where(subnormal, scaled_bits, bits)
    # The exponent of 1/2 into the cleared field (an add: torch-mlir has no bitwise_or.Scalar).
    mantissa = (torch.bitwise_and(source, ~exponent_mask) + ((bias - 1) << mantissa_bits)) \
        .view(x.dtype)
    # The sign from the sign bit: XLA reads a subnormal x as zero, so x < 0 is false.
    mantissa = torch.where(subnormal & (bits < 0), -mantissa, mantissa)
    special = (field == 2 * bias + 1) | ((field == 0) & (fraction == 0))   # inf, NaN, +-0
    return (torch.where(special, x, mantissa),
            torch.where(special, 0, exponent).to(torch.int32))


@decomposition(aten.ldexp.Tensor)
def ldexp(x, e):
    # torch's decomposition is x * 2**e in x's dtype: 2**e overflows or flushes (ldexp(0, 200)
    # was NaN, ldexp(1e30, -200) 0) where eager's is exact for integer exponents. Here three
    # exact powers of two, each inside the exponent range, made from their bits.
    if not x.is_floating_point() or e.is_floating_point() or e.is_complex():
        return as_before(aten.ldexp.Tensor, None, x, e)   # eager's x * 2**e too
    out_dtype = x.dtype
    wide = torch.float64 if out_dtype == torch.float64 else torch.float32
    mantissa_bits, bias = _FLOAT_LAYOUT[wide]
    int_dtype = _SAME_WIDTH_INT[wide]
    # Past 3 * (bias - 27) every finite nonzero result is 0 or inf already.
    e = torch.clamp(e.to(int_dtype), -3 * (bias - 27), 3 * (bias - 27))
    first = torch.div(e, 3, rounding_mode="floor")
    second = torch.div(e - first, 2, rounding_mode="floor")
    out = x.to(wide)
    for part in (first, second, e - first - second):
        out = out * ((part + bias) * (1 << mantissa_bits)).view(wide)
    return out.to(out_dtype)


# --- random masks ----------------------------------------------------------------------------

@decomposition(aten.native_dropout.default)
def native_dropout(input, p, train):
    # torch-mlir's table keeps native_dropout, a random op fed by a graph value. Written with
    # rand_like, the mask is drawn on the host from torch's generator (see calling_convention).
    if not train or p == 0:
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    if p == 1:
        return torch.zeros_like(input), torch.zeros_like(input, dtype=torch.bool)
    keep = torch.rand_like(input) < (1 - p)
    return input * keep * (1.0 / (1 - p)), keep


@decomposition(aten.hardshrink_backward.default, aten.softshrink_backward.default)
def shrink_backward(grad, x, lambd):
    # torch-mlir lowers neither: nn.Hardshrink's and nn.Softshrink's backwards ran on the host
    # on the eager device. Eager's kernels (the same for both): zero where -lambd <= x <= lambd
    # (NaN passes the gradient).
    return torch.where((x >= -lambd) & (x <= lambd), torch.zeros_like(grad), grad)
