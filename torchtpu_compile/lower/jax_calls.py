"""Graphs that call JAX functions (``jax_op``): each call's StableHLO is what JAX lowers.

The graph is cut at each ``torchtpu_jax::*`` call and put together by ``splice.py``; this
module supplies the calls' functions, lowered for the program's platform and precision.

Example::

    gm = make_fx(lambda x: rms_norm(x.sin(), w) * 2, tracing_mode="fake")(x)
    callees = jax_callees(gm, "cpu", "medium")   # {rms_norm's node: Callee(JAX's StableHLO)}
"""
from __future__ import annotations

import operator

import torch.fx as fx

from ..kernels.jax_op import kernel_of
from .mlir_types import tensor_type
from .splice import Callee


def jax_callees(gm: fx.GraphModule, platform: str, precision: str) -> dict:
    """``{call node: Callee}`` for every ``jax_op`` call in ``gm`` (empty when there is none)."""
    callees = {}
    for node in gm.graph.nodes:
        kernel = kernel_of(node.target) if node.op == "call_function" else None
        if kernel is None:
            continue
        inputs = list(node.args[0])
        avals = kernel.avals([a.meta["val"] for a in inputs])
        specs = kernel.output_specs(avals)
        outputs = [None] * len(specs)
        for user in node.users:
            if user.op == "call_function" and user.target is operator.getitem:
                outputs[user.args[1]] = user
        callees[node] = Callee(text=kernel.stablehlo(avals, precision, platform), inputs=inputs,
                               outputs=outputs,
                               result_types=[tensor_type(*spec) for spec in specs])
    return callees
