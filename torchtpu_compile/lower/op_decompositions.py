"""Decompositions for ops that torch-mlir lowers wrongly, not at all, or by crashing.

Found by the OpInfo sweep (tests/opinfo) and the model zoo; each is registered with
``@decomposition`` (the one registry of lower/decompositions.py) and has a test in
tests/test_op_decompositions.py. A function returns ``NotImplemented`` for the cases it leaves
to torch-mlir.

Example::

    table = decomposition_table()                           # includes these
    table[torch.ops.aten.remainder.Tensor](torch.tensor([-3.0]), torch.tensor([2.0]))  # [1.]
"""
from __future__ import annotations

import math
import threading

import torch

from .decompositions import decomposition

aten = torch.ops.aten

#: Set while a decomposition that only rewrites its indices calls its own op again.
_wrapping = threading.local()


# --- elementwise -----------------------------------------------------------------------------

def _as_tensor(value, like):
    """A Python scalar as a 0-d tensor of the promoted dtype: torch-mlir cannot legalize the
    ``torch.constant.float`` that scalar overloads such as ``fmod.Scalar`` leave behind."""
    if isinstance(value, torch.Tensor):
        return value
    return torch.scalar_tensor(value, dtype=torch.result_type(like, value))


@decomposition(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def remainder(a, b):
    # torch-mlir's lowering gives the C remainder (sign of the dividend) for floats; Python's
    # takes the divisor's sign. From fmod, as the CPU kernel does, to keep its rounding.
    a, b = _as_tensor(a, b), _as_tensor(b, a)
    mod = torch.fmod(a, b)
    # logical_xor, not !=: torch-mlir compares booleans as signed, which XLA rejects.
    wrong_sign = (mod != 0) & torch.logical_xor(mod < 0, b < 0)
    return torch.where(wrong_sign, mod + b, mod)


@decomposition(aten.fmod.Scalar)
def fmod_scalar(a, b):
    return torch.fmod(a, _as_tensor(b, a))


def _is_integer(dtype: torch.dtype) -> bool:
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


@decomposition(aten.div.Tensor_mode, aten.div.Scalar_mode)
def div_mode(a, b, *, rounding_mode=None):
    # torch-mlir floors integer quotients in float64: int64 beyond 2**53 loses its low digits
    # (and TPUs have no float64). Integers are floored exactly here; floats stay torch-mlir's.
    if rounding_mode != "floor" or not _is_integer(torch.result_type(a, b)):
        return NotImplemented
    return _floor_divide_integers(_as_tensor(a, b), _as_tensor(b, a))


@decomposition(aten.floor_divide.default, aten.floor_divide.Scalar)
def floor_divide(a, b):
    return torch.div(a, b, rounding_mode="floor")


def _floor_divide_integers(a, b):
    """a // b in integer arithmetic, as the CPU kernel computes it: the truncated quotient,
    one less where the remainder is nonzero and its sign differs from the divisor's
    (tests/test_integer_division.py).

    Division by zero is not caught: XLA has no way to raise from inside a program.
    """
    quotient = torch.div(a, b, rounding_mode="trunc")
    rest = a - quotient * b
    # logical_xor, not !=: see remainder.
    rounds_down = (rest != 0) & torch.logical_xor(rest < 0, b < 0)
    return quotient - rounds_down.to(quotient.dtype)


def _computing_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for the half-width floats, which eager's CPU kernels compute in; else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _promoted(a, b):
    dtype = torch.result_type(a, b)
    return a.to(dtype), b.to(dtype)


@decomposition(aten.fmax.default)
def fmax(a, b):
    # torch-mlir's lowering builds a comparison of the unbroadcast shapes and fails to verify.
    a, b = _promoted(a, b)
    if not a.is_floating_point():
        return torch.maximum(a, b)
    return torch.where(b.isnan(), a, torch.where(a.isnan(), b, torch.maximum(a, b)))


@decomposition(aten.fmin.default)
def fmin(a, b):
    a, b = _promoted(a, b)
    if not a.is_floating_point():
        return torch.minimum(a, b)
    return torch.where(b.isnan(), a, torch.where(a.isnan(), b, torch.minimum(a, b)))


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


@decomposition(aten.addmv.default)
def addmv(self, mat, vec, *, beta=1, alpha=1):
    # No torch-mlir lowering. beta == 0 ignores self, NaNs included, as eager does.
    out = torch.mv(mat, vec)
    if alpha != 1:
        out = out * alpha
    if beta == 0:
        return out.expand(torch.broadcast_shapes(self.shape, out.shape)).clone()
    return out + (self * beta if beta != 1 else self)


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


@decomposition(aten.cumsum.default)
@_static_length
def cumsum(x, dim, *, dtype=None):
    # torch-mlir has no lowering for cumsum (nor cumprod, cummax, cummin, logcumsumexp).
    x = _scan_dtype(x, dtype)
    if x.dim() == 0:
        return x.clone()
    return _scan((x,), dim % x.dim(), lambda a, b: (a[0] + b[0],))[0]


@decomposition(aten.cumprod.default)
@_static_length
def cumprod(x, dim, *, dtype=None):
    x = _scan_dtype(x, dtype)
    if x.dim() == 0:
        return x.clone()
    return _scan((x,), dim % x.dim(), lambda a, b: (a[0] * b[0],))[0]


@decomposition(aten.logcumsumexp.default)
@_static_length
def logcumsumexp(x, dim):
    if x.dim() == 0:
        return x.clone()

    def combine(a, b):
        hi, lo = torch.maximum(a[0], b[0]), torch.minimum(a[0], b[0])
        # -inf with -inf stays -inf (hi - hi would be NaN).
        safe = torch.where(hi == float("-inf"), torch.zeros_like(hi), hi)
        return (torch.where(hi == float("-inf"), hi, safe + torch.log1p(torch.exp(lo - safe))),)
    return _scan((x,), dim % x.dim(), combine)[0]


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


# --- diagonals: strided slices of the flattened last two dims --------------------------------

def _diagonal_slice(x, offset, dim1, dim2):
    """(x with dim1, dim2 moved last and flattened, start, end, step, length) of the diagonal."""
    moved = torch.movedim(x, (dim1 % x.dim(), dim2 % x.dim()), (-2, -1))
    n, m = moved.shape[-2], moved.shape[-1]
    if offset >= 0:
        length, start = max(min(n, m - offset), 0), offset
    else:
        length, start = max(min(n + offset, m), 0), -offset * m
    flat = moved.reshape(list(moved.shape[:-2]) + [n * m])
    end = start + (length - 1) * (m + 1) + 1 if length else start
    return moved, flat, start, end, m + 1, length


@decomposition(aten.diagonal.default)
def diagonal(x, offset=0, dim1=0, dim2=1):
    # torch-mlir leaves a torch.constant.int behind for diagonal (and diag, diagonal_copy).
    moved, flat, start, end, step, length = _diagonal_slice(x, offset, dim1, dim2)
    if length == 0:
        return flat.new_zeros(list(moved.shape[:-2]) + [0])
    return aten.slice.Tensor(flat, -1, start, end, step)


@decomposition(aten.diagonal_scatter.default)
def diagonal_scatter(x, src, offset=0, dim1=0, dim2=1):
    moved, flat, start, end, step, length = _diagonal_slice(x, offset, dim1, dim2)
    if length == 0:
        return x.clone()
    flat = aten.slice_scatter.default(flat, src, -1, start, end, step)
    return torch.movedim(flat.reshape(moved.shape), (-2, -1), (dim1 % x.dim(), dim2 % x.dim()))


# --- selection and distances -----------------------------------------------------------------

@decomposition(aten.kthvalue.default)
def kthvalue(x, k, dim=-1, keepdim=False):
    # torch-mlir leaves a torch.constant.bool behind. The k smallest, the last of them; NaN
    # counts as the largest value, as in eager (XLA's top-k would place it first).
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64)
    keys = torch.where(x.isnan(), float("inf"), x) if x.is_floating_point() else x
    _, indices = torch.topk(keys, k, dim=dim, largest=False, sorted=True)
    indices = indices.narrow(dim, k - 1, 1)
    values = x.gather(dim, indices)
    if not keepdim:
        values, indices = values.squeeze(dim), indices.squeeze(dim)
    return values, indices


