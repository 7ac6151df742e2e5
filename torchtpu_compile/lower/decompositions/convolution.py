"""Convolutions torch-mlir fails on, written as forward convolutions, which lower in every case:
transposed convolutions (conv_transpose1d/2d/3d), and the gradients of every convolution (1-D,
grouped, strides that do not divide the input evenly, transposed).

Example::

    table = decomposition_table()
    table[torch.ops.aten.convolution.default](x, w, None, [2, 2], [0, 0], [1, 1], True,
                                              [0, 0], 1)   # conv_transpose2d(x, w, stride=2)
"""
from __future__ import annotations

import torch

from .common import has_symbolic_size
from .registry import decomposition

aten = torch.ops.aten


# --- spreading and padding -------------------------------------------------------------------

def _interleave_zeros(x, dim: int, stride: int):
    """Insert ``stride - 1`` zeros between elements along ``dim`` (the lhs dilation of XLA)."""
    if stride == 1:
        return x
    length = x.shape[dim]
    expanded = x.unsqueeze(dim + 1)
    zeros_shape = list(expanded.shape)
    zeros_shape[dim + 1] = stride - 1
    spread = torch.cat([expanded, expanded.new_zeros(zeros_shape)], dim=dim + 1)
    merged_shape = list(x.shape)
    merged_shape[dim] = length * stride
    return spread.reshape(merged_shape).narrow(dim, 0, (length - 1) * stride + 1)


def _pad_spatial(x, pads):
    """Pad (or, with negative amounts, trim) the trailing spatial dims; pads = [(lo, hi), ...]."""
    flat = []
    for lo, hi in reversed(pads):
        flat += [lo, hi]
    if not any(flat):
        return x
    return aten.constant_pad_nd(x, flat, 0.0)


def _spread_by_stride(x, stride, dilation, kernel, padding, tail):
    """``x`` with ``stride - 1`` zeros between its spatial elements, padded by the kernel
    extent less ``padding`` (plus ``tail`` at the end): a forward convolution over it is the
    transposed one (and the input gradient of a strided one)."""
    spatial = x.dim() - 2
    for i in range(spatial):
        x = _interleave_zeros(x, 2 + i, stride[i])
    extent = [dilation[i] * (kernel[i] - 1) for i in range(spatial)]
    return _pad_spatial(x, [(extent[i] - padding[i], extent[i] - padding[i] + tail[i])
                            for i in range(spatial)])


# --- transposed convolution as a forward one -------------------------------------------------

