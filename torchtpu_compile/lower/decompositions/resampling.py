"""Resampling: upsampling's output-size overloads (which the eager device meets) through PyTorch's
own decompositions, and the backwards of nearest, linear and bicubic upsampling and of the grid
sampler as scatter-adds; antialiased upsampling as gathers of eager's filter taps, its
backward as scatter-adds of the same taps.

Example::

    table = decomposition_table()
    table[torch.ops.aten.upsample_bilinear2d.default](x, [7, 9], False)
"""
from __future__ import annotations

import math
import struct

import torch

from .common import computing_dtype, torch_decomposition
from .registry import decomposition

aten = torch.ops.aten


# --- upsampling ------------------------------------------------------------------------------
# Traced models reach these through the ``.vec`` overloads, which torch-mlir's table decomposes;
# the eager device meets the output-size overloads (``.vec`` is CompositeImplicit, resolved
# before dispatch), which do not lower. PyTorch's own decompositions (gathers and arithmetic) do.


@decomposition(aten.upsample_bilinear2d.default)
def upsample_bilinear2d(x, output_size, align_corners, *scales):
    if x.dtype == torch.uint8:
        # Eager's uint8 kernel interpolates in fixed point, one axis at a time, rounding in
        # between: PyTorch's decomposition (float, both axes at once) was 1 off on a third of
        # the pixels. Not lowered: eager's kernel runs.
        return NotImplemented
    return torch_decomposition(aten.upsample_bilinear2d.default)(x, output_size, align_corners,
                                                                  *scales)


@decomposition(aten.upsample_bicubic2d.default)
def upsample_bicubic2d(x, output_size, align_corners, *scales):
    if x.dtype == torch.uint8:
        return NotImplemented   # eager's fixed-point kernel runs, as for bilinear
    return torch_decomposition(aten.upsample_bicubic2d.default)(x, output_size, align_corners,
                                                                 *scales)


