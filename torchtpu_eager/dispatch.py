"""``__torch_dispatch__`` for tpu tensors: every ATen op, one way or another, on the device.

Each op falls in one of these kinds, decided once per op and kept:

- a registered handler (``@handles``): copies, device moves, clone, empty-likes, dropout;
- a view (``op.is_view``, and ``_unsafe_view``): a new tensor over the same storage, geometry
  from the meta device;
- a random op: drawn on the host from the tpu generator (``rng.py``);
- a host value (returns a Python number or bool: ``.item()``, ``equal``), or an error check
  that returns nothing (``_linalg_check_errors``, ``_assert_async``): computed on the host;
- everything else: traced once per (op, shapes, dtypes, arguments) into an ``OpGraph``, which
  the current mode runs (strict, debug) or records (defer-and-fuse). An op that cannot be
  traced or lowered runs on the host, counted and named in ``torchtpu_compile.stats()``.

Example::

    x = torch.ones(3, device="tpu")
    (x + 1).cpu()          # aten.add.Tensor: one compiled program, cached for these shapes
"""
from __future__ import annotations

import contextlib

import logging
import warnings

import torch

from torchtpu_compile import dtype_support
from torchtpu_compile._logging import log
from torchtpu_compile.errors import InvalidInputError, LoweringError, PlatformError
from torchtpu_compile.kernels.jax_op import kernel_of
from torchtpu_compile.lower import device_random
from torchtpu_compile.lower.precision import resolve_precision
from torchtpu_compile.lower.support import is_written, written_arguments
from torchtpu_compile.profiling import TORCH_PROFILER, span
from torchtpu_compile.runtime.cache import RecentlyUsed
from torchtpu_compile.runtime.client import get_client

from . import fallback, modes, rng, scalars, trace_cache, views
from .device import check_device
from .fuse import Lazy
from .kernels import foreign_tensor_error
from .modes import Strict, concrete
from .programs import (OpGraph, _fake_examples, _platform, example, meta_kernel_failed,
                       outside_dynamo, splice, trace)
from .storage import Storage
from .tensor import (DEVICE, TpuTensor, _numel, contiguous_strides, dense_tensor, is_dense,
                     memory_layout, new_tensor, reach, strided_tensor, view_tensor)
from .transfer import download, from_cpu, not_dense, to_cpu, upload

aten = torch.ops.aten
_CPU = torch.device("cpu")

_handlers: dict = {}     # OpOverload -> handler(func, args, kwargs)
_ops = RecentlyUsed()    # signature -> _Compiled or _Fallback (its program: bounded)


def handles(*ops):
    """Register the decorated function as the handler of each op in ``ops``.

    Example::

        @handles(aten.clone.default)
        def clone(func, args, kwargs): ...
    """
    def register(fn):
        for op in ops:
            _handlers[id(op)] = _with_checks(op, fn)
        return fn
    return register


def dispatch(func, args, kwargs):
    # Keyed by id: OpOverload hashes in Python (slow), and each op is one object for good.
    handler = _handlers.get(id(func))
    if handler is None:
        handler = _handlers[id(func)] = _classify(func)
    if TORCH_PROFILER._is_profiler_enabled:
        with span(f"torchtpu::eager {func}"):
            return handler(func, args, kwargs)
    return handler(func, args, kwargs)


def _classify(func):
    return _with_checks(func, _handler_of(func))


def _with_checks(func, handler):
    """``handler`` with the checks ``func``'s schema calls for (a device argument: that the
    device exists), decided once per op: ops without them pay nothing."""
    if any(a.name == "device" for a in func._schema.arguments):
        return _checking_device(handler)
    return handler


def _checking_device(handler):
    """``handler``, first refusing a tpu device that does not exist (``torch.ones(2,
    device="tpu:1")``, ``x.to("tpu:3")``): such results landed on tpu:0, where CUDA raises."""
    def checked(func, args, kwargs):
        device = kwargs.get("device")   # a custom op's "device" may be any type (an int)
        if type(device) is torch.device and device.index and device.type == DEVICE.type:
            check_device(device)
        return handler(func, args, kwargs)
    return checked


def _handler_of(func):
    schema = func._schema
    if func.namespace not in ("aten", "prims") and \
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _DEVICE_KEY):
        return run_users_device_kernel
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE_IMPLICIT):
        return run_decomposed
    if torch.Tag.inplace_view in func.tags:  # t_, unsqueeze_, as_strided_: new geometry only
        return run_inplace_view
    if func.is_view and not any(is_written(a) for a in schema.arguments):
        return run_view
    if torch.Tag.nondeterministic_seeded in func.tags:
        return run_random
    if func is aten.index.Tensor:  # tagged data-dependent for its boolean masks only
        return run_index
    if torch.Tag.dynamic_output_shape in func.tags:
        return run_data_dependent
    if kernel_of(func) is not None:
        # A jax_op returns a list of tensors, which the test below takes for host values: its
        # JAX lowering is what the device runs, as in compiled graphs.
        return run_op
    if schema.returns and not all(_is_tensor_type(r.type) for r in schema.returns):
        return run_host_value
    return run_op


_COMPOSITE_IMPLICIT = torch._C.DispatchKey.CompositeImplicitAutograd


_DEVICE_KEY = torch._C.DispatchKey.PrivateUse1


def run_users_device_kernel(func, args, kwargs):
    # A library's own kernel for the device (torch.library.register_kernel(op, "tpu"),
    # custom_op(device_types="tpu"), Library.impl(..., "PrivateUse1")) runs on the tpu
    # tensors, as a CUDA kernel gets CUDA tensors: the op's default kernel ran on host copies
    # instead, and a tpu-only op could not run at all.
    return func._op_dk(_DEVICE_KEY, *args, **kwargs)


def run_decomposed(func, args, kwargs):
    # PyTorch decomposes these ops (.to, .reshape, ...) at the autograd keys, which inference
    # mode and inference tensors skip: they then reach the device whole, and are decomposed
    # here as they would have been above it.
    return func.decompose(*args, **kwargs)


def _is_tensor_type(t) -> bool:
    text = str(t)
    return text.startswith("Tensor") or text in ("Tensor?", "Optional[Tensor]")


# --- signatures: the cache key of an op call, and its tensors in order -----------------------

def _sig(value, tensors: list):
    kind = type(value)
    if kind is TpuTensor:
        tensors.append(value)
        return (value.dtype, value._shape)
    if kind is float:
        # 0.0 and -0.0 are equal and hash alike, but an op compiled for one gives the other
        # the wrong signs: x.div(0.0, rounding_mode="floor") ran -0.0's program (fuzz seed 3588)
        return (kind, value or str(value))  # a zero by its sign; still (float, _): scalars
    if kind is int or kind is bool:
        return (kind, value)  # 1, 1.0 and True hash alike but give different dtypes
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return (value.dtype, tuple(value.shape), "host")
    if kind is list or kind is tuple:
        return tuple([_sig(v, tensors) for v in value])
    if isinstance(value, torch.ScriptObject):
        # Packed weights (quantize_dynamic's): keys compare, and its __eq__ raises.
        return (torch.ScriptObject, id(value))
    return value


def signature(func, args, kwargs):
    """(hashable key of this call, its tensors in order); the key names the op by id."""
    tensors: list = []
    key = [id(func)]
    for a in args:
        kind = type(a)  # the common kinds inline, as _sig keys them: a call less per argument
        if kind is TpuTensor:
            tensors.append(a)
            key.append((a.dtype, a._shape))
        elif kind is float:
            key.append((kind, a or str(a)))
        elif kind is int or kind is bool:
            key.append((kind, a))
        else:
            key.append(_sig(a, tensors))
    if kwargs:
        for k, v in kwargs.items():
            key.append(k)
            key.append(_sig(v, tensors))
    return tuple(key), tensors


def _substitute(value, values):
    """``value`` with each tensor replaced by the next of ``values``; tpu devices made host."""
    if isinstance(value, torch.Tensor):
        return next(values)
    if isinstance(value, (list, tuple)):
        return type(value)(_substitute(v, values) for v in value)
    if isinstance(value, torch.device) and value.type == "tpu":
        return _CPU
    return value


#: Ops whose indices may be host tensors (uploaded), as on CUDA: ATen's index kernels take
#: "indices ... either on cpu or on the same device as the indexed tensor"; ``x[idx] = v``
#: with a host ``idx`` raised a device mismatch.
_HOST_INDICES = frozenset(id(op) for op in (
    aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
    aten._index_put_impl_.default, aten._unsafe_index.Tensor, aten._unsafe_index_put.default))


#: Ops whose device-generic kernel reaches a backend's own (``convolution_overrideable`` on
#: the tpu device, which PyTorch leaves unimplemented): given a host weight, they raised
#: NotImplementedError naming that kernel, where CUDA checks the devices and raises.
_DEVICE_CHECKED = frozenset(id(op) for op in (
    aten.convolution.default, aten._convolution.default, aten.convolution_backward.default))


def _check_devices(func, tensors, args=(), kwargs=None) -> bool:
    """Raise where a host tensor (other than a 0-d scalar) is an argument of ``func``, as
    PyTorch does for a CUDA op given a CPU tensor; True where ``func`` is then to run its
    device-generic implementation instead (``_COMPOSITE``). A host tensor it writes raises
    even 0-d (``running.add_(loss)`` of a host ``running``): CUDA lets host scalars in as
    inputs only."""
    device = kwargs.get("device") if kwargs else None
    if type(device) is torch.device and device.type != DEVICE.type and \
            torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE_EXPLICIT):
        # A factory told where its result goes (linspace(0.5, end_tpu, 4, device="cpu")):
        # its device-generic kernel reads the tpu values and builds it there, as on CUDA.
        return True
    indices = args[1] if id(func) in _HOST_INDICES and len(args) > 1 else ()
    for t in tensors:
        if type(t) is not TpuTensor and (t.dim() != 0 or _written(func, t, args, kwargs or {})):
            if any(t is index for index in indices):
                continue
            if id(func) not in _DEVICE_CHECKED and torch._C._dispatch_has_kernel_for_dispatch_key(
                    func.name(), _COMPOSITE_EXPLICIT):
                # No device check on CUDA either: the kernel reads its host arguments
                # (pack_padded_sequence's lengths) and computes with the device tensors.
                return True
            if t.device.type == "tpu":
                raise foreign_tensor_error(func)
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two "
                f"devices, {DEVICE} and {t.device}! (when checking arguments of {func}). "
                f"Move the tensor with .to('tpu'), or use a 0-dim tensor for a scalar.")
    return False


