"""Pooling: ceil_mode, divisor_override and count_include_pad as explicit padding (torch-mlir gets
ceil mode's last window wrong and ignores the override), 3-D max pooling with indices and the
adaptive 3-D pools as reductions over windows one spatial dim at a time, and the backwards
torch-mlir does not lower as scatter-adds.

Example::

    table = decomposition_table()
    table[torch.ops.aten.avg_pool2d.default](x, [3, 3], [2, 2], [1, 1], True)   # ceil mode
"""
from __future__ import annotations

import torch

from .common import (as_itself, calling_itself, computing_dtype, has_symbolic_size,
                     torch_decomposition)
from .registry import decomposition

aten = torch.ops.aten


# --- windows ---------------------------------------------------------------------------------

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


def _flat_pad(low, high) -> list:
    """constant_pad_nd's argument: (low, high) per spatial dim, last dim first."""
    flat = []
    for lo, hi in reversed(list(zip(low, high))):
        flat += [lo, hi]
    return flat


def _regular_windows(n: int, size: int, kernel: int, stride: int, padding: int,
                     dilation: int):
    """(positions, valid) of shape (size, kernel): the input positions each output's window
    reads along one dim; padding and ceil mode's overhang are invalid."""
    pos = torch.arange(size)[:, None] * stride - padding + torch.arange(kernel)[None, :] * dilation
    valid = (pos >= 0) & (pos < n)
    return pos.clamp(0, n - 1), valid


