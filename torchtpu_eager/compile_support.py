"""torch.compile on tpu tensors: compiled graphs take and return them, with no host round trip.

Two things make that work. Compiled programs read a tpu tensor's PJRT buffer directly and wrap
their results as tpu tensors (``register_device_tensor`` in the runtime). And Dynamo is told to
trace a tpu tensor as a tensor: it treats tensor subclasses with their own
``__torch_dispatch__`` as opaque objects otherwise, and would step into our dispatch code.

Example::

    model = torch.compile(model.to("tpu"), backend="torchtpu")
    y = model(x.to("tpu"))          # y is a tpu tensor
"""
from __future__ import annotations

import sys

from . import modes
from .tensor import DEVICE, TpuTensor, new_tensor

_taught = False


def _read_buffer(t):
    from . import views
    return modes.concrete(views.read(t))


def _wrap_buffer(buffer):
    t = new_tensor(buffer, tuple(buffer.shape), _dtype_of(buffer))
    modes.current().note_write(t._st)
    return t


def _dtype_of(buffer):
    import numpy as np
    import torch
    name = str(buffer.dtype)
    if name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.empty((), dtype=np.dtype(name))).dtype


def register_with_runtime() -> None:
    """Tell the runtime how to read a tpu tensor's buffer and wrap a result (idempotent; the
    device calls it when it registers itself: light, no jax)."""
    from torchtpu_compile.runtime.device_tensors import register_device_tensor
    register_device_tensor(TpuTensor, _read_buffer, DEVICE.type, _wrap_buffer)


def teach_dynamo() -> None:
    """Make Dynamo trace ``TpuTensor`` values as tensors (idempotent; imports Dynamo)."""
    global _taught
    if _taught:
        return
    from torch._dynamo import trace_rules
    from torch._dynamo.variables.builder import VariableBuilder
    VariableBuilder._type_dispatch()[TpuTensor] = VariableBuilder.wrap_tensor
    # Our dispatch code runs below the graph (as ATen kernels do); Dynamo must never trace it.
    trace_rules.add("torchtpu_eager")
    from .rng import register_replay_ops
    register_replay_ops(TpuTensor)
    _taught = True


def teach_dynamo_if_loaded() -> None:
    """``teach_dynamo`` when Dynamo is already imported (never imports it: that is slow)."""
    if "torch._dynamo.variables.builder" in sys.modules:
        teach_dynamo()