def _written(func, tensor, args, kwargs) -> bool:
    """Whether ``func`` writes ``tensor``, one of its arguments (self of an in-place op, an
    out= tensor)."""
    for position, argument in enumerate(func._schema.arguments):
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        if value is tensor and argument.alias_info is not None and \
                argument.alias_info.is_write:
            return True
    return False


_COMPOSITE_EXPLICIT = torch._C.DispatchKey.CompositeExplicitAutograd
_COMPOSITE = object()  # the _ops entry of a signature run by its CompositeExplicit kernel


def _input_values(tensors) -> tuple:
    """(the op's input values, the reads folded into its program): a strided view's value is
    its storage's, and ``(position, read graph, the read's other inputs)`` of each such input
    is listed for the op to run the read itself (``_folded``); where no input is a strided
    view, the list is None and every value is the tensor's own."""
    values = []
    folded = None
    for t in tensors:
        if type(t) is TpuTensor:
            storage = t._st
            value = storage.value
            # The common case inline: a dense tensor whose storage holds its buffer as is.
            if value is not None and t._dense and t._shape == storage.shape:
                values.append(value)
                continue
            read = views.read_graph_of(t)
            if read is None:
                values.append(views.read(t))
            else:
                if folded is None:
                    folded = []
                folded.append((len(values), *read))
                values.append(views.storage_value(storage))
        else:
            values.append(upload(t))
    return values, folded


class _Fold:
    """An op's graph with its strided inputs' reads folded in (``_folded``), and the layout of
    its fresh results: None (all contiguous), or per result None or (the storage's shape, the
    result's strides) where eager gives it a permuted layout (``relu(x.t())`` is a transposed
    tensor on the CPU, and so are both of ``x.t().sort(0)``'s), which the program then writes
    in that memory order."""

    __slots__ = ("graph", "layout")

    def __init__(self, graph, layout=None):
        self.graph, self.layout = graph, layout


def _folded(entry, folded: list, func, args, kwargs, tensors):
    """``entry``'s ``_Fold`` for the reads ``folded`` (kept per set of reads): ``F.linear``
    reads ``w.t()``, a backward ``grad.t()``, and each read was a program of its own, whose
    result (on a TPU, the whole transposed weight) was written out only to be read by the
    next. None where the spliced graph does not lower: the reads then run on their own."""
    key = tuple([(position, read.id) for position, read, _ in folded])
    folds = entry.folds
    if folds is None:
        folds = entry.folds = {}
    fold = folds.get(key, folds)
    if fold is not folds:
        return fold
    op = entry.graph
    source = {position: k for k, (position, _, _) in enumerate(folded)}
    graphs = [read for _, read, _ in folded] + [op]
    # The reads' other inputs (their positions: views.py) come after the op's own inputs.
    n_inputs = len(op.placeholders)
    refs = []
    for position, _, extra in folded:
        refs.append((-1 - position, *range(-1 - n_inputs, -1 - n_inputs - len(extra), -1)))
        n_inputs += len(extra)
    refs.append(tuple([(source[p], 0) if p in source else -1 - p
                       for p in range(len(op.placeholders))]))
    wanted = [(len(folded), j) for j in range(len(op.out_meta))]
    layout = _eager_layout(entry, func, args, kwargs, tensors)
    if layout is not None:  # each permuted result in its memory order: a transpose graph each
        for j, result in enumerate(layout):
            if result is None:
                continue
            walked, strides = result
            shape, dtype = op.out_meta[j]
            graphs.append(trace(_permute_to(walked), [example(shape, dtype)], "layout",
                                what=("layout", walked)))
            refs.append(((len(folded), j),))
            wanted[j] = (len(graphs) - 1, 0)
            layout[j] = (tuple([shape[d] for d in walked]), strides)
    fold = _Fold(splice(graphs, refs, n_inputs, wanted, op.label + "+reads"),
                 layout)
    try:
        modes.current().check(fold.graph)  # strict compiles it; defer-and-fuse lowers it
    except Exception as exc:  # a LoweringError, or XLA refusing the combination
        log.debug("tpu: %s runs its input reads as programs of their own: %s", op.label, exc)
        fold = None
    folds[key] = fold
    return fold


def _permute_to(walked):
    """The traced function writing a value in the memory order ``walked``."""
    return lambda v: (v.permute(walked).clone(),)


def _eager_layout(entry, func, args, kwargs, tensors):
    """Per fresh result of ``func`` (the graph's outputs, in order), (its dims outermost
    first, its strides) where eager's result on these inputs' geometries is a permuted dense
    layout (``x.t() * 2`` has strides (1, n) on the CPU: TensorIterator follows its inputs'
    layout; ``x.t().sort(0)``'s values and indices both do), else None; None for the whole
    where every result is contiguous, or the op returns anything but fresh tensors (it may
    write its arguments besides: batch norm in training writes the running statistics, and its
    result of a channels-last input is channels-last). From the op run on fake CPU tensors
    viewing storages as the inputs do: on meta tensors a convolution of channels-last inputs
    picks no CPU backend and comes out contiguous, where the CPU's is channels-last."""
    plan, counts = entry.returns
    if entry.resized or not plan or any(kind != "fresh" for kind, _ in plan) or any(counts) \
            or len(entry.graph.out_meta) != len(plan) + len(entry.mutated):
        return None
    # Fake tensor's own Python frames must not reach Dynamo, which would trace them as user
    # code where a compiled function leaves ops to the device (nn.LSTM's graph break).
    with outside_dynamo():
        metas = iter(_fake_examples(
            [_meta_view(t) if type(t) is TpuTensor else t.to("meta") for t in tensors]))
        try:
            out = func(*_substitute(tuple(args), metas), **{
                k: _substitute(v, metas) for k, v in kwargs.items()})
        except Exception:  # no meta kernel: the result stays contiguous
            return None
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out) if isinstance(
        out, (tuple, list)) else ()
    if len(outs) != len(plan) or not all(isinstance(o, torch.Tensor) for o in outs):
        return None
    layout = [_permuted_layout(tuple(o.shape), tuple(o.stride())) for o in outs]
    return None if all(result is None for result in layout) else layout


def _permuted_layout(size: tuple, stride: tuple):
    """(dims outermost first, ``stride``) where ``stride`` lays ``size`` out densely in an
    order other than row-major, else None (contiguous but for size-1 dims, or not dense)."""
    walked = views._permuted_dims(size, size, stride, 0)
    if walked is None or walked == sorted(walked) or 0 in stride:
        return None
    # size-1 dims last: they do not move memory, and the permute names every dim
    return walked + [d for d in range(len(size)) if d not in walked], stride


# --- the compiled path ------------------------------------------------------------------------

class _Compiled:
    """How to run one op signature: its graph, which leaves it writes, how to rebuild returns;
    ``lifted``: the dtype of the extra input the op's floats are (``scalars.py``), or None."""

    __slots__ = ("graph", "mutated", "returns", "n_fresh", "lifted", "single", "result", "fast",
                 "in_place", "resized", "folds")

    def __init__(self, graph, mutated, returns, n_fresh, lifted=None, resized=()):
        self.graph, self.mutated, self.returns, self.n_fresh = graph, mutated, returns, n_fresh
        self.lifted = lifted
        # (signature position, new shape) of each out= tensor whose shape is not the result's:
        # eager resizes it (out_resize below); every run of the signature does.
        self.resized = resized
        self.fast = None  # strict mode's decision, once it ran there (_fast_plan)
        self.folds = None  # its graphs with strided inputs' reads folded in (_folded)
        plan, counts = returns
        self.single = (not mutated and len(plan) == 1 and plan[0][0] == "fresh"
                       and counts == [0])
        # An in-place op (add_, mul_): (signature position, argument index) of the one tensor
        # it writes and returns, its new value the one output; None for every other op.
        self.in_place = None
        if len(mutated) == 1 and n_fresh == 0 and len(plan) == 1 and plan[0][0] == "alias" \
                and plan[0][1] is not None and plan[0][1][0] == "arg" and not resized:
            self.in_place = (mutated[0], plan[0][1][1])
        # The one result's shape, dtype, element count and strides, for every mode's run.
        shape, dtype = graph.out_meta[0] if self.single else ((), None)
        self.result = (shape, dtype, _numel(shape), contiguous_strides(shape))


class _Fallback:
    __slots__ = ("reason",)

    def __init__(self, reason: str):
        self.reason = reason


def _written_leaves(func, args, kwargs) -> list:
    """Indices (in signature order) of tensor leaves the op writes (in-place and out= args)."""
    positions = {position for position, _ in written_arguments(func, args, kwargs)}
    written, counter = [], [0]

    def leaves(value, write):
        if isinstance(value, torch.Tensor):
            if write:
                written.append(counter[0])
            counter[0] += 1
        elif isinstance(value, (list, tuple)):
            for v in value:
                leaves(v, write)

    for i, value in enumerate(args):
        leaves(value, i in positions)
    for name, value in kwargs.items():
        leaves(value, name in positions)
    return written


def _return_plan(func, args, kwargs):
    """Per schema return: ("alias", where) for returns that are a written argument, else fresh."""
    schema = func._schema
    by_set = {}
    for i, a in enumerate(schema.arguments):
        if is_written(a):
            by_set[frozenset(a.alias_info.before_set)] = ("arg", i) if i < len(args) else \
                ("kwarg", a.name)
    plan = []
    for r in schema.returns:
        info = r.alias_info
        if info is not None and info.is_write:
            plan.append(("alias", by_set.get(frozenset(info.before_set))))
        else:
            plan.append(("fresh", str(r.type)))
    return plan


