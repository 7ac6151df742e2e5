"""Padding rules for images of many sizes: convolutions and pooling over padded spatial dims.

A convolution reads, past the real end of a spatial dim, its own zero padding; a bucket's
padding lies there instead. Filled with zeros (max pooling: with the lowest value, as its own
padding reads), the padding is what eager's kernel reads, and every real output position, a
prefix of the padded output, gets eager's value. The output's real size is the node's
symbolic size, the same formula at the bucket's size. A convolution contracts its channels,
so a padded channel dim stays refused there; pooling keeps each channel (and each sample) apart,
so a padded batch or channel dim passes through it.

Gradients: with the padding of both the incoming gradient and the input zero, the padded
positions add nothing to the weight's gradient, and each real input position gathers the
gradients of the real outputs only.

Example::

    model = torch.compile(resnet, backend="torchtpu")
    torch._dynamo.mark_dynamic(images, 2); torch._dynamo.mark_dynamic(images, 3)
    model(images)      # one program per bucket of (height, width), not per image size
"""
from __future__ import annotations

import torch

from .layout import NotPaddable, evaluate, is_symbolic, prefix, sym_expr
from ..lower.decompositions.pooling import (adaptive_windows, box_means, box_means_backward,
                                           longest_adaptive_window, separable_max)
from .rules import Padded, _prefix_dim, lowest, out_shape, padding_rule, reradix

aten = torch.ops.aten


def _spatial(x: Padded, what: str, pooled: int | None = None) -> list:
    """The padded dims among ``x``'s last ``pooled`` (its spatial dims), the dims before them
    kept apart; a convolution's (``pooled`` None: (N, C, *spatial)) padded channel dim is
    refused, as the convolution contracts it."""
    if pooled is None:
        if x.layout[1] is not None:
            raise NotPaddable(f"{what} over a padded channel dim")
        pooled = len(x.layout) - 2
    padded = [d for d in range(len(x.layout) - pooled, len(x.layout))
              if x.layout[d] is not None]
    for d in padded:
        _prefix_dim(x, d, what)
    return padded


def _output_layout(ctx, node, x: Padded, result, pooled: int, out_index=None) -> tuple:
    """The layout of the dims before the last ``pooled`` as ``x``'s (a convolution's output
    channels: not padded, as it refuses padded input channels), a prefix of the node's
    symbolic size per padded spatial dim."""
    shape = out_shape(node) if out_index is None else _symbolic_shape(
        node.meta["val"][out_index])
    first = len(x.layout) - pooled
    layout = list(x.layout[:first])
    for d in range(first, len(x.layout)):
        if x.layout[d] is None:
            layout.append(None)
            continue
        expr = shape[d]
        if not is_symbolic(expr) or evaluate(expr, ctx.pad_env) != result.shape[d]:
            raise NotPaddable(f"{node.target}'s output size {expr} is not its padded size")
        layout.append(prefix(expr))
    return tuple(layout)


def _symbolic_shape(val) -> list:
    return [sym_expr(s) for s in val.shape]


def _zero_padded(ctx, x: Padded):
    return ctx.fill(x, 0) if x.padded else x.tensor


@padding_rule(aten.convolution.default)
def convolution(ctx, node, x, weight, bias, *args):
    if any(d is not None for d in weight.layout):
        raise NotPaddable("a convolution with a padded weight")
    spatial = _spatial(x, "a convolution")
    tensor = ctx.fill(x, 0, spatial) if spatial else x.tensor
    result = aten.convolution.default(tensor, weight.tensor,
                                      None if bias is None else bias.tensor, *args)
    return Padded(result, _output_layout(ctx, node, x, result, len(x.layout) - 2))


@padding_rule(aten.convolution_backward.default)
def convolution_backward(ctx, node, grad, x, weight, *args):
    if any(d is not None for d in weight.layout):
        raise NotPaddable("a convolution with a padded weight")
    _spatial(x, "a convolution's gradient")
    _spatial(grad, "a convolution's gradient")
    grad_input, grad_weight, grad_bias = aten.convolution_backward.default(
        _zero_padded(ctx, grad), _zero_padded(ctx, x), weight.tensor, *args)
    return [None if grad_input is None else Padded(grad_input, x.layout),
            None if grad_weight is None else Padded(grad_weight, (None,) * grad_weight.dim()),
            None if grad_bias is None else Padded(grad_bias, (None,) * grad_bias.dim())]


