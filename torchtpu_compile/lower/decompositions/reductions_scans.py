"""Reductions and scans: reductions of 0-d tensors (on which torch-mlir crashes), sums of
half-width floats accumulated in float32 (as eager), norm's Scalar overloads as vector norms,
the cumulative ops (which torch-mlir does not lower) as log-depth prefix combines, histograms
as scatter-adds.

Checks of reductions over no elements run before these: checks.py.

Example::

    table = decomposition_table()
    table[torch.ops.aten.cumsum.default](torch.tensor([1, 2, 3]), 0)   # [1, 3, 6], int64
"""
from __future__ import annotations

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

from .common import (as_before, as_itself, calling_itself, computing_dtype, rounded_once,
                     torch_decomposition)
from .registry import decomposition

aten = torch.ops.aten


# --- reductions over 0-d tensors -------------------------------------------------------------

def _over_one_element(op):
    """The decomposition of reduction ``op``: on a 0-d input, the same op over a [1] tensor.

    torch-mlir crashes the process (sum, mean, amax, amin, aminmax with keepdim; logsumexp,
    var, std, softmax) or fails
    (prod, argmax, any, all, max.dim, vector_norm) on a 0-d input with a ``dim``. Other inputs
    go to torch-mlir's own decomposition of the op, if it has one.
    """
    names = [a.name for a in op._schema.arguments]
    dim_at = names.index("dim")

    def decompose(x, *args, **kwargs):
        if x.dim() != 0:
            return as_before(op, None, x, *args, **kwargs)
        args = list(args)
        if len(args) >= dim_at:  # args exclude x, so "dim" sits at dim_at - 1
            dim = args[dim_at - 1]
            args[dim_at - 1] = [0] if isinstance(dim, (list, tuple)) else \
                (None if dim is None else 0)
        elif "dim" in kwargs and kwargs["dim"] is not None:
            kwargs["dim"] = [0] if isinstance(kwargs["dim"], (list, tuple)) else 0
        out = op(x.reshape(1), *args, **kwargs)
        if isinstance(out, (tuple, list)):
            return tuple(o.reshape(()) for o in out)
        return out.reshape(())
    decompose.__name__ = f"{op.__name__.replace('.', '_')}_of_0d"
    return decompose


# --- sums and products of half-width floats, accumulated in float32 -------------------------

#: The reductions that accumulate: eager (CPU and CUDA alike) sums a bf16 or f16 tensor in
#: float32 and rounds once; an XLA reduce in the tensor's own dtype rounds at every addition.
#: (Not prod: the CPU multiplies bf16 in bf16.)
_ACCUMULATING = (aten.sum.default, aten.sum.dim_IntList, aten.nansum.default, aten.mean.default,
                 aten.mean.dim, aten.linalg_vector_norm.default, aten.var_mean.correction)


_OVER_ONE_ELEMENT = (
    aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
    aten.aminmax.default, aten.logsumexp.default, aten.var.correction, aten.std.correction,
    aten.var_mean.correction, aten.std_mean.correction, aten._softmax.default,
    aten._log_softmax.default, aten.prod.dim_int, aten.argmax.default, aten.argmin.default,
    aten.any.dim, aten.any.dims, aten.all.dim, aten.max.dim, aten.min.dim,
    aten.linalg_vector_norm.default)


def _of_moduli(op, inner):
    """``inner``, except that the norm of a complex tensor is the norm of its elements'
    moduli: torch-mlir converts each complex element to its real part first."""
    def decompose(x, *args, **kwargs):
        if x.is_complex() and kwargs.get("dtype") is None:
            return op(torch.abs(x), *args, **kwargs)
        return inner(x, *args, **kwargs)
    decompose.__name__ = inner.__name__
    return decompose


#: Reductions whose result is real for a complex input.
_OF_MODULI = (aten.linalg_vector_norm.default,)


def _in_int16(op, inner):
    """``inner`` (a decomposition of ``op``, or None for the op as it is), except that a uint8
    or bool input is compared in int16, which holds all of their values; the values come back
    in the input's dtype, the indices as they are."""
    def decompose(x, *args, **kwargs):
        if x.dtype in (torch.uint8, torch.bool):
            out = op(x.to(torch.int16), *args, **kwargs)
            if op in (aten.argmax.default, aten.argmin.default):
                return out
            if op in (aten.max.dim, aten.min.dim):
                return out[0].to(x.dtype), out[1]
            if isinstance(out, (tuple, list)):
                return tuple(o.to(x.dtype) for o in out)
            return out.to(x.dtype)
        return as_before(op, inner, x, *args, **kwargs)
    decompose.__name__ = f"{op.__name__.replace('.', '_')}_in_int16"
    return decompose


