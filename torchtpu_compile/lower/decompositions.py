"""Decompositions applied while aot_autograd traces: torch-mlir's table plus our own.

Ours are registered one per op with ``@decomposition(op)`` and win over torch-mlir's. Checks
registered with ``@checked_first(op)`` see an op's arguments before whichever decomposition it
has (or none): the place for eager's argument errors and edge values (empty_reductions.py).
"""
from __future__ import annotations

import functools

import torch

aten = torch.ops.aten
_OURS: dict = {}
_CHECKS: dict = {}


def decomposition(*ops):
    """Register the decorated function as the decomposition of each op in ``ops``.

    An op is an ``OpOverload`` or, for a custom op that its library registers only when
    imported, its ``"namespace::name"`` (default overload), resolved when the table is built.

    Example::

        @decomposition(aten.silu.default)
        def silu(x):
            return x * torch.sigmoid(x)
    """
    def register(fn):
        for op in ops:
            _OURS[op] = fn
        return fn
    return register


def checked_first(*ops):
    """Register ``check(*args, **kwargs)`` to run before each op's decomposition.

    The check raises eager's error for inputs eager rejects, returns eager's result where the
    decomposition would compute another one, or returns None to decompose as usual. Shapes are
    static here (both paths trace with fake tensors), so it decides on the host.

    Example::

        @checked_first(aten.max.default)
        def max_of_nothing(x):
            if x.numel() == 0:
                raise invalid_input(RuntimeError, "max(): ...")
    """
    def register(fn):
        for op in ops:
            _CHECKS[op] = fn
        return fn
    return register


def _checked(check, decompose):
    def run(*args, **kwargs):
        result = check(*args, **kwargs)
        if result is not None:
            return result
        return NotImplemented if decompose is None else decompose(*args, **kwargs)
    run.__name__ = f"checked_{getattr(decompose, '__name__', 'op')}"
    return run


@functools.lru_cache(maxsize=None)
def _base_table() -> dict:
    from torch_mlir.extras.fx_decomp_util import get_decomposition_table
    return dict(get_decomposition_table())


def decomposition_table(ours: bool = True) -> dict:
    """The table given to aot_autograd: torch-mlir's, ours winning.

    With ``ours=False``, torch-mlir's without the ops we decompose: they stay whole, for
    ``numerics.locate`` to check each of our decompositions against eager's op.

    Example::

        table = decomposition_table()
        aten.topk.default in table, aten.topk.default in decomposition_table(ours=False)
        # True, False
    """
    mine = _our_table()
    if not ours:
        return {op: fn for op, fn in _base_table().items() if op not in mine}
    from . import empty_reductions  # noqa: F401  (registers its checks on import)
    from .index_checks import with_index_checks
    table = {**_base_table(), **mine}
    for op, check in _CHECKS.items():
        table[op] = _checked(check, table.get(op))
    # Last: indexing ops mark their indices, then decompose as above (index_checks.py).
    return with_index_checks(table)


def _our_table() -> dict:
    from . import foreach_decompositions  # noqa: F401  (registers itself on import)
    from . import op_decompositions  # noqa: F401  (registers itself on import)
    from . import jax_decompositions  # noqa: F401  (registers itself on import)
    from . import special_decompositions  # noqa: F401  (registers itself on import)
    table = {}
    for op, fn in _OURS.items():
        if isinstance(op, str):
            op = _custom_op(op)
            if op is None:  # its library is not loaded: nothing can call it
                continue
        table[op] = fn
    return table


def our_ops() -> frozenset:
    """The ops we decompose (``@decomposition``), those of libraries not loaded left out."""
    return frozenset(_our_table())


def _custom_op(qualified_name: str):
    namespace, name = qualified_name.split("::")
    try:
        return getattr(getattr(torch.ops, namespace), name).default
    except (AttributeError, RuntimeError):
        return None


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


@decomposition(aten.convolution_backward.default)
def convolution_backward(grad_out, input, weight, bias_sizes, stride, padding, dilation,
                         transposed, output_padding, groups, output_mask):
    # torch-mlir's own lowering fails for 1-D convolutions, for groups > 1, and when
    # (in + 2*pad - extent) % stride differs between spatial dims (STACK-NOTES). Both
    # gradients are forward convolutions, which lower in every case.
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
        spread = grad_out
        for i in range(spatial):
            spread = _interleave_zeros(spread, 2 + i, stride[i])
        extent = [dilation[i] * (kernel[i] - 1) for i in range(spatial)]
        spread = _pad_spatial(spread, [(extent[i] - padding[i], extent[i] - padding[i] + remainder[i])
                                       for i in range(spatial)])
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
    if output_mask[0]:
        grad_input = aten.convolution(grad_out, weight, None, stride, padding, dilation, False,
                                      [0] * spatial, groups)
    if output_mask[1]:
        _, grad_weight, _ = convolution_backward(input, grad_out, weight, None, stride, padding,
                                                 dilation, False, [0] * spatial, groups,
                                                 [False, True, False])
    if output_mask[2]:
        grad_bias = grad_out.sum([0] + list(range(2, 2 + spatial)))
    return grad_input, grad_weight, grad_bias


@decomposition(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_with_indices_backward(grad_out, input, kernel_size, stride, padding, dilation,
                                     ceil_mode, indices):
    # torch-mlir fails to legalize this op (a leftover torch.constant.int). The forward saved,
    # per output element, the flat index of its maximum inside each (H*W) plane: the gradient
    # is a scatter-add of grad_out to those positions (overlapping windows add up).
    plane = input.shape[-2] * input.shape[-1]
    lead = list(input.shape[:-2])
    grad = grad_out.new_zeros(lead + [plane])
    grad = grad.scatter_add(-1, indices.reshape(lead + [-1]), grad_out.reshape(lead + [-1]))
    return grad.reshape(input.shape)
