"""The five batch-norm ops ``nn.SyncBatchNorm`` calls, for tpu tensors.

PyTorch has them for CUDA only (no CPU kernel) and lets third-party devices into
SyncBatchNorm, so a DDP script with ``convert_sync_batchnorm`` failed on the device with a
dispatcher error. Each is composed of device ops here, with CUDA's kernels' math: statistics
per channel (dim 1), in float32 for half and bfloat16 inputs, results in the input's dtype.

Example::

    mean, invstd = torch.batch_norm_stats(x, 1e-5)          # x on tpu: per-channel stats
    y = torch.batch_norm_elemt(x, weight, bias, mean, invstd, 1e-5)
"""
from __future__ import annotations

import torch


def _accumulating(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _per_channel(stat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``stat`` [C] shaped to broadcast along ``like``'s dim 1."""
    return stat.reshape([1, -1] + [1] * (like.dim() - 2))


def _other_dims(x: torch.Tensor) -> list:
    return [d for d in range(x.dim()) if d != 1]


def batch_norm_stats(input, eps):
    x = _accumulating(input)
    mean = x.mean(_other_dims(x))
    var = (x - _per_channel(mean, x)).square().mean(_other_dims(x))
    return mean, (var + eps).rsqrt()


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var,
                                        momentum, eps, counts):
    # Each rank's (count, mean, biased variance) merged; the running statistics are updated
    # in place, as CUDA's kernel does (its schema does not say so).
    counts = counts.to(mean.dtype).reshape(-1, 1)
    total = counts.sum()
    global_mean = (counts * mean).sum(0) / total
    variances = invstd.square().reciprocal() - eps
    var = (counts * (variances + (mean - global_mean).square())).sum(0) / total
    if running_mean is not None:
        running_mean.copy_(momentum * global_mean + (1 - momentum) * running_mean)
    if running_var is not None:
        unbiased = var * total / (total - 1)
        running_var.copy_(momentum * unbiased + (1 - momentum) * running_var)
    return global_mean, (var + eps).rsqrt()


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    x = _accumulating(input)
    out = (x - _per_channel(mean, x)) * _per_channel(invstd, x)
    if weight is not None:
        out = out * _per_channel(weight, x)
    if bias is not None:
        out = out + _per_channel(bias, x)
    return out.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g,
                               bias_g):
    dy, x = _accumulating(grad_out), _accumulating(input)
    sum_dy = dy.sum(_other_dims(dy))
    sum_dy_xmu = (dy * (x - _per_channel(mean, x))).sum(_other_dims(dy))
    grad_weight = (sum_dy_xmu * invstd).to(weight.dtype if weight is not None else x.dtype)
    grad_bias = sum_dy.to(weight.dtype if weight is not None else x.dtype)
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu,
                              count):
    dy, x = _accumulating(grad_out), _accumulating(input)
    total = count.sum().to(sum_dy.dtype)
    mean_dy, mean_dy_xmu = sum_dy / total, sum_dy_xmu / total
    scale = invstd if weight is None else invstd * weight.to(invstd.dtype)
    grad = (dy - _per_channel(mean_dy, dy)
            - (x - _per_channel(mean, x)) * _per_channel(invstd.square() * mean_dy_xmu, x))
    return (grad * _per_channel(scale, x)).to(grad_out.dtype)


KERNELS = {
    "batch_norm_stats": batch_norm_stats,
    "batch_norm_gather_stats_with_counts": batch_norm_gather_stats_with_counts,
    "batch_norm_elemt": batch_norm_elemt,
    "batch_norm_backward_reduce": batch_norm_backward_reduce,
    "batch_norm_backward_elemt": batch_norm_backward_elemt,
}