#: The extrema that torch-mlir starts from the *signed* extreme of the element type, which
#: for uint8 and bool is inside their range once comparisons are unsigned: amax of uint8
#: [0, 1] was 128 and amin of [200] 127; bool amin of [True] was False, and max.dim's index
#: was 0 whatever the data (cumprod's backward takes the last zero from it: its gradient at
#: and after a zero was wrong).
_FROM_SIGNED_EXTREME = (
    aten.amax.default, aten.amin.default, aten.aminmax.default, aten.max.default,
    aten.min.default, aten.max.dim, aten.min.dim, aten.argmax.default, aten.argmin.default)


def _of_nonzero(op, inner):
    """``inner``, except that a uint8 input is reduced as ``x != 0``: torch-mlir reduces its
    bits (any of [200] was 200, all of [1, 2] 0), where eager's result is 0 or 1."""
    def decompose(x, *args, **kwargs):
        if x.dtype == torch.uint8:
            return op(x != 0, *args, **kwargs).to(torch.uint8)
        return as_before(op, inner, x, *args, **kwargs)
    decompose.__name__ = f"{op.__name__.replace('.', '_')}_of_nonzero"
    return decompose


#: Variances and deviations of float32 (and the half-width floats, computed in float32):
#: eager's CPU kernel accumulates them in float64, so the std of values near 1e30 is finite
#: where float32 squares overflow (inf). Not var_mean: layer and group norm decompose
#: through it, and the scaling's extra max reduction would be in every norm layer's step
#: (their eager kernels overflow in float32 too: layer_norm of [1e30, -1e30, 0, 5] is zeros).
_SCALED = (aten.var.correction, aten.std.correction, aten.std_mean.correction)

#: Largest magnitude reduced unscaled: its squares, summed over 2^28 elements, stay finite.
_UNSCALED_BOUND = 2.0 ** 50
_LARGEST_SCALE = 2.0 ** 100


def overflow_scale(big):
    """What a float32 variance divides its input by first, per slice whose largest magnitude
    is ``big`` (float32): a power of two near it where it reaches ``_UNSCALED_BOUND``, else 1.

    Example::

        overflow_scale(torch.tensor([1e17, 3.0]))   # [2**56, 1]
    """
    # The exponent field alone: 2^floor(log2(big)), exactly; at most 2^100, whose inverse is
    # normal (XLA may multiply by the inverse, and 2^-127 flushes to zero).
    power = torch.bitwise_and(big.view(torch.int32), 0x7F800000).view(torch.float32)
    power = torch.clamp(power, max=_LARGEST_SCALE)
    return torch.where((big >= _UNSCALED_BOUND) & (big < float("inf")), power,
                       torch.ones_like(power))


def _scaled(op, inner):
    """``inner``, except that a float32-computed input reaching past ``_UNSCALED_BOUND`` is
    divided by a power of two near its largest magnitude first (per reduced slice) and the
    results multiplied back: exact scalings, so only the float32 overflow goes away."""
    def decompose(x, *args, **kwargs):
        dim = args[0] if args else kwargs.get("dim")
        # an empty input's numel is symbolic under dynamic=True, and amax of it raises
        if not x.is_floating_point() or computing_dtype(x.dtype) != torch.float32 or \
                guard_or_false(x.numel() == 0):
            return as_before(op, inner, x, *args, **kwargs)
        dims = list(range(x.dim())) if dim is None else dim
        scale = overflow_scale(torch.amax(x.abs().to(torch.float32), dim=dims, keepdim=True))
        scale = scale.to(x.dtype)
        out = as_before(op, inner, x / scale, *args, **kwargs)
        if out is NotImplemented:
            return out
        keepdim = kwargs.get("keepdim", False)
        first = out[0] if isinstance(out, (tuple, list)) else out
        scale = scale.reshape(first.shape) if not keepdim else scale
        squared = op in (aten.var.correction, aten.var_mean.correction)
        first = first * scale * scale if squared else first * scale
        return (first, out[1] * scale) if isinstance(out, (tuple, list)) else first
    decompose.__name__ = f"{op.__name__.replace('.', '_')}_scaled"
    return decompose