# Sorts lower to StableHLO's sort with eager's comparator (NaN last: stablehlo_passes
# .sorts_put_nan_last), unstable as eager's default sort; stability is built here.

def _stable_sort(x, dim, descending=False):
    """(values, original positions) of a stable sort along ``dim``: one sort of a unique int64
    key, (the value's rank in eager's order) * n + position, so any sort gives one answer;
    for 64-bit values, which leave no room for the position, two sorts (``_stable_by_runs``)."""
    n = x.shape[dim]
    rank = _order_rank(x)
    if n < 2 or rank is None:
        return _stable_by_runs(x, dim, descending)
    if descending:  # NaN (the largest) first, as eager
        rank = -rank - 1
    shape = [1] * x.dim()
    shape[dim] = n
    _, positions = aten.sort.default(rank * n + torch.arange(n).reshape(shape), dim, False)
    return x.gather(dim, positions), positions


def _order_rank(x):
    """An int64 tensor ordered as eager orders ``x`` (equal values equal, -0 = +0, NaN above
    everything), with |rank| < 2**31; None for 64-bit dtypes."""
    if x.dtype in (torch.int64, torch.float64) or x.is_complex():
        return None
    if not x.is_floating_point():
        return x.to(torch.int64)
    value = x.to(torch.float32)
    # One zero and one NaN, by selects: XLA may fold x + 0.0 to x and keep -0.
    value = torch.where(value == 0, 0.0, value)
    value = torch.where(value.isnan(), float("nan"), value)
    bits = value.view(torch.int32).to(torch.int64)
    # Negative floats' bits grow with their magnitude: mirrored below zero.
    return torch.where(bits < 0, -(bits + 2 ** 31) - 1, bits)


def _stable_by_runs(x, dim, descending):
    """The stable sort as the unstable one, then each run of equal values put back in
    position order by a second sort of the exact key run * n + position."""
    values, positions = aten.sort.default(x, dim, descending)
    n = x.shape[dim]
    if n < 2:
        return values, positions
    later, earlier = values.narrow(dim, 1, n - 1), values.narrow(dim, 0, n - 1)
    differs = later != earlier
    if x.is_floating_point():
        differs = differs & ~(later.isnan() & earlier.isnan())
    starts = torch.cat([torch.ones_like(differs.narrow(dim, 0, 1)), differs], dim)
    run = torch.cumsum(starts.to(torch.int64), dim)
    _, order = aten.sort.default(run * n + positions, dim, False)
    return values.gather(dim, order), positions.gather(dim, order)


@decomposition(aten.topk.default)
def topk(x, k, dim=-1, largest=True, sorted=True):
    # torch-mlir lowers topk to the unstable sort, so among equal values the indices were the
    # platform sort's choice (XLA:CPU's, TPU's, neither eager's nth_element). Eager leaves the
    # order of ties unspecified (torch.topk's docs); ours is the first k of the stable sort:
    # equal values lowest position first on every platform, as jax.lax.top_k. NaN is the
    # largest value, as in eager. (Bucket padding sits after the real elements: it loses ties.)
    if x.dtype == torch.bool:
        raise RuntimeError("topk does not support bool dtypes (as eager PyTorch on CPU)")
    if x.dim() == 0:
        if k not in (0, 1):
            raise RuntimeError("selected index k out of range")
        return x.clone(), torch.zeros((), dtype=torch.int64)
    values, positions = _stable_sort(x, dim, descending=largest)
    return values.narrow(dim, 0, k), positions.narrow(dim, 0, k)


@decomposition(aten.sort.stable)
def sort_stable(x, *, stable=None, dim=-1, descending=False):
    # No torch-mlir lowering for this overload; without stable=True it is the default sort.
    if not stable or x.dim() == 0:
        return aten.sort.default(x, dim, descending)
    return _stable_sort(x, dim, descending)


def _sorted_along(x, dim):
    """(x sorted stably along ``dim``, the original positions), a 0-d tensor as one element."""
    values = x.reshape(1) if x.dim() == 0 else x
    return _stable_sort(values, dim if x.dim() else 0)


def _median(x, dim, keepdim, ignore_nan):
    # The lower middle element of the stable sort (the CPU kernel's nth_element picks the same
    # element among ties in every case we compared). median: any NaN gives NaN at the first
    # NaN's position; nanmedian: the middle of the numbers, NaN when there are none.
    dim = dim % max(x.dim(), 1)
    values, positions = _sorted_along(x, dim)
    n = values.shape[dim]
    if x.is_floating_point():
        nans = values.isnan().sum(dim, keepdim=True)
    else:
        nans = torch.zeros_like(values.narrow(dim, 0, 1), dtype=torch.int64)
    if ignore_nan:
        pick = ((n - nans - 1) // 2).clamp(min=0)
    else:
        pick = torch.where(nans > 0, n - nans, (n - 1) // 2)
    value = values.gather(dim, pick)
    index = positions.gather(dim, pick)
    if x.dim() == 0:
        return value.reshape(()), index.reshape(())
    if not keepdim:
        value, index = value.squeeze(dim), index.squeeze(dim)
    return value, index


@decomposition(aten.median.dim)
def median_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=False)


@decomposition(aten.nanmedian.dim)
def nanmedian_dim(x, dim, keepdim=False):
    return _median(x, dim, keepdim, ignore_nan=True)


@decomposition(aten.median.default)
def median(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=False)[0]


@decomposition(aten.nanmedian.default)
def nanmedian(x):
    return _median(x.reshape(-1), 0, False, ignore_nan=True)[0]


@decomposition(aten.mode.default)
def mode(x, dim=-1, keepdim=False):
    # The CPU kernel sorts (value, position) pairs and keeps the first longest run: the most
    # frequent value, the smallest among equally frequent ones, at its last position.
    if x.dim() == 0:
        return x.clone(), torch.zeros((), dtype=torch.int64)
    dim = dim % x.dim()
    values, positions = _sorted_along(x, dim)
    n = values.shape[dim]
    values_t, positions_t = values.movedim(dim, -1), positions.movedim(dim, -1)
    starts = torch.ones_like(values_t, dtype=torch.bool)
    if n > 1:
        differs = values_t.narrow(-1, 1, n - 1) != values_t.narrow(-1, 0, n - 1)
        starts = torch.cat([starts.narrow(-1, 0, 1), differs], -1)
    run = torch.cumsum(starts.to(torch.int64), -1) - 1
    lengths = torch.zeros_like(run).scatter_add(-1, run, torch.ones_like(run))
    length = lengths.gather(-1, run)
    # The longest run, the first of equally long ones: at its start, the score is unique.
    score = length * (n + 1) - torch.arange(n, dtype=torch.int64)
    start = score.argmax(-1, keepdim=True)
    end = start + length.gather(-1, start) - 1
    value = values_t.gather(-1, start).movedim(-1, dim)
    index = positions_t.gather(-1, end).movedim(-1, dim)
    if not keepdim:
        value, index = value.squeeze(dim), index.squeeze(dim)
    return value, index


@decomposition(aten._cdist_forward.default)
def cdist(x1, x2, p, compute_mode=None):
    # No torch-mlir lowering. Differences, not the |a|^2 + |b|^2 - 2ab expansion: exact at
    # p = 2 where eager's matmul form rounds, and any p works the same way.
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)
    if p == 0:
        return (diff != 0).sum(-1).to(x1.dtype)
    if p == float("inf"):
        return diff.abs().amax(-1)
    if p == 1:
        return diff.abs().sum(-1)
    if p == 2:
        return diff.square().sum(-1).sqrt()
    return diff.abs().pow(p).sum(-1).pow(1.0 / p)


