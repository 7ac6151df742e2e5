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

import collections
import functools
import os
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


def _private_buffers(tensors: list, args: list) -> list:
    """For each tensor, whether a compiled program may take (donate) its buffer: the tensor is
    its storage's whole buffer, already computed, and nothing else holds that buffer.

    Another storage holding it (``clone`` and ``deepcopy`` share buffers), a deferred value,
    a caller's reference, or another argument of the call on the same storage all say no.
    """
    storages = collections.Counter(id(a._st) for a in args if type(a) is TpuTensor)
    private = []
    for t in tensors:
        storage = t._st
        value = storage.value
        # References: the storage's, ``value``'s and getrefcount's argument; one more is a
        # holder we cannot see, and a donated buffer would be deleted under it.
        private.append(t._dense and t._shape == storage.shape and storages[id(storage)] == 1
                       and type(value) is _array_type() and sys.getrefcount(value) == 3)
        del value
    return private


def _adopt(t, result) -> None:
    """``t`` takes the buffer of ``result`` (a compiled program's new value for it)."""
    from . import views
    views.write(t, views.read(result))


@functools.cache
def _array_type():
    from jaxlib import _jax
    return _jax.ArrayImpl


def register_with_runtime() -> None:
    """Tell the runtime how to read a tpu tensor's buffer, wrap a result and donate a buffer
    (idempotent; the device calls it when it registers itself: light, no jax)."""
    from torchtpu_compile.runtime.device_tensors import register_device_tensor, register_donor
    register_device_tensor(TpuTensor, _read_buffer, DEVICE.type, _wrap_buffer)
    register_donor(TpuTensor, DEVICE.type, _private_buffers, _adopt)


def teach_make_fx() -> None:
    """Make ``make_fx`` trace ops on ``TpuTensor`` values as ops on tensors (idempotent).

    ProxyTensorMode records an op only when it knows every tensor's type; for any other
    subclass it steps aside and lets the subclass's ``__torch_dispatch__`` run under it, so
    tracing recorded our dispatch code's own work (meta-device shape runs, host fallbacks)
    instead of the op, and a tpu tensor captured by the traced function became a constant
    computed at trace time. ``torch.func.linearize`` on tpu tensors (it traces ``jvp`` with
    ``make_fx``) then returned the tracing tangents' values, not the jvp. As a known type, a
    tpu tensor is recorded as a CUDA tensor is: ops on it become graph nodes, and its value a
    constant of the graph.

    Example::

        gm = make_fx(lambda t: t * x_tpu)(t_tpu)   # graph: mul(t, _tensor_constant0)
    """
    from torch.fx.experimental import proxy_tensor
    if TpuTensor not in proxy_tensor.HANDLED_TYPES:
        proxy_tensor.HANDLED_TYPES = (*proxy_tensor.HANDLED_TYPES, TpuTensor)


def teach_dynamo() -> None:
    """Make Dynamo trace ``TpuTensor`` values as tensors (idempotent; imports Dynamo)."""
    global _taught
    if _taught:
        return
    from torch._dynamo import trace_rules
    from torch._dynamo.variables.builder import VariableBuilder
    VariableBuilder._type_dispatch()[TpuTensor] = VariableBuilder.wrap_tensor
    _plain_tensors_to_dynamo()
    from torchtpu_compile import dynamo_cache, versions
    dynamo_cache.keyed_by(versions.source_digest(
        os.path.basename(__file__), root=os.path.dirname(__file__)))
    # Our dispatch code runs below the graph (as ATen kernels do); Dynamo must never trace it.
    trace_rules.add("torchtpu_eager")
    from .rng import register_replay_ops
    register_replay_ops(TpuTensor)
    _no_tpu_constants_in_fake_tensors()
    _grouped_mm_of_every_float_dtype()
    _optimizers_capturable_on_tpu()
    _taught = True


def _plain_tensors_to_dynamo() -> None:
    # Dynamo tracks a tensor of a Python subclass as that class's instance, to run its
    # __torch_function__ (ours is the disabled one) and rewrap results in its type. A compared
    # tpu tensor's result (`return x > 0`) then came back through a global naming
    # torch.Tensor that Dynamo never installed: NameError '__subclass_Tensor_..._c0'. A tpu
    # tensor is a plain tensor of device "tpu" to the graph, as a CUDA one is.
    from torch._dynamo.variables import builder
    infer = builder.infer_subclass_type
    if getattr(infer, "__wrapped__", None) is not None:
        return

    def infer_subclass_type(value):
        return None if type(value) is TpuTensor else infer(value)
    infer_subclass_type.__wrapped__ = infer
    builder.infer_subclass_type = infer_subclass_type


