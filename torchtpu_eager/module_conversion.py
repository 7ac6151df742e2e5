"""``Module.to("tpu")``, ``Module.tpu()`` and ``Module.cpu()`` of a tpu model keep each
Parameter object, as on CUDA.

``Module._apply`` keeps a parameter's identity by assigning ``param.data`` only where the old
and new tensors have "compatible shallow-copy types" (CPU and CUDA do; a PrivateUse1 tensor
does not); otherwise it makes a new ``Parameter`` per module. Two modules that share one
weight (a language model's tied embedding and output head) then got two copies on tpu and
trained them apart, silently, and an optimizer built before ``.to("tpu")`` held the old CPU
parameters. PyTorch's other way, ``torch.__future__``'s swap on conversion, swaps the new
tensor into the same Parameter object: ties and references survive. We turn it on for the
conversions that involve tpu only, so what a CPU-only script does is unchanged.

A swap needs each parameter held by its module and autograd alone: moving a model while an
autograd graph still holds its weights (``out = model(x); model.cpu()``), or while a weak
reference points at one, cannot swap. That conversion goes PyTorch's plain way instead, as it
did before (new Parameter objects), with a warning, rather than failing half-way. The weak
references every ``nn.LSTM``/``GRU``/``RNN`` keeps to its own weights (``_flat_weight_refs``)
do not count: ``RNNBase._apply`` drops them before converting and makes them again after, so
they are dropped before the check too (a tied word language model came untied).

Example::

    model.head.weight = model.embed.weight
    model.to("tpu")
    assert model.head.weight is model.embed.weight
"""
from __future__ import annotations

import contextlib
import functools
import threading
import weakref

import torch

from torchtpu_compile._logging import warn_once

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


def _unswappable(module: torch.nn.Module) -> str | None:
    """The first parameter ``swap_tensors`` would refuse (PyTorch's checks, made before any
    parameter is touched), or None."""
    for name, param in module.named_parameters():
        grad = param.grad
        if weakref.getweakrefs(param) or (grad is not None and weakref.getweakrefs(grad)):
            return f"{name} has a weak reference"
        if param._use_count() > 1:
            return f"{name} is held by an autograd graph or another tensor"
    return None


def move_in_place(tensor: torch.Tensor, device) -> None:
    """Move ``tensor`` (a Parameter or a buffer) to ``device`` keeping its Python object, as
    ``tensor.data = tensor.to(device)`` does between CPU and CUDA. That assignment refuses a
    tpu tensor ("incompatible tensor type": a PrivateUse1 tensor is not a CPU tensor's
    shallow-copy type), so the moved tensor is swapped in instead (``torch.utils.swap_tensors``,
    what ``Module.to`` does here); a Parameter stays a Parameter with its ``requires_grad``.

    Example::

        w = model.weight
        move_in_place(w, "tpu")
        assert model.weight is w and w.device.type == "tpu"
    """
    with torch.no_grad():
        moved = tensor.to(device)
        if isinstance(tensor, torch.nn.Parameter):
            moved = torch.nn.Parameter(moved, requires_grad=tensor.requires_grad)
    torch.utils.swap_tensors(tensor, moved)


def _drop_rnn_weight_refs(module: torch.nn.Module) -> list:
    """Clear the weak references RNN modules keep to their weights, as ``RNNBase._apply``
    does first thing; returns the modules, whose references ``_apply`` makes again."""
    rnns = [m for m in module.modules() if isinstance(m, torch.nn.RNNBase)]
    for rnn in rnns:
        rnn._flat_weight_refs = []
    return rnns


def _converted(original, self, args, kwargs):
    rnns = _drop_rnn_weight_refs(self)
    try:
        return _convert(original, self, args, kwargs)
    finally:
        for rnn in rnns:    # _apply remade them, unless a conversion failed before reaching it
            if not rnn._flat_weight_refs:
                rnn._init_flat_weights()


def _convert(original, self, args, kwargs):
    blocked = _unswappable(self)
    if blocked is not None:
        warn_once(("module conversion", type(self).__name__, blocked),
                  "torchtpu: %s.to(): %s, so its parameters are replaced, not moved in place: "
                  "tied weights come apart and optimizers built before the move keep the old "
                  "ones. Move the model before the forward pass or after backward",
                  type(self).__name__, blocked)
        return original(self, *args, **kwargs)
    with _swapping():
        return original(self, *args, **kwargs)


def register() -> None:
    """Wrap ``Module.to``, ``Module.tpu`` and ``Module.cpu`` (idempotent)."""
    module = torch.nn.Module
    if getattr(module.to, "_torchtpu", False):
        return
    original_to = module.to

    @functools.wraps(original_to)
    def to(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]
        if not _involves_tpu(self, device):
            return original_to(self, *args, **kwargs)
        return _converted(original_to, self, args, kwargs)

    to._torchtpu = True
    module.to = to
    original_tpu = getattr(module, NAME, None)
    if original_tpu is not None:
        @functools.wraps(original_tpu)
        def tpu(self, *args, **kwargs):
            return _converted(original_tpu, self, args, kwargs)
        setattr(module, NAME, tpu)
    original_cpu = module.cpu

    @functools.wraps(original_cpu)
    def cpu(self):
        if not _involves_tpu(self, None):
            return original_cpu(self)
        return _converted(original_cpu, self, (), {})

    module.cpu = cpu