def _flat_positions(ctx, node_x, x: Padded, index, dims: list, to_real: bool):
    """Positions flattened over ``x``'s ``dims`` (max pooling's indices, row-major over the
    pooled dims), from the bucket's padded plane to the real one (``to_real``) or back."""
    shape = _symbolic_shape(node_x.meta["val"])
    real = [ctx.real_size(x, d, shape[d]) for d in dims]
    padded = [x.tensor.shape[d] for d in dims]
    return reradix(index, padded, real) if to_real else reradix(index, real, padded)


_POOLS_3D = {aten.max_pool3d_with_indices.default, aten.max_pool3d_with_indices_backward.default,
             aten.avg_pool3d.default, aten.avg_pool3d_backward.default,
             aten._adaptive_avg_pool3d.default, aten._adaptive_avg_pool3d_backward.default,
             aten.adaptive_max_pool3d.default, aten.adaptive_max_pool3d_backward.default}


def _pooled(node) -> int:
    """How many trailing dims a pooling op pools (its kernel size may be one int for all)."""
    return 3 if node.target in _POOLS_3D else 2


def _pooled_dims(x: Padded, pooled: int) -> list:
    return list(range(len(x.layout) - pooled, len(x.layout)))


@padding_rule(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def max_pool_with_indices(ctx, node, x, kernel_size, *args):
    # Eager pads a window with the lowest value; the indices count real positions.
    pooled = _pooled(node)
    spatial = _spatial(x, "max pooling", pooled)
    tensor = ctx.fill(x, lowest(x.tensor.dtype), spatial) if spatial else x.tensor
    out, indices = node.target(tensor, kernel_size, *args)
    layout = _output_layout(ctx, node, x, out, pooled, out_index=0)
    if spatial:
        indices = _flat_positions(ctx, node.args[0], x, indices, _pooled_dims(x, pooled),
                                  to_real=True)
    return [Padded(out, layout), Padded(indices, layout)]


@padding_rule(aten.max_pool2d_with_indices_backward.default,
              aten.max_pool3d_with_indices_backward.default)
def max_pool_with_indices_backward(ctx, node, grad, x, kernel_size, *args):
    *rest, indices = args
    pooled = _pooled(node)
    spatial = _spatial(x, "max pooling's gradient", pooled)
    # padded outputs add nothing, and go to position 0 of their plane
    positions = _flat_positions(ctx, node.args[1], x, ctx.fill(indices, 0),
                                _pooled_dims(x, pooled), to_real=False) \
        if spatial else indices.tensor
    result = node.target(_zero_padded(ctx, grad), x.tensor, kernel_size, *rest, positions)
    return Padded(result, x.layout)


def _average_pooling_exact(x: Padded, pooled: int, padding, ceil_mode, count_include_pad,
                           what: str) -> list:
    """The padded spatial dims of an average pooling whose divisor is the window's area for
    every real output: without ceil mode a real output's window ends within the real input
    and eager's own padding, which the bucket's zero padding stands in for. Ceil mode's last
    window, and padding not counted, divide by a count that the bucket's size would change."""
    spatial = _spatial(x, what, pooled)
    padding = [padding] if isinstance(padding, int) else list(padding)
    if spatial and (ceil_mode or (not count_include_pad and any(padding))):
        raise NotPaddable(f"{what} whose divisor counts real positions (ceil mode, or "
                          f"padding not counted)")
    return spatial


@padding_rule(aten.avg_pool2d.default, aten.avg_pool3d.default)
def avg_pool(ctx, node, x, kernel_size, stride=(), padding=0, ceil_mode=False,
             count_include_pad=True, divisor_override=None):
    pooled = _pooled(node)
    spatial = _average_pooling_exact(x, pooled, padding, ceil_mode, count_include_pad,
                                     "average pooling")
    result = node.target(_zero_padded(ctx, x) if spatial else x.tensor, kernel_size, stride,
                         padding, ceil_mode, count_include_pad, divisor_override)
    return Padded(result, _output_layout(ctx, node, x, result, pooled))


@padding_rule(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def avg_pool_backward(ctx, node, grad, x, kernel_size, stride, padding, ceil_mode,
                      count_include_pad, divisor_override=None):
    # padded outputs add nothing to the real inputs' gradients
    spatial = _average_pooling_exact(x, _pooled(node), padding, ceil_mode, count_include_pad,
                                     "average pooling's gradient")
    result = node.target(_zero_padded(ctx, grad) if spatial else grad.tensor, x.tensor,
                         kernel_size, stride, padding, ceil_mode, count_include_pad,
                         divisor_override)
    return Padded(result, x.layout)


def _adaptive_windows(ctx, node_x, x: Padded, output_size) -> list:
    """Adaptive pooling's windows (``adaptive_windows``) over each pooled dim of ``x`` at its
    real size: a padded dim's windows are traced from its real size, as long as its longest
    window at any real size up to the bucket; padded positions lie in none."""
    if any(not isinstance(out, int) for out in output_size):
        # an output as long as its dynamic input (``(2, None)``): windows the bucket resizes
        raise NotPaddable("adaptive pooling to a dynamic output size")
    shape = _symbolic_shape(node_x.meta["val"])
    windows = []
    for d, out in zip(_pooled_dims(x, len(output_size)), output_size):
        if x.layout[d] is None:
            windows.append(adaptive_windows(x.tensor.shape[d], out))
            continue
        longest = max(longest_adaptive_window(n, out) for n in range(1, x.tensor.shape[d] + 1))
        windows.append(adaptive_windows(ctx.real_size(x, d, shape[d]), out, longest))
    return windows


@padding_rule(aten._adaptive_avg_pool2d.default, aten._adaptive_avg_pool3d.default)
def adaptive_avg_pool(ctx, node, x, output_size):
    # Each output is the mean of its window at the real size (the op's decomposition, with
    # windows from the real size): padded positions lie in no window.
    pooled = _pooled(node)
    if not _spatial(x, "adaptive average pooling", pooled):
        return Padded(node.target(x.tensor, output_size), _pooled_to_static(x, pooled))
    result = box_means(x.tensor, _adaptive_windows(ctx, node.args[0], x, output_size))
    return Padded(result, _pooled_to_static(x, pooled))


@padding_rule(aten._adaptive_avg_pool2d_backward.default,
              aten._adaptive_avg_pool3d_backward.default)
def adaptive_avg_pool_backward(ctx, node, grad, x):
    # Each output's gradient, over its window's length, goes to the real positions of its
    # window; the padding gets none.
    pooled = _pooled(node)
    if not _spatial(x, "adaptive average pooling's gradient", pooled):
        return Padded(node.target(grad.tensor, x.tensor), x.layout)
    windows = _adaptive_windows(ctx, node.args[1], x, _static_output(grad, pooled))
    return Padded(box_means_backward(grad.tensor, x.tensor.shape, windows), x.layout)


@padding_rule(aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default)
def adaptive_max_pool(ctx, node, x, output_size):
    # The largest real element of each window at the real size; the indices count real
    # positions of the plane, as eager's.
    pooled = _pooled(node)
    layout = _pooled_to_static(x, pooled)
    if not _spatial(x, "adaptive max pooling", pooled):
        values, indices = node.target(x.tensor, output_size)
        return [Padded(values, layout), Padded(indices, layout)]
    values, indices = separable_max(x.tensor,
                                    _adaptive_windows(ctx, node.args[0], x, output_size))
    indices = _flat_positions(ctx, node.args[0], x, indices, _pooled_dims(x, pooled),
                              to_real=True)
    return [Padded(values, layout), Padded(indices, layout)]


@padding_rule(aten.adaptive_max_pool2d_backward.default,
              aten.adaptive_max_pool3d_backward.default)
def adaptive_max_pool_backward(ctx, node, grad, x, indices):
    # Each output's gradient to its maximum's position in the padded plane.
    pooled = _pooled(node)
    if not _spatial(x, "adaptive max pooling's gradient", pooled):
        return Padded(node.target(grad.tensor, x.tensor, indices.tensor), x.layout)
    _static_output(grad, pooled)
    positions = _flat_positions(ctx, node.args[1], x, ctx.fill(indices, 0),
                                _pooled_dims(x, pooled), to_real=False)
    return Padded(node.target(_zero_padded(ctx, grad), x.tensor, positions), x.layout)


def _pooled_to_static(x: Padded, pooled: int) -> tuple:
    """An adaptive pool's output layout: its batch and channel dims as the input's, its
    ``pooled`` dims static."""
    return tuple(x.layout[:len(x.layout) - pooled]) + (None,) * pooled


def _static_output(grad: Padded, pooled: int) -> list:
    """An adaptive pool's output sizes from its gradient: its ``pooled`` dims must not be
    padded (an output as long as its dynamic input, ``(2, None)``, is refused as in the
    forward)."""
    if any(d is not None for d in grad.layout[-pooled:]):
        raise NotPaddable("adaptive pooling to a dynamic output size")
    return list(grad.tensor.shape[-pooled:])