def teach_higher_order_ops() -> None:
    """Give every higher-order op with a dense implementation a rule for tpu tensors
    (idempotent).

    Example::

        torch.cond(x.sum() > 0, torch.sin, torch.cos, (x,))   # x on tpu: runs a branch
    """
    # A higher-order op meets a tensor subclass and asks it for a rule of its own: torch.cond,
    # while_loop, scan, map, an in-place custom op's auto_functionalized and linalg's error
    # check (with_effects) raised "There was no rule registered for HOP cond and subclass
    # TpuTensor", eagerly and in compiled graphs (they run between XLA regions). A tpu tensor
    # is a plain tensor to them: each runs its dense implementation, as on host tensors, whose
    # ops then run on the device. (The rng HOPs, which have none, are rng.py's.)
    from torch._C import DispatchKey
    from torch._ops import _higher_order_ops
    for hop in list(_higher_order_ops.values()):
        dense = hop.py_kernels.get(DispatchKey.CompositeExplicitAutograd)
        if dense is not None and TpuTensor not in hop.python_key_table:
            hop.py_impl(TpuTensor)(dense)


def _grouped_mm_of_every_float_dtype() -> None:
    # transformers' MoE layers (Mixtral, Qwen2-MoE) call torch._grouped_mm on a "tpu" device
    # for every dtype, since TPUs lower it natively (integrations/moe.py,
    # _can_use_grouped_mm), and the device's decomposition computes it in any float dtype. Its
    # meta kernel is CUDA's, bf16 only, so a model compiled on the device with float32 weights
    # failed in Dynamo's fake-tensor pass ("Expected inputs of BF16 type"). On tpu tensors of
    # one float dtype the result is the meta kernel's for bf16 stand-ins, in that dtype (or
    # out_dtype); every other call, on any device, gets the meta kernel as before.
    import torch
    from torch._subclasses.fake_impls import register_op_impl
    from torch.fx.operator_schemas import _normalize_function_or_error
    grouped_mm = torch.ops.aten._grouped_mm.default

    def on_tpu(fake_mode, func, *args, **kwargs):
        _, options = _normalize_function_or_error(func, args=args, kwargs=kwargs,
                                                  normalize_to_only_use_kwargs=True)
        mat_a, mat_b = options.pop("input"), options.pop("mat2")  # the normalizer says input
        out_dtype = options.pop("out_dtype", None)
        if mat_a.fake_device.type != DEVICE.type or mat_a.dtype != mat_b.dtype or \
                not mat_a.dtype.is_floating_point or mat_a.dtype == torch.bfloat16:
            return NotImplemented
        bf16 = torch.bfloat16
        if options.get("bias") is not None:
            options["bias"] = options["bias"].to(bf16)
        with fake_mode:
            out = func(mat_a.to(bf16), mat_b.to(bf16), **options)
            return out.to(out_dtype or mat_a.dtype)

    register_op_impl(lambda func: func is grouped_mm)(on_tpu)


def _optimizers_capturable_on_tpu() -> None:
    # Dynamo makes a compiled opt.step() capturable (step counters on the params' device) for
    # CUDA and XPU params only, but tells the traced code capturable for every group. On tpu
    # the counters were made on the CPU, and each later group's _init_group moved the earlier
    # ones to tpu copies (move_step_if_cpu): the traced += 1 went to the old objects, and
    # opt.state[p]["step"] stayed 0 in every group but the last (a checkpoint's, a later eager
    # step's bias correction). Uninitialized all-tpu groups are made capturable as CUDA's are.
    from torch._dynamo.variables.optimizer import OptimizerVariable
    set_capturable = OptimizerVariable._set_capturable

    def _set_capturable(self, tx) -> None:
        for group in self.value.param_groups:
            params = group.get("params", [])
            if "capturable" in group and params and all(
                    p.device.type == DEVICE.type for p in params) and not any(
                    p in self.value.state for p in params):
                group["capturable"] = True
        set_capturable(self, tx)

    OptimizerVariable._set_capturable = _set_capturable


