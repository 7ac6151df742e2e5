"""Sorts and selections: stable sorts (sort(stable=True), topk, median, mode) as one sort of a
unique key, kthvalue with NaN as the largest value, searchsorted by counting.

Example::

    table = decomposition_table()
    table[torch.ops.aten.topk.default](torch.tensor([1.0, 2.0, 2.0]), 2)   # ([2, 2], [1, 2])
"""
from __future__ import annotations

import torch

from ...errors import invalid_input
from .registry import decomposition

aten = torch.ops.aten


# --- sorts -----------------------------------------------------------------------------------

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


# --- order statistics: k-th value, median, mode ----------------------------------------------

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


# --- binary search ---------------------------------------------------------------------------

@decomposition(aten.searchsorted.Tensor)
def searchsorted(sorted_sequence, values, *, out_int32=False, right=False, side=None,
                 sorter=None):
    dtype = torch.int32 if out_int32 else torch.int64
    n = sorted_sequence.shape[-1]
    if isinstance(n, torch.SymInt):
        # The search unrolls over log2 of the length: at a symbolic length that would
        # specialize it. Left whole, the graph compiles at its exact shape.
        return NotImplemented
    if n == 0 or values.numel() == 0:  # XLA aborts on an empty gather
        return torch.zeros(values.shape, dtype=dtype)
    if sorter is not None:
        sorted_sequence = sorted_sequence.gather(-1, sorter)
    return _binary_search(sorted_sequence, values, right or side == "right").to(dtype)


def _binary_search(sequence, values, right):
    """The CPU kernel's search (cus_lower_bound / cus_upper_bound), every value at once, with
    its comparisons: a step goes right unless ``sequence[mid] >= value`` (``>`` for
    ``right``). A count of the elements below each value agrees only without NaN: a NaN value
    goes right at every step (to the end) and a NaN in the sequence sends the search right
    wherever it meets one; counting put a NaN value at 0."""
    n = sequence.shape[-1]
    start = torch.zeros(values.shape, dtype=torch.int64)
    end = torch.full(values.shape, n, dtype=torch.int64)
    for _ in range(n.bit_length()):
        searching = start < end
        mid = start + (end - start) // 2
        at = mid.clamp(max=n - 1)
        # (a 0-d index would be read as a Python int: data-dependent)
        mid_value = sequence[at.reshape(-1)].reshape(at.shape) if sequence.dim() == 1 \
            else sequence.gather(-1, at)
        stops = mid_value > values if right else mid_value >= values
        start = torch.where(searching & ~stops, mid + 1, start)
        end = torch.where(searching & stops, mid, end)
    return start


@decomposition(aten.bucketize.Tensor)
def bucketize(values, boundaries, *, out_int32=False, right=False):
    # PyTorch's own decomposition returns the values' dtype for empty boundaries.
    if boundaries.dim() != 1:  # else searchsorted's batched search named a gather's shapes
        raise invalid_input(RuntimeError, f"boundaries tensor must be 1 dimension, but got "
                                          f"dim({boundaries.dim()})")
    return searchsorted(boundaries, values, out_int32=out_int32, right=right)