def _functional_variant(func):
    """The functional twin of an op that writes Tensor[] arguments and returns nothing
    (``_fused_adamw_`` -> ``_fused_adamw``, ``_foreach_add_.List`` -> ``_foreach_add.List``):
    it returns the new value of each written argument (a list or a tensor), in order. None for
    every other op.

    Such an op is traced through its twin rather than on clones of its arguments: PyTorch's
    functionalization kernel takes an empty written list (``max_exp_avg_sqs`` of AdamW without
    amsgrad) for a tensor outside ``functionalize()`` and fails an internal assert ("mutating a
    non-functional tensor with a functional tensor"). The twin is what that kernel would call.

    Example::

        _functional_variant(aten._fused_adamw_.default)   # aten._fused_adamw.default
    """
    schema = func._schema
    written = [a for a in schema.arguments if is_written(a)]
    if schema.returns or not any(str(a.type).startswith("List[Tensor]") for a in written):
        return None
    packet = getattr(aten, func.overloadpacket.__name__.rstrip("_"), None)
    twin = getattr(packet, func._overloadname, None) if packet is not None else None
    if twin is None or len(twin._schema.returns) != len(written) or \
            any(is_written(a) for a in twin._schema.arguments):
        return None
    return twin


def _pointwise_twin(func):
    """The functional overload of pointwise op ``func`` that computes what it writes
    (``mul_.Tensor`` -> ``mul.Tensor``, ``mul.out`` -> ``mul.Tensor``, ``exp.out`` ->
    ``exp.default``): same arguments, less the out= ones. None where there is none."""
    schema = func._schema
    names = [a.name for a in schema.arguments if not (is_written(a) and a.kwarg_only)]
    packet = getattr(aten, func.overloadpacket.__name__.rstrip("_"), None)
    for overload in packet.overloads() if packet is not None else ():
        twin = getattr(packet, overload)
        arguments = twin._schema.arguments
        if [a.name for a in arguments] == names and not any(is_written(a) for a in arguments):
            return twin
    return None


def _meta(value):
    """``value`` with each tensor (in lists and tuples too) an empty one on the meta device."""
    if isinstance(value, torch.Tensor):
        return torch.empty(value.shape, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta(v) for v in value)
    return value


def _check_meta_kernel(func, args, kwargs) -> None:
    """Raise eager's error where ``func``'s own meta kernel refuses the inputs.

    The op is traced through the decomposition table, so its meta kernel, which holds most of
    eager's argument checks, never ran: ``avg_pool2d(divisor_override=0)``, ``roll`` with
    shifts and dims of other lengths, ``diagonal_copy(dim1=10000)``, ``gather(out=)`` of
    another dtype all returned values. The compile path runs it (Dynamo's fake tensors). Once
    per signature; where the meta kernel refuses, eager on the host has the last word (its
    exception and message; it may accept what a meta kernel refuses, then tracing goes on)."""
    if "device" in kwargs:  # a factory: its checks are the trace's
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # out= resized on the meta copies
            func(*_meta(tuple(args)), **{k: _meta(v) for k, v in kwargs.items()})
    except NotImplementedError:  # no meta kernel: the trace decides
        return
    except Exception:  # noqa: BLE001  (any refusal: eager decides what it is)
        try:
            fallback.raise_eagers_error(func, args, kwargs)
        except NotImplementedError:
            # No host kernel to ask (a device op: _thnn_fused_lstm_cell, whose meta kernel
            # trips over a missing bias): the trace decides.
            return


def _check_output_casts(func, args, kwargs) -> None:
    """Raise eager's error where op ``func`` would write a result of a dtype its output cannot
    hold. A pointwise op: one eager's TensorIterator cannot cast to ("result type Float can't
    be cast to the desired output type Long": ``int_tensor.mul_(2.5)``,
    ``torch.add(f, 1, out=long)``). Any other op's out=: a dtype other than the result's, where
    eager has the last word (aminmax, gather and complex refuse it, sum computes in it).
    Traced, the result was cast to the output's dtype without a word. The result's dtype comes
    from the op's functional twin on meta tensors; eager itself raises the error (once per
    signature)."""
    twin = _pointwise_twin(func)
    if twin is None:
        return
    pointwise = torch.Tag.pointwise in func.tags
    outs = written_arguments(func, args, kwargs)
    names = {name for name, _ in outs}
    kwarg_only = {a.name for a in func._schema.arguments if a.kwarg_only}
    if not pointwise and not names <= kwarg_only:
        return  # an in-place op other than a pointwise one: it computes in its own dtype
    try:
        result = twin(*_meta(tuple(args)), **{k: _meta(v) for k, v in kwargs.items()
                                              if k not in names})
    except Exception:  # the twin's own errors are the op's, raised when it is traced
        return
    results = result if isinstance(result, (list, tuple)) else (result,)
    for produced, (_, target) in zip(results, outs):
        if isinstance(target, torch.Tensor) and isinstance(produced, torch.Tensor) and (
                not torch.can_cast(produced.dtype, target.dtype) if pointwise
                else produced.dtype != target.dtype):
            fallback.raise_eagers_error(func, args, kwargs)
            return