def _no_tpu_constants_in_fake_tensors() -> None:
    # Fake tensors keep a small real tensor as their "constant" (torch.tensor(2.0, device=...)
    # moved by _to_copy) and run later ops on it with dispatch turned off, which a wrapper
    # subclass cannot serve: every op then hit PyTorch's internal assert "func != nullptr"
    # (torch.distributions' broadcast_all of a Python number with tpu tensors, Normal(mu, 2.0),
    # under torch.compile). A tpu value stays fake, as any value that is not a constant.
    from torch._subclasses.fake_tensor import FakeTensorMode
    may_turn_const = FakeTensorMode.may_turn_const

    def _may_turn_const(self, t) -> bool:
        return type(t) is not TpuTensor and may_turn_const(self, t)

    FakeTensorMode.may_turn_const = _may_turn_const


def _touches_tpu(gm, example_inputs) -> bool:
    """Whether a Dynamo graph takes or makes tpu tensors."""
    import torch
    values = list(example_inputs) + [node.meta.get("example_value") for node in gm.graph.nodes]
    return any(isinstance(v, torch.Tensor) and v.device.type == DEVICE.type for v in values)


def route_default_backend() -> None:
    """``torch.compile(model)`` with its default backend compiles tpu graphs with torchtpu.

    A script moved from cuda to tpu keeps its ``torch.compile(model)``: Inductor has no code
    generator for the tpu (Dynamo traced into this package's dispatch code and crashed), so a
    graph that takes or makes tpu tensors goes to the "torchtpu" backend, and every other graph
    to Inductor as before (Dynamo has learnt that tpu tensors are tensors when
    ``torch.compile`` was called: ``teach_dynamo_at_compile``). Inductor's ``mode``/``options``
    do not apply to torchtpu: they are ignored, with a warning naming them. Idempotent; the
    device calls it when it registers itself.

    Example::

        model = torch.compile(model.to("tpu"))      # as on cuda; compiled by torchtpu
        y = model(x.to("tpu"))
    """
    import torch
    wrapper = torch._TorchCompileInductorWrapper
    if getattr(wrapper.__call__, "_torchtpu_routes", False):
        return
    original_call = wrapper.__call__

    @functools.wraps(original_call)
    def __call__(self, model_, inputs_):
        if not _touches_tpu(model_, inputs_):
            return original_call(self, model_, inputs_)
        from torch._dynamo.backends.registry import lookup_backend

        from torchtpu_compile._logging import warn_once
        if self.config:
            warn_once(("inductor options", tuple(sorted(self.config))),
                      "torchtpu: torch.compile's mode/options configure Inductor, which does "
                      "not compile for the tpu; torchtpu compiles this graph and ignores %s "
                      "(torchtpu's settings: torchtpu_compile.config)",
                      ", ".join(sorted(self.config)))
        # By its registered name: the compile front end imports this module (backend.py).
        return lookup_backend("torchtpu")(model_, inputs_)

    __call__._torchtpu_routes = True
    wrapper.__call__ = __call__


def teach_dynamo_at_compile() -> None:
    """``torch.compile``, whatever its backend, teaches Dynamo that tpu tensors are tensors
    (``teach_dynamo``) before it traces. Idempotent; the device calls it when it registers
    itself.

    With a backend named by string (``"eager"``, ``"aot_eager"``) or given as a function,
    Dynamo traced into a tpu tensor's dispatch code until Python's recursion limit, unless
    something earlier in the process (a torchtpu or default-backend compile) had taught it.

    Example::

        torch.compile(lambda x: x.sum(0), backend="aot_eager")(torch.ones(3, 4, device="tpu"))
    """
    import torch
    original = torch.compile
    if getattr(original, "_torchtpu_teaches", False):
        return

    @functools.wraps(original)
    def compile(*args, **kwargs):
        teach_dynamo()  # imports Dynamo, as torch.compile does
        return original(*args, **kwargs)

    compile._torchtpu_teaches = True
    torch.compile = compile


def teach_dynamo_if_loaded() -> None:
    """``teach_dynamo`` when Dynamo is already imported (never imports it: that is slow)."""
    if "torch._dynamo.variables.builder" in sys.modules:
        teach_dynamo()

