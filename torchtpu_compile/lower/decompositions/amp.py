"""GradScaler's two ops, so that a scaled training step stays on the device: the inf/NaN check
with unscaling of the gradients, and the scale's update. No host round trip per step, as with
CUDA's kernels (whose semantics these follow).

Example::

    table = decomposition_table()
    grads, found_inf = table[torch.ops.aten._amp_foreach_non_finite_check_and_unscale.default](
        [g], torch.zeros(()), torch.tensor(0.5))
"""
from __future__ import annotations

import torch

from .registry import decomposition

aten = torch.ops.aten


@decomposition(aten._amp_foreach_non_finite_check_and_unscale.default)
def non_finite_check_and_unscale(grads, found_inf, inv_scale):
    # Every gradient is multiplied, found or not (GradScaler skips the step on found_inf).
    # The check reads the scaled values, as CUDA's kernel does.
    any_non_finite = found_inf != 0
    for grad in grads:
        any_non_finite = any_non_finite | ~torch.isfinite(grad).all()
    # In float32 and rounded once, as CUDA's kernel computes low-precision gradients.
    unscaled = [(grad.float() * inv_scale).to(grad.dtype) for grad in grads]
    return unscaled, torch.where(any_non_finite, 1.0, found_inf).to(found_inf.dtype)


@decomposition(aten._amp_update_scale.default)
def update_scale(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                 growth_interval):
    found = found_inf != 0
    successful = growth_tracker + 1
    grow = ~found & (successful == growth_interval)
    grown = scale * growth_factor
    # CUDA keeps the old scale when growing overflows to inf. XLA (CPU and TPU) flushes
    # subnormals to zero, so a scale above 1 / tiny (2**126 in float32) would have an inverse
    # of 0: every gradient unscaled to zero, found_inf never set, training silently stalled.
    # Such a scale is kept too; eager would grow to 2**127, with the same unscaled gradients.
    grown = torch.where(torch.isfinite(grown) & (grown <= 1 / torch.finfo(scale.dtype).tiny),
                        grown, scale)
    new_scale = torch.where(found, scale * backoff_factor, torch.where(grow, grown, scale))
    new_tracker = torch.where(found | grow, torch.zeros_like(growth_tracker), successful)
    return new_scale.to(scale.dtype), new_tracker.to(growth_tracker.dtype)