def _build(func, args, kwargs, tensors, key, lift_floats=False):
    """The ``_Compiled`` (or ``_Fallback``) of the call with signature ``key``; None where
    ``lift_floats`` and the op's scalars cannot be an input."""
    _check_meta_kernel(func, args, kwargs)
    # Eager's error where its CPU kernel has no instance for the inputs' dtypes (bmm of bool
    # returned a value: meta kernels do not check dtypes, XLA takes any type); asked of the
    # CPU kernel once per signature.
    dtype_support.check(func, args, kwargs)
    written = _written_leaves(func, args, kwargs)
    if written:
        _check_output_casts(func, args, kwargs)
    plan = _return_plan(func, args, kwargs)
    twin = _functional_variant(func)
    shapes: list = []   # number of tensors per fresh return, filled while tracing

    def fn(*values, _call=None):
        values = list(values)
        if twin is None:
            for i in written:
                values[i] = values[i].clone()  # write into a copy: the graph stays functional
        it = iter(values)
        op_args, op_kwargs = _call if _call is not None else (args, kwargs)
        call_args = _substitute(tuple(op_args), it)
        call_kwargs = {k: _substitute(v, it) for k, v in op_kwargs.items()}
        if twin is not None:  # the new values of the written lists, leaf by leaf
            new = twin(*call_args, **call_kwargs)
            new = new if isinstance(new, tuple) else (new,)  # one return: not in a tuple
            return tuple(t for value in new
                         for t in (value if isinstance(value, (list, tuple)) else (value,)))
        out = func(*call_args, **call_kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        fresh = []
        shapes.clear()
        for (kind, _), value in zip(plan, outs):
            if kind == "alias":
                shapes.append(None)
            elif isinstance(value, (list, tuple)):
                shapes.append(len(value))
                fresh.extend(value)
            elif value is None:
                shapes.append(-1)
            else:
                shapes.append(0)
                fresh.append(value)
        return tuple(fresh) + tuple(values[i] for i in written)

    examples = [example(t.shape, t.dtype) for t in tensors]
    label = str(func)
    lifted = scalars.dtype_for(tensors, scalars.collect(args, kwargs, func),
                               kwargs.get("dtype")) if lift_floats else None
    def make():
        if lifted is not None:
            return _trace_lifted(fn, examples, label, func, args, kwargs, lifted), list(shapes)
        return trace(fn, examples, label), list(shapes)

    try:
        # What the trace depends on besides the examples: the op and its signature (the
        # tensors' shapes and dtypes, every other argument's value), and whether its scalars
        # are lifted (trace_cache: a warm process skips the trace).
        graph, shapes[:] = trace_cache.cached(("op", func, lifted is not None, key[1:]),
                                              examples, label, _platform(), make)
        if graph is None:
            return None
        modes.current().check(graph)
    except (InvalidInputError, PlatformError):
        raise  # eager's own error for these inputs, or no device: not a reason for the host
    except (LoweringError, NotImplementedError, RuntimeError, TypeError, ValueError,
            AssertionError, IndexError) as exc:
        if lift_floats:
            return None
        if meta_kernel_failed():
            # Likely inputs eager rejects: raise its error (its own words, as on CUDA), not
            # a fallback warning; nothing is kept for the signature. Where eager accepts them
            # after all, the op falls back as any op that does not lower.
            fallback.raise_eagers_error(func, args, kwargs)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return _Fallback(first[:300])
    n_fresh = len(graph.out_meta) - len(written)
    resized = tuple((leaf, shape) for leaf, (shape, _) in zip(written, graph.out_meta[n_fresh:])
                    if tuple(shape) != tuple(tensors[leaf].shape))
    return _Compiled(graph, written, (plan, list(shapes)), n_fresh, lifted=lifted,
                     resized=resized)


def out_resize(t: TpuTensor, shape: tuple) -> None:
    """Resize out= tensor ``t`` to its result's ``shape`` as eager's ``resize_output`` does,
    with eager's warning where it had elements. Without this the result's buffer was stored
    under the old shape (an empty out= stayed empty; a (5,) out read back 12 values)."""
    if t.numel() > 0:
        warnings.warn(
            f"An output with one or more elements was resized since it had shape "
            f"{list(t.shape)}, which does not match the required output shape {list(shape)}. "
            f"This behavior is deprecated, and in a future PyTorch release outputs will not be "
            f"resized unless they have zero elements. You can explicitly reuse an out tensor t "
            f"by resizing it, inplace, to zero elements with t.resize_(0).", stacklevel=2)
    views.resize(t, shape, keep=False)


def _trace_lifted(fn, examples, label, func, args, kwargs, dtype):
    """Trace ``fn`` with its floats (or ints) as an input (see scalars.py), or None if they
    cannot be."""
    scalar_values = scalars.collect(args, kwargs, func)
    graphs = []
    for variant in (0, 1):
        values = scalars.sentinels(scalar_values, variant)
        if values is None:
            return None
        swapped_args, swapped_kwargs = scalars.replace(args, kwargs, values, func)

        def traced(*tensors, _a=swapped_args, _k=swapped_kwargs):
            return fn(*tensors, _call=(_a, _k))
        graph = trace(traced, examples, label)
        lifted = scalars.lift(graph.gm, values, dtype)
        if lifted is None:
            return None
        graphs.append(lifted)
    if graphs[0].code != graphs[1].code:  # a scalar was transformed, not just passed along
        return None
    kind = "floats" if dtype.is_floating_point else "ints"
    graph = OpGraph(graphs[0], f"{label} ({kind} as inputs)")
    if graph.out_meta != OpGraph(graphs[1], label).out_meta:
        return None  # a scalar that sized a result (arange's end), not just a value in it
    return graph


def _rebuild(entry: _Compiled, outputs: list, args, kwargs, layout=None):
    """The op's return from its outputs; ``layout``: a ``_Fold``'s, per fresh result."""
    plan, shapes = entry.returns
    meta = entry.graph.out_meta
    position = 0
    results = []
    for (kind, where), count in zip(plan, shapes):
        if kind == "alias":
            source, key = where
            results.append(args[key] if source == "arg" else kwargs[key])
        elif count == -1:
            results.append(None)
        elif count == 0:
            shape, dtype = meta[position]
            if layout is not None and layout[position] is not None:
                results.append(_laid_out(outputs[position], shape, dtype, layout[position],
                                         modes._current or modes.current()))
            else:
                results.append(_fresh(outputs[position], shape, dtype))
            position += 1
        else:
            items = []
            for _ in range(count):
                shape, dtype = meta[position]
                items.append(_fresh(outputs[position], shape, dtype))
                position += 1
            results.append(items)
    if not plan:
        return None
    return results[0] if len(plan) == 1 else tuple(results)


def _fresh(value, shape, dtype):
    t = new_tensor(value, shape, dtype)
    (modes._current or modes.current()).note_write(t._st)  # the mode is set: no call
    return t


_SEEN_ONCE, _NOT_LIFTABLE = object(), object()
_by_structure = RecentlyUsed()   # signature, scalars blanked -> lifted _Compiled, or a marker
_float_recompiles: dict = {}   # structure of a not-liftable op -> programs compiled for it
#: Programs compiled for one op that differ only in float (or int) arguments before we say so:
#: a loop that passes a new value each step compiles every step, and nothing else shows it.
FLOAT_RECOMPILE_WARNING = 8


def _lifted_entry(func, args, kwargs, tensors, key):
    """The op's entry with its floats (or its ints in scalar slots: ``scalars.int_slots``) as
    an input, once it is seen with a second set of them."""
    structure = scalars.structure(key, func, args, kwargs)
    if structure == key:
        return None  # no floats, no ints in scalar slots
    known = _by_structure.get(structure)
    if known is None:
        _by_structure[structure] = _SEEN_ONCE
        return None
    if known is _SEEN_ONCE:
        known = _build(func, args, kwargs, tensors, key, lift_floats=True) or _NOT_LIFTABLE
        _by_structure[structure] = known
    if known is _NOT_LIFTABLE:
        count = _float_recompiles[structure] = _float_recompiles.get(structure, 1) + 1
        if count == FLOAT_RECOMPILE_WARNING:
            values = scalars.collect(args, kwargs, func)
            kind = type(values[0]).__name__ if values else "scalar"
            logging.getLogger("torchtpu").warning(
                "%s has compiled %d programs that differ only in its %s arguments (%s): a "
                "%s that changes every call compiles every call. Pass it as a tensor if "
                "the op takes one.", func, count, kind, values, kind)
        return None
    return known


class _FastPlan:
    """Strict mode's whole run of one op signature, decided once (``_fast_plan``).

    ``run``: the executable's run; ``indices``: which inputs it takes (None: all, in order);
    ``results``: (shape, dtype, element count, strides) of each fresh result, in order;
    ``written``: the signature position of the one argument the op writes (its new value is
    the last output; the op returns that argument, ``returned``), or None; ``precision``: the
    matmul precision the program was built for, or None where no precision changes it.
    """

    __slots__ = ("run", "indices", "results", "written", "returned", "precision", "single")

    def __init__(self, run, indices, results, written, returned, precision):
        self.run, self.indices, self.results = run, indices, results
        self.written, self.returned, self.precision = written, returned, precision
        self.single = written is None and len(results) == 1  # most ops: one new tensor


def _fast_plan(entry: _Compiled, args):
    """The op's ``_FastPlan``, or False where a run needs more than one execute and new
    tensors: several written arguments, a return that is a list or None, floats as an input,
    index checks, or a program that rebuilds its outputs (constants, host draws, views)."""
    graph = entry.graph
    if entry.lifted is not None or graph.checked:
        return False
    precision = None
    program = graph._any_precision
    if program is None:  # depends on the matmul precision: the one it was built for now
        precision = resolve_precision(_platform())
        program = graph._by_precision.get(precision)
    direct = program.direct_run() if program is not None else None
    if direct is None:
        return False
    plan, counts = entry.returns
    written = returned = None
    if entry.mutated:
        if entry.in_place is None:
            return False
        written, returned = entry.in_place
        if type(args[returned]) is not TpuTensor:
            return False
        results = ()
    else:
        if not plan or any(kind != "fresh" for kind, _ in plan) or any(counts) or \
                len(graph.out_meta) != len(plan):  # (an empty list also counts 0 tensors)
            return False
        results = tuple((shape, dtype, _numel(shape), contiguous_strides(shape))
                        for shape, dtype in graph.out_meta)
    run, indices = direct
    if indices is not None and list(indices) == list(range(len(graph.placeholders))):
        indices = None  # every argument, in order: no list to build per run
    return _FastPlan(run, indices, results, written, returned, precision)


def _write_in_place(target: TpuTensor, value, mode) -> None:
    """``views.write(target, value)``, its common case inline (a dense tensor)."""
    storage = target._st
    if target._dense and not storage.freed and storage.stands_for is None:
        storage.value = value
        storage.shape = target._shape
        mode.note_write(storage)
    else:
        views.write(target, value)


def _fast_results(fast: _FastPlan, outputs: list, tensors: list, args):
    """The op's return from its outputs, for the fast path's ops other than one fresh result:
    a written argument (its new value stored) or several fresh results."""
    written = fast.written
    if written is not None:
        _write_in_place(tensors[written], outputs[0], modes._current)
        return args[fast.returned]
    return tuple([dense_tensor(Storage(out, shape, dtype, numel), shape, strides)
                  for out, (shape, dtype, numel, strides) in zip(outputs, fast.results)])


#: Writes eager lets through a view that overlaps itself and whose every element counts, not
#: only the last one (accumulate=True): they run on the host (fallback.run_through_storage).
_ACCUMULATING_PUTS = {torch.ops.aten.index_put_.default, torch.ops.aten._index_put_impl_.default}

_overlap_errors: dict = {}   # (signature, geometries, storage pattern) -> eager's error or None


def check_overlap(func, args, kwargs, key, tensors) -> None:
    """Raise eager's error where it refuses to write through overlapping memory: a write to an
    expanded view ("more than one element of the written-to tensor refers to a single memory
    location"), or an input that partly overlaps the written tensor (``x[1:].add_(x[:-1])``,
    "some elements of the input tensor and the written-to tensor refer to a single memory
    location"). Each op runs on functional values here, so without this it returned a value
    where eager raises. Eager itself decides: the op runs once on host tensors that alias as
    the arguments do (their values do not matter to the check), per geometry."""
    storages: dict = {}
    geometry = tuple((tuple(t.stride()), t.storage_offset(), storages.setdefault(id(t._st),
                                                                               len(storages)))
                     if type(t) is TpuTensor else None for t in tensors)
    check = (key, geometry)
    if check not in _overlap_errors:
        bases: dict = {}

        def host(value):
            if type(value) is TpuTensor:
                storage = value._st
                if id(storage) not in bases:
                    # Only the memory layout matters; zeros are valid indices for index ops.
                    bases[id(storage)] = torch.zeros(storage.numel, dtype=storage.dtype)
                return bases[id(storage)].as_strided(value.shape, value.stride(),
                                                     value.storage_offset())
            if isinstance(value, (list, tuple)):
                return type(value)(host(v) for v in value)
            if isinstance(value, torch.device) and value.type == "tpu":
                return _CPU
            return value

        message = None
        try:
            func(*host(tuple(args)), **{k: host(v) for k, v in kwargs.items()})
        except Exception as exc:  # others (the values are not the real ones) are not ours
            if str(exc).startswith("unsupported operation:"):
                message = str(exc)
        _overlap_errors[check] = message
    message = _overlap_errors[check]
    if message is not None:
        raise RuntimeError(message)


_meetings: dict = {}   # the two views' geometries -> whether an element is in both


def elements_meet(a, b) -> bool:
    """Whether views ``a`` and ``b`` of one storage share an element, laid out otherwise (the
    same view read and written meets nothing that a read-then-write changes).

    Eager's kernels run element by element through shared memory, so where eager lets such a
    write through (``check_overlap`` raises where it does not), later elements read values the
    op wrote: the op runs as eager's on the host (``fallback.run_through_storage``)."""
    key = (tuple(a.shape), a.stride(), a.storage_offset(), tuple(b.shape), b.stride(),
           b.storage_offset())
    met = _meetings.get(key)
    if met is None:
        if key[:3] == key[3:] or a.numel() == 0 or b.numel() == 0:
            met = False
        else:
            extent = max(t.storage_offset() + reach(t.shape, t.stride()) for t in (a, b))
            mask = torch.zeros(extent, dtype=torch.bool)
            mask.as_strided(a.shape, a.stride(), a.storage_offset()).fill_(True)
            met = bool(mask.as_strided(b.shape, b.stride(), b.storage_offset()).any())
        _meetings[key] = met
    return met


def run_op(func, args, kwargs):
    key, tensors = signature(func, args, kwargs)
    try:  # RecentlyUsed.get, in C calls only: no Python frame on the per-op path
        _ops.move_to_end(key)
        entry = _ops[key]
    except KeyError:
        entry = None
    if entry is None:
        entry = _COMPOSITE if _check_devices(func, tensors, args, kwargs) else \
            _lifted_entry(func, args, kwargs, tensors, key) or \
            _build(func, args, kwargs, tensors, key)
        _ops[key] = entry
    if entry is _COMPOSITE:
        return func._op_dk(_COMPOSITE_EXPLICIT, *args, **kwargs)
    if type(entry) is _Fallback:
        return fallback.run_on_host(func, args, kwargs, entry.reason)
    if entry.mutated:
        # A written tensor that may overlap itself (a zero stride: an expanded view) or shares
        # its storage with another argument: rare, and then eager decides (check_overlap).
        # Inline: no Python call on the per-op path.
        for i in entry.mutated:
            w = tensors[i]
            if type(w) is TpuTensor:
                overlaps = not w._dense and 0 in w.stride()
                seen = False  # w passed again (x.index_add_(0, i, x)) is another argument
                for t in tensors:
                    if overlaps or (type(t) is TpuTensor and t._st is w._st and
                                    (t is not w or seen)):
                        check_overlap(func, args, kwargs, key, tensors)
                        # (run_through_storage returns the one tensor written)
                        if len(func._schema.returns) == 1 and any(
                                r is not w and type(r) is TpuTensor and r._st is w._st and
                                elements_meet(w, r) for r in tensors):
                            return fallback.run_through_storage(func, args, kwargs, w)
                        break
                    seen = seen or t is w
                if overlaps and func in _ACCUMULATING_PUTS and \
                        (args[3] if len(args) > 3 else kwargs.get("accumulate", False)):
                    return fallback.run_through_storage(func, args, kwargs, w)
    mode = modes._current or modes.current()
    values, folded = _input_values(tensors)
    fast = entry.fast
    if folded is None and fast and type(mode) is Strict and \
            not TORCH_PROFILER._is_profiler_enabled:
        # The per-op fast path: one execute, new tensors, nothing else decided again.
        if fast.precision is None or fast.precision == resolve_precision(_platform()):
            for value in values:
                if type(value) is Lazy:  # left by defer-and-fuse mode: run its recording
                    values = [concrete(v) for v in values]
                    break
            indices = fast.indices
            outputs = fast.run(values if indices is None else [values[i] for i in indices])
            if fast.single:
                shape, dtype, numel, strides = fast.results[0]
                return dense_tensor(Storage(outputs[0], shape, dtype, numel), shape, strides)
            return _fast_results(fast, outputs, tensors, args)
        entry.fast = fast = None  # another matmul precision: plan again after this run
    if entry.lifted is not None:
        values.append(scalars.as_input(scalars.collect(args, kwargs, func), entry.lifted))
    graph = entry.graph
    layout = None
    if folded is not None:
        fold = _folded(entry, folded, func, args, kwargs, tensors)
        if fold is None:  # the reads as programs of their own
            for position, _, _ in folded:
                values[position] = views.read(tensors[position])
        else:
            graph, layout = fold.graph, fold.layout
            for _, _, extra in folded:
                values.extend(extra)
    outputs = mode.apply(graph, values)
    if fast is None and folded is None and type(mode) is Strict:  # planned on its own graph
        entry.fast = _fast_plan(entry, args)
    if entry.single:  # one fresh tensor, nothing written: most ops
        shape, dtype, numel, strides = entry.result
        if layout is not None:  # eager's permuted layout, the program's result its memory
            return _laid_out(outputs[0], shape, dtype, layout[0], mode)
        storage = Storage(outputs[0], shape, dtype, numel)
        mode.note_write(storage)
        return dense_tensor(storage, shape, strides)
    in_place = entry.in_place
    if in_place is not None and type(tensors[in_place[0]]) is TpuTensor:
        _write_in_place(tensors[in_place[0]], outputs[0], mode)
        return args[in_place[1]]
    n_fresh = entry.n_fresh
    for leaf, shape in entry.resized:
        out_resize(tensors[leaf], shape)
    for leaf, value in zip(entry.mutated, outputs[n_fresh:]):
        views.write(tensors[leaf], value)
    return _rebuild(entry, outputs, args, kwargs, layout)


def _laid_out(value, shape, dtype, layout, mode) -> TpuTensor:
    """The fresh result ``value``, which the program wrote in the memory order ``layout``
    gives, ``(the storage's shape, the result's strides)`` (``_Fold``)."""
    storage = Storage(value, layout[0], dtype, _numel(shape))
    mode.note_write(storage)
    return view_tensor(storage, shape, layout[1], 0, False)


# --- other kinds ------------------------------------------------------------------------------

def _meta_view(t: TpuTensor) -> torch.Tensor:
    """A meta tensor viewing a storage like ``t``'s exactly as ``t`` does: view ops applied to
    it give the new geometry without touching data."""
    storage = t._st
    return torch.empty((storage.numel,), dtype=storage.dtype, device="meta").as_strided(
        t._shape, t.stride(), t.storage_offset())


_view_geometry: dict = {}   # a view call's key (_view_key) -> its results' geometry, or None


def _view_key(func, args, kwargs, base: TpuTensor):
    """What a view's geometry depends on: the op and its arguments (``signature``), and how the
    base views its storage."""
    key, _ = signature(func, args, kwargs)
    return key, base.stride(), base.storage_offset(), base._st.numel


def _check_in_storage(size, stride, offset, storage) -> None:
    """Raise eager's error for a view reaching past its storage (``as_strided``): a meta
    tensor's storage has no bounds, and the view's reads came back clamped to the last
    element, its writes landing on it."""
    if 0 in size:
        return
    needed = offset + reach(size, stride)
    if needed > storage.numel:
        itemsize = storage.dtype.itemsize
        raise RuntimeError(
            f"setStorage: sizes {list(size)}, strides {list(stride)}, storage offset {offset}, "
            f"and itemsize {itemsize} requiring a storage size of {needed * itemsize} are out "
            f"of bounds for storage of size {storage.numel * itemsize}")


def _geometry_of_view(func, args, kwargs, base: TpuTensor):
    """(size, stride, offset, dense) of each result of view op ``func`` on ``base`` (one, or a
    list or tuple of them), from a meta tensor viewing a storage as ``base`` does; None where
    the result cannot be a view of the storage."""
    storage = base._st
    out = func(_meta_view(base), *args[1:], **kwargs)

    def geometry(m):
        if m.dtype != storage.dtype:  # view(dtype) reinterprets bits: compute it instead
            raise _NotAView
        if m.is_conj() or m.is_neg():
            # conj()/_neg_view only set a bit that our storage views cannot carry: compute
            # the conjugated (negated) values instead, or every later read would miss it.
            raise _NotAView
        size, stride, offset = tuple(m.shape), tuple(m.stride()), m.storage_offset()
        _check_in_storage(size, stride, offset, storage)
        return size, stride, offset, is_dense(size, stride, offset, storage.numel)

    try:
        if isinstance(out, (list, tuple)):
            return type(out)(geometry(m) for m in out)
        return geometry(out)
    except _NotAView:
        return None


def run_view(func, args, kwargs):
    base = args[0]
    if type(base) is not TpuTensor:
        return run_op(func, args, kwargs)
    # The geometry is decided once per view call's key: the meta tensors that give it cost
    # three dispatches, and views are a third of a training step's ops (t, detach, view).
    key = _view_key(func, args, kwargs, base)
    geometry = _view_geometry.get(key, _view_geometry)
    if geometry is _view_geometry:
        geometry = _view_geometry[key] = _geometry_of_view(func, args, kwargs, base)
    if geometry is None:  # computed: a write to it is refused or carried (views.computed_view)
        out = run_op(func, args, kwargs)
        for t in (out if isinstance(out, (list, tuple)) else (out,)):
            if type(t) is TpuTensor:
                views.computed_view(func, base, t, tuple(args[1:]))
        return out
    storage = base._st
    # The CPU's view shares its base's dispatch keys: a view of a normal tensor is a normal
    # tensor, in inference mode too (made there, our wrapper was an inference tensor, and
    # autograd raised "Cannot set version_counter for inference tensor" on every view), and a
    # view of an inference tensor is one outside it too (made as a normal tensor, a write
    # through it was allowed where the CPU raises "Inplace update to inference tensor").
    with _inference_mode_of(base):
        if geometry and type(geometry[-1]) is bool:  # one result: (size, stride, offset, dense)
            return view_tensor(storage, *geometry)
        return type(geometry)(view_tensor(storage, *g) for g in geometry)  # split, unbind


def _inference_mode_of(base: TpuTensor):
    """Inference mode on while a view of ``base`` is made exactly when ``base`` is an inference
    tensor; a no-op where it already is so (only the wrapper is made under it: nothing
    dispatches).

    Example::

        with _inference_mode_of(base):
            view = view_tensor(base._st, size, stride, offset, dense)
    """
    inference = base.is_inference()
    if torch.is_inference_mode_enabled() != inference:
        return torch._C._InferenceMode(inference)
    return contextlib.nullcontext()


class _NotAView(Exception):
    pass


# A view autograd does not track: aot_autograd returns some compiled outputs through it to
# hide their aliasing from autograd. On the CPU it shares the storage; traced as an op, it
# copied, and those outputs no longer aliased each other.
handles(aten._unsafe_view.default)(run_view)


def run_inplace_view(func, args, kwargs):
    # Only the tensor's geometry changes, in place: traced as an op it wrote the transposed
    # values into a tensor that kept its old size (x.t_(), stft's squeeze_/transpose_).
    base = args[0]
    if type(base) is not TpuTensor or func._schema.name.startswith("aten::resize"):
        return run_op(func, args, kwargs)  # resizing reallocates: not a view of the storage
    meta = _meta_view(base)
    func(meta, *args[1:], **kwargs)
    base._restride(meta.shape, meta.stride(), meta.storage_offset())
    return base


def run_random(func, args, kwargs):
    with rng.drawing_on_host(func, args, kwargs) as (func, host_args, host_kwargs):
        return fallback.run_on_host(func, host_args, host_kwargs, reason=None)


def run_data_dependent(func, args, kwargs):
    # Its output shape depends on the values (masked_select, unique): never one static
    # program, so not traced at all (tracing 0-dim inputs crashed torch-mlir).
    if _host_arguments_checked(func, args, kwargs):
        return func._op_dk(_COMPOSITE_EXPLICIT, *args, **kwargs)
    return fallback.run_on_host(func, args, kwargs, "its output shape depends on the data")


def _host_arguments_checked(func, args, kwargs) -> bool:
    """``_check_devices`` for an op that runs on the host: it took host tensors as its own
    (``masked_select`` with a host mask, ``bincount`` with host weights, ``allclose`` of a
    tpu and a host tensor returned), where CUDA raises."""
    tensors = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif type(value) is list or type(value) is tuple:   # Tensor[] and Tensor?[] arguments
            tensors.extend(v for v in value if isinstance(v, torch.Tensor))
    return _check_devices(func, tensors, args, kwargs)


def run_index(func, args, kwargs):
    # x[i] with integer indices is a gather of static shape (it ran on the host); a boolean
    # mask selects as many elements as it holds true values.
    if any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in args[1]):
        return run_data_dependent(func, args, kwargs)
    return run_op(func, args, kwargs)