_TRUTH = (aten.any.default, aten.any.dim, aten.any.dims, aten.all.default, aten.all.dim)

#: The float extrema XLA:CPU computes with vector max and min instructions from 4096
#: elements on, which skip NaN: max of 4096 values holding a NaN was the largest number,
#: where eager's (and XLA's own, below that size) is NaN. Each is told the NaN apart.
_NAN_SKIPPED = (aten.amax.default, aten.amin.default, aten.aminmax.default, aten.max.default,
                aten.min.default, aten.linalg_vector_norm.default)


def _reduced_dims(op, x, args, kwargs) -> tuple:
    """(dims, keepdim) an extremum of ``_NAN_SKIPPED`` reduces over, or None where it is no
    max or min (a vector norm of finite order)."""
    every = list(range(x.dim()))
    if op in (aten.max.default, aten.min.default):
        return every, False
    if op is aten.aminmax.default:
        dim = kwargs.get("dim")
        return (every if dim is None else [dim]), kwargs.get("keepdim", False)
    if op is aten.linalg_vector_norm.default:
        order = args[0] if args else kwargs.get("ord", 2)
        if order not in (float("inf"), float("-inf")):
            return None
        args = args[1:]
    dim = args[0] if args else kwargs.get("dim")
    keepdim = args[1] if len(args) > 1 else kwargs.get("keepdim", False)
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    return (dims or every), keepdim


def _nan_kept(op, inner):
    """``inner``, except that a reduced slice holding a NaN is NaN (``_NAN_SKIPPED``)."""
    def decompose(x, *args, **kwargs):
        reduced = _reduced_dims(op, x, args, kwargs)
        if calling_itself(op) or reduced is None or not x.is_floating_point() or x.dim() == 0:
            return as_before(op, inner, x, *args, **kwargs)
        out = as_itself(op, x, *args, **kwargs)
        dims, keepdim = reduced
        nan = torch.isnan(x).any(dims, keepdim=keepdim)
        if isinstance(out, (tuple, list)):
            return tuple(torch.where(nan, float("nan"), o) for o in out)
        return torch.where(nan, float("nan"), out)
    decompose.__name__ = f"{op.__name__.replace('.', '_')}_nan_kept"
    return decompose


def _reduction_decomposition(op):
    decompose = _over_one_element(op) if op in _OVER_ONE_ELEMENT else None
    if op in _FROM_SIGNED_EXTREME:
        decompose = _in_int16(op, decompose)
    if op in _TRUTH:
        decompose = _of_nonzero(op, decompose)
    if op in _ACCUMULATING:
        decompose = rounded_once(op, decompose)
    if op in _OF_MODULI:
        decompose = _of_moduli(op, decompose)
    if op in _SCALED:
        decompose = _scaled(op, decompose)
    if op in _NAN_SKIPPED:
        decompose = _nan_kept(op, decompose)
    return decompose


for _op in dict.fromkeys(_OVER_ONE_ELEMENT + _ACCUMULATING + _FROM_SIGNED_EXTREME
                             + _TRUTH + _NAN_SKIPPED):
    decomposition(_op)(_reduction_decomposition(_op))


# --- norm's Scalar overloads, as vector norms ------------------------------------------------
# C++ callers reach at::norm without a dim: weight norm over every dim (torch._weight_norm's
# norm_except_dim, parametrizations.weight_norm(dim=None)) and spectral norm's power iteration.
# torch-mlir lowers none of these overloads (each call ran on the host, counted); PyTorch's own
# decomposition is linalg_vector_norm, whose rules above apply.

for _op in (aten.norm.Scalar, aten.norm.ScalarOpt_dtype, aten.norm.ScalarOpt_dim_dtype):
    decomposition(_op)(torch_decomposition(_op))


# --- all / any of a bool tensor, as a 0-d tensor -----------------------------------------------
# torch._assert on a tensor and every torch.distributions argument check call these (unlowered:
# a host round trip per Normal(...) built on the eager device).

@decomposition(aten._is_all_true.default)
def is_all_true(x):
    return torch.all(x)


@decomposition(aten._is_any_true.default)
def is_any_true(x):
    return torch.any(x)