@decomposition(aten.convolution.default)
def transposed_convolution(x, weight, bias, stride, padding, dilation, transposed,
                           output_padding, groups):
    # torch-mlir fails on transposed convolutions (conv_transpose2d/3d). A transposed
    # convolution is a forward one over the input spread by the stride, padded by the kernel
    # extent less the padding, with the kernel flipped and its channel dims swapped.
    if not transposed or has_symbolic_size(x, weight):
        return NotImplemented
    spatial = x.dim() - 2
    stride, padding, dilation = list(stride), list(padding), list(dilation)
    output_padding = list(output_padding)
    kernel = list(weight.shape[2:])
    in_ch, out_per_group = weight.shape[0], weight.shape[1]
    sizes = [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (kernel[i] - 1)
             + output_padding[i] + 1 for i in range(spatial)]
    if 0 in sizes:
        # No output position (a padding that eats the whole output): eager returns the empty
        # result, where the forward convolution over the spread input refused a kernel larger
        # than it (fuzz seed 7152).
        return x.new_zeros([x.shape[0], groups * out_per_group] + sizes)
    spread = _spread_by_stride(x, stride, dilation, kernel, padding, output_padding)
    w = weight.reshape([groups, in_ch // groups, out_per_group] + kernel)
    w = w.transpose(1, 2).reshape([groups * out_per_group, in_ch // groups] + kernel)
    w = aten.flip(w, list(range(2, 2 + spatial)))
    return aten.convolution(spread, w, bias, [1] * spatial, [0] * spatial, dilation, False,
                            [0] * spatial, groups)


# --- gradients as forward convolutions -------------------------------------------------------

@decomposition(aten.convolution_backward.default)
def convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    # torch-mlir 20261001's own lowering fails for 1-D convolutions, for groups > 1, and when
    # (in + 2*pad - extent) % stride differs between spatial dims. Both gradients are forward
    # convolutions, which lower in every case.
    if has_symbolic_size(grad_out, input, weight):
        return NotImplemented
    if transposed:
        return _transposed_convolution_backward(grad_out, input, weight, stride, padding,
                                                dilation, groups, output_mask)
    spatial = input.dim() - 2
    # A one-element list applies to every spatial dim (SigLIP's padding="valid" gives [0]).
    stride, padding, dilation = (list(v) * spatial if len(v) == 1 else list(v)
                                 for v in (stride, padding, dilation))
    kernel = list(weight.shape[2:])
    out_sizes = list(grad_out.shape[2:])
    in_sizes = list(input.shape[2:])
    # Input positions past the last window never reach the output.
    remainder = [(in_sizes[i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1) % stride[i]
                 for i in range(spatial)]
    n, out_ch = grad_out.shape[0], grad_out.shape[1]
    in_ch = input.shape[1]
    in_per_group, out_per_group = in_ch // groups, out_ch // groups
    grad_input = grad_weight = grad_bias = None

    if output_mask[0]:
        spread = _spread_by_stride(grad_out, stride, dilation, kernel, padding, remainder)
        # (O, I/g, k...) -> (I, O/g, k...), flipped: the adjoint of the forward kernel.
        w = weight.reshape([groups, out_per_group, in_per_group] + kernel)
        w = w.transpose(1, 2).reshape([in_ch, out_per_group] + kernel)
        w = aten.flip(w, list(range(2, 2 + spatial)))
        grad_input = aten.convolution(spread, w, None, [1] * spatial, [0] * spatial, dilation,
                                      False, [0] * spatial, groups)

    if output_mask[1]:
        x = _pad_spatial(input, [(padding[i], padding[i] - remainder[i]) for i in range(spatial)])
        # Contract over the batch: input channels become the batch, the batch the channels.
        x = x.reshape([n, groups, in_per_group] + list(x.shape[2:]))
        x = x.permute([2, 1, 0] + list(range(3, 3 + spatial)))
        x = x.reshape([in_per_group, groups * n] + list(x.shape[3:]))
        g = grad_out.reshape([n, groups, out_per_group] + out_sizes)
        g = g.permute([1, 2, 0] + list(range(3, 3 + spatial)))
        g = g.reshape([groups * out_per_group, n] + out_sizes)
        gw = aten.convolution(x, g, None, dilation, [0] * spatial, stride, False,
                              [0] * spatial, groups)
        grad_weight = gw.transpose(0, 1)

    if output_mask[2]:
        grad_bias = grad_out.sum([0] + list(range(2, 2 + spatial)))
    return grad_input, grad_weight, grad_bias


def _transposed_convolution_backward(grad_out, input, weight, stride, padding, dilation, groups,
                                     output_mask):
    # y = conv_transpose(x, w) is the adjoint of z = conv(y, w): so dL/dx is that forward
    # convolution of dL/dy, and dL/dw is the weight gradient of conv(dL/dy, w) at output x.
    spatial = input.dim() - 2
    grad_input = grad_weight = grad_bias = None
    if 0 in grad_out.shape[2:]:  # no output position: nothing flows back (as the forward)
        return (input.new_zeros(input.shape) if output_mask[0] else None,
                weight.new_zeros(weight.shape) if output_mask[1] else None,
                grad_out.new_zeros([weight.shape[1] * groups]) if output_mask[2] else None)
    if output_mask[0]:
        grad_input = aten.convolution(grad_out, weight, None, stride, padding, dilation, False,
                                      [0] * spatial, groups)
        # An output_padding of a stride or more (allowed below the dilation) gives the forward
        # convolution positions past the input's end, which no input element made.
        for i in range(spatial):
            if grad_input.shape[2 + i] != input.shape[2 + i]:
                grad_input = grad_input.narrow(2 + i, 0, input.shape[2 + i])
    if output_mask[1]:
        _, grad_weight, _ = convolution_backward(input, grad_out, weight, None, stride, padding,
                                                 dilation, False, [0] * spatial, groups,
                                                 [False, True, False])
    if output_mask[2]:
        grad_bias = grad_out.sum([0] + list(range(2, 2 + spatial)))
    return grad_input, grad_weight, grad_bias