def run_host_value(func, args, kwargs):
    if _host_arguments_checked(func, args, kwargs):
        return func._op_dk(_COMPOSITE_EXPLICIT, *args, **kwargs)
    return fallback.run_on_host(func, args, kwargs, reason=None)


# Ops that return nothing and exist to raise: linalg's info check (after cholesky_ex, inv_ex,
# solve_ex, ...) and torch._assert_async. Traced, they left no output, so the graph dropped
# them (a non-positive-definite cholesky returned NaN instead of eager's error) or, recorded by
# defer-and-fuse, reached the importer (LoweringError). They read their tensor on the host and
# raise there, as eager's CPU kernels do (a wait for the device, as on CUDA for linalg).
handles(aten._linalg_check_errors.default, aten._assert_async.default,
        aten._assert_async.msg)(run_host_value)


@handles(aten.convolution.default)
def convolution(func, args, kwargs):
    # torch.jit.trace never records convolution, only the _convolution that CPU's and CUDA's
    # kernels call, and leaves the tracer on for the code below it (every size read becomes a
    # traced value). Run here, a traced CNN kept the example's output as a constant, returned
    # for every input, or the tracer asserted on the device's own ops.
    if torch._C._get_tracing_state() is not None:
        raise RuntimeError(
            "tpu: torch.jit.trace cannot record a convolution on tpu tensors (the tracer "
            "records the _convolution a CPU or CUDA kernel calls, which the tpu device does "
            "not run): trace the model on the CPU (model.cpu(), CPU example inputs) and move "
            "the traced module with .to('tpu'), or use torch.export or torch.compile.")
    return run_op(func, args, kwargs)