@decomposition(aten.all.dims)
def all_dims(x, dim=None, keepdim=False):
    # torch-mlir lowers any.dims, not all.dims (each call ran on the host): all is "not any
    # of the negation" (over no dims, each element's truth). uint8 in, uint8 out, as eager.
    out = torch.logical_not(aten.any.dims(torch.logical_not(x), dim, keepdim))
    return out.to(torch.uint8) if x.dtype == torch.uint8 else out


# --- scans: a log-depth prefix combine (Hillis-Steele) of shifted copies ---------------------

def _scan(values: tuple, dim: int, combine) -> tuple:
    """Inclusive prefix ``combine`` of tensors ``values`` along ``dim`` in log2(n) steps.

    ``combine(earlier, later)`` takes and returns tuples like ``values``; it must be
    associative. Positions with no element ``k`` before them keep their value at each step.
    """
    n = values[0].shape[dim]
    if n <= 1:
        return values
    position = torch.arange(n).view([-1] + [1] * (values[0].dim() - 1 - dim))
    k = 1
    while k < n:
        earlier = tuple(torch.cat([v.narrow(dim, 0, k), v.narrow(dim, 0, n - k)], dim)
                        for v in values)
        combined = combine(earlier, values)
        reached = position >= k
        values = tuple(torch.where(reached, c, v) for c, v in zip(combined, values))
        k *= 2
    return values


def _static_length(fn):
    # A scan unrolls over its length: at a symbolic (bucketed) length that would specialize
    # it. Leave the op whole there; buckets/trace.py decomposes it again at the padded size.
    def decompose(x, dim, *args, **kwargs):
        if x.dim() and isinstance(x.shape[dim], torch.SymInt):
            return NotImplemented
        return fn(x, dim, *args, **kwargs)
    decompose.__name__ = fn.__name__
    return decompose


def _scan_dtype(x, dtype):
    # Integer and bool inputs accumulate in int64 unless a dtype is given (as eager does).
    if dtype is not None:
        return x.to(dtype)
    if not (x.is_floating_point() or x.is_complex()):
        return x.to(torch.int64)
    return x


def _accumulating_scan(x, dim: int, combine):
    """Inclusive scan of ``x`` along ``dim`` by the associative ``combine(earlier, later)``.

    Eager's CPU kernels scan bf16 and f16 in float32 and round each result once; a scan in
    bf16 rounds at every step (a cumsum of 3000 values ~3x eager's error).
    """
    scanned = _scan((x.to(computing_dtype(x.dtype)),), dim, lambda a, b: (combine(a[0], b[0]),))
    return scanned[0].to(x.dtype)


@decomposition(aten.cumsum.default)
@_static_length
def cumsum(x, dim, *, dtype=None):
    # torch-mlir has no lowering for cumsum (nor cumprod, cummax, cummin, logcumsumexp).
    x = _scan_dtype(x, dtype)
    if x.dim() == 0:
        return x.clone()
    if x.is_floating_point():
        # Eager's sums start from +0.0, so no element of its result is -0.0 (+0.0 + -0.0 is
        # +0.0); the scan starts from the first element itself. Not x + 0.0: XLA folds it.
        x = torch.where(x == 0, torch.zeros_like(x), x)
    return _accumulating_scan(x, dim % x.dim(), torch.add)


@decomposition(aten.cumprod.default)
@_static_length
def cumprod(x, dim, *, dtype=None):
    x = _scan_dtype(x, dtype)
    if x.dim() == 0:
        return x.clone()
    return _accumulating_scan(x, dim % x.dim(), torch.mul)


def _log_add_exp(a, b):
    hi, lo = torch.maximum(a, b), torch.minimum(a, b)
    # -inf with -inf stays -inf (hi - hi would be NaN).
    safe = torch.where(hi == float("-inf"), torch.zeros_like(hi), hi)
    return torch.where(hi == float("-inf"), hi, safe + torch.log1p(torch.exp(lo - safe)))


@decomposition(aten.logcumsumexp.default)
@_static_length
def logcumsumexp(x, dim):
    if x.dim() == 0:
        return x.clone()
    return _accumulating_scan(x, dim % x.dim(), _log_add_exp)


