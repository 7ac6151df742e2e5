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

A scripted or traced module's C++ modules hold its parameters as well, which rules the swap
out; it converts PyTorch's plain way, then each old Parameter takes its new tensor and goes back
into every slot that held it (``_convert_scripted``); ``torch.jit.load``'s plain tensors become
Parameters first.

A lazy module's uninitialized parameters and buffers (``nn.LazyLinear(3).to("tpu")``, the
CUDA idiom) cannot become tpu tensors: the tpu tensor type is not an ``UninitializedParameter``,
so the module took a zero-size tpu weight for an initialized one and failed its first forward.
They stay on the CPU, uninitialized, through the conversion; the module's first forward
initializes them there (from the CPU generator, as on CPU) and then moves them to the device.
Built for the device (``nn.LazyLinear(3, device="tpu")``, or under ``torch.device("tpu")``),
they are CPU ones marked for it, materialized on the CPU and moved in place at once, then
initialized on the device by the module, as a ``Linear(..., device="tpu")`` is.

Example::

    model.head.weight = model.embed.weight
    model.to("tpu")
    assert model.head.weight is model.embed.weight
"""
from __future__ import annotations

import contextlib
import functools
import inspect
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
    return any(t.device.type == NAME or hasattr(t, "_torchtpu_device")
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


def _is_uninitialized(tensor) -> bool:
    return isinstance(tensor, torch.nn.parameter.UninitializedTensorMixin)


@contextlib.contextmanager
def _uninitialized_left_out(module: torch.nn.Module):
    """Lazy modules' uninitialized parameters and buffers out of ``_apply``'s reach (it skips a
    None), put back after; yields the modules that hold some."""
    held = []
    for m in module.modules():
        for table in (m._parameters, m._buffers):
            for name, tensor in table.items():
                if _is_uninitialized(tensor):
                    held.append((m, table, name, tensor))
    for _, table, name, tensor in held:
        table[name] = None
        tensor.__dict__.pop("_torchtpu_device", None)   # the conversion says where it goes
    try:
        yield list({id(m): m for m, *_ in held}.values())
    finally:
        for _, table, name, tensor in held:
            table[name] = tensor


def _move_once_initialized(module: torch.nn.Module, device) -> None:
    """A forward pre-hook after the lazy module's own (which initializes it) moving it to
    ``device``, once; a later conversion replaces it."""
    previous = getattr(module, "_torchtpu_lazy_move", None)
    if previous is not None:
        previous.remove()

    def move(mod, args, kwargs):
        if any(_is_uninitialized(t) for t in (*mod._parameters.values(),
                                              *mod._buffers.values())):
            return None
        mod._torchtpu_lazy_move.remove()
        del mod._torchtpu_lazy_move
        mod.to(device)
        return None
    module._torchtpu_lazy_move = module.register_forward_pre_hook(move, with_kwargs=True)


def _converted(original, self, args, kwargs):
    rnns = _drop_rnn_weight_refs(self)
    try:
        with _uninitialized_left_out(self) as lazy:
            converted = _convert(original, self, args, kwargs)
        if lazy:
            device = next((t.device for t in (*self.parameters(), *self.buffers())
                           if not _is_uninitialized(t)), None)
            device = device if device is not None else _target(original, args, kwargs)
            for module in lazy if device is not None else ():  # .to(dtype): where it was
                _move_once_initialized(module, device)
        return converted
    finally:
        for rnn in rnns:    # _apply remade them, unless a conversion failed before reaching it
            if not rnn._flat_weight_refs:
                rnn._init_flat_weights()


def _convert(original, self, args, kwargs):
    if isinstance(self, torch.jit.ScriptModule):
        return _convert_scripted(original, self, args, kwargs)
    blocked = _unswappable(self)
    if blocked is not None:
        warn_once(("module conversion", type(self).__name__, blocked),
                  "torchtpu: %s.to(): %s, so its parameters are replaced, not moved in place: "
                  "tied weights come apart and optimizers built before the move keep the old "
                  "ones. Move the model before the forward pass or after backward",
                  type(self).__name__, blocked)
        return original(self, *args, **kwargs)
    kept = _attributes_and_hooks(self)
    with _swapping():
        converted = original(self, *args, **kwargs)
    _restore(kept)
    return converted


def _convert_scripted(original, self, args, kwargs):
    """A scripted module's conversion, keeping each Parameter object. Its C++ modules hold
    every parameter too, so no swap is possible before PyTorch's plain conversion, which puts a
    new Parameter in each slot (a tie came apart; an optimizer built before the move trained
    nothing). After it, each old Parameter takes its new tensor (a swap, with the slots
    briefly holding a placeholder) and goes back into every slot that held it."""
    slots: dict = {}   # id of a parameter -> (it, [(scripted module, name), ...])
    wrapped: dict = {}   # id of a loaded module's plain tensor -> the Parameter made of it
    for module in self.modules():
        if isinstance(module, torch.jit.ScriptModule):
            for name, param in module._parameters.items():
                if param is None:
                    continue
                if not isinstance(param, torch.nn.Parameter):
                    # torch.jit.load gives plain tensors, which PyTorch's conversion refuses
                    # ("param must be a Parameter") where CUDA assigns their .data
                    if id(param) not in wrapped:
                        wrapped[id(param)] = torch.nn.Parameter(
                            param, requires_grad=param.requires_grad)
                    param = wrapped[id(param)]
                    module._c.setattr(name, param)
                slots.setdefault(id(param), (param, []))[1].append((module, name))
    kept = _attributes_and_hooks(self)
    converted = original(self, *args, **kwargs)
    placeholder = torch.empty(0)
    for param, places in slots.values():
        module, name = places[0]
        moved = module._parameters[name]
        if moved is param:
            continue
        for module, name in places:
            module._c.setattr(name, placeholder)
        torch.utils.swap_tensors(param, moved)
        for module, name in places:
            module._c.setattr(name, param)
    _restore(kept)
    return converted


def _attributes_and_hooks(module: torch.nn.Module) -> list:
    """Each parameter's Python attributes and tensor hooks: ``swap_tensors`` swaps them out
    with the old tensor, where CUDA's ``param.data = ...`` keeps both (a flag an optimizer or
    a sharding library set on a weight, a gradient hook registered before the move)."""
    return [(p, dict(p.__dict__), p._backward_hooks, p._post_accumulate_grad_hooks)
            for p in module.parameters()]


def _restore(kept: list) -> None:
    for param, attributes, hooks, post_hooks in kept:
        for name, value in attributes.items():
            param.__dict__.setdefault(name, value)
        # set again even where the attribute reads back: that registers them with the new
        # tensor's autograd record, which the swap left without them
        if hooks:
            param._backward_hooks = hooks
        if post_hooks:
            param._post_accumulate_grad_hooks = post_hooks


def _target(original, args, kwargs) -> torch.device | None:
    """Where a conversion sends a module: ``to``'s device (None for a dtype only), ``tpu()``
    or ``cpu()``."""
    if original.__name__ == "cpu":
        return torch.device("cpu")
    if original.__name__ == NAME:
        index = args[0] if args else kwargs.get("device")
        return torch.device(NAME, index if isinstance(index, int) else 0)
    if original.__name__ == "to_empty":
        return torch.device(kwargs["device"])
    device = torch._C._nn._parse_to(*args, **kwargs)[0]
    return None if device is None else torch.device(device)


def _made_for_the_device(new):
    """``UninitializedParameter.__new__`` (or the buffer's) making one for the tpu device
    (``nn.LazyLinear(4, device="tpu")``, a lazy module built under ``torch.device("tpu")``) as
    a CPU one marked for the device: a tpu tensor cannot be an UninitializedParameter
    (``_make_subclass`` refused it, and the module could not be built)."""
    signature = inspect.signature(new)

    @functools.wraps(new)
    def made(cls, *args, **kwargs):
        bound = signature.bind(cls, *args, **kwargs)
        device = bound.arguments.get("device")
        if torch.empty(0, device=device).device.type != NAME:
            return new(cls, *args, **kwargs)
        bound.arguments["device"] = "cpu"
        tensor = new(*bound.args, **bound.kwargs)
        tensor._torchtpu_device = torch.device(device if device is not None else NAME)
        return tensor
    return made


def _materialized_on_the_device(materialize):
    """``materialize`` of one marked for the device: made on the CPU, then moved keeping its
    object (``move_in_place``); the module initializes it after, on the device."""
    @functools.wraps(materialize)
    def materialized(self, shape, device=None, dtype=None):
        target = self.__dict__.pop("_torchtpu_device", None)
        materialize(self, shape, device=device, dtype=dtype)
        if target is not None and device is None:
            move_in_place(self, target)
    return materialized


def register() -> None:
    """Wrap ``Module.to``, ``Module.tpu``, ``Module.cpu`` and ``Module.to_empty``
    (idempotent)."""
    module = torch.nn.Module
    if getattr(module.to, "_torchtpu", False):
        return
    parameter = torch.nn.parameter
    for kind in (parameter.UninitializedParameter, parameter.UninitializedBuffer):
        kind.__new__ = _made_for_the_device(kind.__new__)
    mixin = parameter.UninitializedTensorMixin
    mixin.materialize = _materialized_on_the_device(mixin.materialize)
    copy = parameter.UninitializedParameter.__deepcopy__

    @functools.wraps(copy)
    def deepcopy(self, memo):   # the copy is for the device too
        result = copy(self, memo)
        if hasattr(self, "_torchtpu_device"):
            result._torchtpu_device = self._torchtpu_device
        return result
    parameter.UninitializedParameter.__deepcopy__ = deepcopy
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
    original_to_empty = module.to_empty

    @functools.wraps(original_to_empty)
    def to_empty(self, *, device, recurse=True):
        # its _apply replaced each Parameter with a new one, as .to did: tied weights came
        # apart (an LM head trained apart from its embedding)
        if not _involves_tpu(self, device):
            return original_to_empty(self, device=device, recurse=recurse)
        return _converted(original_to_empty, self, (), {"device": device, "recurse": recurse})

    module.to_empty = to_empty