@handles(aten._pack_padded_sequence.default)
def pack_padded_sequence(func, args, kwargs):
    # Its lengths must be a host tensor, on CUDA as on CPU; given tpu lengths, the host run
    # copied them over and PackedSequence then refused the tpu batch_sizes with a message
    # about building PackedSequences by hand.
    lengths = args[1]
    if type(lengths) is TpuTensor:
        raise RuntimeError(f"'lengths' argument should be a 1D CPU int64 tensor, but got "
                           f"{lengths.dim()}D {lengths.device} "
                           f"{_scalar_type_name(lengths.dtype)} tensor")
    return _handler_of(func)(func, args, kwargs)


def _scalar_type_name(dtype: torch.dtype) -> str:
    """c10's name of ``dtype`` as C++ messages print it: ``Long`` for ``torch.int64``."""
    return torch.empty(0, dtype=dtype).type()[len("torch."):-len("Tensor")]


@handles(aten.equal.default)
def equal(func, args, kwargs):
    # CUDA's equal compares on the device and raises for a host tensor; ours compared on the
    # host and returned (run_host_value checks the devices).
    return run_host_value(func, args, kwargs)


@handles(aten._linalg_det.default, aten._linalg_slogdet.default)
def determinant(func, args, kwargs):
    # The LU these return beside the value is eager's: of A.mT where A is contiguous, else of
    # A, the convention their backward solves in. The op's program sees A's value dense
    # (contiguous), so a non-contiguous A runs as its transpose: the same determinant, and
    # the LU of A itself (its gradient came back transposed).
    a = args[0]
    if not a.is_contiguous() and not a.is_complex():  # complex: eager's LU is A's anyway
        a = a.mT
    return run_op(func, (a, *args[1:]), kwargs)


@handles(aten.cholesky.default)
def cholesky(func, args, kwargs):
    # Eager's kernel: the factor, then its info checked. As one program the check cannot
    # lower (it raises on the host), and the whole op ran on the host.
    a = args[0]
    upper = kwargs.get("upper", args[1] if len(args) > 1 else False)
    factor, info = run_op(aten.linalg_cholesky_ex.default, (a,), {"upper": upper})
    aten._linalg_check_errors.default(info, "cholesky", is_matrix=a.dim() == 2)
    return factor


@handles(aten.one_hot.default)
def one_hot(func, args, kwargs):
    # Reached whole in inference mode only; elsewhere kernels.one_hot_checked runs above
    # autograd (AutogradPrivateUse1).
    from .kernels import one_hot_checked
    return one_hot_checked(*args, **kwargs)


@handles(aten._pin_memory.default)
def pin_memory(func, args, kwargs):
    # Eager's check (Memory.cpp), as for a cuda tensor: a device tensor is not host memory to
    # pin. It ran on the host with a warning and gave the tpu tensor back, unpinned.
    raise RuntimeError(f"cannot pin '{args[0].type()}' only dense CPU tensors can be pinned")


@handles(aten.scaled_dot_product_attention.default)
def attention(func, args, kwargs):
    # Reached whole in inference mode only, as one_hot above.
    from .kernels import attention_in_eager_layout
    return attention_in_eager_layout(*args, **kwargs)


@handles(aten.is_set_to.default)
def is_set_to(func, args, kwargs):
    # Eager's test: one storage, and the same offset, sizes and strides. PyTorch's placeholder
    # storage of a wrapper tensor told every tpu tensor apart, itself included.
    a, b = args
    return type(a) is TpuTensor and type(b) is TpuTensor and a._st is b._st and \
        a.storage_offset() == b.storage_offset() and a.shape == b.shape and \
        a.stride() == b.stride()


@handles(aten.copy_.default)
def copy_(func, args, kwargs):
    dst, src = args[0], args[1]
    if dst is src:  # a no-op in PyTorch (a donated input handed back: program/donation.py)
        return dst
    if type(dst) is not TpuTensor:  # tpu -> host
        return dst.copy_(to_cpu(src), **kwargs)
    if type(src) is not TpuTensor:  # host -> tpu: convert on the host, then one upload
        host = src.to(dtype=dst.dtype).expand(dst.shape)
        # non_blocking from pinned memory: PyTorch's promise that the source is not written
        # until a synchronization, so the transfer may finish after this returns.
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
        asynchronous = bool(non_blocking) and src.is_pinned()
        order = views.storage_order(dst)
        if order is not None:
            # All of dst's storage in another order (``.to("tpu")`` of ``x.t()`` or of a
            # channels-last tensor): uploaded in that order, no transpose on the device.
            shape = dst._st.shape
            whole = dense_tensor(dst._st, shape, contiguous_strides(shape))
            views.write(whole, upload(host.permute(order).contiguous().reshape(shape),
                                      asynchronous=asynchronous))
            return dst
        views.write(dst, upload(host.contiguous(), asynchronous=asynchronous))
        return dst
    if dst._st is src._st or (not dst._dense and 0 in dst.stride()):
        check_overlap(func, args, kwargs, signature(func, args, kwargs)[0], [dst, src])
        if dst._st is src._st and elements_meet(dst, src):
            return fallback.run_through_storage(func, args, kwargs, dst)
    if src.dtype == dst.dtype and src.shape == dst.shape:
        views.write(dst, views.read(src))
        return dst
    return run_op(func, args, kwargs)


@handles(aten._to_copy.default)
def to_copy(func, args, kwargs):
    src = args[0]
    device = kwargs.get("device")
    if device is not None and device.type == "cpu":
        host = to_cpu(src)
        rest = {k: v for k, v in kwargs.items() if k not in ("device", "non_blocking")}
        return func(host, **rest) if rest else host
    if device is not None and device.type == "meta":
        # As from any device, geometry without data: PyTorch's ZeroTensor kernels (the
        # tangents forward AD gives constants: jvp of `v * 3`) take their result's shape and
        # dtype from the op on `.to("meta")` copies; a tpu tensor came back, and the meta
        # kernel refused the mix of devices.
        return func(_meta_view(src), **kwargs)
    rest = {k: v for k, v in kwargs.items() if k != "device"}
    if rest.get("memory_format") in _PERMUTING_FORMATS:
        return _in_memory_format(func, src, rest)
    return run_op(func, (src,), rest)


#: Memory formats whose layout is a permutation of the logical order.
_PERMUTING_FORMATS = (torch.channels_last, torch.channels_last_3d)


def _in_memory_format(func, src: TpuTensor, kwargs: dict) -> TpuTensor:
    """The result of copy op ``func`` (clone, _to_copy) of ``src`` in ``kwargs``'s memory
    format, with eager's strides: a dense storage in that memory order, viewed in logical
    order. An op's own result is contiguous, so ``x.to(memory_format=torch.channels_last)``,
    ``contiguous(memory_format=...)`` and ``clone(memory_format=...)`` kept the contiguous
    layout: ``.stride()`` and ``is_contiguous(memory_format=...)`` differed from eager, and a
    view relying on the channels-last order (``permute(0, 2, 3, 1).view(-1)``) raised."""
    shape = tuple(src.shape)
    strides = tuple(torch.empty_like(_meta_view(src),
                                     memory_format=kwargs["memory_format"]).stride())
    in_order = run_op(func, (src.permute(memory_layout(shape, strides)),),
                      {**kwargs, "memory_format": torch.contiguous_format})
    return view_tensor(in_order._st, shape, strides, 0,
                       is_dense(shape, strides, 0, in_order._st.numel))