def _cumulative_extreme(x, dim, later_wins):
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64)
    dim = dim % x.dim()
    index = torch.arange(x.shape[dim]).view([-1] + [1] * (x.dim() - 1 - dim)).expand(x.shape)

    def combine(a, b):
        # NaN wins and stays; ties go to the later index, as in the CPU kernel.
        take = later_wins(b[0], a[0])
        if x.is_floating_point():
            take = b[0].isnan() | (~a[0].isnan() & take)
        return torch.where(take, b[0], a[0]), torch.where(take, b[1], a[1])
    return _scan((x, index.contiguous()), dim, combine)


@decomposition(aten.cummax.default)
@_static_length
def cummax(x, dim):
    return _cumulative_extreme(x, dim, lambda later, earlier: later >= earlier)


@decomposition(aten.cummin.default)
@_static_length
def cummin(x, dim):
    return _cumulative_extreme(x, dim, lambda later, earlier: later <= earlier)


# --- histograms ------------------------------------------------------------------------------

@decomposition(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    # No torch-mlir lowering (Mixtral's router counts tokens per expert with it). A scatter-add
    # of ones into the bins, with the CPU kernel's bin arithmetic and edge cases.
    # Integers (CUDA's; the CPU refuses them) in int64: x - lo and its product by the bin
    # count wrapped in uint8 (a 2346-pixel image's counts were [35, 0, ..., 7]).
    wide = x.dtype if x.is_floating_point() else torch.int64
    flat = x.flatten().to(wide)
    lo = torch.scalar_tensor(min, dtype=wide)
    hi = torch.scalar_tensor(max, dtype=wide)
    if min == max and flat.numel():
        lo, hi = flat.min(), flat.max()
    same = lo == hi
    lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    if x.is_floating_point():
        position = ((flat - lo) * bins / (hi - lo)).floor().to(torch.int64)
    else:
        position = torch.div((flat - lo) * bins, hi - lo, rounding_mode="floor")
    position = torch.where(flat == hi, bins - 1, position)
    inside = (flat >= lo) & (flat <= hi)
    return x.new_zeros(bins).scatter_add(0, position.clamp(0, bins - 1), inside.to(x.dtype))


def _linspace(start, end, steps: int):
    """Eager's linspace between 0-d tensors: the first half counted up from ``start``, the
    second down from ``end``, so both ends are exact (histogram's edges must be eager's)."""
    index = torch.arange(steps, dtype=start.dtype)
    step = (end - start) / max(steps - 1, 1)
    return torch.where(index < steps // 2, start + step * index,
                       end - step * (steps - 1 - index))


def _histogram_from_edges(x, edges, weight, density):
    values = x.reshape(-1)
    bins = edges.numel() - 1
    # Eager's bin: the last edge not above the value; the rightmost edge closes the last bin.
    position = torch.bucketize(values, edges, right=True) - 1
    inside = (values >= edges[0]) & (values <= edges[-1])
    position = torch.where(inside, position.clamp(0, bins - 1), 0)
    amount = torch.ones_like(values) if weight is None else weight.reshape(-1).to(x.dtype)
    amount = torch.where(inside, amount, 0)
    hist = torch.zeros(bins, dtype=x.dtype).scatter_add(0, position, amount)
    if density:
        hist = hist / (hist.sum() * (edges[1:] - edges[:-1]))
    return hist, edges


@decomposition(aten.histogram.bin_ct)
def histogram_bin_ct(x, bins=100, *, range=None, weight=None, density=False):
    # Unlowered. The edges span ``range`` or the data (widened by 1/2 each way when all values
    # are equal, as eager), or [0, 1] for no data. Data with NaN or inf and no range raise
    # eager's error (lower/index_checks.py).
    if not x.dtype.is_floating_point:
        return NotImplemented
    if range is not None:
        low, high = (torch.full((), float(v), dtype=x.dtype) for v in range)
    elif x.numel() == 0:  # eager's edges span [0, 1]: widened from [0, 0] they were [-0.5, 0.5]
        low, high = torch.zeros((), dtype=x.dtype), torch.ones((), dtype=x.dtype)
    else:
        low, high = x.min(), x.max()
    equal = low == high
    low, high = torch.where(equal, low - 0.5, low), torch.where(equal, high + 0.5, high)
    return _histogram_from_edges(x, _linspace(low, high, bins + 1), weight, density)


@decomposition(aten.histogram.bins_tensor)
def histogram_bins_tensor(x, bins, *, weight=None, density=False):
    if not x.dtype.is_floating_point:
        return NotImplemented
    return _histogram_from_edges(x, bins.to(x.dtype), weight, density)
