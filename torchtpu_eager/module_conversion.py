"""``Module.to("tpu")`` and ``Module.tpu()`` keep each Parameter object, as on CUDA.

``Module._apply`` keeps a parameter's identity by assigning ``param.data`` only where the old
and new tensors have "compatible shallow-copy types" (CPU and CUDA do; a PrivateUse1 tensor
does not); otherwise it makes a new ``Parameter`` per module. Two modules that share one
weight (a language model's tied embedding and output head) then got two copies on tpu and
trained them apart, silently, and an optimizer built before ``.to("tpu")`` held the old CPU
parameters. PyTorch's other way, ``torch.__future__``'s swap on conversion, swaps the new
tensor into the same Parameter object: ties and references survive. We turn it on for the
conversions that involve tpu only, so what a CPU-only script does is unchanged.

Example::

    model.head.weight = model.embed.weight
    model.to("tpu")
    assert model.head.weight is model.embed.weight
"""
from __future__ import annotations

import contextlib
import functools
import threading

import torch

from .device import NAME

_lock = threading.RLock()


@contextlib.contextmanager
def _swapping():
    # A process-wide flag that _apply reads; held under a lock while one conversion runs.
    with _lock:
        previous = torch.__future__.get_swap_module_params_on_conversion()
        torch.__future__.set_swap_module_params_on_conversion(True)
        try:
            yield
        finally:
            torch.__future__.set_swap_module_params_on_conversion(previous)


def _involves_tpu(module: torch.nn.Module, device) -> bool:
    if device is not None and torch.device(device).type == NAME:
        return True
    return any(t.device.type == NAME
               for t in (*module.parameters(), *module.buffers()))


def register() -> None:
    """Wrap ``Module.to`` and ``Module.tpu`` (idempotent)."""
    module = torch.nn.Module
    if getattr(module.to, "_torchtpu", False):
        return
    original_to = module.to

    @functools.wraps(original_to)
    def to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if not _involves_tpu(self, device):
            return original_to(self, *args, **kwargs)
        with _swapping():
            return original_to(self, *args, **kwargs)

    to._torchtpu = True
    module.to = to
    original_tpu = getattr(module, NAME, None)
    if original_tpu is not None:
        @functools.wraps(original_tpu)
        def tpu(self, *args, **kwargs):
            with _swapping():
                return original_tpu(self, *args, **kwargs)
        setattr(module, NAME, tpu)