@handles(aten.lift_fresh.default, aten.lift_fresh_copy.default)
def lift(func, args, kwargs):
    # torch.tensor(data, device="tpu") under a FakeTensorMode (Dynamo and AOTAutograd tracing
    # a compiled function) makes a real tpu tensor and lifts it; the modes leave lifting a
    # tensor subclass to the subclass, so nothing would trace it. Lifted as what it is, a host
    # constant moved to the device, the modes see ops they know: the graph holds the constant
    # and a copy to tpu, as it does on CUDA where the tracer avoids touching the device.
    if torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE) is not None:
        from torch.utils._mode_utils import no_dispatch
        with no_dispatch():  # the download itself is real work, not traced
            host = to_cpu(args[0])
        return func(host).to(DEVICE)
    if func is aten.lift_fresh.default:
        return args[0]
    return clone(func, args, kwargs)


@handles(aten.clone.default)
def clone(func, args, kwargs):
    src = args[0]
    # Buffers are immutable and writes replace them, so a dense copy can share its buffer.
    if src._dense and src._shape == src._st.shape and kwargs.get("memory_format") in (
            None, torch.contiguous_format, torch.preserve_format):
        out = new_tensor(src._st.value, src._shape, src.dtype)
        modes.current().note_write(out._st)
        return out
    if kwargs.get("memory_format") in _PERMUTING_FORMATS:
        return _in_memory_format(func, src, kwargs)
    return run_op(aten.clone.default, (src,), kwargs)  # memory_format: eager's layout


@handles(aten.new_zeros.default, aten.new_ones.default, aten.new_full.default)
def new_filled(func, args, kwargs):
    # The factory it is, with the source's dtype and device: traced as an op, its program took
    # the source as an input, so one was compiled per source shape for the same result.
    src = args[0]
    options = {"dtype": kwargs.get("dtype") or src.dtype, "layout": kwargs.get("layout"),
               "device": kwargs.get("device") or src.device,
               "pin_memory": kwargs.get("pin_memory")}
    if func is aten.new_full.default:
        return aten.full.default(args[1], args[2], **options)
    factory = aten.zeros.default if func is aten.new_zeros.default else aten.ones.default
    return factory(args[1], **options)


@handles(aten.zeros_like.default, aten.ones_like.default, aten.full_like.default,
         aten.rand_like.default, aten.rand_like.generator, aten.randn_like.default,
         aten.randn_like.generator, aten.randint_like.default, aten.randint_like.Tensor,
         aten.randint_like.low_dtype, aten.randint_like.generator,
         aten.randint_like.Tensor_generator, aten.randint_like.low_generator_dtype)
def filled_like(func, args, kwargs):
    # A factory "like" a tpu tensor, on another device (zeros_like(t, device="cpu")): the
    # source gives only its geometry. The op ran on the device, and came back a tpu tensor.
    device = kwargs.get("device")
    if device is not None and device.type != "tpu":
        return func(_meta_view(args[0]),
                    *[to_cpu(a) if type(a) is TpuTensor else a for a in args[1:]], **kwargs)
    inner = _like_handlers.get(id(func))
    if inner is None:  # run_random for the random ones (their generator state), else run_op
        inner = _like_handlers[id(func)] = _handler_of(func)
    memory_format = kwargs.get("memory_format")
    if memory_format in _PERMUTING_FORMATS:  # an op's own result is contiguous
        out = inner(func, args, {**kwargs, "memory_format": None})
        return _in_memory_format(aten.clone.default, out, {"memory_format": memory_format})
    return inner(func, args, kwargs)


_like_handlers: dict = {}   # id(op) -> the handler a *_like op has on the device


@handles(aten.empty_like.default, aten.new_empty.default, aten.new_empty_strided.default,
         aten.empty.memory_format, aten.empty_strided.default)
def empty(func, args, kwargs):
    if func is aten.empty_like.default:
        shape, dtype = args[0].shape, kwargs.get("dtype") or args[0].dtype
    elif func in (aten.new_empty.default, aten.new_empty_strided.default):
        shape, dtype = args[1], kwargs.get("dtype") or args[0].dtype
    else:
        shape, dtype = args[0], kwargs.get("dtype") or torch.get_default_dtype()
    device = kwargs.get("device")
    if device is not None and device.type != "tpu":
        host = {k: v for k, v in kwargs.items()}
        return func(*[to_cpu(a) if type(a) is TpuTensor else a for a in args], **host)
    stride = _empty_strides(func, args, kwargs)
    if stride is None:
        return new_tensor(None, tuple(shape), dtype)
    return strided_tensor(None, shape, stride, dtype)


def _empty_strides(func, args, kwargs):
    """The strides eager gives an empty tensor where they may not be contiguous, else None:
    ``empty_strided``'s own (CPU's ``.to`` of a dense layout makes its copy with them), a
    memory format's (channels-last), ``empty_like``'s of a permuted source (``preserve_format``),
    from the op on the meta device."""
    if func is aten.empty_strided.default:
        return tuple(args[1])
    if func is aten.new_empty_strided.default:
        return tuple(args[2])
    memory_format = kwargs.get("memory_format")
    if func is aten.new_empty.default or memory_format is torch.contiguous_format or (
            func is aten.empty.memory_format and memory_format is None) or (
            func is aten.empty_like.default and memory_format in (None, torch.preserve_format)
            and args[0].stride() == contiguous_strides(tuple(args[0].shape))):
        return None
    if func is aten.empty_like.default and memory_format in (None, torch.preserve_format):
        # eager's rule: a dense source's strides as they are (the meta kernel makes a source
        # contiguous but for a size-1 dim's stride contiguous)
        stride = tuple(args[0].stride())
        if memory_layout(tuple(args[0].shape), stride) is not None:
            return stride
    meta = {k: v for k, v in kwargs.items() if k not in ("device", "pin_memory")}
    return tuple(func(*[_meta_view(a) if type(a) is TpuTensor else a for a in args],
                      device="meta", **meta).stride())


@handles(aten.native_dropout.default)
def native_dropout(func, args, kwargs):
    x, p, train = args[0], args[1], args[2] if len(args) > 2 else kwargs.get("train")
    if not train or p == 0:
        return run_op(aten.clone.default, (x,), {}), run_op(
            aten.ones_like.default, (x,), {"dtype": torch.bool})
    # The mask is drawn on the device from a key of the tpu generator, or (config.random_draws)
    # on the host from that generator; the arithmetic stays on device.
    if device_random.enabled(get_client().platform):
        with rng.drawing_from_tpu_generator():
            key = from_cpu(device_random.KeyDraw(1)()[0])
        mask = run_op(aten.lt.Scalar, (device_random.uniform_like(key, x), 1 - p), {})
    else:
        # CPU's own draw (a bernoulli_ of the input's shape and dtype): the same seed gives
        # CPU's masks, as randn and multinomial give CPU's numbers. torch.rand(...) < 1 - p,
        # drawn before, consumed the generator differently: an LSTM with dropout between
        # layers or a dropout MLP trained to other numbers than on the CPU.
        noise = torch.empty(x.shape, dtype=x.dtype).bernoulli_(1 - p, generator=rng.generator())
        mask = from_cpu(noise.bool())
    scaled = run_op(aten.mul.Tensor, (x, mask), {})
    # p == 1 scales by 0 (every element dropped), as CPU's kernel does, not 1 / 0.
    scale = 0.0 if p == 1 else 1.0 / (1 - p)
    return run_op(aten.mul.Tensor, (scaled, scale), {}), mask


@handles(aten.native_batch_norm.default)
def native_batch_norm(func, args, kwargs):
    # In training mode it writes the running statistics, but its schema does not say so: traced
    # as it stands, the update was silently lost. _native_batch_norm_legit is the same op with
    # the writes declared; it also decomposes with float32 statistics for bf16 inputs, where
    # torch-mlir's own lowering of native_batch_norm computed them in bf16.
    names = [a.name for a in func._schema.arguments]
    bound = {**dict(zip(names, args)), **kwargs}
    if not bound["training"]:
        return run_op(func, args, kwargs)
    values = tuple(bound[n] for n in names)
    if bound["running_mean"] is None or bound["running_var"] is None:
        return run_op(aten._native_batch_norm_legit.no_stats, values[:3] + values[5:], {})
    return run_op(aten._native_batch_norm_legit.default, values, {})


#: The fused optimizer steps with their learning rate as a tensor (PyTorch's own overloads).
_TENSOR_LR = {aten._fused_adamw_.default: aten._fused_adamw_.tensor_lr,
              aten._fused_adam_.default: aten._fused_adam_.tensor_lr,
              aten._fused_sgd_.default: aten._fused_sgd_.tensor_lr,
              aten._fused_adagrad_.default: aten._fused_adagrad_.tensor_lr}


@handles(*_TENSOR_LR)
def fused_step_with_tensor_lr(func, args, kwargs):
    # A learning-rate schedule (the Trainer's default) passes a new float every step, and a
    # float is part of the op's cache key: each step compiled the whole update again. The
    # rate's arithmetic (lr * weight_decay) keeps it from being lifted as other floats are
    # (scalars.py); the tensor_lr overload takes it as an input instead, so one program serves
    # every rate. The rate travels as lifted floats do (float64 for a float64 model).
    lr = kwargs.get("lr")
    if type(lr) is not float:
        return run_op(func, args, kwargs)
    return run_op(_TENSOR_LR[func], args,
                  {**kwargs, "lr": from_cpu(torch.tensor(lr, dtype=scalars.dtype_for(args[0])))})