@decomposition(aten.upsample_trilinear3d.default)
def upsample_trilinear3d(x, output_size, align_corners, *scales):
    return torch_decomposition(aten.upsample_trilinear3d.default)(x, output_size,
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


def _scatter_back(grad, output_size, input_size, scales, taps):
    """The backward of a separable upsampling: one spatial dim at a time, each output's
    gradient added to the input positions it read. ``taps(in_size, out_size, scale, dtype)``
    gives a dim's (sources, weight) pairs, a weight None or a tensor over the outputs in
    ``dtype`` (the one the gradient is summed in)."""
    dims = len(output_size)
    compute = computing_dtype(grad.dtype)
    out = grad.to(compute)
    scales = list(scales) + [None] * (dims - len(scales))
    for i in range(dims):
        axis = grad.dim() - dims + i
        target = list(out.shape)
        target[axis] = input_size[axis]
        shape = [1] * out.dim()
        shape[axis] = output_size[i]
        summed = torch.zeros(target, dtype=compute)
        for source, weight in taps(input_size[axis], output_size[i], scales[i], compute):
            summed = summed.index_add(
                axis, source, out if weight is None else out * weight.reshape(shape))
        out = summed
    return out.to(grad.dtype)


def _upsample_nearest_backward(exact: bool):
    def backward(grad, output_size, input_size, *scales):
        # Unlowered with scales (torch-mlir leaves a torch.constant.int); the eager device
        # meets these overloads in every nearest interpolation's backward.
        return _scatter_back(grad, output_size, input_size, scales,
                             lambda n_in, n_out, scale, dtype: [
                                 (_nearest_sources(n_in, n_out, scale, exact), None)])
    return backward


for _op in (aten.upsample_nearest1d_backward.default, aten.upsample_nearest2d_backward.default,
            aten.upsample_nearest3d_backward.default):
    decomposition(_op)(_upsample_nearest_backward(exact=False))
for _op in (aten._upsample_nearest_exact1d_backward.default,
            aten._upsample_nearest_exact2d_backward.default,
            aten._upsample_nearest_exact3d_backward.default):
    decomposition(_op)(_upsample_nearest_backward(exact=True))


# --- grid sampling ---------------------------------------------------------------------------

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


# --- backwards of linear upsampling ----------------------------------------------------------

def _source_positions(in_size: int, out_size: int, scale, align_corners: bool, dtype):
    """The real-valued input position each output position reads (UpSample.h's
    area_pixel_compute_source_index, in eager's opmath type: float64 for float64, else
    float32), before any clamping."""
    out = torch.arange(out_size).to(dtype)
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        return out * ratio  # a Python float: arithmetic in ``dtype``
    ratio = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    return (out + 0.5) * ratio - 0.5


def _linear_sources(in_size: int, out_size: int, scale, align_corners: bool, dtype):
    """(first source, second source, weight of the second) of each output position of linear
    upsampling along one dim, as eager computes them (UpSample.h: arithmetic in ``dtype``, the
    position clamped at 0 and the weight to [0, 1]; equal sizes copy)."""
    if out_size == in_size:
        out = torch.arange(out_size)
        return out, out, torch.zeros(out_size, dtype=dtype)
    position = _source_positions(in_size, out_size, scale, align_corners, dtype).clamp(min=0)
    first = torch.floor(position).to(torch.int64).clamp(max=in_size - 1)
    second = torch.where(first < in_size - 1, first + 1, first)
    return first, second, (position - first).clamp(0, 1)


def _linear_taps(in_size: int, out_size: int, scale, align_corners: bool, dtype):
    # the computing dtype is eager's opmath type: float64 weights for a float64 gradient
    # (float32 ones were 3e-7 off, fuzz seed 6086)
    first, second, weight = _linear_sources(in_size, out_size, scale, align_corners, dtype)
    return [(first, 1 - weight), (second, weight)]


def _upsample_linear_backward(grad, output_size, input_size, align_corners, *scales):
    # Unlowered (torch-mlir has no legalization for them); the eager device meets these
    # overloads in every linear, bilinear or trilinear interpolation's backward: each output's
    # gradient goes to its two sources with their weights.
    return _scatter_back(grad, output_size, input_size, scales,
                         lambda n_in, n_out, scale, dtype: _linear_taps(
                             n_in, n_out, scale, align_corners, dtype))


decomposition(aten.upsample_linear1d_backward.default, aten.upsample_bilinear2d_backward.default,
              aten.upsample_trilinear3d_backward.default)(_upsample_linear_backward)


# --- backward of bicubic upsampling ----------------------------------------------------------

_CUBIC_A = -0.75  # UpSample.h's cubic convolution coefficient


def _cubic_taps(in_size: int, out_size: int, scale, align_corners: bool, dtype):
    """The four (source, weight) taps of each output position of bicubic upsampling along one
    dim, as eager computes them (UpSample.h: the position unclamped, each source clamped into
    the input, weights in ``dtype``, eager's opmath type)."""
    position = _source_positions(in_size, out_size, scale, align_corners, dtype)
    first = torch.floor(position)
    t = position - first
    a = _CUBIC_A

    def near(x):  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    weights = [far(t + 1), near(t), near(1 - t), far(2 - t)]
    first = first.to(torch.int64)
    return [((first + k - 1).clamp(0, in_size - 1), weight) for k, weight in enumerate(weights)]


@decomposition(aten.upsample_bicubic2d_backward.default)
def upsample_bicubic2d_backward(grad, output_size, input_size, align_corners, *scales):
    # Unlowered; the eager device met it in every bicubic interpolation's backward (ViT-style
    # position embeddings resized to another image size): each output's gradient goes to its
    # sixteen sources, one dim at a time.
    return _scatter_back(grad, output_size, input_size, scales,
                         lambda n_in, n_out, scale, dtype: _cubic_taps(
                             n_in, n_out, scale, align_corners, dtype))


# --- antialiased bilinear and bicubic upsampling --------------------------------------------
# Unlowered (torch-mlir has no legalization): interpolate(antialias=True) ran on the host, on
# both paths. Separable: each output position along a dim is a normalized filter over
# a window of inputs, as eager's UpSampleKernel.cpp computes (_compute_weights_aa).

def _triangle(x):
    x = x.abs()
    return torch.where(x < 1, 1 - x, 0.0)


def _keys_cubic(x, a=-0.5):  # the antialiasing kernel's coefficient (Keys), not -0.75
    x = x.abs()
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    return torch.where(x < 1, near, torch.where(x < 2, far, 0.0))


def _aa_taps(interp_size: int, kernel):
    """taps(in_size, out_size, scale, align_corners, dtype): the (source, weight) pairs of
    each output position, ``max_interp_size`` of them, zero weight past its window."""
    def taps(in_size: int, out_size: int, scale, align_corners: bool, dtype):
        if align_corners:
            ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
        else:
            ratio = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
        if dtype != torch.float64:  # eager's opmath type: float32 but for float64
            ratio = struct.unpack("f", struct.pack("f", ratio))[0]
        support = interp_size * 0.5 * ratio if ratio >= 1.0 else interp_size * 0.5
        invscale = 1.0 / ratio if ratio >= 1.0 else 1.0
        center = (torch.arange(out_size).to(dtype) + 0.5) * ratio
        first = (center - support + 0.5).to(torch.int64).clamp(min=0)  # truncated, as eager
        size = (center + support + 0.5).to(torch.int64).clamp(max=in_size) - first
        count = int(math.ceil(support)) * 2 + 1
        weights = [torch.where(k < size, kernel((first + k - center + 0.5) * invscale), 0.0)
                   for k in range(count)]
        total = sum(weights[1:], weights[0])
        total = torch.where(total != 0, total, 1.0)
        return [((first + k).clamp(max=in_size - 1), (w / total).to(dtype))
                for k, w in enumerate(weights)]
    return taps


def _gather_forward(x, output_size, scales, taps):
    """A separable resampling forward: along each spatial dim, each output the weighted sum of
    the inputs ``taps`` names (in eager's order, first tap first)."""
    dims = len(output_size)
    compute = computing_dtype(x.dtype)
    out = x.to(compute)
    scales = list(scales) + [None] * (dims - len(scales))
    for i in range(dims):
        axis = x.dim() - dims + i
        shape = [1] * out.dim()
        shape[axis] = output_size[i]
        summed = None
        for source, weight in taps(out.shape[axis], output_size[i], scales[i], compute):
            term = out.index_select(axis, source) * weight.reshape(shape)
            summed = term if summed is None else summed + term
        out = summed
    return out.to(x.dtype)


def _antialiased(interp_size: int, kernel):
    taps = _aa_taps(interp_size, kernel)

    def forward(x, output_size, align_corners, *scales):
        if not x.is_floating_point():
            return NotImplemented  # uint8 images: eager rounds its own way
        return _gather_forward(x, output_size, scales, lambda n_in, n_out, scale, dtype: taps(
            n_in, n_out, scale, align_corners, dtype))
    return forward


def _antialiased_backward(interp_size: int, kernel):
    taps = _aa_taps(interp_size, kernel)

    def backward(grad, output_size, input_size, align_corners, *scales):
        # Each output's gradient goes back to its window of inputs with the forward's weights.
        # (Once wrong for 16 -> 8 rows with align_corners: XLA recomputed these taps' source
        # rows with an FMA; fx_passes.fold_literal_expressions now holds eager's.)
        return _scatter_back(grad, output_size, input_size, scales,
                             lambda n_in, n_out, scale, dtype: taps(
                                 n_in, n_out, scale, align_corners, dtype))
    return backward


decomposition(aten._upsample_bilinear2d_aa.default)(_antialiased(2, _triangle))
decomposition(aten._upsample_bicubic2d_aa.default)(_antialiased(4, _keys_cubic))
decomposition(aten._upsample_bilinear2d_aa_backward.default)(
    _antialiased_backward(2, _triangle))
decomposition(aten._upsample_bicubic2d_aa_backward.default)(
    _antialiased_backward(4, _keys_cubic))
