"""nn.SyncBatchNorm's batch-norm ops on tpu tensors (torchtpu_eager/sync_batch_norm.py): two
ranks' halves of a batch, through the ops as SyncBatchNorm calls them, against eager
``F.batch_norm`` of the whole batch on the CPU (forward, running statistics, gradients)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchtpu_eager  # noqa: F401  (registers the device; autoload does too)


def _synced_batch_norm(halves, weight, bias, running_mean, running_var, momentum, eps):
    """The forward of ``torch.nn.modules._functions.SyncBatchNorm`` over ``halves`` (one
    per rank), with the all-gather done by stacking."""
    stats = [torch.batch_norm_stats(h, eps) for h in halves]
    mean_all = torch.stack([m for m, _ in stats])
    invstd_all = torch.stack([s for _, s in stats])
    counts = torch.tensor([h.numel() // h.size(1) for h in halves], dtype=mean_all.dtype,
                          device=mean_all.device)
    mean, invstd = torch.batch_norm_gather_stats_with_counts(
        halves[0], mean_all, invstd_all, running_mean, running_var, momentum, eps, counts)
    outs = [torch.batch_norm_elemt(h, weight, bias, mean, invstd, eps) for h in halves]
    return outs, mean, invstd, counts.to(torch.int32)


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5, 2)], ids=["1d", "2d"])
def test_sync_batch_norm_ops_match_batch_norm_of_the_whole_batch(shape):
    # CUDA-only ops: a DDP script with convert_sync_batchnorm raised a dispatcher error on tpu.
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=torch.float64)
    weight, bias = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    grad = torch.randn(shape, dtype=torch.float64)
    eps, momentum = 1e-5, 0.1

    ref_x, ref_w, ref_b = (t.clone().requires_grad_() for t in (x, weight, bias))
    ref_mean, ref_var = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    ref = F.batch_norm(ref_x, ref_mean, ref_var, ref_w, ref_b, True, momentum, eps)
    ref.backward(grad)

    tpu = lambda t: t.to("tpu")  # noqa: E731
    halves = [tpu(h) for h in x.split([2, shape[0] - 2])]
    grads = [tpu(g) for g in grad.split([2, shape[0] - 2])]
    running_mean, running_var = tpu(torch.zeros(3, dtype=torch.float64)), tpu(
        torch.ones(3, dtype=torch.float64))
    outs, mean, invstd, counts = _synced_batch_norm(
        halves, tpu(weight), tpu(bias), running_mean, running_var, momentum, eps)
    torch.testing.assert_close(torch.cat([o.cpu() for o in outs]), ref.detach())
    torch.testing.assert_close(running_mean.cpu(), ref_mean)
    torch.testing.assert_close(running_var.cpu(), ref_var)

    # The backward: per-rank reductions, summed (the all-reduce), then each rank's elements.
    reduced = [torch.batch_norm_backward_reduce(g, h, mean, invstd, tpu(weight), True, True, True)
               for g, h in zip(grads, halves)]
    sum_dy = sum(r[0] for r in reduced)
    sum_dy_xmu = sum(r[1] for r in reduced)
    grad_input = torch.cat([torch.batch_norm_backward_elemt(
        g, h, mean, invstd, tpu(weight), sum_dy, sum_dy_xmu, counts).cpu()
        for g, h in zip(grads, halves)])
    torch.testing.assert_close(grad_input, ref_x.grad)
    torch.testing.assert_close(sum(r[2] for r in reduced).cpu(), ref_w.grad)
    torch.testing.assert_close(sum(r[3] for r in reduced).cpu(), ref_b.grad)


def test_sync_batch_norm_stats_of_bfloat16_are_float32():
    x = torch.randn(4, 3, 5).to(torch.bfloat16)
    mean, invstd = torch.batch_norm_stats(x.to("tpu"), 1e-5)
    assert mean.dtype == invstd.dtype == torch.float32
    torch.testing.assert_close(mean.cpu(), x.float().mean((0, 2)))
    torch.testing.assert_close(invstd.cpu(), (x.float().var((0, 2), unbiased=False) + 1e-5).rsqrt())