@decomposition(aten.histc.default)
def histc(x, bins=100, min=0, max=0):
    # No torch-mlir lowering (Mixtral's router counts tokens per expert with it). A scatter-add
    # of ones into the bins, with the CPU kernel's bin arithmetic and edge cases.
    flat = x.flatten()
    lo = torch.scalar_tensor(min, dtype=x.dtype)
    hi = torch.scalar_tensor(max, dtype=x.dtype)
    if min == max and flat.numel():
        lo, hi = flat.min(), flat.max()
    same = lo == hi
    lo, hi = torch.where(same, lo - 1, lo), torch.where(same, hi + 1, hi)
    position = ((flat - lo) * bins / (hi - lo)).floor().to(torch.int64)
    position = torch.where(flat == hi, bins - 1, position)
    inside = (flat >= lo) & (flat <= hi)
    return x.new_zeros(bins).scatter_add(0, position.clamp(0, bins - 1), inside.to(x.dtype))


# --- grouped matmuls (mixture-of-experts layers) ---------------------------------------------

def _groups(offs, length: int):
    """Group of each of ``length`` positions: how many cumulative ends ``offs`` lie at or
    before it (positions past the last end get ``len(offs)``, no group)."""
    position = torch.arange(length, device=offs.device)
    return (position.unsqueeze(1) >= offs.to(torch.int64).unsqueeze(0)).sum(1)


def _rows_grouped_mm(input, weight, offs):
    # out[t] = input[t] @ weight[group(t)], one masked matmul per group: static shapes, and
    # no (tokens x K x N) gather of weights.
    group = _groups(offs, input.shape[0]).unsqueeze(1)
    out = input.new_zeros(input.shape[0], weight.shape[-1])
    for e in range(weight.shape[0]):
        out = torch.where(group == e, input @ weight[e], out)
    return out


@decomposition(aten._grouped_mm.default)
def grouped_mm(self, mat2, offs=None, bias=None, out_dtype=None):
    # No torch-mlir lowering; transformers' MoE layers call it for bf16 weights.
    if self.dim() == 3 and mat2.dim() == 3 and offs is None:
        out = torch.bmm(self, mat2)
    elif self.dim() == 2 and mat2.dim() == 3 and offs is not None:
        out = _rows_grouped_mm(self, mat2, offs)
    elif self.dim() == 2 and mat2.dim() == 2 and offs is not None:
        # The contraction dim is split into groups: one [M, N] product per group.
        group = _groups(offs, self.shape[1])
        out = torch.stack([(self * (group == e)) @ mat2 for e in range(offs.shape[0])])
    else:
        return NotImplemented
    if bias is not None:
        out = out + (bias.unsqueeze(-2) if bias.dim() == 2 and out.dim() == 3 else bias)
    return out.to(out_dtype) if out_dtype is not None else out


@decomposition("transformers::grouped_mm_fallback")
def transformers_grouped_mm(input, weight, offs):
    # transformers' custom op for fp32 MoE weights under torch.compile: a Python loop over
    # offs.tolist() inside, opaque to Dynamo, and no lowering.
    return _rows_grouped_mm(input, weight, offs)


@decomposition("transformers::grouped_mm_fallback_backward")
def transformers_grouped_mm_backward(input, weight, offs, grad_output):
    group = _groups(offs, input.shape[0]).unsqueeze(1)
    grad_input = input.new_zeros(input.shape)
    grad_weight = []
    for e in range(weight.shape[0]):
        mine = group == e
        grad_input = torch.where(mine, grad_output @ weight[e].transpose(0, 1), grad_input)
        grad_weight.append((input * mine).transpose(0, 1) @ grad_output)
    return grad_input, torch.stack(grad_weight)


# --- views that torch-mlir lowers through constants XLA rejects ------------------------------

def _contiguous_strides(size) -> list:
    strides, step = [], 1
    for s in reversed(list(size)):
        strides.append(step)
        step *= max(s, 1)
    return strides[::-1]


@decomposition(aten.as_strided.default, aten.as_strided_copy.default)
def as_strided(x, size, stride, storage_offset=None):
    # torch-mlir lowers as_strided through a dense_resource index constant, which XLA rejects
    # ("Only dense elements attr are supported"); group_norm's decomposition emits it. On a
    # contiguous input it is a reshape, or a gather at indices computed in the graph.
    if not x.is_contiguous() or x.storage_offset() != 0:
        return NotImplemented
    offset = storage_offset or 0
    size, stride = list(size), list(stride)
    count = 1
    for s in size:
        count *= s
    if offset == 0 and count == x.numel() and all(
            st == cs for s, st, cs in zip(size, stride, _contiguous_strides(size)) if s > 1):
        return x.reshape(size).clone()
    return x.reshape(-1)[_strided_index(size, stride, offset)]