def adaptive_windows(n, size: int, longest: int | None = None):
    """Adaptive pooling's windows along one dim of ``n`` elements: output j reads
    [floor(j n / size), ceil((j + 1) n / size)), as ``(positions, valid)`` of shape
    (size, longest), padded to the longest window with invalid positions. ``n`` may be a
    traced 0-d tensor (a bucket's real size) given ``longest``, the longest window at any
    size the program serves.

    Example::

        pos, valid = adaptive_windows(5, 2)      # windows [0, 3) and [2, 5)
    """
    # The longest window in Python (a shape); the windows themselves from arange, as traced
    # code must build its constants.
    if longest is None:
        longest = longest_adaptive_window(n, size)
    j = torch.arange(size)
    pos = ((j * n) // size)[:, None] + torch.arange(longest)[None, :]
    valid = pos < (-((-(j + 1) * n) // size))[:, None]
    return pos.clamp(max=n - 1), valid


def longest_adaptive_window(n: int, size: int) -> int:
    return max(-(-(j + 1) * n // size) - j * n // size for j in range(size))


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


# --- max pooling -----------------------------------------------------------------------------

@decomposition(aten.max_pool2d_with_indices.default)
def max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
    """XLA:CPU's vector max skips NaN in windows of large inputs (as in its reductions,
    reductions_scans._NAN_SKIPPED): a window holding NaN is NaN, at eager's index, the last
    NaN in the window's scan order (``val > max || isnan(val)``): the largest flat index of
    a NaN there, pooled as int32 codes ``index + 1``."""
    pool = aten.max_pool2d_with_indices.default
    if not x.is_floating_point() or calling_itself(pool):
        return _max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode)
    values, indices = as_itself(pool, x, kernel_size, stride, padding, dilation, ceil_mode)
    flat = torch.arange(_plane(x.shape[-2:]), dtype=torch.int32).reshape(x.shape[-2:])
    codes = torch.where(torch.isnan(x), flat + 1, 0)
    last_nan, _ = pool(codes, kernel_size, stride, padding, dilation, ceil_mode)
    in_nan_window = last_nan > 0
    return (torch.where(in_nan_window, float("nan"), values),
            torch.where(in_nan_window, (last_nan - 1).to(indices.dtype), indices))


def _max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode):
    # torch-mlir gets the last window of ceil_mode wrong. Pad on the right with -inf to the
    # floor-mode size; indices come back in the unpadded input's coordinates.
    dims, pool = 2, aten.max_pool2d_with_indices.default
    if x.dtype in (torch.uint8, torch.int8):
        # XLA's CPU backend crashed the process (SIGSEGV) on torch-mlir's 8-bit max pool: the
        # same values in int32.
        values, indices = pool(x.to(torch.int32), kernel_size, stride, padding, dilation,
                               ceil_mode)
        return values.to(x.dtype), indices
    if not ceil_mode:
        if stride:
            return NotImplemented
        # An empty stride (F.max_pool2d(x, k)'s default) is the kernel; torch-mlir takes 1.
        return pool(x, kernel_size, _expand(kernel_size, dims), padding, dilation, False)
    if has_symbolic_size(x):
        return NotImplemented
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
    return separable_max(x, windows)


def _adaptive(pool, x, output_size, dims: int):
    """``pool(x, windows)`` over adaptive windows of the last ``dims`` dims; at a symbolic
    size the op stays whole (its longest window is no shape there): a bucket pools it at the
    real size (buckets/spatial_rules.py), an exact-shape program once its sizes are static."""
    if has_symbolic_size(x):
        return NotImplemented
    return pool(x, [adaptive_windows(n, out) for n, out
                    in zip(x.shape[-dims:], _expand(output_size, dims))])


@decomposition(aten.adaptive_max_pool3d.default)
def adaptive_max_pool3d(x, output_size):
    return _adaptive(separable_max, x, output_size, 3)


@decomposition(aten.adaptive_max_pool2d.default)
def adaptive_max_pool2d(x, output_size):
    # PyTorch's reference (torch-mlir's table) handles only sizes that divide the input
    # ("condition must be true" otherwise: nn.AdaptiveMaxPool1d/2d ran in eager PyTorch).
    return _adaptive(separable_max, x, output_size, 2)


def _plane(sizes) -> int:
    # Size.numel() of symbolic sizes specialized them: a guard per image size, and a CNN
    # trained at a new size got a backward compiled for an earlier one (a shape error)
    plane = 1
    for size in sizes:
        plane = plane * size
    return plane


def _max_pool_backward(dims: int):
    def backward(grad, x, *args):
        # Unlowered (torch-mlir fails to legalize max_pool2d_with_indices_backward: a leftover
        # torch.constant.int). The forward saved, per output element, the flat index of its
        # maximum inside each plane of the last ``dims`` dims: each output's gradient goes to
        # that input position, summed where windows overlap.
        if has_symbolic_size(grad, x):
            return NotImplemented
        indices = args[-1]
        flat_grad = torch.zeros(list(x.shape[:-dims]) + [_plane(x.shape[-dims:])],
                                dtype=grad.dtype)
        flat_grad = flat_grad.scatter_add(-1, indices.flatten(-dims), grad.flatten(-dims))
        return flat_grad.reshape(x.shape)
    backward.__name__ = f"max_pool{dims}d_backward"
    return backward


max_pool3d_backward = decomposition(aten.max_pool3d_with_indices_backward.default,
                                    aten.adaptive_max_pool3d_backward.default)(
                                        _max_pool_backward(3))
max_pool2d_backward = decomposition(aten.max_pool2d_with_indices_backward.default,
                                    aten.adaptive_max_pool2d_backward.default)(
                                        _max_pool_backward(2))


def separable_max(x, windows: list):
    """(max, flat input index) over box windows, one spatial dim at a time (``windows``:
    ``adaptive_windows`` or the like, per pooled dim); the index is row-major over ``x``'s
    pooled dims.

    Example::

        values, indices = separable_max(x, [adaptive_windows(n, 7) for n in x.shape[-2:]])

    Reducing the last dim first and keeping, per window, the first maximum keeps eager's choice
    among equal maxima: the first in its scan order (the lexicographically smallest position)
    and, where a window holds NaN, the last NaN (eager's test is ``val > max || isnan(val)``).
    """
    dims = len(windows)
    spatial = x.shape[-dims:]
    flat = torch.arange(_plane(spatial)).reshape(spatial).expand(x.shape)
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


# --- average pooling -------------------------------------------------------------------------

def box_means(x, windows: list):
    """Adaptive average pooling over the last ``len(windows)`` dims of ``x`` (``windows``:
    ``adaptive_windows`` per dim): a box mean is the mean along each dim in turn, in float32
    for the narrower floats as eager accumulates.

    Example::

        box_means(x, [adaptive_windows(n, 7) for n in x.shape[-2:]])   # a 7x7 pool
    """
    dims = len(windows)
    out = x.to(computing_dtype(x.dtype))
    for i, (pos, valid) in enumerate(windows):
        axis = x.dim() - dims + i
        gathered, ok = _gather_windows(out, axis, pos, valid)
        out = torch.where(ok, gathered, 0).sum(axis + 1) / ok.sum(axis + 1)
    return out.to(x.dtype)


def box_means_backward(grad, in_shape, windows: list):
    """The gradient of ``box_means`` over an input of ``in_shape``: each window's gradient,
    over its length, added back at the positions it read; positions no window reads get 0.

    Example::

        box_means_backward(grad, x.shape, [adaptive_windows(n, 7) for n in x.shape[-2:]])
    """
    return _spread_back(grad, in_shape, windows, [valid.sum(1) for _, valid in windows])


@decomposition(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(x, output_size):
    # At a symbolic size the op stays whole: torch's decomposition gathers over the longest
    # window, a length that does not grow with the size, which no bucket can hold. A bucket
    # pools it at the real size (buckets/spatial_rules.py); an exact-shape program decomposes
    # it once its sizes are static, as torch does.
    if has_symbolic_size(x):
        return NotImplemented
    return torch_decomposition(aten._adaptive_avg_pool2d.default)(x, output_size)


@decomposition(aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool3d(x, output_size):
    return _adaptive(box_means, x, output_size, 3)  # unlowered


def _adaptive_avg_pool_backward(dims: int):
    def backward(grad, x):
        if has_symbolic_size(grad, x):
            return NotImplemented
        return box_means_backward(grad, x.shape, [
            adaptive_windows(n, size) for n, size in zip(x.shape[-dims:], grad.shape[-dims:])])
    backward.__name__ = f"adaptive_avg_pool{dims}d_backward"
    return backward


# 3-D: unlowered; 2-D: torch-mlir lowers only output sizes that divide the input's; the others
# (a 7x7 pool of a 10x10 map) ran on the host.
decomposition(aten._adaptive_avg_pool2d_backward.default)(_adaptive_avg_pool_backward(2))
decomposition(aten._adaptive_avg_pool3d_backward.default)(_adaptive_avg_pool_backward(3))


def _spread_back(grad, in_shape, windows: list, per_dim_divisors: list):
    """The adjoint of box means: each output's gradient, divided by its window's size (per
    spatial dim a vector over that dim's windows, or one number), added back at the input
    positions its window read (``windows``: (positions, valid) per dim), in float32 for the
    narrower floats as eager accumulates."""
    dims = len(windows)
    compute = computing_dtype(grad.dtype)
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


def _avg_pool(x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override,
              dims, pool):
    # torch-mlir ignores divisor_override and gets ceil_mode's clipped last window wrong. A
    # sum over zero-padded windows, divided by the window sizes PyTorch uses: counted on a
    # ones mask (the padded region included or not), or the override. Half-width floats sum
    # in float32, as eager's kernels (a window summed in bf16 rounds at every addition).
    if computing_dtype(x.dtype) != x.dtype:
        return pool(x.to(computing_dtype(x.dtype)), kernel_size, stride, padding, ceil_mode,
                    count_include_pad, divisor_override).to(x.dtype)
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

    def sums_of(padded):
        if not padded.is_floating_point():
            # Integers: exact sums (an average of integers truncates), one dim at a time.
            for i, (k, s) in enumerate(zip(kernel, stride)):
                padded = padded.unfold(padded.dim() - dims + i, k, s).sum(-1,
                                                                         dtype=padded.dtype)
            return padded
        return pool(padded, kernel, stride, [0] * dims, False, True, None) * window

    def window_sums(t):
        return sums_of(aten.constant_pad_nd(t, flat_pad, 0))

    def divided(sums, divisor):
        # Eager's integer kernels divide in integers, truncating: -30 / 4 is -7.
        if not x.is_floating_point():
            return torch.div(sums, divisor, rounding_mode="trunc").to(x.dtype)
        return sums / divisor

    sums = window_sums(x)
    if divisor_override is not None:
        return divided(sums, divisor_override)
    ones = x.new_ones([1] * (x.dim() - dims) + in_sizes)
    if count_include_pad:  # the padding counts, the ceil-mode overhang does not
        ones = aten.constant_pad_nd(ones, _flat_pad(padding, padding), 1.0)
        ones = aten.constant_pad_nd(ones, _flat_pad([0] * dims, extra), 0.0)
        counts = sums_of(ones)
    else:
        counts = window_sums(ones)
    return divided(sums, counts)


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