@handles(aten.resize_.default, aten.resize_as_.default)
def resize_(func, args, kwargs):
    # Traced as an op (resize_as_), the new shape's values were written under the old shape.
    t = args[0]
    size = tuple(args[1].shape if func is aten.resize_as_.default else args[1])
    if any(n < 0 for n in size):
        fallback.raise_eagers_error(func, args, kwargs)
    if tuple(t.shape) != size:
        views.resize(t, size)
    if kwargs.get("memory_format") in _PERMUTING_FORMATS:
        # eager restrides the memory in place, values unmoved
        strides = tuple(torch.empty(size, device="meta",
                                    memory_format=kwargs["memory_format"]).stride())
        offset, storage = t.storage_offset(), t._st
        t._become(view_tensor(storage, size, strides, offset,
                              is_dense(size, strides, offset, storage.numel)))
    return t


@handles(aten.set_.source_Tensor)
def set_(func, args, kwargs):
    # t views source's storage as source does: a write through either reaches the other.
    t, source = args[0], args[1]
    if type(source) is not TpuTensor or source.dtype != t.dtype:
        fallback.raise_eagers_error(func, args, kwargs)
        raise RuntimeError(f"tpu: set_ takes a tpu tensor of the same dtype ({t.dtype}), not "
                           f"{source.dtype} on {source.device}")
    if source is not t:
        t._become(source)
    return t


@handles(aten._nested_tensor_from_tensor_list.default, aten._nested_from_padded.default)
def nested_tensor(func, args, kwargs):
    # The host fallback would build a host nested tensor that no tpu tensor can wrap (PyTorch
    # then fails with "NestedTensorImpl doesn't support sizes. Please file an issue").
    # _nested_tensor_from_mask (nn.TransformerEncoder's fast path) is nested.py's.
    raise NotImplementedError(
        f"{func}: nested tensors are not supported on the tpu device, beyond "
        f"nn.TransformerEncoder's fast path: use a padded tensor with a mask.")


_SPARSE_LAYOUTS = {aten._to_sparse_csr: torch.sparse_csr, aten._to_sparse_csc: torch.sparse_csc,
                   aten._to_sparse_bsr: torch.sparse_bsr, aten._to_sparse_bsc: torch.sparse_bsc}


@handles(aten._sparse_coo_tensor_with_dims_and_tensors.default,
         aten._sparse_coo_tensor_with_dims.default, aten._sparse_compressed_tensor_unsafe.default,
         aten._sparse_compressed_tensor_with_dims.default,
         aten.sparse_compressed_tensor.comp_plain_value_size,
         aten.sparse_compressed_tensor.comp_plain_value, aten._to_sparse.default,
         aten._to_sparse.sparse_dim, aten._to_sparse_csr.default, aten._to_sparse_csc.default,
         aten._to_sparse_bsr.default, aten._to_sparse_bsc.default)
def sparse_tensor(func, args, kwargs):
    # Refused before any lowering: the constructors' lowering failed ("failed to legalize
    # ... _sparse_coo_tensor_with_dims_and_tensors", a host-fallback warning, or under strict
    # mode only that), and a CSR tensor's .to("tpu") built a tpu tensor whose every use then
    # failed ("found at least two devices, tpu:0 and tpu:0").
    layout = kwargs.get("layout") or _SPARSE_LAYOUTS.get(func.overloadpacket, torch.sparse_coo)
    raise not_dense(layout, func)


__all__ = ["dispatch", "handles", "signature", "download"]


def _broadcasts_to(shape: tuple, target: tuple) -> bool:
    try:
        return torch.broadcast_shapes(shape, target) == target
    except RuntimeError:
        return False


@handles(aten.select_backward.default, aten.slice_backward.default)
def view_backward(func, args, kwargs):
    # The gradient of x[t] (x[i:i + n], narrow) is zeros with the view's gradient written
    # through that view, whose position is an input of the write (views.py): traced as an op,
    # each index was a constant, and a loop over time steps compiled a program per step.
    grad, sizes = args[0], list(args[1])
    if type(grad) is not TpuTensor:
        return run_op(func, args, kwargs)
    view = aten.select.int if func is aten.select_backward.default else aten.slice.Tensor
    out = new_tensor(None, tuple(sizes), grad.dtype)  # a storage never written reads as zeros
    aten.copy_.default(view(out, *args[2:], **kwargs), grad)
    return out


@handles(aten.zero_.default)
def zero_(func, args, kwargs):
    # A storage never written reads as zeros already: torch.zeros (empty, then zero_) and
    # new_zeros ran a program of zeros to read, and one more to write zeros over them.
    self = args[0]
    storage = self._st
    if self._dense and storage.value is None and not storage.freed and \
            storage.stands_for is None:
        return self
    return run_op(func, args, kwargs)


@handles(aten.fill_.Scalar)
def fill_scalar(func, args, kwargs):
    # The value as an input in the tensor's dtype, converted on the host by eager's own fill
    # (torch.full), an input of the program (scalars.as_input): y_neg[idx] = label
    # compiled a program per label (forward_forward: 10), a float fill one per float (its
    # decomposition, full(), takes the value where only a Python scalar fits).
    self, value = args[0], args[1]
    if type(self) is not TpuTensor or type(value) not in (int, float, bool) or \
            (not self._dense and 0 in self.stride()):
        # An expanded tensor: eager fills it, where its fill_.Tensor refuses the overlap.
        return run_op(func, args, kwargs)
    host = torch.full((), value, dtype=self.dtype)  # eager's conversion, and its errors
    # kept uploaded per value, 0-dim: an upload and a view per call made fill_ 5x slower
    stored = new_tensor(scalars.as_input([host.item()], self.dtype, keep=True, shape=()), (),
                        self.dtype)
    return aten.fill_.Tensor(self, stored)


@handles(aten.roll.default)
def roll(func, args, kwargs):
    # A gather at positions (arange(n) - shift) % n, the shift an input (scalars.as_input):
    # traced as an op, each shift was a constant of its own program (and its decomposition
    # transforms the shift, so it cannot be lifted as floats are).
    self, shifts = args[0], args[1]
    dims = args[2] if len(args) > 2 else kwargs.get("dims", [])
    if type(self) is not TpuTensor or self.numel() == 0 or \
            (len(dims) != len(shifts) and len(dims) > 0) or len(shifts) == 0:
        return run_op(func, args, kwargs)  # eager's errors, and its flattening roll
    if len(dims) == 0:
        if len(shifts) != 1:
            return run_op(func, args, kwargs)
        flat = aten.roll.default(aten.reshape.default(self, [-1]), shifts, [0])
        return aten.view.default(flat, list(self.shape))
    out = self
    for shift, dim in zip(shifts, dims):
        dim = dim + self.dim() if dim < 0 else dim
        if not 0 <= dim < self.dim():
            return run_op(func, args, kwargs)  # eager's IndexError
        n = self.shape[dim]
        by = new_tensor(scalars.as_input([shift % n], torch.int64), (1,), torch.int64)
        index = aten.remainder.Scalar(
            aten.sub.Tensor(torch.arange(n, device=self.device), by), n)
        out = aten.index_select.default(out, dim, index)
    return out


@handles(aten.index_put_.default, aten.index_put.default)
def index_put_with_mask(func, args, kwargs):
    """``x[mask] = v`` (and ``index_put(..., accumulate=True)``) with one boolean mask over
    ``x``'s leading dims, on the device: a select, with no data-dependent shape.

    One value per selected element (``v`` of shape (count, ...)) is placed by a running count
    of the mask; the count is read back once to check it against ``v`` (eager's "shape
    mismatch" where they differ), as CUDA syncs for the mask's nonzero. A value broadcast to
    every selected element needs no count. Anything else is the op as traced.
    """
    self, indices, values = args[0], args[1], args[2]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    mask = indices[0] if len(indices) == 1 else None
    if (mask is None or type(mask) is not TpuTensor or mask.dtype != torch.bool
            or mask.dim() == 0 or mask.numel() == 0
            or tuple(mask.shape) != tuple(self.shape[:mask.dim()])):
        return run_op(func, args, kwargs)
    if values.numel() == 1 and type(values) is not TpuTensor:
        values = from_cpu(values)
    if type(values) is not TpuTensor or (values.dtype != self.dtype and values.numel() != 1):
        return run_op(func, args, kwargs)
    values = values.to(self.dtype)
    rest = tuple(self.shape[mask.dim():])
    while values.dim() > len(rest) + 1 and values.shape[0] == 1:  # eager drops leading 1s
        values = values[0]
    shared = values.dim() <= len(rest) or values.shape[0] == 1  # one value set for every element
    element = values if values.dim() <= len(rest) else values[0] if shared else None
    element_shape = tuple(values.shape[1:]) if element is None else tuple(element.shape)
    if values.dim() > len(rest) + 1 or not _broadcasts_to(element_shape, rest):
        fallback.raise_eagers_error(func, args, kwargs)  # eager's "shape mismatch"
        return run_op(func, args, kwargs)
    broadcast_mask = aten.view.default(mask, list(mask.shape) + [1] * len(rest))
    if shared:
        source = element
    else:
        flat = aten.reshape.default(mask, [-1])   # an expanded or transposed mask: a copy
        position = aten.sub.Tensor(aten.cumsum.default(flat, 0), 1)
        count = int(to_cpu(aten.select.int(position, 0, -1))) + 1
        if count != values.shape[0]:
            fallback.raise_eagers_error(func, args, kwargs)
            return run_op(func, args, kwargs)
        if count == 0:  # nothing selected, nothing to place
            return aten.clone.default(self) if func is aten.index_put.default else self
        rows = aten.index_select.default(values, 0, aten.clamp_min.default(position, 0))
        source = aten.view.default(aten.expand.default(
            rows, [flat.shape[0], *rest]), list(mask.shape) + list(rest))
    if accumulate:
        zero = aten.zeros_like.default(self)
        selected = aten.add.Tensor(self, aten.where.self(broadcast_mask, source, zero))
    else:
        selected = aten.where.self(broadcast_mask, source, self)
    if func is aten.index_put.default:
        return selected
    views.write(self, views.read(selected))
    return self


from . import storage_ops  # noqa: E402,F401  (registers record_stream; FSDP2 storage helpers)
from . import nested  # noqa: E402,F401  (registers _nested_tensor_from_mask)
from . import nonzero  # noqa: E402,F401  (registers nonzero on the device)
