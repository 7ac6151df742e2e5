"""Normalization layers torch-mlir fails on: batch norm in inference and with the update of its
running statistics, and weight norm's backward; and layer and group norm with their moments in
float32 (torch-mlir computes torch.var_mean of float32 in float64).

Example::

    table = decomposition_table()
    table[torch.ops.aten.native_batch_norm.default](x, w, b, mean, var, False, 0.1, 1e-5)
"""
from __future__ import annotations

import torch

from .common import computing_dtype
from .registry import decomposition

aten = torch.ops.aten


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
    compute = computing_dtype(input.dtype)
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


def _moments(x, dims: list):
    """(mean, deviations from it, biased variance) of ``x`` over ``dims``, kept, in ``x``'s
    own dtype: the mean, then the mean of the squared deviations (two passes, no
    cancellation)."""
    mean = x.mean(dims, keepdim=True)
    centered = x - mean
    return mean, centered, (centered * centered).mean(dims, keepdim=True)


@decomposition(aten.native_layer_norm.default)
def native_layer_norm(input, normalized_shape, weight, bias, eps):
    # torch's decomposition takes torch.var_mean, which torch-mlir computes in float64 for a
    # float32 input: every layer norm of a transformer was float64 arithmetic (half the SIMD
    # width on CPU; TPUs have no float64 units). Eager's CPU kernel computes float32 moments
    # in float32 (float32 for the half-width floats too); so does this. Its output is
    # contiguous whatever the input's layout (a permuted input's result must take .view).
    compute = computing_dtype(input.dtype)
    x = input.to(compute).contiguous()
    dims = list(range(input.dim() - len(normalized_shape), input.dim()))
    mean, centered, var = _moments(x, dims)
    rstd = torch.rsqrt(var + eps)
    out = centered * rstd
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return out.to(input.dtype), mean.to(input.dtype), rstd.to(input.dtype)


@decomposition(aten.native_group_norm.default)
def native_group_norm(input, weight, bias, batch_size, num_channels, inner, groups, eps):
    # As layer norm's (torch's decomposition takes torch.var_mean, float64 under torch-mlir),
    # with torch's arithmetic otherwise: given a weight, one scale and shift per sample and
    # channel, as eager's CPU kernel applies them.
    compute = computing_dtype(input.dtype)
    x = input.to(compute)
    in_group = [1, groups, num_channels // groups, 1]  # a weight or bias, grouped
    per_channel = [batch_size, num_channels] + [1] * (input.dim() - 2)
    mean, centered, var = _moments(x.reshape(batch_size, groups, num_channels // groups, inner),
                                   [2, 3])
    rstd = torch.rsqrt(var + eps)
    if weight is not None:
        scale = rstd * weight.reshape(in_group)
        shift = -mean * scale
        if bias is not None:
            shift = shift + bias.reshape(in_group)
        out = x * scale.reshape(per_channel) + shift.reshape(per_channel)
    else:
        out = (centered * rstd).reshape(input.shape)
        if bias is not None:
            out = out + bias.reshape([1] + per_channel[1:])
    return out.to(input.dtype), mean.reshape(batch_size, groups).to(input.dtype), \
        rstd.reshape(batch_size, groups).to(input.dtype)
