"""A bucketed graph's inputs written in place (a static KV cache) take their new values
straight from the padded results.

aot_autograd returns the new value of each input a graph overwrites as an output and copies it
into the input after the call. Cut back from a bucket, that value was first copied out of the
padded result (contiguous, at the real size) and then copied again into the input: two copies
of the whole cache per decode step. Here the real region of the padded result is copied into
the input once, and the input itself is handed back as its new value, so aot_autograd's copy
is a no-op (``Tensor.copy_`` of a tensor into itself), as the unbucketed static cache does
(``program/donation.host_adoptions``).

Only where the copy is the one aot_autograd would make: a plain host tensor, not requiring
grad, contiguous, of the result's dtype and real shape; else the value is cut back as before.

Example::

    plans = write_plans(outputs_plan, ((3, 0),))     # input 3's new value is output 0
    outputs = outputs_written(results, outputs_plan, plans, args)
"""
from __future__ import annotations

import torch

from .layout import outputs_by, unpad_with

_Tensor = torch.Tensor


def write_plans(plans: list, mutated_inputs: tuple) -> tuple:
    """(graph input, graph output, program result, padded shape, real region, real shape) for
    each mutated input (``mutated_inputs``: (graph input, graph output) pairs) whose new value
    is a padded program result, by an ``outputs_plan`` (``layout.outputs_plan``)."""
    written = []
    for graph_input, graph_output in mutated_inputs:
        if graph_output >= len(plans):
            continue
        kind, *rest = plans[graph_output]
        if kind == "tensor" and rest[1] is not None:
            padded, region, real_shape = rest[1][:3]
            written.append((graph_input, graph_output, rest[0], padded, region,
                            tuple(real_shape)))
    return tuple(written)


def outputs_written(results: list, plans: list, written: tuple, args: list) -> list:
    """``layout.outputs_by(results, plans)``, but each input of ``written`` (``write_plans``)
    that can take its new value in place gets it and is its own output (module doc)."""
    if not written:
        return outputs_by(results, plans)
    outputs = outputs_by(results, plans, skip={w[1] for w in written})
    for graph_input, graph_output, index, padded, region, real_shape in written:
        tensor, result = args[graph_input], results[index]
        if type(tensor) is _Tensor and tensor.is_cpu and not tensor.requires_grad \
                and tensor.dtype == result.dtype and tensor.shape == real_shape \
                and tensor.is_contiguous():
            tensor.view([r.stop for r in region]).copy_(result.reshape(padded)[region])
            outputs[graph_output] = tensor
        else:
            outputs[graph_output] = unpad_with(result, plans[graph_output][2])
    return outputs