def _strided_index(size, stride, offset):
    """Flat storage positions of the elements of an as_strided(size, stride, offset) view."""
    index = torch.full([1] * len(size), offset, dtype=torch.int64)
    for d, (s, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[d] = s
        index = index + torch.arange(s, dtype=torch.int64).view(shape) * st
    return index.expand(list(size))


@decomposition(aten.as_strided_scatter.default)
def as_strided_scatter(x, src, size, stride, storage_offset=None):
    # No lowering (Swin's window partition backward). On a contiguous input: a scatter of
    # ``src`` into the flat storage at the view's positions.
    if not x.is_contiguous() or x.storage_offset() != 0:
        return NotImplemented
    index = _strided_index(list(size), list(stride), storage_offset or 0)
    flat = x.reshape(-1).scatter(0, index.reshape(-1), src.reshape(-1).to(x.dtype))
    return flat.reshape(x.shape)


# --- pooling: ceil_mode, divisor_override and count_include_pad as explicit padding ----------

def _pool_geometry(in_sizes, kernel, stride, padding, dilation, ceil_mode):
    """Per spatial dim (output size, extra right padding so that a floor-mode pool over the
    padded input has that output size), with PyTorch's ceil-mode rule."""
    out = []
    for n, k, s, p, d in zip(in_sizes, kernel, stride, padding, dilation):
        span = n + 2 * p - d * (k - 1) - 1
        size = (-(-span // s) if ceil_mode else span // s) + 1
        if ceil_mode and (size - 1) * s >= n + p:  # the last window must start inside
            size -= 1
        extra = max((size - 1) * s + d * (k - 1) + 1 - (n + 2 * p), 0)
        out.append((size, extra))
    return out


def _expand(value, dims: int) -> list:
    value = [value] if isinstance(value, int) else list(value)
    return value * dims if len(value) == 1 else value


@decomposition(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    # torch-mlir gets the last window of ceil_mode wrong. Pad on the right with -inf to the
    # floor-mode size; indices come back in the unpadded input's coordinates.
    if not ceil_mode:
        return NotImplemented
    dims, pool = 2, aten.max_pool2d_with_indices.default
    kernel = _expand(kernel_size, dims)
    stride = _expand(stride, dims) if stride else kernel
    padding, dilation = _expand(padding, dims), _expand(dilation, dims)
    in_sizes = list(x.shape[-dims:])
    geometry = _pool_geometry(in_sizes, kernel, stride, padding, dilation, True)
    extra = [e for _, e in geometry]
    if not any(extra):
        return pool(x, kernel, stride, padding, dilation, False)
    flat_pad = _flat_pad([0] * dims, extra)
    low = float("-inf") if x.is_floating_point() else torch.iinfo(x.dtype).min
    values, indices = pool(aten.constant_pad_nd(x, flat_pad, low), kernel, stride, padding,
                           dilation, False)
    padded = [n + e for n, e in zip(in_sizes, extra)]
    coords, rest = [], indices
    for size in reversed(padded):  # unflatten in padded coordinates...
        coords.append(rest % size)
        rest = rest // size
    flat = torch.zeros_like(indices)
    for coord, size in zip(reversed(coords), in_sizes):  # ...reflatten in the input's
        flat = flat * size + coord
    return values, flat


@decomposition(aten.max_pool3d_with_indices.default)
def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    # torch-mlir lowers max_pool3d but not its indices: windows reduced one dim at a time.
    kernel = _expand(kernel_size, 3)
    stride = _expand(stride, 3) if stride else kernel
    padding, dilation = _expand(padding, 3), _expand(dilation, 3)
    in_sizes = list(x.shape[-3:])
    geometry = _pool_geometry(in_sizes, kernel, stride, padding, dilation, ceil_mode)
    windows = [_regular_windows(n, size, k, s, p, d) for n, (size, _), k, s, p, d
               in zip(in_sizes, geometry, kernel, stride, padding, dilation)]
    return _separable_max(x, windows)


@decomposition(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(x, output_size):
    return _separable_max(x, [_adaptive_windows(n, out) for n, out
                              in zip(x.shape[-3:], _expand(output_size, 3))])


@decomposition(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    # Unlowered. A box mean is the mean along each dim in turn (in float32 for narrower
    # floats, as eager accumulates).
    dims = 3
    compute = _computing_dtype(x.dtype)
    out = x.to(compute)
    for i, (n, size) in enumerate(zip(x.shape[-dims:], _expand(output_size, dims))):
        axis = x.dim() - dims + i
        pos, valid = _adaptive_windows(n, size)
        gathered, ok = _gather_windows(out, axis, pos, valid)
        out = torch.where(ok, gathered, 0).sum(axis + 1) / ok.sum(axis + 1)
    return out.to(x.dtype)


@decomposition(aten.max_pool3d_with_indices_backward.default,
               aten.adaptive_max_pool3d_backward.default)
def max_pool3d_backward(grad, x, *args):
    # Unlowered. Each output's gradient goes to the input position its index names,
    # summed where windows overlap.
    indices = args[-1]
    flat_grad = torch.zeros(list(x.shape[:-3]) + [x.shape[-3:].numel()], dtype=grad.dtype)
    flat_grad = flat_grad.scatter_add(-1, indices.flatten(-3), grad.flatten(-3))
    return flat_grad.reshape(x.shape)


@decomposition(aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool3d_backward(grad, x):
    # The forward's per-dim means, transposed: each window's gradient, over its length,
    # added back at the positions it read.
    dims = 3
    windows = [_adaptive_windows(n, size) for n, size in zip(x.shape[-dims:], grad.shape[-dims:])]
    per_dim = [valid.sum(1) for _, valid in windows]
    return _spread_back(grad, x.shape, windows, per_dim)


def _spread_back(grad, in_shape, windows: list, per_dim_divisors: list):
    """The adjoint of box means: each output's gradient, divided by its window's size (per
    spatial dim a vector over that dim's windows, or one number), added back at the input
    positions its window read (``windows``: (positions, valid) per dim), in float32 for the
    narrower floats as eager accumulates."""
    dims = len(windows)
    compute = _computing_dtype(grad.dtype)
    out = grad.to(compute)
    for i in reversed(range(dims)):
        axis = len(in_shape) - dims + i
        pos, valid = windows[i]
        divisor = per_dim_divisors[i]
        if isinstance(divisor, torch.Tensor):
            shape = [1] * out.dim()
            shape[axis] = pos.shape[0]
            divisor = divisor.reshape(shape)
        spread = (out / divisor).unsqueeze(axis + 1).expand(
            list(out.shape[:axis + 1]) + [pos.shape[1]] + list(out.shape[axis + 1:]))
        spread = torch.where(_window_mask(valid, spread.dim(), axis), spread, 0)
        target = list(out.shape)
        target[axis] = in_shape[axis]
        out = torch.zeros(target, dtype=compute).index_add(
            axis, pos.reshape(-1), spread.flatten(axis, axis + 1))
    return out.to(grad.dtype)


def _regular_windows(n: int, size: int, kernel: int, stride: int, padding: int,
                     dilation: int):
    """(positions, valid) of shape (size, kernel): the input positions each output's window
    reads along one dim; padding and ceil mode's overhang are invalid."""
    pos = torch.arange(size)[:, None] * stride - padding + torch.arange(kernel)[None, :] * dilation
    valid = (pos >= 0) & (pos < n)
    return pos.clamp(0, n - 1), valid


def _adaptive_windows(n: int, size: int):
    """Adaptive pooling's windows along one dim: output j reads [floor(j n / size),
    ceil((j + 1) n / size)), padded to the longest window with invalid positions."""
    # The longest window in Python (a shape); the windows themselves from arange, as traced
    # code must build its constants.
    length = max(-(-(j + 1) * n // size) - j * n // size for j in range(size))
    j = torch.arange(size)
    pos = ((j * n) // size)[:, None] + torch.arange(length)[None, :]
    valid = pos < (-((-(j + 1) * n) // size))[:, None]
    return pos.clamp(max=n - 1), valid


def _gather_windows(x, axis: int, pos, valid):
    """``x`` with dim ``axis`` replaced by (window, position in window), and ``valid`` shaped
    to broadcast against it."""
    gathered = x.index_select(axis, pos.reshape(-1))
    shape = list(x.shape)
    shape[axis:axis + 1] = list(pos.shape)
    return gathered.reshape(shape), _window_mask(valid, len(shape), axis)


def _window_mask(valid, rank: int, axis: int):
    """A (window, position) mask shaped to broadcast over a rank-``rank`` tensor whose dims
    ``axis`` and ``axis + 1`` are window and position."""
    shape = [1] * rank
    shape[axis:axis + 2] = list(valid.shape)
    return valid.reshape(shape)


def _separable_max(x, windows: list):
    """(max, flat input index) over box windows, one spatial dim at a time.

    Reducing the last dim first and keeping, per window, the first maximum keeps eager's choice
    among equal maxima: the first in its scan order (the lexicographically smallest position)
    and, where a window holds NaN, the last NaN (eager's test is ``val > max || isnan(val)``).
    """
    dims = len(windows)
    spatial = x.shape[-dims:]
    flat = torch.arange(spatial.numel()).reshape(spatial).expand(x.shape)
    low = float("-inf") if x.is_floating_point() else torch.iinfo(x.dtype).min
    values = x
    for i in reversed(range(dims)):  # the first dim reduced last decides first
        pos, valid = windows[i]
        axis = x.dim() - dims + i
        gathered, ok = _gather_windows(values, axis, pos, valid)
        flats, _ = _gather_windows(flat, axis, pos, valid)
        gathered = torch.where(ok, gathered, low)
        top = gathered.amax(axis + 1, keepdim=True)
        nan_window = torch.isnan(top)
        chosen = ok & ((gathered == top) | (torch.isnan(gathered) & nan_window))
        length = pos.shape[1]
        k = torch.arange(length).reshape([length if a == axis + 1 else 1
                                          for a in range(gathered.dim())])
        first = torch.where(chosen, k, length).amin(axis + 1, keepdim=True)
        last = torch.where(chosen, k, -1).amax(axis + 1, keepdim=True)
        pick = torch.where(nan_window, last, first)
        values = top.squeeze(axis + 1)
        flat = flats.gather(axis + 1, pick.expand_as(top)).squeeze(axis + 1)
    return values, flat


def _flat_pad(low, high) -> list:
    """constant_pad_nd's argument: (low, high) per spatial dim, last dim first."""
    flat = []
    for lo, hi in reversed(list(zip(low, high))):
        flat += [lo, hi]
    return flat


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
              dims, pool):
    # torch-mlir ignores divisor_override and gets ceil_mode's clipped last window wrong. A
    # sum over zero-padded windows, divided by the window sizes PyTorch uses: counted on a
    # ones mask (the padded region included or not), or the override.
    kernel = _expand(kernel_size, dims)
    stride = _expand(stride, dims) if stride else kernel
    padding = _expand(padding, dims)
    if not ceil_mode and divisor_override is None and (count_include_pad or not any(padding)):
        return NotImplemented
    in_sizes = list(x.shape[-dims:])
    extra = [e for _, e in _pool_geometry(in_sizes, kernel, stride, padding, [1] * dims,
                                          ceil_mode)]
    flat_pad = _flat_pad(padding, [p + e for p, e in zip(padding, extra)])
    window = 1
    for k in kernel:
        window *= k

    def window_sums(t):
        return pool(aten.constant_pad_nd(t, flat_pad, 0.0), kernel, stride, [0] * dims, False,
                    True, None) * window

    sums = window_sums(x)
    if divisor_override is not None:
        return sums / divisor_override
    ones = x.new_ones([1] * (x.dim() - dims) + in_sizes)
    if count_include_pad:  # the padding counts, the ceil-mode overhang does not
        ones = aten.constant_pad_nd(ones, _flat_pad(padding, padding), 1.0)
        ones = aten.constant_pad_nd(ones, _flat_pad([0] * dims, extra), 0.0)
        counts = pool(ones, kernel, stride, [0] * dims, False, True, None) * window
    else:
        counts = window_sums(ones)
    return sums / counts


@decomposition(aten.avg_pool2d.default)
def avg_pool2d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 2, aten.avg_pool2d.default)


@decomposition(aten.avg_pool3d.default)
def avg_pool3d(x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    return _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                     divisor_override, 3, aten.avg_pool3d.default)


def _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                       divisor_override, dims):
    # Unlowered (torch-mlir's avg_pool2d_backward fails for ceil_mode and count_include_pad
    # = False, its 3-D one always). Each output's gradient over the divisor eager used, added
    # back at the input positions its window read. Eager's divisor: the override; else the
    # window clipped to the padded input (count_include_pad) or to the input itself.
    kernel = _expand(kernel_size, dims)
    stride = _expand(stride, dims) if stride else kernel
    padding = _expand(padding, dims)
    windows, divisors = [], []
    for n, size, k, s, p in zip(x.shape[-dims:], grad.shape[-dims:], kernel, stride, padding):
        pos, valid = _regular_windows(n, size, k, s, p, 1)
        windows.append((pos, valid))
        if divisor_override:
            divisors.append(divisor_override if not divisors else 1)
        elif count_include_pad:
            start = torch.arange(size) * s - p
            divisors.append(torch.clamp(start + k, max=n + p) - start)
        else:
            divisors.append(valid.sum(1))
    return _spread_back(grad, x.shape, windows, divisors)


@decomposition(aten.avg_pool2d_backward.default)
def avg_pool2d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override, 2)


@decomposition(aten.avg_pool3d_backward.default)
def avg_pool3d_backward(grad, x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                        divisor_override):
    return _avg_pool_backward(grad, x, kernel_size, stride, padding, ceil_mode,
                              count_include_pad, divisor_override, 3)


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
            from .decompositions import _base_table
            base = _base_table().get(op)
            return base(x, *args, **kwargs) if base is not None else NotImplemented
        args = list(args)
        if len(args) >= dim_at:  # args exclude x, so "dim" sits at dim_at - 1
            dim = args[dim_at - 1]
            args[dim_at - 1] = [0] if isinstance(dim, (list, tuple)) else (None if dim is None else 0)
        elif "dim" in kwargs and kwargs["dim"] is not None:
            kwargs["dim"] = [0] if isinstance(kwargs["dim"], (list, tuple)) else 0
        out = op(x.reshape(1), *args, **kwargs)
        if isinstance(out, (tuple, list)):
            return tuple(o.reshape(()) for o in out)
        return out.reshape(())
    decompose.__name__ = f"{op.__name__.replace('.', '_')}_of_0d"
    return decompose


for _op in (aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.amin.default,
            aten.aminmax.default, aten.logsumexp.default, aten.var.correction,
            aten.std.correction, aten.var_mean.correction, aten.std_mean.correction,
            aten._softmax.default, aten._log_softmax.default, aten.prod.dim_int,
            aten.argmax.default, aten.argmin.default, aten.any.dim, aten.any.dims, aten.all.dim,
            aten.all.dims, aten.max.dim, aten.min.dim, aten.linalg_vector_norm.default):
    decomposition(_op)(_over_one_element(_op))


@decomposition(aten.roll.default)
def roll(x, shifts, dims=()):
    # torch-mlir's roll builds a concatenate of the wrong size for some shifts (|shift| > 1 on
    # a 3-d input). Two slices and a concatenate per rolled dim.
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    dims = [dims] if isinstance(dims, int) else list(dims)
    if not dims:
        return roll(x.flatten(), shifts, [0]).reshape(x.shape)
    out = x.clone()  # a roll by zero is still a new tensor
    for shift, dim in zip(shifts, dims):
        n = out.shape[dim]
        shift = shift % n if n else 0
        if shift:
            out = torch.cat([out.narrow(dim, n - shift, shift), out.narrow(dim, 0, n - shift)], dim)
    return out


@decomposition(aten.index_put.default)
def index_put(x, indices, values, accumulate=False):
    # torch-mlir leaves a torch.constant.int behind (x[idx] = v with a 1-d index). With integer
    # indices on the leading dims: one linear index into the flattened leading dims, then a
    # scatter (or scatter-add) of rows. Otherwise (None gaps, boolean masks) the op stays, its
    # negative indices wrapped first, as for index (backward of x[..., [-2], :]).
    if len(indices) == 1 and indices[0] is not None and indices[0].dtype == torch.bool:
        # x[mask] = v with v the same for every selected element (it broadcasts over the dims
        # the mask leaves): a select, no data-dependent shapes.
        mask = indices[0]
        rest = x.dim() - mask.dim()
        if values.dim() <= rest:
            mask = mask.view(list(mask.shape) + [1] * rest)
            values = values.to(x.dtype)
            if accumulate:
                return x + torch.where(mask, values, torch.zeros_like(x))
            return torch.where(mask, values, x)
    if any(i is None for i in indices) or any(i.dtype == torch.bool for i in indices):
        if getattr(_wrapping, "active", False):
            return NotImplemented
        _wrapping.active = True
        try:
            return aten.index_put.default(x, _wrap_negative(x, indices), values, accumulate)
        finally:
            _wrapping.active = False
    k = len(indices)
    lead, rest = list(x.shape[:k]), list(x.shape[k:])
    index = torch.broadcast_tensors(*indices)
    linear = torch.zeros(index[0].shape, dtype=torch.int64)
    for i, size in zip(index, lead):
        linear = linear * size + torch.where(i < 0, i + size, i)
    rows = linear.reshape(-1)
    count = 1
    for size in lead:
        count *= size
    flat = x.reshape([count] + rest)
    vals = values.to(x.dtype).expand(list(linear.shape) + rest).reshape([rows.shape[0]] + rest)
    where = rows.view([-1] + [1] * len(rest)).expand(vals.shape)
    if accumulate:
        flat = flat.scatter_add(0, where, vals)
    else:
        flat = flat.scatter(0, where, vals)
    return flat.reshape(x.shape)


# --- small gaps: each op a short formula of ops that lower ------------------------------------

@decomposition(aten.erfc.default)
def erfc(x):
    # No lowering. 1 - erf loses relative accuracy only where erfc < ~1e-7, far below the
    # absolute tolerance of an fp32 comparison.
    return 1 - torch.erf(x)


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


@decomposition(aten.unfold.default)
def unfold(x, dimension, size, step):
    # torch-mlir leaves a torch.constant.int behind. The windows as slices, stacked on dim
    # ``dimension``, their elements last, as eager lays them out.
    if x.dim() == 0:
        return x.reshape(1)
    dimension %= x.dim()
    count = (x.shape[dimension] - size) // step + 1
    windows = [x.narrow(dimension, i * step, size) for i in range(count)]
    return torch.stack(windows, dimension).movedim(dimension + 1, -1)


@decomposition(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None,
                 sorter=None):
    # No lowering. The insertion point is the count of sequence elements below the value
    # (at or below it, for right=True): one comparison per pair, fine at OpInfo's sizes.
    dtype = torch.int32 if out_int32 else torch.int64
    if sorted_sequence.numel() == 0 or values.numel() == 0:  # XLA aborts on an empty gather
        return torch.zeros(values.shape, dtype=dtype)
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    right = right or side == "right"
    seq = sorted_sequence.unsqueeze(-2) if sorted_sequence.dim() > 1 else sorted_sequence
    v = values.unsqueeze(-1)
    below = (seq <= v) if right else (seq < v)
    return below.sum(-1).to(dtype)


@decomposition(aten.view_copy.default)
def view_copy(x, size):
    return x.reshape(size).clone()


@decomposition(aten.unbind_copy.int)
def unbind_copy(x, dim=0):
    return [t.clone() for t in torch.unbind(x, dim)]


@decomposition(aten.narrow_copy.default)
def narrow_copy(x, dim, start, length):
    return x.narrow(dim, start, length).clone()


@decomposition(aten.permute_copy.default)
def permute_copy(x, dims):
    return x.permute(dims).clone()


@decomposition(aten.hypot.default)
def hypot(a, b):
    a, b = _promoted(a, b)
    return torch.sqrt(a * a + b * b)


@decomposition(aten.angle.default)
def angle(x):
    # Real inputs only (complex ones do not reach XLA from us): pi below zero, else 0; NaN stays.
    if x.is_complex():
        return NotImplemented
    x = x if x.is_floating_point() else x.to(torch.get_default_dtype())
    return torch.where(x < 0, torch.pi, 0.0).to(x.dtype) + x * 0


@decomposition(aten.dist.default)
def dist(a, b, p=2):
    return torch.linalg.vector_norm(a - b, p)


# --- transposed convolution as a forward one -------------------------------------------------

@decomposition(aten.convolution.default)
def transposed_convolution(x, weight, bias, stride, padding, dilation, transposed,
                           output_padding, groups):
    # torch-mlir fails on transposed convolutions (conv_transpose2d/3d). A transposed
    # convolution is a forward one over the input spread by the stride, padded by the kernel
    # extent less the padding, with the kernel flipped and its channel dims swapped.
    if not transposed:
        return NotImplemented
    from .decompositions import _interleave_zeros, _pad_spatial
    spatial = x.dim() - 2
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    output_padding = list(output_padding)
    kernel = list(weight.shape[2:])
    spread = x
    for i in range(spatial):
        spread = _interleave_zeros(spread, 2 + i, stride[i])
    extent = [dilation[i] * (kernel[i] - 1) for i in range(spatial)]
    spread = _pad_spatial(spread, [(extent[i] - padding[i],
                                    extent[i] - padding[i] + output_padding[i])
                                   for i in range(spatial)])
    in_ch, out_per_group = weight.shape[0], weight.shape[1]
    w = weight.reshape([groups, in_ch // groups, out_per_group] + kernel)
    w = w.transpose(1, 2).reshape([groups * out_per_group, in_ch // groups] + kernel)
    w = aten.flip(w, list(range(2, 2 + spatial)))
    return aten.convolution(spread, w, bias, [1] * spatial, [0] * spatial, dilation, False,
                            [0] * spatial, groups)


@decomposition(aten.native_batch_norm.default)
def native_batch_norm_eval(input, weight, bias, running_mean, running_var, training, momentum,
                           eps):
    # Inference: torch-mlir's lowering cast the statistics into the empty saved mean and rstd
    # and failed (the eager device meets native_batch_norm itself; traced models reach
    # _native_batch_norm_legit_no_training). Normalized by the running statistics, in float32
    # for reduced-precision inputs as the CPU kernel computes.
    if training or running_mean is None or running_var is None:
        return NotImplemented
    shape = [1, -1] + [1] * (input.dim() - 2)
    compute = _computing_dtype(input.dtype)
    rstd = torch.rsqrt(running_var.to(compute) + eps)
    out = (input.to(compute) - running_mean.to(compute).reshape(shape)) * rstd.reshape(shape)
    if weight is not None:
        out = out * weight.to(compute).reshape(shape)
    if bias is not None:
        out = out + bias.to(compute).reshape(shape)
    empty = input.new_zeros((0,))
    return out.to(input.dtype), empty, empty


@decomposition(aten._batch_norm_with_update_functional.default)
def batch_norm_with_update(input, weight, bias, running_mean, running_var, momentum, eps):
    # No lowering (its fake kernel types bf16 running stats f32, the CPU kernel bf16: see
    # program._RegionModule). The same computation as
    # _native_batch_norm_legit_functional in training mode, plus the empty reserve tensor.
    out, mean, rstd, new_mean, new_var = aten._native_batch_norm_legit_functional.default(
        input, weight, bias, running_mean, running_var, True, momentum, eps)
    reserve = input.new_zeros((0,), dtype=torch.uint8)
    return out, mean, rstd, reserve, new_mean, new_var



@decomposition(aten.index.Tensor)
def index(x, indices):
    # torch-mlir's gather does not wrap negative indices: x[..., [-2], :] (Falcon's fused QKV
    # split) read the wrong elements, silently. Wrap them, then index as usual; the flag lets
    # that inner call through to the op itself.
    if getattr(_wrapping, "active", False):
        return NotImplemented
    _wrapping.active = True
    try:
        return aten.index.Tensor(x, _wrap_negative(x, indices))
    finally:
        _wrapping.active = False


def _wrap_negative(x, indices) -> list:
    """Integer ``indices`` (of aten.index / index_put) with negative entries counted from
    the end of their dim; None gaps and boolean masks kept."""
    wrapped, dim = [], 0
    for i in indices:
        if i is not None and i.dtype in (torch.bool, torch.uint8):
            dim += i.dim()  # a mask spans as many dims as it has
        else:
            if i is not None:
                i = torch.where(i < 0, i + x.shape[dim], i)
            dim += 1
        wrapped.append(i)
    return wrapped


@decomposition(aten._weight_norm_interface_backward.default)
def weight_norm_backward(grad_w, saved_v, saved_g, saved_norms, dim):
    # No lowering (wav2vec2/HuBERT's convolutional position embedding trains through it).
    # With w = g * v / |v| (the norm over every dim but ``dim``; all of them for dim = -1):
    # dL/dg = sum(dL/dw * v) / |v|, dL/dv = g / |v| * (dL/dw - v * sum(dL/dw * v) / |v|^2).
    dims = [d for d in range(saved_v.dim()) if d != dim] if dim != -1 else \
        list(range(saved_v.dim()))
    per_dim = (grad_w * saved_v).sum(dims, keepdim=True).reshape(saved_norms.shape)
    norms = saved_norms
    grad_v = (saved_g / norms) * (grad_w - saved_v * (per_dim / (norms * norms)))
    grad_g = per_dim / norms
    return grad_v, grad_g.reshape(saved_g.shape)



# --- resampling ------------------------------------------------------------------------------
# Traced models reach these through the ``.vec`` overloads, which torch-mlir's table decomposes;
# the eager device meets the output-size overloads (``.vec`` is CompositeImplicit, resolved
# before dispatch), which do not lower. PyTorch's own decompositions (gathers and arithmetic) do.

def _torch_decomposition(op):
    from torch._decomp import decomposition_table
    return decomposition_table[op]


@decomposition(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(x, output_size, align_corners, *scales):
    return _torch_decomposition(aten.upsample_bilinear2d.default)(x, output_size, align_corners,
                                                                  *scales)


@decomposition(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, *scales):
    return _torch_decomposition(aten.upsample_bicubic2d.default)(x, output_size, align_corners,
                                                                 *scales)


@decomposition(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(x, output_size, align_corners, *scales):
    return _torch_decomposition(aten.upsample_trilinear3d.default)(x, output_size,
                                                                   align_corners, *scales)


def _nearest_sources(in_size: int, out_size: int, scale, exact: bool):
    """The input position each output position of nearest upsampling reads, as eager picks it
    (UpSample.h: float32 arithmetic; 1 / the given scale, else in / out)."""
    out = torch.arange(out_size)
    if out_size == in_size and not exact:  # whatever the scale says, as eager
        return out
    if out_size == 2 * in_size and not exact:
        return out // 2
    factor = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    position = out.to(torch.float32) + 0.5 if exact else out.to(torch.float32)
    # A Python float multiplies a float32 tensor in float32: eager's (float)(1.0 / scale).
    return torch.floor(position * factor).to(torch.int64).clamp(max=in_size - 1)


def _upsample_nearest_backward(exact: bool):
    def backward(grad, output_size, input_size, *scales):
        # Unlowered with scales (torch-mlir leaves a torch.constant.int); the eager device
        # meets these overloads in every nearest interpolation's backward. Each output's
        # gradient added to the input position it copied, one spatial dim at a time.
        dims = len(output_size)
        compute = _computing_dtype(grad.dtype)
        out = grad.to(compute)
        scales = list(scales) + [None] * (dims - len(scales))
        for i in range(dims):
            axis = grad.dim() - dims + i
            source = _nearest_sources(input_size[axis], output_size[i], scales[i], exact)
            target = list(out.shape)
            target[axis] = input_size[axis]
            out = torch.zeros(target, dtype=compute).index_add(axis, source, out)
        return out.to(grad.dtype)
    return backward


for _op in (aten.upsample_nearest1d_backward.default, aten.upsample_nearest2d_backward.default,
            aten.upsample_nearest3d_backward.default):
    decomposition(_op)(_upsample_nearest_backward(exact=False))
for _op in (aten._upsample_nearest_exact1d_backward.default,
            aten._upsample_nearest_exact2d_backward.default,
            aten._upsample_nearest_exact3d_backward.default):
    decomposition(_op)(_upsample_nearest_backward(exact=True))


def _grid_source(coord, size: int, padding_mode: int, align_corners: bool):
    """(source coordinate, d source / d coord) of a grid coordinate in [-1, 1] along a dim of
    ``size``, as eager's grid sampler computes them (borders count as outside for the
    gradient of clipping)."""
    if align_corners:
        src, grad = (coord + 1) / 2 * (size - 1), (size - 1) / 2
    else:
        src, grad = ((coord + 1) * size - 1) / 2, size / 2
    if padding_mode == 0:  # zeros
        return src, torch.full_like(src, grad)
    slope = torch.ones_like(src)
    if padding_mode == 2:  # reflection about the borders (or the pixel edges), then clipped
        low, span = (0.0, size - 1.0) if align_corners else (-0.5, float(size))
        if span <= 0:
            return torch.zeros_like(src), torch.zeros_like(src)
        shifted = src - low
        slope = torch.where(shifted < 0, -1.0, 1.0)
        shifted = shifted.abs()
        extra = torch.fmod(shifted, span)
        odd = torch.remainder(torch.floor(shifted / span), 2) == 1
        src = torch.where(odd, span - extra, extra) + low
        slope = torch.where(odd, -slope, slope)
    inside = (src > 0) & (src < size - 1)
    return src.clamp(0, size - 1), torch.where(inside, slope * grad, 0.0)


@decomposition(aten.grid_sampler_2d_backward.default)
def grid_sampler_2d_backward(grad, x, grid, interpolation_mode, padding_mode, align_corners,
                             output_mask):
    # Unlowered: each sample's gradient added back at the pixels it read, weighted as it read
    # them; the grid's, the sampled surface's slope (zero for nearest). Bicubic is not.
    if interpolation_mode not in (0, 1):
        return NotImplemented
    n, c, height, width = x.shape
    out_h, out_w = grid.shape[1:3]
    ix, gx = _grid_source(grid[..., 0], width, padding_mode, align_corners)
    iy, gy = _grid_source(grid[..., 1], height, padding_mode, align_corners)
    if interpolation_mode == 1:  # nearest: round half to even, as eager
        corners = [(torch.round(ix), torch.round(iy), torch.ones_like(ix), None, None)]
    else:  # (x, y, weight, d weight / d ix, d weight / d iy) of the four neighbours
        x0, y0 = ix.floor(), iy.floor()
        wx, wy = ix - x0, iy - y0
        corners = [(x0, y0, (1 - wx) * (1 - wy), wy - 1, wx - 1),
                   (x0 + 1, y0, wx * (1 - wy), 1 - wy, -wx),
                   (x0, y0 + 1, (1 - wx) * wy, -wy, 1 - wx),
                   (x0 + 1, y0 + 1, wx * wy, wy, wx)]
    flat_x = x.reshape(n, c, height * width)
    grad_x = torch.zeros_like(flat_x)
    slope_x = slope_y = torch.zeros_like(grad)
    for cx, cy, weight, dx, dy in corners:
        inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height)
        index = torch.where(inside, cy * width + cx, 0).to(torch.int64)
        index = index.reshape(n, 1, out_h * out_w).expand(n, c, out_h * out_w)
        weight = torch.where(inside, weight, 0).unsqueeze(1)
        grad_x = grad_x.scatter_add(2, index, (grad * weight).reshape(n, c, -1))
        if dx is not None:
            value = torch.where(inside.unsqueeze(1),
                                flat_x.gather(2, index).reshape(n, c, out_h, out_w), 0)
            slope_x = slope_x + value * dx.unsqueeze(1)
            slope_y = slope_y + value * dy.unsqueeze(1)
    grad_grid = torch.stack([(grad * slope_x).sum(1) * gx, (grad * slope_y).sum(1) * gy], -1)
    return (grad_x.reshape(x.shape) if output_mask[0] else None), grad_grid


# --- scatter reductions ----------------------------------------------------------------------

#: Largest (source elements x target elements) comparison a dense scatter_reduce may build.
_DENSE_SCATTER_LIMIT = 1 << 22


@decomposition(aten.scatter_reduce.two)
def scatter_reduce(self, dim, index, src, reduce, include_self=True):
    # torch-mlir leaves it unlowered. Each source element goes to a flat position of self; sum
    # and mean are accumulating scatters (index_put), which scale. amax, amin and prod have no
    # accumulating scatter to lower to: every source element is compared with every target
    # position, a dense (K x N) table bounded by _DENSE_SCATTER_LIMIT (beyond it: the host).
    if self.dtype == torch.bool:
        return NotImplemented
    if self.dim() == 0:  # a 0-dim self is one slot of a 1-element dim
        return scatter_reduce(self.reshape(1), 0, index.reshape(-1), src.reshape(-1), reduce,
                              include_self).reshape(())
    dim = dim % self.dim()
    src = src[tuple(slice(0, n) for n in index.shape)]  # src may be larger than index
    if index.numel() == 0:
        return self.clone()
    flat = _flat_positions(self.shape, dim, index)
    values = src.reshape(-1)
    n = self.numel()
    target = self.reshape(-1)
    count = torch.zeros(n, dtype=torch.int64).index_put((flat,), torch.ones_like(flat), True)
    hit = count > 0
    if reduce in ("sum", "mean"):
        total = torch.zeros_like(target).index_put((flat,), values, True)
        if include_self:
            total, count = total + target, count + 1
        if reduce == "mean":
            divisor = count.clamp(min=1).to(total.dtype)
            total = total / divisor if total.is_floating_point() else \
                torch.div(total, divisor, rounding_mode="floor")
        return torch.where(hit, total, target).reshape(self.shape)
    if flat.numel() * n > _DENSE_SCATTER_LIMIT:
        return NotImplemented
    mask = flat[:, None] == torch.arange(n)[None, :]
    column = values[:, None]
    if reduce == "prod":
        out = torch.where(mask, column, torch.ones_like(column)).prod(0)
        out = out * target if include_self else out
    else:
        info = torch.finfo if self.is_floating_point() else torch.iinfo
        fill = info(self.dtype).min if reduce == "amax" else info(self.dtype).max
        if self.is_floating_point():
            fill = float("-inf") if reduce == "amax" else float("inf")
        filled = torch.where(mask, column, torch.full_like(column, fill))
        out = filled.amax(0) if reduce == "amax" else filled.amin(0)
        if include_self:
            out = torch.maximum(out, target) if reduce == "amax" else torch.minimum(out, target)
    return torch.where(hit, out.to(self.dtype), target).reshape(self.shape)


_SEGMENT_SCATTER = {"sum": "sum", "mean": "sum", "max": "amax", "min": "amin", "prod": "prod"}


@decomposition(aten.segment_reduce.default)
def segment_reduce(data, reduce, *, lengths=None, indices=None, offsets=None, axis=0,
                   unsafe=False, initial=None):
    # Unlowered. Each position along ``axis`` belongs to the segment whose end is the first
    # past it; a scatter_reduce into the segments, then eager's values for empty segments
    # (sum 0, prod 1, mean NaN, max -inf, min inf) or ``initial``, which also joins every
    # segment's reduction.
    if indices is not None or reduce not in _SEGMENT_SCATTER:
        return NotImplemented
    axis = axis % data.dim()
    if lengths is None:
        count = offsets.narrow(-1, 1, offsets.shape[-1] - 1) - \
            offsets.narrow(-1, 0, offsets.shape[-1] - 1)
    else:
        count = lengths
    ends = torch.cumsum(count, -1)
    length, segments = data.shape[axis], count.shape[-1]
    segment = (ends.unsqueeze(-1) <= torch.arange(length)).sum(-2)     # lead + [length]
    trailing = [1] * (data.dim() - axis - 1)
    index = segment.reshape(list(segment.shape) + trailing).expand(data.shape)
    out_shape = list(data.shape[:axis]) + [segments] + list(data.shape[axis + 1:])
    out = data.new_zeros(out_shape).scatter_reduce(axis, index.clamp(max=segments - 1), data,
                                                   _SEGMENT_SCATTER[reduce], include_self=False)
    count = count.reshape(list(count.shape) + trailing)
    empty = count == 0
    if initial is not None:
        if reduce in ("sum", "mean"):
            out = out + initial
        elif reduce == "prod":
            out = out * initial
        else:
            limit = torch.full_like(out, initial)
            out = torch.maximum(out, limit) if reduce == "max" else torch.minimum(out, limit)
        if reduce == "mean":
            out = out / count.clamp(min=1)
        return torch.where(empty, torch.full_like(out, initial), out)
    if reduce == "mean":
        return out / count   # 0 / 0: NaN for an empty segment, as eager
    fill = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}[reduce]
    return torch.where(empty, torch.full_like(out, fill), out)


@decomposition(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_with_reduce(self, dim, index, src, reduce):
    # The older spelling of scatter_reduce ("add", "multiply"), also unlowered.
    if not isinstance(src, torch.Tensor):
        src = torch.full(index.shape, src, dtype=self.dtype)
    mode = {"add": "sum", "multiply": "prod"}.get(reduce)
    if mode is None:
        return NotImplemented
    return scatter_reduce(self, dim, index, src, mode, True)


@decomposition(aten.index_reduce.default)
def index_reduce(self, dim, index, source, reduce, include_self=True):
    # Unlowered; the same as scatter_reduce with ``index`` spread over ``source``'s other dims.
    if self.dim() == 0:  # a 0-dim self is one slot of a 1-element dim
        return index_reduce(self.reshape(1), 0, index.reshape(-1), source.reshape(-1), reduce,
                            include_self).reshape(())
    dim = dim % self.dim()
    view = [1] * source.dim()
    view[dim] = index.numel()
    spread = index.to(torch.int64).reshape(view).expand(source.shape)
    return scatter_reduce(self, dim, spread, source, reduce, include_self)


def _flat_positions(shape, dim: int, index):
    """The flat position in a contiguous tensor of ``shape`` of each element of ``index``
    (scatter semantics: ``index`` gives the coordinate along ``dim``, its own position the
    others)."""
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    flat = torch.zeros(index.shape, dtype=torch.int64)
    for d in range(len(shape)):
        if d == dim:
            coord = index.to(torch.int64)
        else:
            view = [1] * index.dim()
            view[d] = index.shape[d]
            coord = torch.arange(index.shape[d]).reshape(view)
        flat = flat + coord * strides[d]
    return flat.reshape(-1)


# --- gamma functions -------------------------------------------------------------------------
# torch-mlir lowers none of lgamma, digamma, polygamma; mvlgamma is written with lgamma.
# polygamma (digamma, then Hurwitz zeta) is in special_decompositions.py.

_LANCZOS_G = 7.0
_LANCZOS = (0.99999999999980993, 676.5203681218851, -1259.1392167224028, 771.32342877765313,
            -176.61502916214059, 12.507343278686905, -0.13857109526572012,
            9.9843695780195716e-6, 1.5056327351493116e-7)


def _gamma_input(x):
    """(x in its computing dtype, result dtype): integers give float32, as eager does;
    reduced-precision floats compute in float32 as the CPU kernels do."""
    result = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    compute = _computing_dtype(result)
    return x.to(compute), result


def _sin_pi(x):
    # sin(pi x) from the distance to the nearest integer: exact zeros, no loss for large x.
    return torch.sin(torch.pi * (x - torch.round(x)))


def _lgamma_positive(x):
    # Lanczos (g = 7, 9 terms) for x >= 0.5: relative error ~1e-15 in exact arithmetic.
    z = x - 1
    series = torch.full_like(z, _LANCZOS[0])
    for i, c in enumerate(_LANCZOS[1:], start=1):
        series = series + c / (z + i)
    t = z + _LANCZOS_G + 0.5
    return 0.5 * math.log(2 * math.pi) + (z + 0.5) * torch.log(t) - t + torch.log(series)


@decomposition(aten.lgamma.default)
def lgamma(x):
    x, result = _gamma_input(x)
    reflected = math.log(math.pi) - torch.log(torch.abs(_sin_pi(x))) - \
        _lgamma_positive(torch.where(x < 0.5, 1 - x, 1.0))
    out = torch.where(x < 0.5, reflected, _lgamma_positive(torch.where(x < 0.5, 1.0, x)))
    pole = (x <= 0) & (x == torch.floor(x))
    return torch.where(pole, float("inf"), out).to(result)


def _digamma_at_least_half(y):
    # Recurrence psi(y) = psi(y + 1) - 1/y up to y >= 6, then the asymptotic series.
    acc = torch.zeros_like(y)
    for _ in range(6):
        small = y < 6
        acc = acc - torch.where(small, 1 / y, 0.0)
        y = torch.where(small, y + 1, y)
    inv = 1 / (y * y)
    tail = inv * (1 / 12 - inv * (1 / 120 - inv * (1 / 252 - inv * (1 / 240 - inv * (1 / 132)))))
    return acc + torch.log(y) - 0.5 / y - tail


@decomposition(aten.digamma.default)
def digamma(x):
    x, result = _gamma_input(x)
    reflected = _digamma_at_least_half(torch.where(x < 0.5, 1 - x, 1.0)) - \
        torch.pi * torch.cos(torch.pi * (x - torch.round(x))) / _sin_pi(x)
    out = torch.where(x < 0.5, reflected, _digamma_at_least_half(torch.where(x < 0.5, 1.0, x)))
    # As eager: -inf at 0, nan at the negative integers.
    out = torch.where((x < 0) & (x == torch.floor(x)), float("nan"), out)
    return torch.where(x == 0, float("-inf"), out).to(result)


@decomposition(aten.take.default)
def take(x, index):
    # torch-mlir's take does not wrap negative indices (they count from the end in eager), and
    # indexing with ``index`` itself made tracing a 0-dim index on the eager device ask for a
    # data-dependent size. A flat index_select of any rank, negative indices wrapped.
    flat = index.reshape(-1)
    flat = torch.where(flat < 0, flat + x.numel(), flat)
    return x.reshape(-1).index_select(0, flat).reshape(index.shape)


@decomposition(aten.put.default)
def put(x, index, source, accumulate=False):
    # Unlowered; take's inverse: a flat index_put, negative indices counted from the end.
    flat = index.reshape(-1)
    flat = torch.where(flat < 0, flat + x.numel(), flat)
    return x.reshape(-1).index_put((flat,), source.reshape(-1), accumulate).reshape(x.shape)


# --- distances and histograms ----------------------------------------------------------------

@decomposition(aten._pdist_forward.default)
def pdist_forward(x, p=2.0):
    # Unlowered: the p-norms of all row differences, then the pairs i < j in eager's order
    # (row-major over the upper triangle). O(n^2 m) memory, as the output is O(n^2).
    n = x.shape[0]
    diff = (x[:, None, :] - x[None, :, :]).abs()
    if p == 0:
        full = (diff != 0).sum(-1).to(x.dtype)
    elif p == math.inf:
        full = diff.amax(-1)
    elif p == 1:
        full = diff.sum(-1)
    else:
        full = diff.pow(p).sum(-1).pow(1.0 / p)
    rows, cols = torch.triu_indices(n, n, 1)
    return full[rows, cols]


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
    # are equal, as eager). Eager refuses data with NaN or inf when no range is given; this
    # cannot stop a compiled program, and gives NaN edges and an empty histogram instead.
    if not x.dtype.is_floating_point:
        return NotImplemented
    if range is not None:
        low, high = (torch.full((), float(v), dtype=x.dtype) for v in range)
    elif x.numel() == 0:
        low = high = torch.zeros((), dtype=x.dtype)
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
